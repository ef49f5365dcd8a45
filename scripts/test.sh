#!/usr/bin/env bash
# Runs every test of dlock on this machine, installing what is missing first.
#
#   scripts/test.sh          the default suite (well under 30 minutes on 2 cores)
#   scripts/test.sh --long   also the long fault runs (tests marked #[ignore])
#
# Tests start their own ZooKeeper and etcd servers on free loopback ports;
# this script only makes sure the packages are installed.
set -euo pipefail
cd "$(dirname "$0")/.."

long=0
for arg in "$@"; do
  case "$arg" in
    --long) long=1 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "test.sh: unknown option $arg (use --long)" >&2; exit 2 ;;
  esac
done

# Debian packages the suite needs: the real servers and the peers (Curator's
# jars, kazoo, and Go with etcd's Go sources, from which the etcd ⇄ Go tests
# build etcd's own client recipes offline) for the interoperability tests. (etcd-client's build takes
# protoc from the crate protoc-bin-vendored: see .cargo/config.toml.)
# Java 17 comes with ZooKeeper's JRE; javac (for the Curator peers) does not.
packages=(zookeeper etcd-server etcd-client
          libcurator-recipes-java libcurator-framework-java libcurator-client-java
          libslf4j-java python3-kazoo golang-go golang-etcd-server-dev
          tmux)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
command -v javac >/dev/null || missing+=(default-jdk-headless)
if [ ${#missing[@]} -gt 0 ]; then
  echo "test.sh: installing ${missing[*]}"
  sudo_cmd=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || {
      echo "test.sh: ${missing[*]} must be installed, and without root that needs sudo, which is missing" >&2
      exit 1
    }
    sudo_cmd="sudo"
  fi
  # Through sudo's environment reset too.
  $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get update -q
  $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi
scripts/consul.sh get >/dev/null

# The library's shape: no recipe file past 450 lines (a recipe that grows
# so is split along its seams, as inspect/ and kv_semaphore/ are).
long_files=$(find crates/dlock/src/recipes -name '*.rs' -exec wc -l {} + |
  awk '$2 != "total" && $1 > 450 { print $2 " (" $1 " lines)" }')
if [ -n "$long_files" ]; then
  echo "test.sh: recipe files over 450 lines: $long_files" >&2
  exit 1
fi

extra=()
[ "$long" -eq 1 ] && extra=(-- --include-ignored)
# A one-shot run gains nothing from incremental caches, which would take
# gigabytes more of disk (with the profile in Cargo.toml, a fresh build of every
# test target is ~2.5 GB; before it, ~10 GB filled CI's disk).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# --all-features: every backend (etcd and ZooKeeper are also in the default
# build).
cargo test --workspace --all-features --all-targets "${extra[@]}"
cargo test --workspace --all-features --doc
# The docs build without a warning (a broken link is a doc bug), private
# items included. The `dlock` binary first and on its own: it shares the
# library's name, hence its doc directory (see crates/dlock-cli/Cargo.toml).
RUSTDOCFLAGS="-D warnings" cargo doc -q -p dlock-cli --bin dlock --all-features --no-deps --document-private-items
RUSTDOCFLAGS="-D warnings" cargo doc -q --workspace --all-features --no-deps --document-private-items
# The library builds, without a warning, with fewer backends than all: the
# embedded store alone, and ZooKeeper alone (a feature gate that went
# wrong broke both once, unseen).
for features in "" zookeeper; do
  RUSTFLAGS="-D warnings" cargo check -q -p dlock --no-default-features --features "$features" \
    --target-dir target/features
done

# Every example runs to completion on the embedded store (and, in the long
# mode, on a private ZooKeeper too), checking its own outcome.
examples=$(ls crates/dlock/examples/*.rs | xargs -n1 basename | sed 's/\.rs$//')
for ex in $examples; do
  echo "example $ex (embedded)"
  cargo run -q -p dlock --example "$ex"
done
if [ "$long" -eq 1 ]; then
  zk=$(mktemp -d)
  # Set first: a start that fails leaves nothing behind either.
  trap 'scripts/zookeeper.sh stop --dir "$zk/server" >/dev/null 2>&1; rm -rf "$zk"' EXIT
  endpoint=$(scripts/zookeeper.sh start --dir "$zk/server" | sed -n 's/.*endpoint=\([^ ]*\).*/\1/p')
  for ex in $examples; do
    echo "example $ex (zookeeper)"
    cargo run -q -p dlock --example "$ex" -- --endpoint "zk://$endpoint"
  done
fi
echo "examples: all passed"
