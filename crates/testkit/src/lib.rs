//! Test support for `dlock`: private, real ZooKeeper, etcd and Consul servers.
//!
//! Every server started by this crate
//!
//! * listens only on loopback (`127.0.0.1`) on ports chosen by [`free_port`]
//!   (never a fixed, shared port),
//! * keeps its data and its log in a fresh temporary directory,
//! * is stopped (`SIGKILL`) and its directory removed when its handle is dropped,
//! * and is also killed — and its directory removed — when the *owning process*
//!   dies, even by `SIGKILL`: each server runs under a small `/bin/sh` watchdog
//!   that holds the read end of a pipe whose write end only this process has;
//!   when this process goes away the pipe closes and the watchdog kills the
//!   server. This is what makes [`shared_zk`], [`shared_etcd`] and
//!   [`shared_consul`] (kept in statics, which Rust never drops) safe.
//!
//! Nothing is ever skipped silently: if a server cannot be started, the
//! functions return an error naming the binary, the port and the last lines of
//! the server's log, and — when the binary is missing — how to install it.
//! This crate never installs packages itself (`scripts/zookeeper.sh`,
//! `scripts/etcd.sh`, `scripts/consul.sh` and `scripts/test.sh` may).
//!
//! Binaries are found as follows (environment variables override):
//!
//! * ZooKeeper: `java` from `$DLOCK_JAVA`, `$JAVA_HOME/bin/java` or `PATH`; the
//!   class path from `$DLOCK_ZK_CLASSPATH`, else Debian's
//!   `/usr/share/java/zookeeper.jar` (its manifest lists its dependencies) plus
//!   `slf4j-simple.jar` for logging, else `$ZOOKEEPER_HOME/lib/*`.
//! * etcd: `$DLOCK_ETCD`, else `etcd` on `PATH`, else `/usr/bin/etcd`.
//! * Consul: `$DLOCK_CONSUL`, else
//!   `${DLOCK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dlock}/consul/<version>/consul`
//!   (where `scripts/consul.sh get` puts it).
//!
//! What there is:
//!
//! | need | use | start-up here (2 cores) |
//! | --- | --- | --- |
//! | a ZooKeeper any test may share | [`shared_zk`] | once per test process |
//! | a ZooKeeper to stop, restart or pause | [`ZkServer`] | ~0.5 s |
//! | a 3-node ZooKeeper ensemble | [`ZkEnsemble`] | ~2 s |
//! | an etcd any test may share | [`shared_etcd`] | once per test process |
//! | an etcd to stop, restart or pause | [`EtcdServer`] | ~0.2–0.7 s |
//! | a 3-member etcd cluster | [`EtcdCluster`] | ~1–2.5 s |
//! | a Consul any test may share | [`shared_consul`] | once per test process |
//! | a Consul dev agent to stop, restart or pause | [`ConsulServer`] | ~0.4 s |
//! | a 3-server Consul cluster | [`ConsulCluster`] | ~2 s |
//! | etcd's Go recipes as programs (peer harness, election sale) | [`etcd_go_peerbench`], [`etcd_go_electsale`] | ~40 s to build, once |
//!
//! "Shared" means one server per *process*: with `cargo test` that is one per
//! test binary; under `cargo nextest` (one process per test) every test
//! starts its own.
//!
//! ZooKeeper runs with `tickTime=500` (minimum session timeout 1 s),
//! `maxSessionTimeout=60000`, `extendedTypesEnabled=true` (TTL nodes),
//! `-Dznode.container.checkIntervalMs=100` (empty containers vanish fast),
//! all four-letter words allowed, no admin server, `forceSync=yes`; see
//! [`ZkOptions`]. etcd runs with its default timings and fsync; see
//! [`EtcdOptions`]. Consul runs with `raft_multiplier = 1`; see
//! [`ConsulOptions`].
//!
//! ```no_run
//! let zk = dlock_testkit::ZkServer::start()?;
//! println!("connect to {}", zk.connect_string());
//! let etcd = dlock_testkit::shared_etcd();
//! println!("etcd at {}", etcd.endpoint());
//! # Ok::<(), anyhow::Error>(())
//! ```

#![warn(missing_docs)]

mod consul;
mod curator;
mod etcd;
mod go;
pub mod history;
mod kazoo;
mod line_probe;
mod port;
mod process;
mod proxy;
mod server;
mod tls;
mod util;
mod zk;

pub use consul::{
    consul_binary, shared_consul, try_shared_consul, ConsulCluster, ConsulOptions, ConsulServer,
};
pub use curator::{
    classpath as curator_classpath, peerbench_classes as curator_peerbench_classes, CuratorProbe,
};
pub use etcd::{shared_etcd, try_shared_etcd, EtcdCluster, EtcdOptions, EtcdServer, EtcdTls};
pub use go::{etcd_go_electsale, etcd_go_peerbench};
pub use kazoo::{python as kazoo_python, KazooProbe};
pub use line_probe::{line_channel, LineProbe};
pub use port::free_port;
pub use process::all_threads_stopped;
pub use proxy::TcpProxy;
pub use tls::TestCerts;
pub use util::{http_get, zk_four_letter};
pub use zk::{shared_zk, try_shared_zk, ZkEnsemble, ZkOptions, ZkServer};
