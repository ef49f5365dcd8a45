//! The operator commands: run a command under a lock, inspect, revoke.

use anyhow::Result;
use clap::Args;
use dlock::{Participant, ReadWriteLock, Session};

use crate::exit::Exit;
use crate::run::{run_holding, waiting, Holding, RunOptions};
use crate::Global;

/// Arguments of `lock`, `read-lock` and `write-lock`.
#[derive(Debug, Args)]
pub struct LockArgs {
    /// The lock's path, e.g. /locks/nightly-backup.
    pub path: String,
    #[command(flatten)]
    pub run: RunOptions,
}

/// Which lock `dlock lock`-style commands take.
#[derive(Debug, Clone, Copy)]
pub enum LockKind {
    /// The Mutex (Curator InterProcessMutex layout).
    Mutex,
    /// The read half of the ReadWriteLock.
    Read,
    /// The write half of the ReadWriteLock.
    Write,
}

/// Maps "waited `--timeout` in vain" to its exit code.
fn timed_out(e: dlock::Error) -> anyhow::Error {
    match e {
        dlock::Error::Timeout(t) => Exit::Timeout
            .with(format!("could not acquire within {t:?}"))
            .into(),
        other => other.into(),
    }
}

/// `dlock lock|read-lock|write-lock PATH -- CMD...`
pub async fn lock(global: &Global, args: LockArgs, kind: LockKind) -> Result<u8> {
    dlock::path::validate(&args.path)?;
    let session = global.connect_remote().await?;
    let t = args.run.timeout;
    let path = args.path.clone();
    let list = {
        let (session, path) = (session.clone(), path.clone());
        move || {
            let (session, path) = (session.clone(), path.clone());
            Box::pin(async move { participants_at(&session, &path, kind).await })
                as futures::future::BoxFuture<'static, _>
        }
    };
    let holding = match kind {
        LockKind::Mutex => {
            let mutex = dlock::Mutex::new(&session, &path)?;
            let guard = waiting(&path, &session, list, async {
                match t {
                    Some(t) => mutex.acquire_timeout(t).await,
                    None => mutex.acquire().await,
                }
            })
            .await
            .map_err(timed_out)?;
            Holding {
                token: guard.token(),
                node: guard.node().to_string(),
                release: Box::pin(guard.release()),
            }
        }
        LockKind::Read => {
            let rw = ReadWriteLock::new(&session, &path)?;
            let guard = waiting(&path, &session, list, async {
                match t {
                    Some(t) => rw.read_timeout(t).await,
                    None => rw.read().await,
                }
            })
            .await
            .map_err(timed_out)?;
            Holding {
                token: guard.token(),
                node: guard.node().to_string(),
                release: Box::pin(guard.release()),
            }
        }
        LockKind::Write => {
            let rw = ReadWriteLock::new(&session, &path)?;
            let guard = waiting(&path, &session, list, async {
                match t {
                    Some(t) => rw.write_timeout(t).await,
                    None => rw.write().await,
                }
            })
            .await
            .map_err(timed_out)?;
            Holding {
                token: guard.token(),
                node: guard.node().to_string(),
                release: Box::pin(guard.release()),
            }
        }
    };
    let code = run_holding(&session, &global.endpoint, holding, &args.run).await?;
    session.close().await;
    Ok(code)
}

async fn participants_at(
    session: &Session,
    path: &str,
    kind: LockKind,
) -> dlock::Result<Vec<Participant>> {
    match kind {
        LockKind::Mutex => dlock::Mutex::new(session, path)?.participants().await,
        LockKind::Read | LockKind::Write => ReadWriteLock::new(session, path)?.participants().await,
    }
}

/// Arguments of `revoke`.
#[derive(Debug, Args)]
pub struct RevokeArgs {
    /// The full path of the lock node to revoke (see `dlock inspect`).
    pub node: String,
}

/// `dlock revoke NODE`: asks the node's owner to release (Curator's
/// `Revoker.attemptRevoke`).
pub async fn revoke(global: &Global, args: RevokeArgs) -> Result<u8> {
    dlock::path::validate(&args.node)?;
    let session = global.connect_remote().await?;
    dlock::revoke(&session, &args.node).await?;
    session.close().await;
    println!("revocation requested: {}", args.node);
    Ok(0)
}

/// Arguments of `inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The recipe's path.
    pub path: String,
    /// Print JSON for scripts instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `dlock inspect PATH`: who holds and who waits, in queue order.
pub async fn inspect(global: &Global, args: InspectArgs) -> Result<u8> {
    dlock::path::validate(&args.path)?;
    let session = global.connect_remote().await?;
    let children = match session.children(&args.path).await {
        Ok(c) => c,
        Err(dlock::Error::NoNode { .. }) => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    let has = |needle: &str| children.iter().any(|c| c.name.contains(needle));
    let (recipe, participants) = if has("__READ__") || has("__WRIT__") {
        (
            "read-write-lock",
            ReadWriteLock::new(&session, &args.path)?
                .participants()
                .await?,
        )
    } else if has("lock-") {
        (
            "mutex",
            dlock::Mutex::new(&session, &args.path)?
                .participants()
                .await?,
        )
    } else {
        ("none", Vec::new())
    };
    session.close().await;
    if args.json {
        let list: Vec<_> = participants
            .iter()
            .map(|p| {
                serde_json::json!({
                    "node": p.node,
                    "session": format!("{:#x}", p.session),
                    "fence": p.token.0,
                    "data": String::from_utf8_lossy(&p.data),
                    "role": if p.holds { "holder" } else { "waiter" },
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({ "path": args.path, "recipe": recipe, "participants": list })
        );
    } else {
        println!(
            "{} ({recipe}): {} participant(s)",
            args.path,
            participants.len()
        );
        if !participants.is_empty() {
            println!(
                "{:<7} {:<20} {:>12}  {:<16} NODE",
                "ROLE", "SESSION", "FENCE", "DATA"
            );
        }
        for p in &participants {
            println!(
                "{:<7} {:<20} {:>12}  {:<16} {}",
                if p.holds { "holder" } else { "waiter" },
                format!("{:#x}", p.session),
                p.token,
                String::from_utf8_lossy(&p.data),
                p.node
            );
        }
    }
    Ok(0)
}
