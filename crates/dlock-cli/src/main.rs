//! `dlock`: distributed locks, semaphores and leader election from the
//! command line.

mod demo;
mod duration;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::{Parser, Subcommand};
use dlock::{Endpoint, Session, SessionOptions};

/// Distributed locks, semaphores and leader election on ZooKeeper, etcd or
/// an embedded store.
///
/// Examples:
///   dlock demo flash-sale --buyers 200 --stock 50
///   dlock --endpoint zk://127.0.0.1:2181 demo flash-sale --lock none
#[derive(Debug, Parser)]
#[command(name = "dlock", version, verbatim_doc_comment)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Options every command shares.
#[derive(Debug, clap::Args)]
pub struct Global {
    /// The store: `embedded`, `zk://host:port[,...][/chroot]` or
    /// `etcd://host:port[,...]`.
    #[arg(long, env = "DLOCK_ENDPOINT", default_value = "embedded", global = true)]
    endpoint: String,
    /// Session timeout, e.g. `500ms`, `10s`.
    #[arg(long, default_value = "10s", value_parser = duration::parse, global = true)]
    session_timeout: Duration,
}

impl Global {
    fn endpoint(&self) -> Result<Endpoint> {
        Ok(self.endpoint.parse()?)
    }

    /// Opens a new session on the endpoint.
    pub async fn connect(&self) -> Result<Session> {
        let options = SessionOptions::default().with_session_timeout(self.session_timeout);
        Ok(dlock::connect_endpoint(&self.endpoint()?, options).await?)
    }

    /// The backend's name, as the demos report it.
    pub fn backend_name(&self) -> Result<&'static str> {
        Ok(match self.endpoint()? {
            Endpoint::Embedded => "embedded",
            Endpoint::ZooKeeper { .. } => "zookeeper",
            Endpoint::Etcd { .. } => "etcd",
            _ => "unknown",
        })
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runnable scenarios from the design documents.
    #[command(subcommand)]
    Demo(demo::Demo),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dlock: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Demo(demo) => demo::run(&cli.global, demo).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dlock: {e:#}");
            ExitCode::FAILURE
        }
    }
}
