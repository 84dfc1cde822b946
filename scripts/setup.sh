#!/usr/bin/env bash
# Install what heapscope needs on Debian/Ubuntu (as root) and the package into ./.venv, and
# put `heapscope` on PATH.
# Usage: bash scripts/setup.sh [--dev]   (--dev adds the test tools)
#        bash scripts/setup.sh --only wait-for-apt|link   (one step; tests/e2e/test_setup_script.py)
set -euo pipefail
cd "$(dirname "$0")/.."

# apt's locks, held (fcntl write locks) by whatever apt or dpkg runs. The variable is only
# for the tests, which hold locks on files of their own.
IFS=: read -r -a apt_locks <<<"${HEAPSCOPE_SETUP_LOCKS:-/var/lib/dpkg/lock-frontend:/var/lib/dpkg/lock:/var/lib/apt/lists/lock}"
apt_wait_s=600

# "PID CMD" of a process holding one of apt's locks; fails when none is held. F_GETLK only
# asks: taking the lock to see would make a starting apt fail. In perl because perl-base is
# essential on Debian and Ubuntu, there before python3 is installed (struct flock as on
# x86_64 and arm64). With sudo for a user who cannot read them (apt's are root's, 0640).
apt_lock_holder() {
    local sudo="" path
    for path in "${apt_locks[@]}"; do [[ ! -e "$path" || -r "$path" ]] || sudo=$SUDO; done
    # shellcheck disable=SC2016  # the $ are perl's
    $sudo perl -MFcntl=F_GETLK,F_WRLCK,F_UNLCK,SEEK_SET,O_RDONLY -e '
        for my $path (@ARGV) {
            sysopen(my $fh, $path, O_RDONLY) or next;  # no lock file: nobody holds it
            my $flock = pack("s s x4 q q i x4", F_WRLCK, SEEK_SET, 0, 0, 0);
            fcntl($fh, F_GETLK, $flock) or die "heapscope setup: F_GETLK on $path: $!\n";
            my ($type, $pid) = (unpack("s s x4 q q i x4", $flock))[0, 4];
            next if $type == F_UNLCK;
            my $cmd = "?";
            if (open(my $cl, "<", "/proc/$pid/cmdline")) {
                local $/;
                ($cmd = <$cl> // "?") =~ s/\0+$//;
                $cmd =~ tr/\0/ /;
            }
            print "$pid $cmd\n";
            exit 0;
        }
        exit 1;' "${apt_locks[@]}"
}

# apt-get install waits for dpkg's lock when told to (DPkg::Lock::Timeout, below) but says
# nothing meanwhile, and apt-get update (apt 2.6) fails at once on /var/lib/apt/lists/lock
# whatever the timeout: so wait here, saying for whom, for at most apt_wait_s seconds.
wait_for_apt() {
    local holder said="" start=$SECONDS
    while holder=$(apt_lock_holder); do
        if [[ "$holder" != "$said" ]]; then
            echo "heapscope setup: waiting for another package manager (pid ${holder%% *}: ${holder#* }) to finish…" >&2
            said=$holder
        fi
        if ((SECONDS - start >= apt_wait_s)); then
            echo "heapscope setup: gave up after $apt_wait_s s: pid ${holder%% *} (${holder#* }) still holds the package manager's lock; run set-up again once it has finished" >&2
            return 1
        fi
        sleep 1
    done
    if [[ -n "$said" ]]; then echo "heapscope setup: the package manager is free, going on" >&2; fi
}

# A new shell finds `heapscope`: root gets a link in /usr/local/bin (on every user's PATH),
# another user one in ~/.local/bin (which Debian's and Ubuntu's ~/.profile put on PATH at
# login when it exists). A link from an earlier set-up (any clone's .venv) is replaced; any
# other file of that name is not ours and is left alone. HEAPSCOPE_SETUP_BIN: for the tests.
link_on_path() {
    local target bin link
    target="$PWD/.venv/bin/heapscope"
    if [[ -n "${HEAPSCOPE_SETUP_BIN:-}" ]]; then
        bin=$HEAPSCOPE_SETUP_BIN
    elif [[ $(id -u) -eq 0 && -w /usr/local/bin ]]; then
        bin=/usr/local/bin
    else
        bin=$HOME/.local/bin
    fi
    link=$bin/heapscope
    if [[ -e "$link" || -L "$link" ]] && [[ ! -L "$link" || "$(readlink "$link")" != */.venv/bin/heapscope ]]; then
        echo "heapscope setup: $link is not set-up's link, left alone: run $target instead" >&2
        return 0
    fi
    mkdir -p "$bin"
    ln -sfn "$target" "$link"
    echo "heapscope setup: heapscope is on PATH as $link -> $target"
}

SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO="sudo"

if [[ "${1:-}" == "--only" ]]; then
    case "${2:-}" in
        wait-for-apt) wait_for_apt ;;
        link) link_on_path ;;
        *) echo "usage: bash scripts/setup.sh --only wait-for-apt|link" >&2; exit 2 ;;
    esac
    exit
fi

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

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "heapscope setup: installing ${missing[*]}" >&2
    wait_for_apt
    $SUDO apt-get update -qq
    wait_for_apt
    # The timeout covers another apt that starts between the wait and this install.
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        -o DPkg::Lock::Timeout="$apt_wait_s" "${missing[@]}" >/dev/null
fi

# unpack FOLDER PACKAGE...: download Debian packages and unpack them into build/FOLDER.
unpack() {
    local folder="$1"; shift
    local tmp
    tmp=$(mktemp -d)
    # apt downloads as its user _apt, which must be able to write the folder.
    if [[ $(id -u) -eq 0 ]] && id _apt >/dev/null 2>&1; then chown _apt "$tmp"; fi
    if ! (cd "$tmp" && apt-get download -qq "$@" >/dev/null 2>&1); then
        wait_for_apt
        $SUDO apt-get update -qq  # package lists older than the archive's current packages
        (cd "$tmp" && apt-get download -qq "$@" >/dev/null)
    fi
    rm -rf "build/$folder"
    mkdir -p "build/$folder"
    for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "build/$folder"; done
    rm -rf "$tmp"
}
# nginx for tests/e2e/test_nginx.py: Debian's own binary, unpacked into build/nginx rather
# than installed. Installing the package starts a daemon on port 80 and enables it at boot
# (policy-rc.d can stop the start, not the enabling), and it would stay a system web server
# after heapscope is gone. Unpacked, nothing runs until a test starts it with its own -p,
# -c and -e: the binary needs no other file of the package, and the libraries it links are
# installed above. An nginx the machine already has is left alone.
if [[ "${1:-}" == "--dev" ]] && ! build/nginx/usr/sbin/nginx -v >/dev/null 2>&1; then
    unpack nginx nginx
    if ! build/nginx/usr/sbin/nginx -v >/dev/null 2>&1; then
        echo "heapscope setup: the unpacked build/nginx/usr/sbin/nginx does not run" >&2
        exit 1
    fi
fi
# Redis for tests/e2e/test_constructors.py, the same way (the server package would start a
# daemon): redis-tools holds the binary, redis-server its name (a link: the binary acts by
# the name it is started as), liblzf1 the one library it links that is not installed above
# (found through LD_LIBRARY_PATH=build/redis/usr/lib/x86_64-linux-gnu).
redis_ok() {
    LD_LIBRARY_PATH=build/redis/usr/lib/x86_64-linux-gnu build/redis/usr/bin/redis-server \
        --version >/dev/null 2>&1
}
if [[ "${1:-}" == "--dev" ]] && ! redis_ok; then
    unpack redis redis-server redis-tools liblzf1
    if ! redis_ok; then
        echo "heapscope setup: the unpacked build/redis/usr/bin/redis-server does not run" >&2
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
link_on_path
