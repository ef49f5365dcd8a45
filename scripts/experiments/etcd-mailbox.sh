#!/usr/bin/env bash
# Builds (once, offline, against Debian's etcd 3.4 Go sources) and runs the
# mailbox-handoff experiment of etcd_mailbox.go, side by side with dlock's own
# etcd mutex and etcd's Go recipe on one private etcd (fsync on), with the
# CPU that etcd and the client spent per lock cycle:
#
#   scripts/experiments/etcd-mailbox.sh [SECONDS]
#
# Needs golang-go and golang-etcd-server-dev (scripts/test.sh installs them)
# and the peers directory next to the repository (../shared/peers).
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds="${1:-5}"
out="${TMPDIR:-/tmp}/dlock-etcd-mailbox"
bin="$out/etcd-mailbox"
if [ ! -x "$bin" ] || [ scripts/experiments/etcd_mailbox.go -nt "$bin" ]; then
  mkdir -p "$out"
  (cd scripts/experiments && GO111MODULE=off GOPATH="$out/gopath:/usr/share/gocode" GOPROXY=off GOFLAGS= \
    GOCACHE="$out/cache" go build -o "$bin" etcd_mailbox.go)
fi
peers="$(cd .. && pwd)/shared/peers"
cargo build --release -q -p dlock-cli
work=$(mktemp -d)
trap 'scripts/etcd.sh stop --dir "$work/etcd" >/dev/null 2>&1; rm -rf "$work"' EXIT
line=$(scripts/etcd.sh start --dir "$work/etcd")
etcd=$(sed -n 's/.*endpoint=\([^ ]*\).*/\1/p' <<<"$line")
pid=$(sed -n 's/.*pid=\([0-9]*\).*/\1/p' <<<"$line")
ticks=$(getconf CLK_TCK)
etcd_cpu() { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }
# One run: its result line, plus etcd's and the client's CPU per operation.
run() {
  local before after out ops client
  before=$(etcd_cpu)
  out=$( { /usr/bin/time -f "client_cpu_s=%U %S" "$@"; } 2>&1 | grep -E '^(peer|client_cpu_s)=')
  after=$(etcd_cpu)
  ops=$(grep -o ' ops=[0-9]*' <<<"$out" | cut -d= -f2)
  client=$(sed -n 's/^client_cpu_s=\(.*\) \(.*\)/\1 + \2/p' <<<"$out")
  awk -v e="$((after - before))" -v t="$ticks" -v c="$client" -v n="$ops" -v line="$(grep '^peer=' <<<"$out")" \
    'BEGIN { split(c, p, " [+] "); printf "%s etcd_cpu_ms_per_op=%.2f client_cpu_ms_per_op=%.2f\n", line, e * 1000 / t / n, (p[1] + p[2]) * 1000 / n }'
}
for n in 8 32; do
  run target/release/dlock --endpoint "etcd://$etcd" bench mutex --clients "$n" --seconds "$seconds" --path "/x/dlock$n"
  run "$bin" --endpoints "$etcd" --clients "$n" --seconds "$seconds" --successor note --path "/x/note$n"
  run "$bin" --endpoints "$etcd" --clients "$n" --seconds "$seconds" --successor read --path "/x/read$n"
  run "$peers/etcd-go/run.sh" mutex --endpoints "$etcd" --clients "$n" --seconds "$seconds" --path "/x/go$n"
done
