#!/usr/bin/env bash
# Bootstrap (scripts/setup.sh), then run `kiln dev` with local Redis and broker.
set -euo pipefail
cd "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash scripts/setup.sh
exec .venv/bin/kiln dev "$@"
