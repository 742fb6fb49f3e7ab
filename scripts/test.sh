#!/usr/bin/env bash
# Bootstrap, then run every check: ruff, mypy, import-linter, pytest (arguments go to pytest).
# All steps run; the exit status is non-zero if any of them failed.
set -uo pipefail

cd "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

say() { printf '[test] %s\n' "$*"; }

if ! bash scripts/setup.sh; then
    say "FAILED: scripts/setup.sh"
    exit 1
fi

# Integration fixtures fail instead of skipping when a service cannot be started.
export KILN_REQUIRE_SERVICES=1

BIN=.venv/bin
summary=()
failed=0

record() {  # record NAME STATUS
    summary+=("$1=$2")
    if [ "$2" != PASS ]; then failed=1; fi
}

lint_dirs=()
for d in wire proxy storage cli tests bench spark_examples; do
    if [ -d "$d" ]; then lint_dirs+=("$d"); fi
done

say "ruff check ${lint_dirs[*]}"
if "$BIN/ruff" check "${lint_dirs[@]}"; then record ruff PASS; else record ruff FAIL; fi

say "mypy"
if "$BIN/mypy" --no-incremental; then record mypy PASS; else record mypy FAIL; fi

say "lint-imports"
if "$BIN/lint-imports"; then record lint-imports PASS; else record lint-imports FAIL; fi

say "pytest -q -p no:cacheprovider $*"
"$BIN/pytest" -q -p no:cacheprovider "$@"
rc=$?
if [ "$rc" -eq 0 ]; then
    record pytest PASS
elif [ "$rc" -eq 5 ]; then
    say "pytest collected no tests (exit 5): treated as a failure"
    record pytest "FAIL(no-tests)"
else
    record pytest "FAIL(exit-$rc)"
fi

say "summary: ${summary[*]}"
if [ "$failed" -ne 0 ]; then
    say "FAILED"
    exit 1
fi
say "all steps passed"
