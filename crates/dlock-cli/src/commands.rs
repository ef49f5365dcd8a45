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
            Holding::new(
                guard.token(),
                guard.node().to_string(),
                Box::pin(guard.release()),
            )
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
            Holding::new(
                guard.token(),
                guard.node().to_string(),
                Box::pin(guard.release()),
            )
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
            Holding::new(
                guard.token(),
                guard.node().to_string(),
                Box::pin(guard.release()),
            )
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
    let is = |name: &str| children.iter().any(|c| c.name == name);
    let (recipe, participants) = if is("leases") || is("locks") {
        // Lease holders (a waiter at the head of the queue holds a lease
        // node for a moment too); the semaphore's size is the clients' own.
        let leases = dlock::Semaphore::new(&session, &args.path, u32::MAX)?
            .participants()
            .await?;
        ("semaphore", leases)
    } else if is(dlock::recipes::kv_semaphore::RECORD) {
        (
            "kv-semaphore",
            kv_participants(&session, &args.path, &children).await?,
        )
    } else if has("__READ__") || has("__WRIT__") {
        (
            "read-write-lock",
            ReadWriteLock::new(&session, &args.path)?
                .participants()
                .await?,
        )
    } else if has("latch-") {
        (
            "leader-latch",
            latch_participants(&session, &args.path).await?,
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

/// Arguments of `semaphore`.
#[derive(Debug, Args)]
pub struct SemaphoreArgs {
    /// The semaphore's path.
    pub path: String,
    /// How many leases the semaphore has (all participants must agree).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub leases: u32,
    /// How many leases to take.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub qty: u32,
    /// Use the KvSemaphore (the Consul design) instead of Curator's
    /// SemaphoreV2 layout.
    #[arg(long)]
    pub kv: bool,
    #[command(flatten)]
    pub run: RunOptions,
}

/// `dlock semaphore PATH --leases N [--qty K] -- CMD...`
pub async fn semaphore(global: &Global, args: SemaphoreArgs) -> Result<u8> {
    dlock::path::validate(&args.path)?;
    if args.qty > args.leases {
        return Err(Exit::Usage
            .with(format!(
                "--qty {} is more than the {} leases there are",
                args.qty, args.leases
            ))
            .into());
    }
    if args.kv && args.qty != 1 {
        return Err(Exit::Usage
            .with("the KvSemaphore gives one lease per session: --kv takes no --qty")
            .into());
    }
    let session = global.connect_remote().await?;
    let t = args.run.timeout;
    let holding = if args.kv {
        let sem = dlock::KvSemaphore::new(&session, &args.path, args.leases)?;
        let lease = match t {
            Some(t) => sem.acquire_timeout(t).await,
            None => sem.acquire().await,
        }
        .map_err(timed_out)?;
        Holding::new(
            lease.token(),
            lease.node().to_string(),
            Box::pin(lease.release()),
        )
    } else {
        let sem = dlock::Semaphore::new(&session, &args.path, args.leases)?;
        let path = args.path.clone();
        let list = {
            let session = session.clone();
            move || {
                let (session, path) = (session.clone(), path.clone());
                Box::pin(async move {
                    dlock::Semaphore::new(&session, &path, 1)?
                        .participants()
                        .await
                }) as futures::future::BoxFuture<'static, _>
            }
        };
        let leases = waiting(&args.path, &session, list, async {
            match t {
                Some(t) => sem.acquire_timeout(args.qty, t).await,
                None => sem.acquire(args.qty).await,
            }
        })
        .await
        .map_err(timed_out)?;
        let token = leases
            .iter()
            .map(|l| l.token())
            .max()
            .expect("at least one lease");
        let node = leases
            .iter()
            .map(|l| l.node().to_string())
            .collect::<Vec<_>>()
            .join(",");
        let release = Box::pin(async move {
            let mut first_error = None;
            for lease in leases {
                if let Err(e) = lease.release().await {
                    first_error.get_or_insert(e);
                }
            }
            first_error.map_or(Ok(()), Err)
        });
        Holding::new(token, node, release)
    };
    let code = run_holding(&session, &global.endpoint, holding, &args.run).await?;
    session.close().await;
    Ok(code)
}

/// Arguments of `elect`.
#[derive(Debug, Args)]
pub struct ElectArgs {
    /// The election's path.
    pub path: String,
    /// Our participant id (stored in our node; shown by `inspect` and by
    /// Curator's getParticipants()).
    #[arg(long)]
    pub id: Option<String>,
    /// Run CMD again each time leadership comes back, instead of once.
    #[arg(long)]
    pub requeue: bool,
    #[command(flatten)]
    pub run: RunOptions,
}

/// `dlock elect PATH [--id ID] [--requeue] -- CMD...`: runs CMD while
/// leader (LeaderSelector layout); leadership is given up when CMD exits.
pub async fn elect(global: &Global, args: ElectArgs) -> Result<u8> {
    dlock::path::validate(&args.path)?;
    let session = global.connect_remote().await?;
    // The selector hands each term over, and holds leadership until told
    // the command is done.
    let (terms_tx, mut terms) =
        tokio::sync::mpsc::channel::<(dlock::Leadership, tokio::sync::oneshot::Sender<()>)>(1);
    let mut selector = dlock::LeaderSelector::new(&session, &args.path, move |term| {
        let terms_tx = terms_tx.clone();
        async move {
            let (done_tx, done) = tokio::sync::oneshot::channel();
            if terms_tx.send((term, done_tx)).await.is_ok() {
                let _ = done.await;
            }
        }
    })?;
    if let Some(id) = &args.id {
        selector = selector.with_id(id.clone());
    }
    if args.requeue {
        selector = selector.with_auto_requeue();
    }
    selector.start()?;
    let first = match args.run.timeout {
        Some(t) => tokio::time::timeout(t, terms.recv())
            .await
            .map_err(|_| Exit::Timeout.with(format!("not elected within {t:?}")))?,
        None => terms.recv().await,
    };
    let mut next = first;
    let mut code = 0;
    while let Some((term, done)) = next {
        let cancelled = term.clone();
        let holding = Holding {
            token: term.epoch(),
            node: term.node().to_string(),
            release: Box::pin(async move {
                let _ = done.send(());
                Ok(())
            }),
            ended: Some(Box::pin(async move { cancelled.cancelled().await })),
        };
        code = run_holding(&session, &global.endpoint, holding, &args.run).await?;
        if !args.requeue || code == Exit::Lost as u8 {
            break;
        }
        next = terms.recv().await;
    }
    let _ = selector.close().await;
    session.close().await;
    Ok(code)
}

/// `dlock count ...`: a SharedCount (4-byte big-endian, Curator-compatible).
#[derive(Debug, clap::Subcommand)]
pub enum CountCommand {
    /// Print the value.
    Get {
        /// The counter's path.
        path: String,
    },
    /// Set the value (creating the counter if needed).
    Set {
        /// The counter's path.
        path: String,
        /// The new value.
        #[arg(allow_hyphen_values = true)]
        value: i32,
    },
    /// Set the value only if it is EXPECTED now (exit code 1 otherwise).
    Cas {
        /// The counter's path.
        path: String,
        /// The value it must have.
        #[arg(allow_hyphen_values = true)]
        expected: i32,
        /// The new value.
        #[arg(allow_hyphen_values = true)]
        value: i32,
    },
}

/// Runs a `count` command.
pub async fn count(global: &Global, command: CountCommand) -> Result<u8> {
    let session = global.connect_remote().await?;
    let code = match command {
        CountCommand::Get { path } => {
            dlock::path::validate(&path)?;
            let (data, _) = session.get_data(&path).await?;
            println!("{}", dlock::recipes::shared_count::decode(&path, &data)?);
            0
        }
        CountCommand::Set { path, value } => {
            let count = dlock::SharedCount::new(&session, &path, value)?;
            count.start().await?;
            count.set(value).await?;
            count.close().await;
            println!("{value}");
            0
        }
        CountCommand::Cas {
            path,
            expected,
            value,
        } => {
            dlock::path::validate(&path)?;
            let (data, stat) = session.get_data(&path).await?;
            let now = dlock::recipes::shared_count::decode(&path, &data)?;
            let swapped = now == expected
                && match session
                    .set_data(
                        &path,
                        &dlock::recipes::shared_count::encode(value),
                        Some(stat.version),
                    )
                    .await
                {
                    Ok(_) => true,
                    Err(dlock::Error::BadVersion { .. }) => false,
                    Err(e) => return Err(e.into()),
                };
            if swapped {
                println!("{value}");
                0
            } else {
                eprintln!("dlock: {path} is not {expected} (or changed meanwhile); left as is");
                1
            }
        }
    };
    session.close().await;
    Ok(code)
}

/// A leader latch's candidates, leader first.
async fn latch_participants(session: &Session, path: &str) -> dlock::Result<Vec<Participant>> {
    let latch = dlock::LeaderLatch::new(session, path)?;
    let mut all = Vec::new();
    for p in latch.participants().await? {
        let owner = session
            .exists(&p.node)
            .await?
            .map_or(0, |s| s.ephemeral_owner);
        all.push(Participant {
            node: p.node,
            session: owner,
            token: p.epoch,
            data: p.id.into_bytes(),
            holds: p.is_leader,
        });
    }
    Ok(all)
}

/// A KvSemaphore's contenders: holders (named in its record) and waiters.
async fn kv_participants(
    session: &Session,
    path: &str,
    children: &[dlock::store::Child],
) -> dlock::Result<Vec<Participant>> {
    let holders = dlock::KvSemaphore::new(session, path, 1)?.holders().await?;
    let mut all = Vec::new();
    for child in children
        .iter()
        .filter(|c| c.name != dlock::recipes::kv_semaphore::RECORD)
    {
        let node = format!("{path}/{}", child.name);
        if let Ok((data, stat)) = session.get_data(&node).await {
            all.push(Participant {
                node,
                session: stat.ephemeral_owner,
                token: stat.token(),
                data,
                holds: holders.contains(&child.name),
            });
        }
    }
    all.sort_by_key(|p| (!p.holds, p.token));
    Ok(all)
}
