#!/usr/bin/env bash
# Side-by-side benchmarks: dlock against Curator 5.4, kazoo and etcd's Go
# recipes, on one private ZooKeeper and one private etcd (loopback, fsync on),
# and against `consul lock` (Consul 1.8.7) on one private Consul agent (dev
# mode: in memory), each workload run alternately (dlock first in odd rounds,
# last in even ones), then a table of medians and dlock/peer ratios.
#
#   scripts/bench-peers.sh [--seconds S] [--rounds R] [--only zk|etcd|embedded|consul|counter] [--markdown FILE]
#
# --only counter: the AtomicCounter and DoubleBarrier rows on ZooKeeper alone.
#
# Installs what is missing (Debian packages; Consul with scripts/consul.sh
# get) the first time.
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
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "bench-peers.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ "$rounds" -ge 3 ] || { echo "bench-peers.sh: --rounds must be at least 3" >&2; exit 2; }

case "$only" in
  ""|zk|etcd|embedded|consul|counter) ;;
  *) echo "bench-peers.sh: --only takes zk, etcd, embedded, consul or counter" >&2; exit 2 ;;
esac

# The Consul rows need no Debian package: only the consul binary.
packages=()
[ "$only" = consul ] || packages=(zookeeper etcd-server curl libcurator-recipes-java
  libcurator-framework-java libcurator-client-java libslf4j-java python3-kazoo golang-go golang-etcd-server-dev)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
[ "$only" = consul ] || command -v javac >/dev/null || missing+=(default-jdk-headless)
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get update -q
  $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi

features=()
case "$only" in
  "") features=(--features "etcd consul") ;;
  etcd) features=(--features etcd) ;;
  consul) features=(--features consul) ;;
esac
echo "building dlock (release ${features[*]})..." >&2
cargo build --release -q -p dlock-cli "${features[@]}"
dlock="${CARGO_TARGET_DIR:-$root/target}/release/dlock"
work=$(mktemp -d)
trap 'scripts/zookeeper.sh stop --dir "$work/zk" >/dev/null 2>&1 || true; scripts/etcd.sh stop --dir "$work/etcd" >/dev/null 2>&1 || true; scripts/consul.sh stop --dir "$work/consul" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

# Production-like servers: fsync on, ZooKeeper's default container reaping
# interval (60 s), tickTime 2000 as shipped.
zk=""
[ "$only" = consul ] || zk=$(DLOCK_ZK_CONTAINER_CHECK_MS=60000 scripts/zookeeper.sh start --dir "$work/zk" --tick-time 2000 | sed -n 's/.*endpoint=\([^ ]*\).*/\1/p')
etcd=""
case "$only" in ""|etcd) etcd=$(scripts/etcd.sh start --dir "$work/etcd" | sed -n 's/.*endpoint=\([^ ]*\).*/\1/p') ;; esac
consul="" consul_bin=""
case "$only" in ""|consul)
  consul_bin=$(scripts/consul.sh get)
  consul=$(scripts/consul.sh start --dir "$work/consul" | sed -n 's/.*endpoint=\([^ ]*\).*/\1/p') ;;
esac
echo "zookeeper=$zk etcd=$etcd consul=$consul${consul_bin:+ ($consul_bin)} seconds=$seconds rounds=$rounds" >&2

results="$work/results"
: > "$results"

# run <workload-label> <impl> <command...>: runs once, records ops_per_s.
run() {
  local label="$1" impl="$2"; shift 2
  local line before=""
  [[ "$label" != etcd* ]] || before=$(etcd_fsyncs)
  line=$("$@" 2>/dev/null | grep -E '^peer=' | tail -n 1) || true
  local rate violations ops disk="" per_op="" fsync_ms=""
  rate=$(sed -n 's/.*ops_per_s=\([0-9.]*\).*/\1/p' <<<"$line")
  violations=$(sed -n 's/.*violations=\([0-9]*\).*/\1/p' <<<"$line")
  ops=$(sed -n 's/.* ops=\([0-9]*\).*/\1/p' <<<"$line")
  [ -n "$rate" ] || { echo "  $label $impl: no result (${line:-nothing printed})" >&2; rate=0; }
  if [ -n "$before" ] && [ -n "$ops" ]; then
    # etcd's WAL fsyncs during the run: how many per op, and how long each.
    read -r per_op fsync_ms < <(awk -v ops="$ops" '{ n = $3 - $1; t = $4 - $2 }
      END { if (n > 0 && ops > 0) printf "%.2f %.2f\n", n / ops, 1000 * t / n }' \
      <<<"$before $(etcd_fsyncs)")
    [ -z "$per_op" ] || disk=" ($per_op fsync/op, $fsync_ms ms each)"
  fi
  echo "  $label $impl: $line$disk" >&2
  # $r: the round of the caller's loop (bash scopes dynamically).
  echo "$label|$impl|$rate|${violations:-?}|${r:-0}|$per_op|$fsync_ms" >> "$results"
}

# etcd_fsyncs: "<count> <seconds>" of etcd's WAL fsyncs so far.
etcd_fsyncs() {
  curl -s "http://$etcd/metrics" | awk '
    /^etcd_disk_wal_fsync_duration_seconds_count/ { n = $2 }
    /^etcd_disk_wal_fsync_duration_seconds_sum/ { t = $2 }
    END { print n + 0, t + 0 }'
}

curator() { PEER_BUILD_DIR="$work/curator-build" bash "$peers/curator/run.sh" "$@"; }
kazoo() { /usr/bin/python3 "$peers/kazoo/peerbench.py" "$@"; }
# span_rate <command...>: runs `dlock bench double-barrier` and prints its
# line with ops_per_s = 1000 / span_p50_ms: cycles per second as the median
# first-member-in to last-member-out span allows, the figure
# curator_barrier_cycles gets from Curator.
span_rate() {
  "$@" | awk '/^peer=/ { for (i = 1; i <= NF; i++) if ($i ~ /^span_p50_ms=/) { split($i, a, "="); s = a[2] }
    sub(/ops_per_s=[0-9.]*/, "ops_per_s=" (s > 0 ? sprintf("%.1f", 1000 / s) : 0)); print }'
}

# curator_barrier_cycles <members> <path>: Curator's PeerBench doublebarrier
# (one cycle per JVM: <members> clients enter, leave, print when) again and
# again on fresh paths for $seconds (at least 3 cycles); prints a `peer=`
# line with the median span from the first member in to the last out (its
# own timestamps: JVM start and connection are not counted) and
# ops_per_s = 1000 / that span.
curator_barrier_cycles() {
  local members="$1" path="$2" n=0 spans="" line start
  start=${EPOCHREALTIME/./}
  while [ "$n" -lt 3 ] || [ $((${EPOCHREALTIME/./} - start)) -lt $((seconds * 1000000)) ]; do
    line=$(curator doublebarrier --connect "$zk" --clients "$members" --members "$members" --hold-ms 0 --path "$path/$n" 2>/dev/null | grep -E '^peer=') || return 1
    spans="$spans $(awk '{ for (i = 1; i <= NF; i++) { split($i, a, "=");
        if (a[1] == "entered" && (lo == "" || a[2] < lo)) lo = a[2];
        if (a[1] == "left" && a[2] > hi) hi = a[2] } } END { print hi - lo }' <<<"$line")"
    n=$((n + 1))
  done
  python3 -c 'import statistics, sys; s = [float(x) for x in sys.argv[2:]]; m = statistics.median(s)
print("peer=curator-5.4 recipe=doublebarrier members=%s cycles=%d span_p50_ms=%.3f ops_per_s=%.1f" % (sys.argv[1], len(s), m, 1000 / m if m else 0))' "$members" $spans
}

etcdgo() { PEER_BUILD_DIR="$work/etcd-go-build" bash "$peers/etcd-go/run.sh" "$@"; }

# in_turn <round> <command>...: runs the commands (each a quoted `run ...`
# line) in order in odd rounds and in reverse order in even ones, so that a
# server that speeds up or slows down over the run (its disk, the host)
# favours no implementation.
in_turn() {
  local round="$1"; shift
  local commands=("$@") i
  if [ $((round % 2)) -eq 1 ]; then
    for i in "${!commands[@]}"; do eval "${commands[$i]}"; done
  else
    for ((i = ${#commands[@]} - 1; i >= 0; i--)); do eval "${commands[$i]}"; done
  fi
}

# each_round <title> <round>: runs the function <round> (one round of a
# server's workloads, every implementation once per workload) $rounds times,
# the round's number in $r, so that dlock and its peers alternate over the
# rounds (dlock first in odd rounds, last in even ones).
each_round() {
  local title="$1" round="$2" r
  for r in $(seq "$rounds"); do
    echo "round $r ($title)" >&2
    "$round"
  done
}

# ceiling <label> <endpoint> <path>: dlock's raw loop (create and delete one
# node, one client) on a server: the rate the server allows at all.
ceiling() {
  run "$1" dlock "$dlock" --endpoint "$2" bench raw --clients 1 --seconds "$seconds" --path "$3"
}

zk_round() {
  in_turn "$r" \
    'run "zk mutex 1" dlock "$dlock" --endpoint "zk://$zk" bench mutex --clients 1 --seconds "$seconds" --path /b/m1' \
    'run "zk mutex 1" curator curator mutex --connect "$zk" --clients 1 --seconds "$seconds" --path /b/c1' \
    'run "zk mutex 1" kazoo kazoo mutex --connect "$zk" --clients 1 --seconds "$seconds" --path /b/k1'
  in_turn "$r" \
    'run "zk mutex 8" dlock "$dlock" --endpoint "zk://$zk" bench mutex --clients 8 --seconds "$seconds" --path /b/m8' \
    'run "zk mutex 8" curator curator mutex --connect "$zk" --clients 8 --seconds "$seconds" --path /b/c8' \
    'run "zk mutex 8" kazoo kazoo mutex --connect "$zk" --clients 8 --seconds "$seconds" --path /b/k8'
  # Many waiters: a handoff must not cost more with more of them waiting
  # (goal: at least 0.85x dlock's zk mutex 8 rate).
  in_turn "$r" \
    'run "zk mutex 32" dlock "$dlock" --endpoint "zk://$zk" bench mutex --clients 32 --seconds "$seconds" --path /b/m32' \
    'run "zk mutex 32" curator curator mutex --connect "$zk" --clients 32 --seconds "$seconds" --path /b/c32' \
    'run "zk mutex 32" kazoo kazoo mutex --connect "$zk" --clients 32 --seconds "$seconds" --path /b/k32'
  in_turn "$r" \
    'run "zk semaphore 8/3" dlock "$dlock" --endpoint "zk://$zk" bench semaphore --clients 8 --leases 3 --seconds "$seconds" --path /b/s' \
    'run "zk semaphore 8/3" curator curator semaphore --connect "$zk" --clients 8 --leases 3 --seconds "$seconds" --path /b/cs' \
    'run "zk semaphore 8/3" kazoo kazoo semaphore --connect "$zk" --clients 8 --leases 3 --seconds "$seconds" --path /b/ks'
  in_turn "$r" \
    'run "zk rwlock 8 (1 write in 10)" dlock "$dlock" --endpoint "zk://$zk" bench rwlock --clients 8 --write-every 10 --seconds "$seconds" --path /b/rw' \
    'run "zk rwlock 8 (1 write in 10)" curator curator rwlock --connect "$zk" --clients 8 --write-every 10 --seconds "$seconds" --path /b/crw'
  run "zk election 8" dlock "$dlock" --endpoint "zk://$zk" bench election --clients 8 --seconds "$seconds" --path /b/e
  ceiling "zk raw create+delete (ceiling)" "zk://$zk" /b/raw
}

# The AtomicCounter against Curator's DistributedAtomicLong (PeerBench
# `counter`: 4 clients x 200 increments, optimistic then promoted to a
# lock), and the DoubleBarrier against DistributedDoubleBarrier.
counter_round() {
  in_turn "$r" \
    'run "zk counter 4x200 (optimistic)" dlock "$dlock" --endpoint "zk://$zk" bench counter --clients 4 --rounds 200 --path /b/dc' \
    'run "zk counter 4x200 (optimistic)" curator curator counter --connect "$zk" --clients 4 --rounds 200 --path /b/cc'
  in_turn "$r" \
    'run "zk counter 4x200 (promoted to a lock)" dlock "$dlock" --endpoint "zk://$zk" bench counter --clients 4 --rounds 200 --path /b/dcp --lock-path /b/dcl' \
    'run "zk counter 4x200 (promoted to a lock)" curator curator counter --connect "$zk" --clients 4 --rounds 200 --path /b/ccp --lock-path /b/ccl'
  in_turn "$r" \
    'run "zk double-barrier 4 (1000 / median first-in-to-last-out ms)" dlock span_rate "$dlock" --endpoint "zk://$zk" bench double-barrier --clients 4 --seconds "$seconds" --path /b/ddb/$r' \
    'run "zk double-barrier 4 (1000 / median first-in-to-last-out ms)" curator curator_barrier_cycles 4 /b/cdb/$r'
  run "zk double-barrier 4 (whole cycles per s, sessions kept)" dlock "$dlock" --endpoint "zk://$zk" bench double-barrier --clients 4 --seconds "$seconds" --path /b/ddc/$r
}

etcd_round() {
  in_turn "$r" \
    'run "etcd mutex 1" dlock "$dlock" --endpoint "etcd://$etcd" bench mutex --clients 1 --seconds "$seconds" --path /b/em1' \
    'run "etcd mutex 1" etcd-go etcdgo mutex --endpoints "$etcd" --clients 1 --seconds "$seconds" --path /b/gm1'
  in_turn "$r" \
    'run "etcd mutex 8" dlock "$dlock" --endpoint "etcd://$etcd" bench mutex --clients 8 --seconds "$seconds" --path /b/em8' \
    'run "etcd mutex 8" etcd-go etcdgo mutex --endpoints "$etcd" --clients 8 --seconds "$seconds" --path /b/gm8'
  # Many waiters: Go's rate grows with its clients, dlock's shared
  # directory watch costs the server two messages per waiting client.
  in_turn "$r" \
    'run "etcd mutex 32" dlock "$dlock" --endpoint "etcd://$etcd" bench mutex --clients 32 --seconds "$seconds" --path /b/em32' \
    'run "etcd mutex 32" etcd-go etcdgo mutex --endpoints "$etcd" --clients 32 --seconds "$seconds" --path /b/gm32'
  in_turn "$r" \
    'run "etcd election 8" dlock "$dlock" --endpoint "etcd://$etcd" bench election --clients 8 --seconds "$seconds" --path /b/ee' \
    'run "etcd election 8" etcd-go etcdgo election --endpoints "$etcd" --clients 8 --seconds "$seconds" --path /b/ge'
  ceiling "etcd raw put+delete (ceiling)" "etcd://$etcd" /b/eraw
}

# loops <impl> <command...>: <command> in 8 parallel shell loops for
# $seconds (scripts/lib/loops.sh). Both sides pay the same fork+exec per
# acquisition, and a new session: what `consul lock` costs a shell script,
# and `dlock lock` as it would be used in its place. Violations are not
# measured (the command is `true`).
# shellcheck source=scripts/lib/loops.sh
source scripts/lib/loops.sh
loops() { shell_loops "$work/loops" "$seconds" "$@"; }

# The Consul rows: `dlock` and `consul lock` as commands, a process per
# acquisition on both sides, each on a prefix of its own; then the library
# itself (sessions kept, `bench mutex`) and the raw ceiling.
consul_round() {
  in_turn "$r" \
    'run "consul lock 8 (a process each)" dlock loops dlock "$dlock" --endpoint "consul://$consul" lock --layout consul /b/dl -- true' \
    'run "consul lock 8 (a process each)" consul-lock loops consul-lock "$consul_bin" lock "-http-addr=$consul" b/cl true'
  in_turn "$r" \
    'run "consul semaphore 8/3 (a process each)" dlock loops dlock "$dlock" --endpoint "consul://$consul" semaphore --kv --layout consul --leases 3 /b/ds -- true' \
    'run "consul semaphore 8/3 (a process each)" consul-lock loops consul-lock "$consul_bin" lock "-http-addr=$consul" -n=3 b/cs true'
  run "consul mutex 8 (library, sessions kept)" dlock "$dlock" --endpoint "consul://$consul" bench mutex --clients 8 --seconds "$seconds" --path /b/m8
  ceiling "consul raw create+delete (ceiling)" "consul://$consul" /b/raw
}

embedded_round() {
  run "embedded mutex 1" dlock "$dlock" bench mutex --clients 1 --seconds "$seconds"
  run "embedded mutex 8" dlock "$dlock" bench mutex --clients 8 --seconds "$seconds"
  run "embedded rwlock 8" dlock "$dlock" bench rwlock --clients 8 --seconds "$seconds"
}

zk_workloads() { each_round ZooKeeper zk_round; }
counter_workloads() { each_round "ZooKeeper counter, double barrier" counter_round; }
etcd_workloads() { each_round etcd etcd_round; }
embedded_workloads() { each_round embedded embedded_round; }
consul_workloads() { each_round Consul consul_round; }

case "$only" in
  "") zk_workloads; counter_workloads; etcd_workloads; embedded_workloads; consul_workloads ;;
  zk) zk_workloads; counter_workloads ;;
  counter) counter_workloads ;;
  etcd) etcd_workloads ;;
  embedded) embedded_workloads ;;
  consul) consul_workloads ;;
esac

# The table: median ops/s per workload and implementation, and dlock/peer.
python3 - "$results" "$markdown" <<'PY'
import sys, statistics, collections
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    label, impl, rate, viol, rnd, per_op, fsync_ms = line.rstrip("\n").split("|")
    disk = (float(per_op), float(fsync_ms)) if per_op else None
    rows.setdefault(label, collections.OrderedDict()).setdefault(impl, []).append((float(rate), viol, rnd, disk))
out = ["| workload | implementation | median ops/s | runs | violations | dlock / this | per round | etcd fsyncs per op, ms each |",
       "|---|---|---:|---:|---:|---:|---|---|"]
for label, impls in rows.items():
    dlock_runs = impls.get("dlock", [])
    dl = statistics.median(r for r, *_ in dlock_runs) if dlock_runs else None
    for impl, runs in impls.items():
        med = statistics.median(r for r, *_ in runs)
        ratio, rounds = "", ""
        if impl != "dlock" and dl and med:
            ratio = f"{dl / med:.2f}x"
            # dlock's rate over this one's in the same round: drift between
            # rounds cancels out of each.
            theirs = {rnd: r for r, _, rnd, _ in runs}
            rounds = ", ".join(f"{d / theirs[rnd]:.2f}" for d, _, rnd, _ in dlock_runs if theirs.get(rnd))
        viols = ",".join(sorted(set(v for _, v, _, _ in runs)))
        disks = [d for *_, d in runs if d]
        disk = ""
        if disks:
            per_op = statistics.median(n for n, _ in disks)
            each = statistics.median(ms for _, ms in disks)
            disk = f"{per_op:.2f}, {each:.2f} ms"
        out.append(f"| {label} | {impl} | {med:.1f} | {len(runs)} | {viols} | {ratio} | {rounds} | {disk} |")
table = "\n".join(out)
print(table)
if sys.argv[2]:
    open(sys.argv[2], "w").write(table + "\n")
PY
