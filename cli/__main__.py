"""`python -m cli` runs the `kiln` command."""

from cli.main import main

main()
