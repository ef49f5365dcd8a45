# shellcheck shell=bash
# The supervision that scripts/zookeeper.sh, scripts/etcd.sh and
# scripts/consul.sh share: argument parsing, free loopback ports, the pid
# file, waiting until the server serves, stop (TERM, then KILL), status, and
# the log's tail when a start fails. Sourced, not run.
#
# A server script sets
#   SERVER_SELF    its name in messages ("etcd.sh")
#   SERVER_NAME    the server's name in messages ("etcd")
#   SERVER_TAG     the prefix of a temporary directory: dlock-TAG-XXXXXX
#   SERVER_PORTS   names of the loopback ports it listens on, each also an
#                  option `--NAME P` of `start`; the first one is the endpoint
# then sources this file, defines the functions
#   server_ensure      find the server's program (installing it if need be)
#   server_prepare D   before each attempt: config files, directories (the
#                      attempt's ports are in PORT[name])
#   server_exec D      exec the server in the foreground (stdout and stderr
#                      go to D/server.log; SIGHUP is ignored)
#   server_ready D     true once the server started in D serves (and it is
#                      ours, not another process on the same port)
#   server_mark D      a string that the server's command line holds, which
#                      tells our process from another one with a reused pid
#   server_describe    what was started, for the message when it did not start
# and optionally
#   server_option ARGS...  an extra option of `start`: set SERVER_SHIFT to
#                      the number of words used, return non-zero if unknown
#   server_cmd_NAME ARGS...  an extra subcommand NAME
# and ends with `server_main "$@"`.
#
# Files in the directory D: server.pid, endpoint (HOST:PORT), server.log,
# and .created-by-SELF when `start` made D itself (then `stop` removes it).

die() { echo "$SERVER_SELF: $*" >&2; exit 1; }
say() { echo "$SERVER_SELF: $*" >&2; }

# The script's leading comment block.
usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0" >&2; exit 2; }

# install_pkg PACKAGE...: apt-get install, with an apt-get update first if
# that fails.
install_pkg() {
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    say "installing Debian package(s) $* ..."
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get install -y --no-install-recommends "$@" >&2 \
        || { "${sudo[@]}" apt-get update >&2 && "${sudo[@]}" apt-get install -y --no-install-recommends "$@" >&2; } \
        || die "could not install $* with apt-get"
}

in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# A random port below the kernel's ephemeral range that nobody listens on.
pick_port() {
    local lo hi p
    lo=10000
    hi=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    [ "$hi" -gt $((lo + 2000)) ] || hi=65000
    for _ in $(seq 1 200); do
        p=$((lo + (RANDOM * 32768 + RANDOM) % (hi - lo)))
        in_use "$p" || { echo "$p"; return 0; }
    done
    die "no free port found"
}

# http_get PORT PATH: print the raw HTTP/1.0 response from 127.0.0.1:PORT.
http_get() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1" \
        && printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1:%s\r\n\r\n' "$2" "$1" >&3 \
        && timeout 2 cat <&3) 2>/dev/null
}

alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }

# The pid in D/server.pid if that process runs and is our server.
ours() {
    local pid=""
    [ -f "$1/server.pid" ] && pid="$(cat "$1/server.pid")"
    alive "$pid" || return 1
    [[ "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" == *"$(server_mark "$1")"* ]] || return 1
    echo "$pid"
}

server_prepare() { :; }
server_option() { return 1; }

declare -A PORT=()

server_start() {
    local dir="" created=0 name p
    local -A fixed=()
    while [ $# -gt 0 ]; do
        if [ "$1" = --dir ]; then
            [ $# -ge 2 ] || usage
            dir="$2"; shift 2; continue
        fi
        for name in "${SERVER_PORTS[@]}"; do
            if [ "$1" = "--$name" ]; then
                if [ $# -lt 2 ] || ! [[ "$2" =~ ^[0-9]+$ ]]; then die "--$name takes a port number"; fi
                fixed[$name]="$2"; shift 2; continue 2
            fi
        done
        SERVER_SHIFT=0
        server_option "$@" || usage
        shift "$SERVER_SHIFT"
    done
    server_ensure
    for p in "${fixed[@]}"; do
        in_use "$p" && die "port 127.0.0.1:$p is already in use by another process"
    done
    if [ -z "$dir" ]; then
        dir="$(mktemp -d "${TMPDIR:-/tmp}/dlock-$SERVER_TAG-XXXXXX")"
        created=1
        touch "$dir/.created-by-$SERVER_SELF"
    fi
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    if [ -f "$dir/server.pid" ] && alive "$(cat "$dir/server.pid")"; then
        die "$SERVER_NAME already runs in $dir (pid $(cat "$dir/server.pid")); stop it first"
    fi

    local all_fixed=1 attempt pid="" ready deadline taken
    [ "${#fixed[@]}" -eq "${#SERVER_PORTS[@]}" ] || all_fixed=0
    for attempt in 1 2 3; do
        # This attempt's ports: the fixed ones, and distinct free ones.
        PORT=()
        taken=" ${fixed[*]} "
        for name in "${SERVER_PORTS[@]}"; do
            p="${fixed[$name]:-}"
            while [ -z "$p" ] || { [ -z "${fixed[$name]:-}" ] && [[ "$taken" == *" $p "* ]]; }; do
                p="$(pick_port)"
            done
            PORT[$name]="$p"
            taken="$taken$p "
        done
        server_prepare "$dir" "$attempt"
        : >"$dir/server.log"
        # A subshell that execs the server: $! is the server's pid. SIGHUP is
        # ignored so closing the terminal does not stop it.
        (
            trap '' HUP
            server_exec "$dir"
        ) </dev/null >>"$dir/server.log" 2>&1 &
        pid=$!
        echo "$pid" >"$dir/server.pid"
        trap 'kill -9 '"$pid"' 2>/dev/null; exit 130' INT TERM
        ready=0
        deadline=$((SECONDS + 30))
        while [ "$SECONDS" -lt "$deadline" ] && alive "$pid"; do
            if server_ready "$dir"; then ready=1; break; fi
            sleep 0.05
        done
        trap - INT TERM
        if [ "$ready" -eq 1 ]; then
            echo "127.0.0.1:${PORT[${SERVER_PORTS[0]}]}" >"$dir/endpoint"
            echo "endpoint=127.0.0.1:${PORT[${SERVER_PORTS[0]}]} pid=$pid dir=$dir"
            return 0
        fi
        kill -9 "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        rm -f "$dir/server.pid"
        if [ "$all_fixed" -eq 0 ] && grep -qi 'address already in use' "$dir/server.log"; then
            say "a port was taken, retrying with other ones"
            continue
        fi
        break
    done
    local ports=""
    for name in "${SERVER_PORTS[@]}"; do ports="$ports $name=${PORT[$name]}"; done
    {
        echo "$SERVER_SELF: $SERVER_NAME ($(server_describe)) on 127.0.0.1 with ports$ports did not start (dir $dir)"
        echo "--- last 40 lines of $dir/server.log ---"
        tail -n 40 "$dir/server.log"
    } >&2
    [ "$created" -eq 1 ] && rm -rf "$dir"
    exit 1
}

# dir_option SUBCOMMAND ARGS...: parse --dir D (and --keep for stop) into
# $dir (absolute if it exists) and $keep.
dir_option() {
    local sub="$1"; shift
    dir="" keep=0
    while [ $# -gt 0 ]; do
        case "$1" in
            --dir) [ $# -ge 2 ] || usage; dir="$2"; shift 2 ;;
            --keep) [ "$sub" = stop ] || usage; keep=1; shift ;;
            *) usage ;;
        esac
    done
    [ -n "$dir" ] || die "$sub needs --dir D"
    [ ! -d "$dir" ] || dir="$(cd "$dir" && pwd)"
}

server_stop() {
    local dir keep pid
    dir_option stop "$@"
    [ -d "$dir" ] || die "no such directory: $dir"
    # Only kill the pid if it still is our server (pids get reused).
    if pid="$(ours "$dir")"; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.05; done
        alive "$pid" && kill -9 "$pid" 2>/dev/null
        for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.05; done
        say "stopped pid $pid"
    else
        say "no $SERVER_NAME running in $dir"
    fi
    rm -f "$dir/server.pid"
    if [ "$keep" -eq 0 ] && [ -f "$dir/.created-by-$SERVER_SELF" ]; then
        rm -rf "$dir"
    fi
}

server_status() {
    local dir keep pid="" ep=""
    dir_option status "$@"
    [ -f "$dir/server.pid" ] && pid="$(cat "$dir/server.pid")"
    [ -f "$dir/endpoint" ] && ep="$(cat "$dir/endpoint")"
    if alive "$pid"; then
        echo "endpoint=$ep pid=$pid dir=$dir"
    else
        say "not running (dir $dir)"
        exit 1
    fi
}

server_main() {
    [ $# -ge 1 ] || usage
    local sub="$1"; shift
    case "$sub" in
        start) server_start "$@" ;;
        stop) server_stop "$@" ;;
        status) server_status "$@" ;;
        -h|--help|help) usage ;;
        *)
            if [[ "$sub" =~ ^[a-z]+$ ]] && declare -F "server_cmd_$sub" >/dev/null; then
                "server_cmd_$sub" "$@"
            else
                usage
            fi ;;
    esac
}
