#!/usr/bin/env bash
# Start or stop a private single-member etcd on loopback ports, with its data
# and log in a private directory. For humans and benchmark scripts; Rust tests
# use the dlock-testkit crate instead.
#
#   scripts/etcd.sh start [--port P] [--peer-port Q] [--dir D] [-- EXTRA ETCD FLAGS...]
#       Starts etcd with clients on 127.0.0.1:P and raft peers on 127.0.0.1:Q
#       (defaults: free ports) and data in D (default: a new temporary
#       directory), waits until GET /health says true, prints
#           endpoint=127.0.0.1:PORT pid=PID dir=DIR
#       on stdout and exits, leaving etcd running in the background.
#   scripts/etcd.sh stop --dir D [--keep]
#       Stops the etcd started in D. A directory that `start` created itself
#       is removed, unless --keep is given.
#   scripts/etcd.sh status --dir D
#       Prints the endpoint line and exits 0 if etcd runs, else exits 1.
#
# If etcd is missing, installs the Debian packages `etcd-server` and
# `etcd-client` (apt-get install -y; apt-get update first if that fails).
# Environment: DLOCK_ETCD (etcd binary).
set -euo pipefail

die() { echo "etcd.sh: $*" >&2; exit 1; }
say() { echo "etcd.sh: $*" >&2; }

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

install_pkg() {
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    say "installing Debian package(s) $* ..."
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get install -y --no-install-recommends "$@" >&2 \
        || { "${sudo[@]}" apt-get update >&2 && "${sudo[@]}" apt-get install -y --no-install-recommends "$@" >&2; } \
        || die "could not install $* with apt-get"
}

ETCD=""
find_etcd() {
    ETCD="${DLOCK_ETCD:-$(command -v etcd || true)}"
    [ -n "$ETCD" ] || { [ -x /usr/bin/etcd ] && ETCD=/usr/bin/etcd; } || true
    [ -n "$ETCD" ] && [ -x "$ETCD" ]
}

ensure_etcd() {
    find_etcd && return 0
    install_pkg etcd-server etcd-client
    find_etcd || die "etcd still missing after installing etcd-server"
}

# A random port below the kernel's ephemeral range that nobody listens on.
pick_port() {
    local lo hi p i
    lo=10000
    hi=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    [ "$hi" -gt $((lo + 2000)) ] || hi=65000
    for i in $(seq 1 200); do
        p=$((lo + (RANDOM * 32768 + RANDOM) % (hi - lo)))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return 0; fi
    done
    die "no free port found"
}

in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# http_get PORT PATH: print the raw HTTP/1.0 response.
http_get() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1" \
        && printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1:%s\r\n\r\n' "$2" "$1" >&3 \
        && timeout 2 cat <&3) 2>/dev/null
}

alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }

cmd_start() {
    local port="" peer="" dir="" created=0 extra=()
    while [ $# -gt 0 ]; do
        case "$1" in
            --port) port="$2"; shift 2 ;;
            --peer-port) peer="$2"; shift 2 ;;
            --dir) dir="$2"; shift 2 ;;
            --) shift; extra=("$@"); break ;;
            *) usage ;;
        esac
    done
    ensure_etcd
    local p
    for p in $port $peer; do
        in_use "$p" && die "port 127.0.0.1:$p is already in use by another process"
    done
    if [ -z "$dir" ]; then
        dir="$(mktemp -d "${TMPDIR:-/tmp}/dlock-etcd-XXXXXX")"
        created=1
        touch "$dir/.created-by-etcd.sh"
    fi
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    if [ -f "$dir/server.pid" ] && alive "$(cat "$dir/server.pid")"; then
        die "etcd already runs in $dir (pid $(cat "$dir/server.pid")); stop it first"
    fi

    local fixed=0 attempt pid="" cport="$port" pport="$peer"
    [ -n "$port" ] && [ -n "$peer" ] && fixed=1
    for attempt in 1 2 3; do
        [ -n "$port" ] || cport="$(pick_port)"
        [ -n "$peer" ] || pport="$(pick_port)"
        [ "$cport" != "$pport" ] || continue
        : >"$dir/server.log"
        # A subshell that execs etcd: $! is etcd's pid. SIGHUP is ignored so
        # closing the terminal does not stop it. ETCD_* variables are dropped
        # (etcd would read them as flags).
        (
            trap '' HUP
            for v in $(compgen -e | grep '^ETCD_' || true); do unset "$v"; done
            exec "$ETCD" --name dlock --data-dir "$dir/data" \
                --listen-client-urls "http://127.0.0.1:$cport" \
                --advertise-client-urls "http://127.0.0.1:$cport" \
                --listen-peer-urls "http://127.0.0.1:$pport" \
                --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
                --initial-cluster "dlock=http://127.0.0.1:$pport" \
                --initial-cluster-state new \
                --initial-cluster-token "dlock-etcd-sh-$$-$cport" \
                --logger zap --log-outputs stderr \
                "${extra[@]}"
        ) </dev/null >>"$dir/server.log" 2>&1 &
        pid=$!
        echo "$pid" >"$dir/server.pid"
        trap 'kill -9 '"$pid"' 2>/dev/null; exit 130' INT TERM
        local i ready=0
        for i in $(seq 1 600); do   # 30 s
            alive "$pid" || break
            if http_get "$cport" /health | grep -q '"health":"true"'; then ready=1; break; fi
            sleep 0.05
        done
        trap - INT TERM
        if [ "$ready" -eq 1 ]; then
            echo "127.0.0.1:$cport" >"$dir/endpoint"
            echo "endpoint=127.0.0.1:$cport pid=$pid dir=$dir"
            return 0
        fi
        kill -9 "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        rm -f "$dir/server.pid"
        if [ "$fixed" -eq 0 ] && grep -q 'address already in use' "$dir/server.log"; then
            say "a port was taken, retrying with other ones"
            rm -rf "$dir/data"
            continue
        fi
        break
    done
    {
        echo "etcd.sh: etcd ($ETCD) on 127.0.0.1:$cport (peer port $pport) did not start (dir $dir)"
        echo "--- last 40 lines of $dir/server.log ---"
        tail -n 40 "$dir/server.log"
    } >&2
    [ "$created" -eq 1 ] && rm -rf "$dir"
    exit 1
}

cmd_stop() {
    local dir="" keep=0
    while [ $# -gt 0 ]; do
        case "$1" in
            --dir) dir="$2"; shift 2 ;;
            --keep) keep=1; shift ;;
            *) usage ;;
        esac
    done
    [ -n "$dir" ] || die "stop needs --dir D"
    [ -d "$dir" ] || die "no such directory: $dir"
    dir="$(cd "$dir" && pwd)"
    local pid=""
    [ -f "$dir/server.pid" ] && pid="$(cat "$dir/server.pid")"
    # Only kill the pid if it still is our etcd (pids get reused).
    if alive "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "--data-dir $dir/data"; then
        kill -TERM "$pid" 2>/dev/null || true
        local i
        for i in $(seq 1 100); do alive "$pid" || break; sleep 0.05; done
        alive "$pid" && kill -9 "$pid" 2>/dev/null
        for i in $(seq 1 100); do alive "$pid" || break; sleep 0.05; done
        say "stopped pid $pid"
    else
        say "no etcd running in $dir"
    fi
    rm -f "$dir/server.pid"
    if [ "$keep" -eq 0 ] && [ -f "$dir/.created-by-etcd.sh" ]; then
        rm -rf "$dir"
    fi
}

cmd_status() {
    local dir=""
    while [ $# -gt 0 ]; do
        case "$1" in
            --dir) dir="$2"; shift 2 ;;
            *) usage ;;
        esac
    done
    [ -n "$dir" ] || die "status needs --dir D"
    local pid="" ep=""
    [ -f "$dir/server.pid" ] && pid="$(cat "$dir/server.pid")"
    [ -f "$dir/endpoint" ] && ep="$(cat "$dir/endpoint")"
    if alive "$pid"; then
        echo "endpoint=$ep pid=$pid dir=$(cd "$dir" && pwd)"
    else
        say "not running (dir $dir)"
        exit 1
    fi
}

[ $# -ge 1 ] || usage
sub="$1"; shift
case "$sub" in
    start) cmd_start "$@" ;;
    stop) cmd_stop "$@" ;;
    status) cmd_status "$@" ;;
    -h|--help|help) usage ;;
    *) usage ;;
esac
