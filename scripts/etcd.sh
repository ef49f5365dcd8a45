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

SERVER_SELF=etcd.sh SERVER_NAME=etcd SERVER_TAG=etcd
SERVER_PORTS=(port peer-port)
# shellcheck source-path=SCRIPTDIR source=lib/server.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/server.sh"

ETCD=""
EXTRA=()

find_etcd() {
    ETCD="${DLOCK_ETCD:-$(command -v etcd || true)}"
    [ -n "$ETCD" ] || { [ -x /usr/bin/etcd ] && ETCD=/usr/bin/etcd; } || true
    [ -n "$ETCD" ] && [ -x "$ETCD" ]
}

server_ensure() {
    find_etcd && return 0
    install_pkg etcd-server etcd-client
    find_etcd || die "etcd still missing after installing etcd-server"
}

server_option() {
    case "$1" in
        --) EXTRA=("${@:2}"); SERVER_SHIFT=$# ;;
        *) return 1 ;;
    esac
}

# A retry after a taken port starts afresh: the data of the failed attempt
# names its peer port.
server_prepare() { [ "$2" -eq 1 ] || rm -rf "$1/data"; }

# ETCD_* variables are dropped (etcd would read them as flags).
server_exec() {
    local v cport="${PORT[port]}" pport="${PORT[peer-port]}"
    for v in $(compgen -e | grep '^ETCD_' || true); do unset "$v"; done
    exec "$ETCD" --name dlock --data-dir "$1/data" \
        --listen-client-urls "http://127.0.0.1:$cport" \
        --advertise-client-urls "http://127.0.0.1:$cport" \
        --listen-peer-urls "http://127.0.0.1:$pport" \
        --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
        --initial-cluster "dlock=http://127.0.0.1:$pport" \
        --initial-cluster-state new \
        --initial-cluster-token "dlock-etcd-sh-$$-$cport" \
        --logger zap --log-outputs stderr \
        "${EXTRA[@]}"
}

server_ready() { [[ "$(http_get "${PORT[port]}" /health)" == *'"health":"true"'* ]]; }
server_mark() { echo "--data-dir $1/data"; }
server_describe() { echo "$ETCD"; }

server_main "$@"
