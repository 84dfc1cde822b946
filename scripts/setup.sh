#!/usr/bin/env bash
# Install what heapscope needs on Debian/Ubuntu (as root) and the package into ./.venv.
# Usage: bash scripts/setup.sh [--dev]   (--dev adds the test tools)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(python3 python3-venv python3-pip python3-dev gcc g++ libc6-dev libjemalloc2 libjemalloc-dev
          llvm binutils elfutils perl graphviz gdb)
if [[ "${1:-}" == "--dev" ]]; then
    packages+=(libc6-dbg util-linux postgresql-15 postgresql-server-dev-15 golang-go chromium
               chromium-driver valgrind librsvg2-bin librust-jemalloc-sys-dev librust-cc-dev
               librust-fs-extra-dev librust-libc-dev python3.11-dbg pkg-config libxml2-dev
               libssl-dev libsqlite3-dev zlib1g-dev passwd prometheus systemd
               openssl libcrypt1 libpcre2-8-0 libssl3 zlib1g)  # the last four: what nginx links
    command -v rustc >/dev/null 2>&1 || packages+=(rustc)
    command -v cargo >/dev/null 2>&1 || packages+=(cargo)
    command -v javac >/dev/null 2>&1 || packages+=(default-jdk-headless)
fi

SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO="sudo"
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "heapscope setup: installing ${missing[*]}" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi

# nginx for tests/e2e/test_nginx.py: Debian's own binary, unpacked into build/nginx rather
# than installed. Installing the package starts a daemon on port 80 and enables it at boot
# (policy-rc.d can stop the start, not the enabling), and it would stay a system web server
# after heapscope is gone. Unpacked, nothing runs until a test starts it with its own -p,
# -c and -e: the binary needs no other file of the package, and the libraries it links are
# installed above. An nginx the machine already has is left alone.
if [[ "${1:-}" == "--dev" ]] && ! build/nginx/usr/sbin/nginx -v >/dev/null 2>&1; then
    nginx_tmp=$(mktemp -d)
    trap 'rm -rf "$nginx_tmp"' EXIT
    # apt downloads as its user _apt, which must be able to write the folder.
    if [[ $(id -u) -eq 0 ]] && id _apt >/dev/null 2>&1; then chown _apt "$nginx_tmp"; fi
    if ! (cd "$nginx_tmp" && apt-get download -qq nginx >/dev/null 2>&1); then
        $SUDO apt-get update -qq  # package lists older than the archive's current nginx
        (cd "$nginx_tmp" && apt-get download -qq nginx >/dev/null)
    fi
    rm -rf build/nginx
    mkdir -p build/nginx
    dpkg-deb -x "$nginx_tmp"/nginx_*.deb build/nginx
    if ! build/nginx/usr/sbin/nginx -v >/dev/null 2>&1; then
        echo "heapscope setup: the unpacked build/nginx/usr/sbin/nginx does not run" >&2
        exit 1
    fi
fi

PY="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
    "$PY" -m venv .venv
fi
extra=""
[[ "${1:-}" == "--dev" ]] && extra="[dev]"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extra}"
# An editable install leaves the sources uncompiled; where PYTHONDONTWRITEBYTECODE is set
# every run would compile them again (0.13 s of each command's start). pip compiles a
# regular install the same way.
.venv/bin/python -m compileall -q src/heapscope >/dev/null
# The compiled loops (heapscope._native) and the helper `run` preloads (heapscope._preload)
# are optional for pip; here they must be there.
.venv/bin/python -c "import sys; from heapscope.native import core, describe
sys.exit(0 if core else f'heapscope setup: {describe()}')"
.venv/bin/python -c "import sys; from heapscope.capture.helper import library
sys.exit(0 if library() else 'heapscope setup: the helper (heapscope._preload) was not built')"
