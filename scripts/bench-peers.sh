#!/usr/bin/env bash
# Side-by-side benchmarks: dlock against Curator 5.4, kazoo and etcd's Go
# recipes, on one private ZooKeeper and one private etcd (loopback, fsync on),
# each workload run alternately (dlock, peer, dlock, peer, ...), then a table
# of medians and dlock/peer ratios.
#
#   scripts/bench-peers.sh [--seconds S] [--rounds R] [--only zk|etcd|embedded] [--markdown FILE]
#
# Installs what is missing (Debian packages) the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
peers="$root/../shared/peers"

seconds=5 rounds=3 only="" markdown=""
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --markdown) markdown="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "bench-peers.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ "$rounds" -ge 3 ] || { echo "bench-peers.sh: --rounds must be at least 3" >&2; exit 2; }

packages=(zookeeper etcd-server protobuf-compiler libcurator-recipes-java libcurator-framework-java
          libcurator-client-java libslf4j-java python3-kazoo golang-go golang-etcd-server-dev)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q && apt-get install -y -q "${missing[@]}"
fi

features=()
case "$only" in ""|etcd) features=(--features etcd) ;; esac
echo "building dlock (release ${features[*]})..." >&2
cargo build --release -q -p dlock-cli "${features[@]}"
dlock="$root/target/release/dlock"
work=$(mktemp -d)
trap 'scripts/zookeeper.sh stop --dir "$work/zk" >/dev/null 2>&1 || true; scripts/etcd.sh stop --dir "$work/etcd" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

# Production-like servers: fsync on, ZooKeeper's default container reaping
# interval (60 s), tickTime 2000 as shipped.
zk=$(DLOCK_ZK_CONTAINER_CHECK_MS=60000 scripts/zookeeper.sh start --dir "$work/zk" --tick-time 2000 | sed -n 's/.*endpoint=\([^ ]*\).*/\1/p')
etcd=""
case "$only" in ""|etcd) etcd=$(scripts/etcd.sh start --dir "$work/etcd" | sed -n 's/.*endpoint=\([^ ]*\).*/\1/p') ;; esac
echo "zookeeper=$zk etcd=$etcd seconds=$seconds rounds=$rounds" >&2

results="$work/results"
: > "$results"

# run <workload-label> <impl> <command...>: runs once, records ops_per_s.
run() {
  local label="$1" impl="$2"; shift 2
  local line
  line=$("$@" 2>/dev/null | grep -E '^peer=' | tail -n 1) || true
  local rate violations
  rate=$(sed -n 's/.*ops_per_s=\([0-9.]*\).*/\1/p' <<<"$line")
  violations=$(sed -n 's/.*violations=\([0-9]*\).*/\1/p' <<<"$line")
  [ -n "$rate" ] || { echo "  $label $impl: no result (${line:-nothing printed})" >&2; rate=0; }
  echo "  $label $impl: $line" >&2
  echo "$label|$impl|$rate|${violations:-?}" >> "$results"
}

curator() { PEER_BUILD_DIR="$work/curator-build" bash "$peers/curator/run.sh" "$@"; }
kazoo() { /usr/bin/python3 "$peers/kazoo/peerbench.py" "$@"; }
etcdgo() { PEER_BUILD_DIR="$work/etcd-go-build" bash "$peers/etcd-go/run.sh" "$@"; }

# Each round runs every implementation once per workload, so dlock and its
# peers alternate (dlock, peer, dlock, peer, ...) over the rounds.
zk_workloads() {
  for r in $(seq "$rounds"); do
    echo "round $r (ZooKeeper)" >&2
    run "zk mutex 1" dlock "$dlock" --endpoint "zk://$zk" bench mutex --clients 1 --seconds "$seconds" --path /b/m1
    run "zk mutex 1" curator curator mutex --connect "$zk" --clients 1 --seconds "$seconds" --path /b/c1
    run "zk mutex 1" kazoo kazoo mutex --connect "$zk" --clients 1 --seconds "$seconds" --path /b/k1
    run "zk mutex 8" dlock "$dlock" --endpoint "zk://$zk" bench mutex --clients 8 --seconds "$seconds" --path /b/m8
    run "zk mutex 8" curator curator mutex --connect "$zk" --clients 8 --seconds "$seconds" --path /b/c8
    run "zk mutex 8" kazoo kazoo mutex --connect "$zk" --clients 8 --seconds "$seconds" --path /b/k8
    if "$dlock" bench --help | grep -q semaphore; then
      run "zk semaphore 8/3" dlock "$dlock" --endpoint "zk://$zk" bench semaphore --clients 8 --leases 3 --seconds "$seconds" --path /b/s
      run "zk semaphore 8/3" curator curator semaphore --connect "$zk" --clients 8 --leases 3 --seconds "$seconds" --path /b/cs
      run "zk semaphore 8/3" kazoo kazoo semaphore --connect "$zk" --clients 8 --leases 3 --seconds "$seconds" --path /b/ks
    fi
    run "zk rwlock 8 (1 write in 10)" dlock "$dlock" --endpoint "zk://$zk" bench rwlock --clients 8 --write-every 10 --seconds "$seconds" --path /b/rw
    run "zk rwlock 8 (1 write in 10)" curator curator rwlock --connect "$zk" --clients 8 --write-every 10 --seconds "$seconds" --path /b/crw
    if "$dlock" bench --help | grep -q election; then
      run "zk election 8" dlock "$dlock" --endpoint "zk://$zk" bench election --clients 8 --seconds "$seconds" --path /b/e
    fi
    run "zk raw create+delete (ceiling)" dlock "$dlock" --endpoint "zk://$zk" bench raw --clients 1 --seconds "$seconds" --path /b/raw
  done
}

etcd_workloads() {
  for r in $(seq "$rounds"); do
    echo "round $r (etcd)" >&2
    run "etcd mutex 1" dlock "$dlock" --endpoint "etcd://$etcd" bench mutex --clients 1 --seconds "$seconds" --path /b/em1
    run "etcd mutex 1" etcd-go etcdgo mutex --endpoints "$etcd" --clients 1 --seconds "$seconds" --path /b/gm1
    run "etcd mutex 8" dlock "$dlock" --endpoint "etcd://$etcd" bench mutex --clients 8 --seconds "$seconds" --path /b/em8
    run "etcd mutex 8" etcd-go etcdgo mutex --endpoints "$etcd" --clients 8 --seconds "$seconds" --path /b/gm8
    if "$dlock" bench --help | grep -q election; then
      run "etcd election 8" dlock "$dlock" --endpoint "etcd://$etcd" bench election --clients 8 --seconds "$seconds" --path /b/ee
      run "etcd election 8" etcd-go etcdgo election --endpoints "$etcd" --clients 8 --seconds "$seconds" --path /b/ge
    fi
    run "etcd raw put+delete (ceiling)" dlock "$dlock" --endpoint "etcd://$etcd" bench raw --clients 1 --seconds "$seconds" --path /b/eraw
  done
}

embedded_workloads() {
  for r in $(seq "$rounds"); do
    echo "round $r (embedded)" >&2
    run "embedded mutex 1" dlock "$dlock" bench mutex --clients 1 --seconds "$seconds"
    run "embedded mutex 8" dlock "$dlock" bench mutex --clients 8 --seconds "$seconds"
    run "embedded rwlock 8" dlock "$dlock" bench rwlock --clients 8 --seconds "$seconds"
  done
}

case "$only" in
  "") zk_workloads; etcd_workloads; embedded_workloads ;;
  zk) zk_workloads ;;
  etcd) etcd_workloads ;;
  embedded) embedded_workloads ;;
  *) echo "bench-peers.sh: --only takes zk, etcd or embedded" >&2; exit 2 ;;
esac

# The table: median ops/s per workload and implementation, and dlock/peer.
python3 - "$results" "$markdown" <<'PY'
import sys, statistics, collections
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    label, impl, rate, viol = line.strip().split("|")
    rows.setdefault(label, collections.OrderedDict()).setdefault(impl, []).append((float(rate), viol))
out = ["| workload | implementation | median ops/s | runs | violations | dlock / this |", "|---|---|---:|---:|---:|---:|"]
for label, impls in rows.items():
    dl = statistics.median(r for r, _ in impls.get("dlock", [(0, "")])) if "dlock" in impls else None
    for impl, runs in impls.items():
        med = statistics.median(r for r, _ in runs)
        ratio = "" if impl == "dlock" or not dl or not med else f"{dl / med:.2f}x"
        viols = ",".join(sorted(set(v for _, v in runs)))
        out.append(f"| {label} | {impl} | {med:.1f} | {len(runs)} | {viols} | {ratio} |")
table = "\n".join(out)
print(table)
if sys.argv[2]:
    open(sys.argv[2], "w").write(table + "\n")
PY
