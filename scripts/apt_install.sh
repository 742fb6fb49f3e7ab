# Sourced by scripts/setup.sh and scripts/clients/*.sh (which define `say` and `die`):
#   apt_install COMMAND PACKAGES...  installs PACKAGES with apt (root or sudo) when COMMAND is
#   not on PATH; apt-get update runs once per shell.
apt_install() {
    local command=$1
    shift
    command -v "$command" >/dev/null 2>&1 && return
    say "installing $* (apt)"
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 || die "$command missing and not root, no sudo"
        sudo="sudo"
    fi
    command -v apt-get >/dev/null 2>&1 || die "$command missing and apt-get not available"
    if [ -z "${APT_UPDATED:-}" ]; then
        $sudo apt-get update -qq || die "apt-get update failed"
        export APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null \
        || die "apt-get install $* failed"
    command -v "$command" >/dev/null 2>&1 || die "$command still not on PATH after installing $*"
}
