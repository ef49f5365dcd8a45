#!/usr/bin/env bash
# Start or stop a private standalone ZooKeeper server on a loopback port, with
# its data and log in a private directory. For humans and benchmark scripts;
# Rust tests use the dlock-testkit crate instead.
#
#   scripts/zookeeper.sh start [--port P] [--dir D] [--tick-time MS]
#       Starts ZooKeeper on 127.0.0.1:P (default: a free port) with data in D
#       (default: a new temporary directory), waits until it serves, prints
#           endpoint=127.0.0.1:PORT pid=PID dir=DIR
#       on stdout and exits, leaving the server running in the background.
#   scripts/zookeeper.sh stop --dir D [--keep]
#       Stops the server started in D. A directory that `start` created itself
#       is removed, unless --keep is given.
#   scripts/zookeeper.sh status --dir D
#       Prints the endpoint line and exits 0 if the server runs, else exits 1.
#
# If Java or ZooKeeper is missing, installs the Debian package `zookeeper`
# (apt-get install -y; apt-get update first if that fails).
# Environment: DLOCK_JAVA (java binary), DLOCK_ZK_CLASSPATH (class path).
set -euo pipefail

die() { echo "zookeeper.sh: $*" >&2; exit 1; }
say() { echo "zookeeper.sh: $*" >&2; }

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

install_pkg() {
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    say "installing Debian package(s) $* ..."
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get install -y --no-install-recommends "$@" >&2 \
        || { "${sudo[@]}" apt-get update >&2 && "${sudo[@]}" apt-get install -y --no-install-recommends "$@" >&2; } \
        || die "could not install $* with apt-get"
}

JAVA=""
CLASSPATH_ZK=""
find_zookeeper() {
    JAVA="${DLOCK_JAVA:-}"
    if [ -z "$JAVA" ]; then
        if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then JAVA="$JAVA_HOME/bin/java"
        else JAVA="$(command -v java || true)"; fi
    fi
    CLASSPATH_ZK="${DLOCK_ZK_CLASSPATH:-}"
    if [ -z "$CLASSPATH_ZK" ] && [ -f /usr/share/java/zookeeper.jar ]; then
        CLASSPATH_ZK=/usr/share/java/zookeeper.jar
        [ -f /usr/share/java/slf4j-simple.jar ] && CLASSPATH_ZK="$CLASSPATH_ZK:/usr/share/java/slf4j-simple.jar"
    fi
    [ -n "$JAVA" ] && [ -x "$JAVA" ] && [ -n "$CLASSPATH_ZK" ]
}

ensure_zookeeper() {
    find_zookeeper && return 0
    install_pkg zookeeper
    find_zookeeper || die "java or /usr/share/java/zookeeper.jar still missing after installing zookeeper"
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

# zk4 PORT WORD: send a four-letter word, print the answer.
zk4() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1" && printf '%s' "$2" >&3 && timeout 2 cat <&3) 2>/dev/null
}

alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }

cmd_start() {
    local port="" dir="" tick=500 created=0
    while [ $# -gt 0 ]; do
        case "$1" in
            --port) port="$2"; shift 2 ;;
            --dir) dir="$2"; shift 2 ;;
            --tick-time) tick="$2"; shift 2 ;;
            *) usage ;;
        esac
    done
    ensure_zookeeper
    if [ -z "$dir" ]; then
        dir="$(mktemp -d "${TMPDIR:-/tmp}/dlock-zk-XXXXXX")"
        created=1
        touch "$dir/.created-by-zookeeper.sh"
    fi
    mkdir -p "$dir/data"
    dir="$(cd "$dir" && pwd)"
    if [ -f "$dir/server.pid" ] && alive "$(cat "$dir/server.pid")"; then
        die "a server already runs in $dir (pid $(cat "$dir/server.pid")); stop it first"
    fi

    local fixed_port=0 attempt pid=""
    if [ -n "$port" ]; then
        fixed_port=1
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            [ "$created" -eq 1 ] && rm -rf "$dir"
            die "port 127.0.0.1:$port is already in use by another process"
        fi
    fi
    for attempt in 1 2 3; do
        [ "$fixed_port" -eq 1 ] || port="$(pick_port)"
        cat >"$dir/zoo.cfg" <<EOF
tickTime=$tick
initLimit=10
syncLimit=5
dataDir=$dir/data
clientPort=$port
clientPortAddress=127.0.0.1
maxClientCnxns=0
4lw.commands.whitelist=*
admin.enableServer=false
extendedTypesEnabled=true
forceSync=yes
autopurge.purgeInterval=0
maxSessionTimeout=60000
EOF
        : >"$dir/server.log"
        # A subshell that execs java: $! is the JVM's pid. SIGHUP is ignored
        # so closing the terminal does not stop the server.
        (
            trap '' HUP
            exec "$JAVA" -Xmx256m -Xms32m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto \
                -XX:-UsePerfData -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
                -Djava.net.preferIPv4Stack=true -Dzookeeper.extendedTypesEnabled=true \
                '-Dzookeeper.4lw.commands.whitelist=*' -Dzookeeper.admin.enableServer=false \
                -Dzookeeper.jmx.log4j.disable=true -Dzookeeper.preAllocSize=4096 \
                -Dznode.container.checkIntervalMs="${DLOCK_ZK_CONTAINER_CHECK_MS:-100}" \
                -Dorg.slf4j.simpleLogger.showDateTime=true \
                -Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS \
                -cp "$CLASSPATH_ZK" org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zoo.cfg"
        ) </dev/null >>"$dir/server.log" 2>&1 &
        pid=$!
        echo "$pid" >"$dir/server.pid"
        trap 'kill -9 '"$pid"' 2>/dev/null; exit 130' INT TERM
        local i ready=0
        for i in $(seq 1 600); do   # 30 s
            alive "$pid" || break
            # `conf` shows our dataDir: the answer comes from our server.
            if [ "$(zk4 "$port" ruok)" = imok ] && zk4 "$port" srvr | grep -q '^Mode: standalone' \
                && zk4 "$port" conf | grep -qF "dataDir=$dir/data"; then
                ready=1; break
            fi
            sleep 0.05
        done
        trap - INT TERM
        if [ "$ready" -eq 1 ]; then
            echo "127.0.0.1:$port" >"$dir/endpoint"
            echo "endpoint=127.0.0.1:$port pid=$pid dir=$dir"
            return 0
        fi
        kill -9 "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        rm -f "$dir/server.pid"
        if [ "$fixed_port" -eq 0 ] && grep -q 'Address already in use' "$dir/server.log"; then
            say "port $port was taken, retrying with another one"
            continue
        fi
        break
    done
    {
        echo "zookeeper.sh: ZooKeeper ($JAVA ... QuorumPeerMain) on 127.0.0.1:$port did not start (dir $dir)"
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
    local pid=""
    [ -f "$dir/server.pid" ] && pid="$(cat "$dir/server.pid")"
    # Only kill the pid if it still is our server (pids get reused).
    if alive "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF "$dir/zoo.cfg"; then
        kill -TERM "$pid" 2>/dev/null || true
        local i
        for i in $(seq 1 100); do alive "$pid" || break; sleep 0.05; done
        alive "$pid" && kill -9 "$pid" 2>/dev/null
        for i in $(seq 1 100); do alive "$pid" || break; sleep 0.05; done
        say "stopped pid $pid"
    else
        say "no server running in $dir"
    fi
    rm -f "$dir/server.pid"
    if [ "$keep" -eq 0 ] && [ -f "$dir/.created-by-zookeeper.sh" ]; then
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
