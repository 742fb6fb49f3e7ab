#!/usr/bin/env bash
# kcat for the compatibility tier (tests/compat/test_kcat.py): Debian's package, built on
# Debian's librdkafka, installed with apt when `kcat` is not on PATH (root or sudo).
# Idempotent; fails loudly when kcat cannot be had.
set -euo pipefail

cd "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

say() { printf '[setup:kcat] %s\n' "$*"; }
die() { printf '[setup:kcat] ERROR: %s\n' "$*" >&2; exit 1; }

# shellcheck source=scripts/apt_install.sh
. scripts/apt_install.sh
apt_install kcat kcat
# `kcat -V` prints its version and librdkafka's; it exits 0 only where the binary runs.
version="$(kcat -V 2>&1)" || die "kcat at $(command -v kcat) does not run: $version"
version="$(printf '%s\n' "$version" | grep -m1 '^Version')" || die "kcat -V names no version"
say "$version"
