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
# Environment: DLOCK_JAVA (java binary), DLOCK_ZK_CLASSPATH (class path),
# DLOCK_ZK_CONTAINER_CHECK_MS (container reaping interval, default 100).
set -euo pipefail

SERVER_SELF=zookeeper.sh SERVER_NAME=ZooKeeper SERVER_TAG=zk
SERVER_PORTS=(port)
# shellcheck source-path=SCRIPTDIR source=lib/server.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/server.sh"

JAVA=""
CLASSPATH_ZK=""
TICK=500

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

server_ensure() {
    find_zookeeper && return 0
    install_pkg zookeeper
    find_zookeeper || die "java or /usr/share/java/zookeeper.jar still missing after installing zookeeper"
}

server_option() {
    case "$1" in
        --tick-time) [ $# -ge 2 ] || usage; TICK="$2"; SERVER_SHIFT=2 ;;
        *) return 1 ;;
    esac
}

server_prepare() {
    mkdir -p "$1/data"
    cat >"$1/zoo.cfg" <<CFG
tickTime=$TICK
initLimit=10
syncLimit=5
dataDir=$1/data
clientPort=${PORT[port]}
clientPortAddress=127.0.0.1
maxClientCnxns=0
4lw.commands.whitelist=*
admin.enableServer=false
extendedTypesEnabled=true
forceSync=yes
autopurge.purgeInterval=0
maxSessionTimeout=60000
CFG
}

server_exec() {
    exec "$JAVA" -Xmx256m -Xms32m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto \
        -XX:-UsePerfData -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
        -Djava.net.preferIPv4Stack=true -Dzookeeper.extendedTypesEnabled=true \
        '-Dzookeeper.4lw.commands.whitelist=*' -Dzookeeper.admin.enableServer=false \
        -Dzookeeper.jmx.log4j.disable=true -Dzookeeper.preAllocSize=4096 \
        -Dznode.container.checkIntervalMs="${DLOCK_ZK_CONTAINER_CHECK_MS:-100}" \
        -Dorg.slf4j.simpleLogger.showDateTime=true \
        -Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS \
        -cp "$CLASSPATH_ZK" org.apache.zookeeper.server.quorum.QuorumPeerMain "$1/zoo.cfg"
}

# zk4 WORD: send a four-letter word to the server, print the answer.
zk4() {
    (exec 3<>"/dev/tcp/127.0.0.1/${PORT[port]}" && printf '%s' "$1" >&3 && timeout 2 cat <&3) 2>/dev/null
}

# `conf` shows our dataDir: the answer comes from our server.
server_ready() {
    [ "$(zk4 ruok)" = imok ] && [[ "$(zk4 srvr)" == *$'\nMode: standalone'* ]] \
        && [[ "$(zk4 conf)" == *"dataDir=$1/data"* ]]
}

server_mark() { echo "$1/zoo.cfg"; }
server_describe() { echo "$JAVA ... QuorumPeerMain"; }

server_main "$@"
