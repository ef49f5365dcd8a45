#!/usr/bin/env bash
# Two dlock builds alternating on one private Consul agent (dev mode), on the
# rows of scripts/bench-peers.sh that a ConsulLock change moves: `consul lock
# 8` (8 shell loops, one `dlock lock --layout consul` process per
# acquisition) and, as the agent's own yardstick, the raw create+delete
# ceiling. Each round runs A then B, or B then A in even rounds:
#
#   scripts/experiments/consul-lock-ab.sh A_BINARY B_BINARY [SECONDS] [ROUNDS]
#
# Build the older one in a worktree with its own target directory, e.g.
#   git worktree add /tmp/old <commit>
#   (cd /tmp/old && CARGO_TARGET_DIR=/tmp/old-target cargo build --release -p dlock-cli --features consul)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
a="$1" b="$2" seconds="${3:-4}" rounds="${4:-5}"
consul_bin=$(scripts/consul.sh get)
work=$(mktemp -d)
trap 'scripts/consul.sh stop --dir "$work/consul" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
consul=$(scripts/consul.sh start --dir "$work/consul" | sed -n 's/.*endpoint=\([^ ]*\).*/\1/p')
echo "consul=$consul ($consul_bin) seconds=$seconds rounds=$rounds" >&2

# shellcheck source=scripts/lib/loops.sh
source scripts/lib/loops.sh

# lock_loops <binary> <prefix>: `consul lock 8` with that build, as
# "<rate>/s (<n> failed)".
lock_loops() {
  shell_loops "$work/loops" "$seconds" dlock "$1" --endpoint "consul://$consul" lock --layout consul "$2" -- true \
    | sed -n 's/.* failed=\([0-9]*\) .*ops_per_s=\([0-9.]*\).*/\2\/s (\1 failed)/p'
}

raw() {
  "$1" --endpoint "consul://$consul" bench raw --clients 1 --seconds "$seconds" --path "$2" 2>/dev/null \
    | sed -n 's/.*ops_per_s=\([0-9.]*\).*/\1\/s/p'
}

for r in $(seq 1 "$rounds"); do
  order="a b"; [ $((r % 2)) -eq 0 ] && order="b a"
  for which in $order; do
    bin=$a; [ "$which" = b ] && bin=$b
    echo "round $r $which: consul lock 8 $(lock_loops "$bin" "/ab/$which$r") raw $(raw "$bin" "/ab/raw-$which$r")"
  done
done
