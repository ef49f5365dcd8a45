# shellcheck shell=bash
# shell_loops: one command per acquisition in 8 parallel shell loops, as a
# shell script uses `dlock lock` or `consul lock`. Shared by
# scripts/bench-peers.sh and scripts/experiments/consul-lock-ab.sh. Sourced,
# not run.

# shell_loops <dir> <seconds> <impl> <command...>: <command> (one process per
# acquisition: it acquires, runs `true`, releases and exits) in 8 parallel
# shell loops for <seconds>, keeping their counts in <dir>, then prints a
# `peer=` line with the completions per second. The last command of each
# loop may finish past the deadline: it counts, and so does the time it took
# (the rate is over the time until every loop ended).
shell_loops() {
  local dir="$1" seconds="$2" impl="$3"; shift 3
  local i start end ok=0 failed=0 n f
  rm -rf "$dir"; mkdir -p "$dir"
  # $EPOCHREALTIME (bash 5): microseconds without forking `date` per turn.
  start=${EPOCHREALTIME/./}
  end=$((start + seconds * 1000000))
  for i in 1 2 3 4 5 6 7 8; do
    (
      n=0 f=0
      while [ "${EPOCHREALTIME/./}" -lt "$end" ]; do
        if "$@" >/dev/null 2>&1; then n=$((n + 1)); else f=$((f + 1)); fi
      done
      echo "$n $f" > "$dir/$i"
    ) &
  done
  wait
  local elapsed=$((${EPOCHREALTIME/./} - start))
  for i in 1 2 3 4 5 6 7 8; do
    read -r n f < "$dir/$i"
    ok=$((ok + n)) failed=$((failed + f))
  done
  awk -v impl="$impl" -v ok="$ok" -v failed="$failed" -v us="$elapsed" 'BEGIN {
    printf "peer=%s clients=8 ops=%d failed=%d seconds=%.3f ops_per_s=%.1f\n", impl, ok, failed, us / 1e6, ok * 1e6 / us }'
}
