#!/usr/bin/env bash
# Fetch Consul 1.8.7, or start and stop a private single-node Consul agent in
# dev mode on loopback ports, with its data and log in a private directory.
# For humans and benchmark scripts.
#
#   scripts/consul.sh get
#       Makes sure the consul binary is in the cache (below), fetching it if
#       not, and prints its path on stdout.
#   scripts/consul.sh start [--port H] [--serf-lan-port A] [--serf-wan-port B]
#                           [--server-port C] [--dir D]
#       Starts `consul agent -dev` with its HTTP API on 127.0.0.1:H, Serf
#       and server RPC on 127.0.0.1:A, B, C (defaults: free ports), no DNS
#       or gRPC, data in D (default: a new temporary directory), waits until
#       it has elected itself leader, prints
#           endpoint=127.0.0.1:H pid=PID dir=DIR
#       on stdout (H: the HTTP API) and exits, leaving it running.
#   scripts/consul.sh stop --dir D [--keep]
#       Stops the agent started in D. A directory that `start` created itself
#       is removed, unless --keep is given.
#   scripts/consul.sh status --dir D
#       Prints the endpoint line and exits 0 if the agent runs, else exits 1.
#
# Consul 1.8.7 is the last MPL-2.0 Consul in Debian, in Debian 11 only:
# `get` downloads the package consul=1.8.7+dfsg1-2+b3 of bullseye/main from
# the Debian mirror this machine's apt sources name, with apt-get in a private
# state directory (the machine's apt configuration is left as it is; the
# index is checked against debian-archive-keyring), and keeps only
# usr/bin/consul, in
#   ${DLOCK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dlock}/consul/1.8.7+dfsg1-2+b3/consul
# Environment: DLOCK_CONSUL (a consul binary to use instead), DLOCK_CACHE.
set -euo pipefail

SERVER_SELF=consul.sh SERVER_NAME=Consul SERVER_TAG=consul
SERVER_PORTS=(port serf-lan-port serf-wan-port server-port)
# shellcheck source-path=SCRIPTDIR source=lib/server.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/server.sh"

CONSUL_PKG=consul
CONSUL_DEB_VERSION=1.8.7+dfsg1-2+b3
CONSUL_VERSION_LINE="Consul v1.8.7"
CONSUL_SUITE=bullseye
CONSUL_KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
CONSUL=""

consul_cached() {
    echo "${DLOCK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dlock}/consul/$CONSUL_DEB_VERSION/consul"
}

# consul_works BIN: BIN runs and is Consul 1.8.7.
consul_works() {
    local out
    [ -x "$1" ] && out="$(CHECKPOINT_DISABLE=1 "$1" version 2>&1)" && [ "${out%%$'\n'*}" = "$CONSUL_VERSION_LINE" ]
}

# The URIs of the Debian mirrors in this machine's apt sources (deb822
# *.sources and one-line sources.list / *.list), security repositories left
# out: only entries with a plain release suite (no -security, -updates).
debian_mirrors() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk 'BEGIN { RS = ""; FS = "\n" }
            {
                types = uris = suites = ""; enabled = "yes"
                for (i = 1; i <= NF; i++) {
                    line = $i
                    if (line ~ /^[ \t]*#/) continue
                    key = tolower(line); sub(/:.*/, "", key)
                    val = line; sub(/^[^:]*:[ \t]*/, "", val)
                    if (key == "types") types = val
                    else if (key == "uris") uris = val
                    else if (key == "suites") suites = val
                    else if (key == "enabled") enabled = tolower(val)
                }
                if (enabled == "no" || (" " types " ") !~ / deb /) next
                n = split(suites, s, /[ \t]+/); plain = 0
                for (i = 1; i <= n; i++) if (s[i] != "" && s[i] !~ /-/) plain = 1
                if (!plain) next
                n = split(uris, u, /[ \t]+/)
                for (i = 1; i <= n; i++) if (u[i] != "" && u[i] !~ /security/) print u[i]
            }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" \
            | awk '$1 == "deb" && $3 !~ /-/ && $2 !~ /security/ { print $2 }'
    done
}

# Fetch the package with apt-get in the private state directory $1 from
# mirror $2; log in $1/apt.log. Prints nothing, fails with a reason on stderr.
fetch_deb() {
    local tmp="$1" uri="$2" apt
    mkdir -p "$tmp/parts" "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/download"
    cat >"$tmp/parts/debian-$CONSUL_SUITE.sources" <<SRC
Types: deb
URIs: $uri
Suites: $CONSUL_SUITE
Components: main
Signed-By: $CONSUL_KEYRING
SRC
    apt=(apt-get -q -o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$tmp/parts"
         -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o Debug::NoLocking=1)
    # apt-get drops to the _apt user to download when run as root: the
    # private directories must be its.
    if [ "$(id -u)" -eq 0 ] && id _apt >/dev/null 2>&1; then
        chmod 755 "$tmp"
        chown -R _apt "$tmp/lists" "$tmp/cache" "$tmp/download"
    fi
    say "fetching $CONSUL_PKG=$CONSUL_DEB_VERSION from $uri ($CONSUL_SUITE main)"
    "${apt[@]}" update >>"$tmp/apt.log" 2>&1 \
        || { say "apt-get update of $CONSUL_SUITE main from $uri failed"; return 1; }
    (cd "$tmp/download" && "${apt[@]}" download "$CONSUL_PKG=$CONSUL_DEB_VERSION") >>"$tmp/apt.log" 2>&1 \
        || { say "apt-get download $CONSUL_PKG=$CONSUL_DEB_VERSION from $uri ($CONSUL_SUITE main) failed"; return 1; }
}

# The cached binary's path, after fetching it if it is not there.
consul_get() {
    local dest tmp uri debs uris=()
    dest="$(consul_cached)"
    if consul_works "$dest"; then echo "$dest"; return 0; fi
    local what="cannot fetch $CONSUL_PKG=$CONSUL_DEB_VERSION (Debian $CONSUL_SUITE main)"
    if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
        die "$what: apt-get and dpkg-deb are needed"
    fi
    [ -f "$CONSUL_KEYRING" ] || die "$what: no $CONSUL_KEYRING (Debian package debian-archive-keyring)"
    mapfile -t uris < <(debian_mirrors | awk '!seen[$0]++')
    [ "${#uris[@]}" -gt 0 ] || die "$what: no Debian mirror found in /etc/apt/sources.list or /etc/apt/sources.list.d/"
    tmp="$(mktemp -d "${TMPDIR:-/tmp}/dlock-consul-get-XXXXXX")"
    # shellcheck disable=SC2064 # $tmp is expanded now, on purpose.
    trap "rm -rf '$tmp'" EXIT
    local fetched=0
    for uri in "${uris[@]}"; do
        if fetch_deb "$tmp" "$uri"; then fetched=1; break; fi
    done
    if [ "$fetched" -eq 0 ]; then
        { echo "--- last 20 lines of apt-get's output ---"; tail -n 20 "$tmp/apt.log"; } >&2
        die "$what from ${uris[*]}: see apt-get's output above"
    fi
    debs=("$tmp"/download/"${CONSUL_PKG}"_*.deb)
    [ -f "${debs[0]}" ] || die "$what: apt-get download left no .deb in $tmp/download"
    dpkg-deb -x "${debs[0]}" "$tmp/root" || die "$what: dpkg-deb -x ${debs[0]} failed"
    [ -f "$tmp/root/usr/bin/consul" ] || die "$what: the package has no usr/bin/consul"
    consul_works "$tmp/root/usr/bin/consul" \
        || die "$what: its usr/bin/consul does not run or is not $CONSUL_VERSION_LINE"
    mkdir -p "$(dirname "$dest")" || die "$what: cannot create $(dirname "$dest")"
    if ! { cp "$tmp/root/usr/bin/consul" "$dest.part.$$" && chmod 755 "$dest.part.$$" \
        && mv -f "$dest.part.$$" "$dest"; }; then
        rm -f "$dest.part.$$"
        die "$what: cannot write $dest"
    fi
    rm -rf "$tmp"
    trap - EXIT
    consul_works "$dest" || die "$what: $dest does not run after copying"
    echo "$dest"
}

server_cmd_get() {
    [ $# -eq 0 ] || usage
    consul_get
}

server_ensure() {
    CONSUL="${DLOCK_CONSUL:-}"
    if [ -n "$CONSUL" ]; then
        [ -x "$CONSUL" ] || die "DLOCK_CONSUL=$CONSUL is not an executable"
        return 0
    fi
    CONSUL="$(consul_get)"
}

server_prepare() { mkdir -p "$1/data"; }

# No update check (it would call out of this machine); CONSUL_* variables
# are dropped so that the agent sees only its flags.
server_exec() {
    local v
    for v in $(compgen -e | grep '^CONSUL_' || true); do unset "$v"; done
    export CHECKPOINT_DISABLE=1
    exec "$CONSUL" agent -dev -bind 127.0.0.1 -client 127.0.0.1 \
        -http-port "${PORT[port]}" -grpc-port -1 -dns-port -1 \
        -serf-lan-port "${PORT[serf-lan-port]}" -serf-wan-port "${PORT[serf-wan-port]}" \
        -server-port "${PORT[server-port]}" \
        -hcl 'disable_update_check = true' -hcl 'disable_anonymous_signature = true' \
        -data-dir "$1/data"
}

# The leader is this agent's own server port: the answer comes from ours.
server_ready() {
    [[ "$(http_get "${PORT[port]}" /v1/status/leader)" == *"\"127.0.0.1:${PORT[server-port]}\""* ]]
}

server_mark() { echo "-data-dir $1/data"; }
server_describe() { echo "$CONSUL agent -dev"; }

server_main "$@"
