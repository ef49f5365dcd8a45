//! `dlock`: distributed locks, semaphores and leader election from the
//! command line.

mod bench;
mod commands;
mod demo;
mod duration;
mod exit;
mod members;
mod run;
mod top;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::{Parser, Subcommand};
use dlock::{Endpoint, Session, SessionOptions};

/// Distributed locks, semaphores and leader election on ZooKeeper, etcd,
/// Consul or an embedded store.
///
/// Examples:
///   dlock --endpoint zk://127.0.0.1:2181 lock /locks/backup -- ./backup.sh
///   dlock --endpoint zk://127.0.0.1:2181 inspect /locks/backup --json
///   dlock demo flash-sale --buyers 200 --stock 50
///
/// CMD runs with DLOCK_FENCE (the fencing token), DLOCK_NODE (our node) and
/// DLOCK_ENDPOINT (the endpoint without user and password) set.
#[derive(Debug, Parser)]
#[command(name = "dlock", version, verbatim_doc_comment, after_help = exit::table())]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Options every command shares.
#[derive(Debug, clap::Args)]
pub struct Global {
    /// The store: `embedded`, `zk://host:port[,...][/chroot]`,
    /// `etcd://host:port[,...]` (`etcds://` for TLS) or
    /// `consul://host:port[,...][/prefix][?token=...]` (`consuls://`).
    #[arg(
        long,
        env = "DLOCK_ENDPOINT",
        // `--help` would print the variable's value, credentials and all.
        hide_env_values = true,
        default_value = "embedded",
        global = true
    )]
    pub endpoint: String,
    /// Session timeout, e.g. `500ms`, `10s`.
    #[arg(long, default_value = "10s", value_parser = duration::parse, global = true)]
    session_timeout: Duration,
    /// Serve Prometheus metrics (acquire latency, waits, holds, losses,
    /// session states) at http://HOST:PORT/metrics while dlock runs.
    #[arg(long, value_name = "HOST:PORT", global = true)]
    metrics_addr: Option<std::net::SocketAddr>,
}

impl Global {
    pub fn endpoint(&self) -> Result<Endpoint> {
        Ok(self.endpoint.parse()?)
    }

    /// Opens a new session on the endpoint.
    pub async fn connect(&self) -> Result<Session> {
        let options = SessionOptions::default().with_session_timeout(self.session_timeout);
        Ok(dlock::connect_endpoint(&self.endpoint()?, options).await?)
    }

    /// Opens a session on a shared store, refusing the embedded one: it
    /// lives inside this process, so nobody else could see the lock.
    pub async fn connect_remote(&self) -> Result<Session> {
        if self.endpoint()? == Endpoint::Embedded {
            return Err(exit::Exit::Usage
                .with("the embedded store lives inside one dlock process, so no other process would see this lock: \
                       pass --endpoint zk://HOST:PORT, etcd://HOST:PORT or consul://HOST:PORT (or set DLOCK_ENDPOINT)")
                .into());
        }
        self.connect().await
    }

    /// The backend's name, as the demos report it.
    pub fn backend_name(&self) -> Result<&'static str> {
        Ok(match self.endpoint()? {
            Endpoint::Embedded => "embedded",
            Endpoint::ZooKeeper { .. } => "zookeeper",
            Endpoint::Etcd { .. } => "etcd",
            Endpoint::Consul { .. } => "consul",
            _ => "unknown",
        })
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run CMD while holding the Mutex at PATH.
    ///
    /// Example: dlock lock /locks/nightly -- ./nightly.sh
    ///
    /// Example: dlock lock /locks/nightly --revocable=30s --max-hold 2h -- ./nightly.sh
    Lock(commands::LockArgs),
    /// Run CMD while holding the read lock of the ReadWriteLock at PATH.
    ///
    /// Example: dlock read-lock /locks/catalog --timeout 30s -- ./export.sh
    ///
    /// Example: dlock read-lock /locks/catalog --revocable -- ./report.sh
    ReadLock(commands::LockArgs),
    /// Run CMD while holding the write lock of the ReadWriteLock at PATH.
    ///
    /// Example: dlock write-lock /locks/catalog --max-hold 15m -- ./reindex.sh
    WriteLock(commands::LockArgs),
    /// Run CMD while holding leases of the Semaphore at PATH (Curator
    /// SemaphoreV2 layout, or --kv for the KvSemaphore).
    ///
    /// Example: dlock semaphore /limits/api --leases 3 -- ./call-api.sh
    ///
    /// Example: dlock semaphore /limits/api --leases 3 --max-hold 10m --revocable -- ./call-api.sh
    Semaphore(commands::SemaphoreArgs),
    /// Run CMD while leader of the election at PATH (LeaderSelector layout).
    ///
    /// Example: dlock elect /services/cron --id host-a --requeue -- ./cron.sh
    Elect(commands::ElectArgs),
    /// Read or change a SharedCount (Curator-compatible 4-byte counter).
    ///
    /// Example: dlock count set /config/workers 8
    #[command(subcommand)]
    Count(commands::CountCommand),
    /// Set, remove or wait on the Barrier at PATH (Curator's
    /// DistributedBarrier layout).
    ///
    /// Example: dlock barrier wait /barriers/deploy --timeout 10m
    #[command(subcommand)]
    Barrier(commands::BarrierCommand),
    /// Enter the DoubleBarrier at PATH, run CMD once COUNT members are in,
    /// then leave and wait until all have left (Curator's
    /// DistributedDoubleBarrier layout). --timeout bounds entering (exit 65)
    /// and, again, the wait for the others to leave.
    ///
    /// Example: dlock double-barrier /barriers/batch --count 3 -- ./step.sh
    DoubleBarrier(commands::DoubleBarrierArgs),
    /// Read or update an AtomicCounter (Curator's DistributedAtomicLong
    /// layout: an 8-byte big-endian i64 at PATH).
    ///
    /// Example: dlock counter add /counters/jobs 1 --lock-path /counters/jobs-lock
    #[command(subcommand)]
    Counter(commands::CounterCommand),
    /// Show the holders and waiters at PATH, in queue order.
    ///
    /// Example: dlock inspect /locks/nightly --json
    Inspect(commands::InspectArgs),
    /// Ask the owner of a lock node to release it (Curator-compatible), or
    /// with --force take it away (delete the node).
    ///
    /// Example: dlock revoke /locks/nightly/_c_4f1e…-lock-0000000042
    ///
    /// Example: dlock revoke --force /limits/api/leases/_c_0a2b…-lease-0000000007
    Revoke(commands::RevokeArgs),
    /// Join, list or watch the group at PATH (Curator's GroupMember layout).
    ///
    /// Example: dlock members watch /groups/workers
    #[command(subcommand)]
    Members(members::MembersCommand),
    /// Print the leader of the election at PATH, then every new leader as
    /// it takes over, without taking part (etcd's Observe; LeaderLatch and
    /// LeaderSelector layouts).
    ///
    /// Example: dlock observe /services/cron --json
    Observe(members::ObserveArgs),
    /// Measure a workload; prints one line in the peer harnesses' format.
    ///
    /// Example: dlock --endpoint zk://127.0.0.1:2181 bench mutex --clients 8 --seconds 10
    Bench(bench::Bench),
    /// Runnable scenarios from the design documents.
    ///
    /// Example: dlock demo flash-sale --buyers 200 --stock 50
    #[command(subcommand)]
    Demo(demo::Demo),
    /// A live view of every lock, semaphore and election under PREFIX:
    /// holders with token, session and hold time, waiters in order,
    /// handoffs per second; updated by watches. q quits. --once --json
    /// prints one snapshot for scripts.
    ///
    /// Example: dlock --endpoint zk://127.0.0.1:2181 top /locks
    Top(top::TopArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::Exit::Usage as u8
            } else {
                0
            };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dlock: cannot start the runtime: {e}");
            return ExitCode::from(exit::Exit::Internal as u8);
        }
    };
    let global = cli.global;
    let result = runtime.block_on(async {
        if let Some(addr) = global.metrics_addr {
            metrics_exporter_prometheus::PrometheusBuilder::new()
                .with_http_listener(addr)
                .install()
                .map_err(|e| {
                    exit::Exit::Usage.with(format!("cannot serve metrics at {addr}: {e}"))
                })?;
        }
        match cli.command {
            Command::Lock(args) => commands::lock(&global, args, commands::LockKind::Mutex).await,
            Command::ReadLock(args) => {
                commands::lock(&global, args, commands::LockKind::Read).await
            }
            Command::WriteLock(args) => {
                commands::lock(&global, args, commands::LockKind::Write).await
            }
            Command::Semaphore(args) => commands::semaphore(&global, args).await,
            Command::Elect(args) => commands::elect(&global, args).await,
            Command::Count(command) => commands::count(&global, command).await,
            Command::Barrier(command) => commands::barrier(&global, command).await,
            Command::DoubleBarrier(args) => commands::double_barrier(&global, args).await,
            Command::Counter(command) => commands::counter(&global, command).await,
            Command::Inspect(args) => commands::inspect(&global, args).await,
            Command::Revoke(args) => commands::revoke(&global, args).await,
            Command::Members(command) => members::members(&global, command).await,
            Command::Observe(args) => members::observe(&global, args).await,
            Command::Bench(args) => bench::run(&global, args).await.map(|()| 0),
            Command::Demo(demo) => demo::run(&global, demo).await.map(|()| 0),
            Command::Top(args) => top::top(&global, args).await,
        }
    });
    // Background work (watch tasks, keep-alives) must not keep us alive.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("dlock: {e:#}");
            ExitCode::from(exit::Exit::of(&e) as u8)
        }
    }
}
