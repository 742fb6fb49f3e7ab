#!/usr/bin/env bash
# kafkajs for the compatibility tier (tests/compat/test_kafkajs.py): the Node.js packages of
# scripts/clients/node/package-lock.json (kafkajs, its snappy and lz4 codec plugins, and
# zstd-napi for a zstd codec) installed with `npm ci` into .clients/node. Skipped while the
# lock, package.json and the Node version are unchanged. Node.js and npm come from apt when
# npm is not on PATH. Idempotent; fails loudly.
set -euo pipefail

cd "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

say() { printf '[setup:kafkajs] %s\n' "$*"; }
die() { printf '[setup:kafkajs] ERROR: %s\n' "$*" >&2; exit 1; }

SRC=scripts/clients/node
OUT=.clients/node
STAMP="$OUT/.kiln-setup-stamp"

# shellcheck source=scripts/apt_install.sh
. scripts/apt_install.sh
apt_install npm nodejs npm
node_version="$(node --version 2>&1)" || die "node does not run: $node_version"

# lz4 (under kafkajs-lz4) and zstd-napi are native addons built at install time, so a round
# trip through each shows the install worked. tests/compat/node/kafkajs_driver.js registers
# the codecs with kafkajs.
codecs_load() {
    NODE_PATH="$OUT/node_modules" node -e '
        const data = Buffer.from("kiln ".repeat(100));
        const lz4 = require("lz4");
        const zstd = require("zstd-napi");
        require("kafkajs-snappy");
        require("kafkajs-lz4");
        if (!lz4.decode(lz4.encode(data)).equals(data)) throw new Error("lz4 round trip");
        if (!zstd.decompress(zstd.compress(data)).equals(data)) throw new Error("zstd round trip");
        console.log(require("kafkajs/package.json").version);
    '
}

want="$( (cat "$SRC/package.json" "$SRC/package-lock.json"; echo "$node_version") | cksum)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && version="$(codecs_load 2>&1)"; then
    say "kafkajs $version up to date in $OUT"
    exit 0
fi

say "npm ci into $OUT (node $node_version)"
rm -rf "$OUT"
mkdir -p "$OUT"
cp "$SRC/package.json" "$SRC/package-lock.json" "$OUT/"
# --foreground-scripts: a native addon that fails to build shows its compiler's output.
(cd "$OUT" && npm ci --no-audit --no-fund --loglevel=error --foreground-scripts >build.log 2>&1) \
    || { tail -40 "$OUT/build.log" >&2; die "npm ci failed (log: $OUT/build.log)"; }
version="$(codecs_load 2>&1)" || die "kafkajs or a codec does not load: $version"
printf '%s' "$want" >"$STAMP"
say "kafkajs $version with snappy, lz4 and zstd codecs in $OUT"
