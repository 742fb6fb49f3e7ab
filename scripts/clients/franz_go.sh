#!/usr/bin/env bash
# franz-go for the compatibility tier: builds tests/compat/franz_go (a small Go program the
# tests run as a subprocess) into .clients/franz-go/franz-go. Modules come from the Go
# module proxy, pinned by the committed go.sum. Skipped while the sources, go.mod, go.sum
# and the Go toolchain are unchanged.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

say() { printf '[franz-go] %s\n' "$*"; }
die() { printf '[franz-go] ERROR: %s\n' "$*" >&2; exit 1; }

SRC=tests/compat/franz_go
OUT=.clients/franz-go
BIN="$OUT/franz-go"
STAMP="$OUT/.kiln-setup-stamp"

GO="$(command -v go || true)"
[ -n "$GO" ] || GO=/usr/local/go/bin/go
[ -x "$GO" ] || die "no Go toolchain (go on PATH or /usr/local/go/bin/go); go.mod needs go >= $(
    awk '$1 == "go" {print $2}' "$SRC/go.mod")"
# The go.mod's version must be served by this toolchain: never download another one.
export GOTOOLCHAIN=local

want="$( (cat "$SRC"/go.mod "$SRC"/go.sum "$SRC"/*.go; "$GO" version) | cksum)"
if [ -x "$BIN" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
    say "up to date ($BIN)"
    exit 0
fi

say "building $BIN with $("$GO" version | awk '{print $3}')"
rm -f "$STAMP"
mkdir -p "$OUT"
# -mod=readonly: a go.sum that does not cover the build fails it instead of being rewritten.
(cd "$SRC" && "$GO" build -mod=readonly -trimpath -o "$ROOT/$BIN" .) \
    || die "go build of $SRC failed (Go module proxy reachable? go.sum up to date?)"
# Without arguments it prints its usage as a fatal event: it runs here.
usage="$("$BIN" 2>&1 || true)"
case "$usage" in
    *'"event":"fatal"'*) ;;
    *) die "$BIN does not run: $usage" ;;
esac
printf '%s' "$want" >"$STAMP"
say "built $BIN"
