//! The operator commands: run a command under a lock, inspect, revoke.

use std::future::Future;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use dlock::{Hold, Layout, Lockable, ReadWriteLock, Session};

use crate::exit::Exit;
use crate::run::{HeldRun, Holding, Limits, RunOptions, Runner};
use crate::Global;

/// Arguments of `lock`, `read-lock` and `write-lock`.
#[derive(Debug, Args)]
pub struct LockArgs {
    /// The lock's path, e.g. /locks/nightly-backup.
    pub path: String,
    /// Whose node layout to use: `curator` (Curator's InterProcessMutex
    /// and InterProcessReadWriteLock), `consul` (Consul's `api.Lock`, as
    /// `consul lock` writes it: the key PATH/.lock) or `kazoo` (kazoo's
    /// (Python) `Lock` nodes, PATH/UUID__lock__SEQ, which kazoo sees without
    /// extra_lock_patterns; kazoo holders keep `dlock lock` out in every
    /// layout). `consul` and `kazoo`: `lock` only.
    #[arg(long, default_value_t = Layout::Curator)]
    pub layout: Layout,
    #[command(flatten)]
    pub held: HeldRun,
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

/// Runs `work` in a new session, then closes the session whatever the
/// outcome: an unclosed session keeps its nodes (a queued candidacy, a
/// lease) until the server expires it, where others see them meanwhile.
async fn in_session<F, Fut>(global: &Global, work: F) -> Result<u8>
where
    F: FnOnce(Session) -> Fut,
    Fut: Future<Output = Result<u8>>,
{
    let session = global.connect_remote().await?;
    let result = work(session.clone()).await;
    session.close().await;
    result
}

/// A command that runs CMD under holds it takes at one path: `lock`,
/// `read-lock`, `write-lock` and `semaphore`.
trait HeldCommand {
    /// The path whose queue is shown while waiting.
    fn path(&self) -> &str;

    /// How to hold, and what to run.
    fn held(&self) -> &HeldRun;
}

impl HeldCommand for LockArgs {
    fn path(&self) -> &str {
        &self.path
    }

    fn held(&self) -> &HeldRun {
        &self.held
    }
}

impl HeldCommand for SemaphoreArgs {
    fn path(&self) -> &str {
        &self.path
    }

    fn held(&self) -> &HeldRun {
        &self.held
    }
}

/// Runs the command's CMD once under the holds `acquire` takes in a new
/// session. `acquire` gets the session and the [`Limits`] to apply to its
/// recipes; it fails with [`dlock::Error::Timeout`] when `--timeout`
/// passed.
async fn run_held<A, Acquired>(
    global: &Global,
    command: &impl HeldCommand,
    acquire: A,
) -> Result<u8>
where
    A: FnOnce(Session, Limits) -> Acquired,
    Acquired: Future<Output = dlock::Result<Vec<Box<dyn Hold>>>>,
{
    let (path, held) = (command.path(), command.held());
    let endpoint = global.endpoint()?;
    let limits = held.limits();
    in_session(global, |session| async move {
        let holds = acquire(session.clone(), limits.clone());
        let holding = async { Ok(limits.hold(Holding::of(holds.await?))) };
        let mut runner = Runner::new(&session, &endpoint, &held.run)?;
        Ok(runner.run(path, holding).await?.code)
    })
    .await
}

/// The library's acquire-with-timeout, or its acquire-forever without one.
async fn within<T, Timed>(
    timeout: Option<Duration>,
    timed: impl FnOnce(Duration) -> Timed,
    forever: impl Future<Output = dlock::Result<T>>,
) -> dlock::Result<T>
where
    Timed: Future<Output = dlock::Result<T>>,
{
    match timeout {
        Some(t) => timed(t).await,
        None => forever.await,
    }
}

impl LockArgs {
    /// The path, and the flags that `kind` of lock can take.
    fn check(&self, kind: LockKind) -> Result<()> {
        dlock::path::validate(&self.path)?;
        if self.layout == Layout::Consul && !matches!(kind, LockKind::Mutex) {
            return Err(Exit::Usage
                .with("--layout consul is Consul's api.Lock: only `dlock lock` has it")
                .into());
        }
        if self.layout == Layout::Kazoo && !matches!(kind, LockKind::Mutex) {
            return Err(Exit::Usage
                .with("--layout kazoo is kazoo's Lock: only `dlock lock` has it")
                .into());
        }
        Ok(())
    }
}

/// `dlock lock|read-lock|write-lock PATH -- CMD...`
pub async fn lock(global: &Global, args: LockArgs, kind: LockKind) -> Result<u8> {
    args.check(kind)?;
    let args = &args;
    run_held(global, args, |session, limits| async move {
        let lock: Box<dyn Lockable> = match kind {
            LockKind::Mutex if args.layout == Layout::Consul => {
                let lock = dlock::ConsulLock::new(&session, &args.path)?;
                let (revocable, limited) = (
                    dlock::ConsulLock::revocable,
                    dlock::ConsulLock::with_max_hold,
                );
                Box::new(limits.apply(lock, revocable, limited))
            }
            LockKind::Mutex => {
                let mutex = dlock::Mutex::new(&session, &args.path)?.with_layout(args.layout)?;
                Box::new(limits.apply(mutex, dlock::Mutex::revocable, dlock::Mutex::with_max_hold))
            }
            LockKind::Read | LockKind::Write => {
                let rw = ReadWriteLock::new(&session, &args.path)?;
                let rw = limits.apply(rw, ReadWriteLock::revocable, ReadWriteLock::with_max_hold);
                match kind {
                    LockKind::Read => Box::new(rw.read_half()),
                    _ => Box::new(rw.write_half()),
                }
            }
        };
        let t = args.held.run.timeout;
        // `lock_for` answers None only when a timeout passed.
        let held = lock.lock_for(t).await?;
        let held = held.ok_or_else(|| dlock::Error::Timeout(t.unwrap_or_default()))?;
        Ok(vec![held])
    })
    .await
}

/// Arguments of `revoke`.
#[derive(Debug, Args)]
pub struct RevokeArgs {
    /// The full path of the holder's node (see `dlock inspect`): a lock,
    /// read or write lock node, a semaphore lease, a KvSemaphore entry, or
    /// a leader's node.
    pub node: String,
    /// Take the hold away instead of asking: delete the node (CURATOR-150).
    /// Works on every kind of holder, revocable or not: its lost signal
    /// fires, its guarded writes are refused, a dlock holder stops its
    /// command (exit 66), and the next waiter gets in at once.
    #[arg(long)]
    pub force: bool,
}

/// `dlock revoke [--force] NODE`: asks the node's owner to release
/// (Curator's `Revoker.attemptRevoke`), or with `--force` deletes it.
pub async fn revoke(global: &Global, args: RevokeArgs) -> Result<u8> {
    dlock::path::validate(&args.node)?;
    in_session(global, |session| async move {
        // Named by an operator: a node that is not there is news (a typo,
        // or released already), not a success.
        if session.exists(&args.node).await?.is_none() {
            eprintln!(
                "dlock: there is no node {}: nothing to revoke (released already?)",
                args.node
            );
            return Ok(1);
        }
        if args.force {
            dlock::revoke_forced(&session, &args.node).await?;
            println!("revoked by force: {}", args.node);
        } else {
            dlock::revoke(&session, &args.node).await?;
            println!("revocation requested: {}", args.node);
        }
        Ok(0)
    })
    .await
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

/// `dlock inspect PATH`: who holds and who waits, in queue order — a
/// printer of [`dlock::inspect`].
pub async fn inspect(global: &Global, args: InspectArgs) -> Result<u8> {
    dlock::path::validate(&args.path)?;
    let (mut seen, path) = (None, &args.path);
    let found = &mut seen;
    in_session(global, |session| async move {
        *found = Some(dlock::inspect(&session, path).await?);
        Ok(0)
    })
    .await?;
    let seen = seen.expect("inspected");
    let recipe = seen.recipe.as_str();
    let participants = &seen.participants;
    // A KV semaphore's free slots: its record's limit less its holders.
    let holders = participants
        .iter()
        .filter(|p| p.role == dlock::Role::Holder)
        .count();
    let free = seen
        .limit
        .map(|limit| (limit as usize).saturating_sub(holders));
    if args.json {
        let list: Vec<_> = participants
            .iter()
            .map(|p| {
                serde_json::json!({
                    "node": p.node,
                    "session": format!("{:#x}", p.session),
                    "fence": p.token.0,
                    "data": String::from_utf8_lossy(&p.data),
                    "role": p.role.as_str(),
                    "access": p.access.map(dlock::Access::as_str),
                    "foreign": p.foreign.map(dlock::Foreign::as_str),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({
                "path": seen.path,
                "recipe": recipe,
                "participants": list,
                "count": seen.count,
                "limit": seen.limit,
                "free": free,
            })
        );
    } else {
        print!(
            "{} ({recipe}): {} participant(s)",
            seen.path,
            participants.len()
        );
        match (seen.count, seen.limit, free) {
            (Some(count), _, _) => println!(", value {count}"),
            (None, Some(limit), Some(free)) => println!(", limit {limit}, {free} free"),
            _ => println!(),
        }
        if !participants.is_empty() {
            println!(
                "{:<7} {:<20} {:>12}  {:<16} NODE",
                "ROLE", "SESSION", "FENCE", "DATA"
            );
        }
        for p in participants {
            let mut notes = Vec::new();
            notes.extend(p.access.map(dlock::Access::as_str));
            notes.extend(p.foreign.map(dlock::Foreign::as_str));
            println!(
                "{:<7} {:<20} {:>12}  {:<16} {}{}",
                p.role.as_str(),
                format!("{:#x}", p.session),
                p.token,
                printable(&p.data),
                p.node,
                if notes.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", notes.join(", "))
                }
            );
        }
    }
    Ok(0)
}

/// Node data as one line of text: control characters (a newline, a
/// terminal's escape sequences), which any client may have written, are
/// shown escaped, not sent to the terminal.
pub(crate) fn printable(data: &[u8]) -> String {
    let text = String::from_utf8_lossy(data);
    text.chars()
        .flat_map(|c| match c.is_control() {
            true => c.escape_default().collect::<Vec<_>>(),
            false => vec![c],
        })
        .collect()
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
    /// Whose node layout the KvSemaphore uses: `curator` (dlock's own
    /// record) or `consul` (Consul's `api.Semaphore`, as `consul lock -n N`
    /// writes it; implies --kv). Or `kazoo`: kazoo's (Python) `Semaphore`
    /// (leases PATH/UUID, the limit stored in PATH, turns under
    /// PATH-__lock__; not with --kv).
    #[arg(long, default_value_t = Layout::Curator)]
    pub layout: Layout,
    #[command(flatten)]
    pub held: HeldRun,
}

impl SemaphoreArgs {
    /// Whether the leases are a KvSemaphore's (Consul's layout is one).
    fn uses_kv(&self) -> bool {
        self.kv || self.layout == Layout::Consul
    }

    /// The path, and the flags that go together.
    fn check(&self) -> Result<()> {
        dlock::path::validate(&self.path)?;
        if self.qty > self.leases {
            return Err(Exit::Usage
                .with(format!(
                    "--qty {} is more than the {} leases there are",
                    self.qty, self.leases
                ))
                .into());
        }
        if self.kv && self.layout == Layout::Kazoo {
            return Err(Exit::Usage
                .with("--layout kazoo is kazoo's Semaphore, which is no KvSemaphore: drop --kv")
                .into());
        }
        if self.layout == Layout::Kazoo && !self.uses_kv() && self.held.hold.revocable.is_some() {
            return Err(Exit::Usage
                .with("--layout kazoo leases listen for no revocation (kazoo reads every lease node's data): drop --revocable")
                .into());
        }
        if self.uses_kv() && self.qty != 1 {
            return Err(Exit::Usage
                .with("the KvSemaphore gives one lease per session: --kv takes no --qty")
                .into());
        }
        Ok(())
    }
}

/// `dlock semaphore PATH --leases N [--qty K] -- CMD...`
pub async fn semaphore(global: &Global, args: SemaphoreArgs) -> Result<u8> {
    args.check()?;
    let args = &args;
    run_held(global, args, |session, limits| async move {
        let t = args.held.run.timeout;
        if args.uses_kv() {
            let sem = dlock::KvSemaphore::new(&session, &args.path, args.leases)?
                .with_layout(args.layout);
            let sem = limits.apply(
                sem,
                dlock::KvSemaphore::revocable,
                dlock::KvSemaphore::with_max_hold,
            );
            let lease = within(t, |t| sem.acquire_timeout(t), sem.acquire()).await?;
            return Ok(vec![Box::new(lease) as Box<dyn Hold>]);
        }
        let sem =
            dlock::Semaphore::new(&session, &args.path, args.leases)?.with_layout(args.layout)?;
        let sem = limits.apply(
            sem,
            dlock::Semaphore::revocable,
            dlock::Semaphore::with_max_hold,
        );
        let leases = within(
            t,
            |t| sem.acquire_timeout(args.qty, t),
            sem.acquire(args.qty),
        )
        .await?;
        Ok(leases
            .into_iter()
            .map(|lease| Box::new(lease) as Box<dyn Hold>)
            .collect())
    })
    .await
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
    /// Run CMD again each time leadership comes back, instead of once
    /// (until CMD's hold is lost, or dlock gets SIGINT, SIGTERM, SIGHUP or SIGQUIT).
    #[arg(long)]
    pub requeue: bool,
    /// Whose node layout to use: `curator` (Curator's LeaderSelector) or
    /// `kazoo` (kazoo's `Election`, whose candidates see ours only then).
    #[arg(long, default_value_t = Layout::Curator)]
    pub layout: Layout,
    #[command(flatten)]
    pub run: RunOptions,
}

/// One term of leadership, and how to tell the selector it is over.
type Term = (dlock::Leadership, tokio::sync::oneshot::Sender<()>);

/// `dlock elect PATH [--id ID] [--requeue] -- CMD...`: runs CMD while
/// leader (LeaderSelector layout); leadership is given up when CMD exits.
/// Whatever the outcome — a timeout too — the candidacy is closed (its node
/// deleted) before dlock exits.
pub async fn elect(global: &Global, args: ElectArgs) -> Result<u8> {
    dlock::path::validate(&args.path)?;
    if args.layout == Layout::Consul {
        return Err(Exit::Usage
            .with("--layout consul has no election: use curator or kazoo")
            .into());
    }
    let endpoint = global.endpoint()?;
    in_session(global, |session| async move {
        // The selector hands each term over, and holds leadership until told
        // the command is done.
        let (terms_tx, mut terms) = tokio::sync::mpsc::channel::<Term>(1);
        let mut selector = dlock::LeaderSelector::new(&session, &args.path, move |term| {
            let terms_tx = terms_tx.clone();
            async move {
                let (done_tx, done) = tokio::sync::oneshot::channel();
                if terms_tx.send((term, done_tx)).await.is_ok() {
                    let _ = done.await;
                }
            }
        })?
        .with_layout(args.layout)?
        // A suspension ends the term only past --suspend-grace, as every
        // other hold of the CLI (the runner watches it), not at once as
        // Curator's default policy would.
        .with_error_policy(dlock::ErrorPolicy::Session);
        if let Some(id) = &args.id {
            selector = selector.with_id(id.clone());
        }
        if args.requeue {
            selector = selector.with_auto_requeue();
        }
        selector.start()?;
        let mut runner = Runner::new(&session, &endpoint, &args.run)?;
        let result = lead(&mut runner, &args, &mut terms).await;
        let _ = selector.close().await;
        result
    })
    .await
}

/// Runs the command for each term handed over: the first within
/// `--timeout`, the next ones (with `--requeue`) whenever they come.
async fn lead(
    runner: &mut Runner<'_>,
    args: &ElectArgs,
    terms: &mut tokio::sync::mpsc::Receiver<Term>,
) -> Result<u8> {
    let mut timeout = args.run.timeout;
    loop {
        let next = async {
            let term = match timeout.take() {
                Some(t) => tokio::time::timeout(t, terms.recv())
                    .await
                    .map_err(|_| dlock::Error::Timeout(t))?,
                None => terms.recv().await,
            };
            // The selector keeps the sender while it is open.
            let (term, done) = term.ok_or(dlock::Error::Closed)?;
            let cancelled = term.clone();
            let release = Box::pin(async move {
                let _ = done.send(());
                Ok(())
            });
            Ok(Holding::ending((*term).clone(), release, async move {
                cancelled.cancelled().await
            }))
        };
        let ran = runner.run(&args.path, next).await?;
        if !args.requeue || ran.last {
            return Ok(ran.code);
        }
    }
}

/// `dlock count ...`: a SharedCount (4-byte big-endian, Curator-compatible).
#[derive(Debug, clap::Subcommand)]
pub enum CountCommand {
    /// Print the value.
    ///
    /// Example: dlock count get /config/workers
    Get {
        /// The counter's path.
        path: String,
    },
    /// Set the value (creating the counter if needed).
    ///
    /// Example: dlock count set /config/workers 8
    Set {
        /// The counter's path.
        path: String,
        /// The new value.
        #[arg(allow_hyphen_values = true)]
        value: i32,
    },
    /// Set the value only if it is EXPECTED now (exit code 1 otherwise,
    /// and if there is no count at PATH).
    ///
    /// Example: dlock count cas /config/workers 8 9
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

/// Refuses bad recipe paths before connecting: a usage error at once, not
/// after waiting out a server that cannot be reached.
pub(crate) fn refuse_bad_paths<'a>(
    what: &str,
    paths: impl IntoIterator<Item = &'a str>,
) -> Result<()> {
    for path in paths {
        dlock::path::validate_recipe(path, what)?;
    }
    Ok(())
}

/// Runs a `count` command.
pub async fn count(global: &Global, command: CountCommand) -> Result<u8> {
    let path = match &command {
        CountCommand::Get { path }
        | CountCommand::Set { path, .. }
        | CountCommand::Cas { path, .. } => path,
    };
    refuse_bad_paths("a count", [path.as_str()])?;
    in_session(global, |session| count_in(session, command)).await
}

async fn count_in(session: Session, command: CountCommand) -> Result<u8> {
    let code = match command {
        CountCommand::Get { path } => {
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
            // No count holds no value, EXPECTED or other: no effect, as
            // a value that differs.
            let (data, stat) = match session.get_data(&path).await {
                Err(dlock::Error::NoNode { .. }) => {
                    eprintln!("dlock: there is no count at {path}; left as is");
                    return Ok(1);
                }
                read => read?,
            };
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
    Ok(code)
}

/// `dlock barrier ...`: a Barrier (Curator's DistributedBarrier).
#[derive(Debug, clap::Subcommand)]
pub enum BarrierCommand {
    /// Close the barrier (create its node; set already: nothing to do).
    ///
    /// Example: dlock barrier set /barriers/deploy
    Set {
        /// The barrier's path.
        path: String,
    },
    /// Open the barrier (delete its node), letting every waiter go.
    ///
    /// Example: dlock barrier remove /barriers/deploy
    Remove {
        /// The barrier's path.
        path: String,
    },
    /// Wait while the barrier is set (exit 65 if --timeout passes first).
    ///
    /// Example: dlock barrier wait /barriers/deploy --timeout 10m
    Wait {
        /// The barrier's path.
        path: String,
        /// How long to wait (default: forever).
        #[arg(long, value_parser = crate::duration::parse)]
        timeout: Option<Duration>,
    },
}

/// Runs a `barrier` command.
pub async fn barrier(global: &Global, command: BarrierCommand) -> Result<u8> {
    let path = match &command {
        BarrierCommand::Set { path }
        | BarrierCommand::Remove { path }
        | BarrierCommand::Wait { path, .. } => path,
    };
    refuse_bad_paths("a barrier", [path.as_str()])?;
    in_session(global, |session| async move {
        match command {
            BarrierCommand::Set { path } => {
                dlock::Barrier::new(&session, &path)?.set_barrier().await?
            }
            BarrierCommand::Remove { path } => {
                dlock::Barrier::new(&session, &path)?
                    .remove_barrier()
                    .await?
            }
            BarrierCommand::Wait { path, timeout } => {
                let barrier = dlock::Barrier::new(&session, &path)?;
                within(
                    timeout,
                    |t| barrier.wait_on_barrier_timeout(t),
                    barrier.wait_on_barrier(),
                )
                .await
                .map_err(|e| match e {
                    dlock::Error::Timeout(t) => Exit::Timeout
                        .with(format!("{path} is still set after {t:?}"))
                        .into(),
                    other => anyhow::Error::new(other),
                })?
            }
        }
        Ok(0)
    })
    .await
}

/// Arguments of `double-barrier`.
#[derive(Debug, Args)]
pub struct DoubleBarrierArgs {
    /// The barrier's path.
    pub path: String,
    /// How many members open the barrier (all must agree).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub count: u32,
    // `--timeout` bounds entering (exit 65) and, again, the wait for the
    // others to leave (reported; the command's exit code is kept).
    #[command(flatten)]
    pub run: RunOptions,
}

/// `dlock double-barrier PATH --count N -- CMD...`: enter, run CMD as a
/// member (DLOCK_NODE is our member node), leave.
pub async fn double_barrier(global: &Global, args: DoubleBarrierArgs) -> Result<u8> {
    dlock::path::validate(&args.path)?;
    let endpoint = global.endpoint()?;
    in_session(global, |session| async move {
        let barrier = dlock::DoubleBarrier::new(&session, &args.path, args.count as usize)?;
        let t = args.run.timeout;
        let enter = async {
            let member = within(t, |t| barrier.enter_timeout(t), barrier.enter()).await?;
            let acquisition = (*member).clone();
            let leave = Box::pin(async move {
                match t {
                    Some(t) => member.leave_timeout(t).await,
                    None => member.leave().await,
                }
            });
            Ok(Holding::ending(acquisition, leave, std::future::pending()))
        };
        let mut runner = Runner::new(&session, &endpoint, &args.run)?;
        Ok(runner.run(&args.path, enter).await?.code)
    })
    .await
}

/// How `dlock counter` updates try (Curator's `DistributedAtomicLong`
/// options).
#[derive(Debug, Args)]
pub struct CounterTries {
    /// Fall back to the Mutex at LOCK_PATH (Curator's PromotedToLock) when
    /// the optimistic tries lose.
    #[arg(long, value_name = "LOCK_PATH")]
    pub lock_path: Option<String>,
    /// How many times a lost optimistic try is repeated (and, with
    /// --lock-path, a lost try under the lock).
    #[arg(long, default_value_t = 10)]
    pub retries: u32,
    /// Print every fact of the result as one JSON object (succeeded,
    /// pre_value, post_value, the tries and their time).
    #[arg(long)]
    pub json: bool,
}

/// `dlock counter ...`: an AtomicCounter (Curator's DistributedAtomicLong).
#[derive(Debug, clap::Subcommand)]
pub enum CounterCommand {
    /// Print the value (0 if the counter does not exist yet).
    ///
    /// Example: dlock counter get /counters/jobs
    Get {
        /// The counter's path.
        path: String,
    },
    /// Add DELTA (negative to subtract) and print the new value; exit 1
    /// if every try lost a race (nothing was added).
    ///
    /// Example: dlock counter add /counters/jobs -3
    Add {
        /// The counter's path.
        path: String,
        /// What to add.
        #[arg(allow_hyphen_values = true)]
        delta: i64,
        #[command(flatten)]
        tries: CounterTries,
    },
    /// Set VALUE through the same tries as an update (Curator's trySet),
    /// or unconditionally with --force; print it. Exit 1 if every try lost.
    ///
    /// Example: dlock counter set /counters/jobs 0
    Set {
        /// The counter's path.
        path: String,
        /// The new value.
        #[arg(allow_hyphen_values = true)]
        value: i64,
        /// Write without comparing (Curator's forceSet).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        tries: CounterTries,
    },
    /// Set VALUE only if the counter is EXPECTED now (Curator's
    /// compareAndSet); exit 1 if it is not.
    ///
    /// Example: dlock counter cas /counters/jobs 41 42
    Cas {
        /// The counter's path.
        path: String,
        /// The value it must have.
        #[arg(allow_hyphen_values = true)]
        expected: i64,
        /// The new value.
        #[arg(allow_hyphen_values = true)]
        value: i64,
        /// Print every fact of the result as one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// Runs a `counter` command.
pub async fn counter(global: &Global, command: CounterCommand) -> Result<u8> {
    let (path, tries) = match &command {
        CounterCommand::Get { path } | CounterCommand::Cas { path, .. } => (path, None),
        CounterCommand::Add { path, tries, .. } | CounterCommand::Set { path, tries, .. } => {
            (path, Some(tries))
        }
    };
    refuse_bad_paths("a counter", [path.as_str()])?;
    let lock_path = tries.and_then(|t| t.lock_path.as_deref());
    refuse_bad_paths("a counter's lock", lock_path)?;
    in_session(global, |session| counter_in(session, command)).await
}

fn atomic_counter(
    session: &Session,
    path: &str,
    tries: &CounterTries,
) -> Result<dlock::AtomicCounter> {
    let retry = dlock::RetryPolicy {
        max_retries: tries.retries,
        ..dlock::AtomicCounter::DEFAULT_RETRY
    };
    let mut counter = dlock::AtomicCounter::new(session, path)?.with_retry(retry);
    if let Some(lock_path) = &tries.lock_path {
        counter =
            counter.promoted_to_lock(dlock::PromotedToLock::new(lock_path)?.with_retry(retry));
    }
    Ok(counter)
}

/// Prints an update's result; exit code 1 if it did not take effect.
fn report(path: &str, what: &str, value: &dlock::AtomicValue, json: bool) -> u8 {
    if json {
        let stats = &value.stats;
        println!(
            "{}",
            serde_json::json!({
                "path": path,
                "succeeded": value.succeeded,
                "pre_value": value.pre_value,
                "post_value": value.post_value,
                "optimistic_tries": stats.optimistic_tries,
                "promoted_lock_tries": stats.promoted_lock_tries,
                "optimistic_ms": stats.optimistic_time.as_secs_f64() * 1000.0,
                "promoted_ms": stats.promoted_time.as_secs_f64() * 1000.0,
            })
        );
    } else if value.succeeded {
        println!("{}", value.post_value);
    }
    if value.succeeded {
        0
    } else {
        if !json {
            eprintln!(
                "dlock: {what} at {path} did not take effect (it is {}); left as is",
                value.post_value
            );
        }
        1
    }
}

async fn counter_in(session: Session, command: CounterCommand) -> Result<u8> {
    Ok(match command {
        CounterCommand::Get { path } => {
            let value = dlock::AtomicCounter::new(&session, &path)?.get().await?;
            println!("{}", value.post_value);
            0
        }
        CounterCommand::Add { path, delta, tries } => {
            let value = atomic_counter(&session, &path, &tries)?.add(delta).await?;
            report(&path, &format!("adding {delta}"), &value, tries.json)
        }
        CounterCommand::Set {
            path,
            value,
            force: true,
            tries,
        } => {
            // forceSet neither reads nor retries: there are no facts to
            // report but the value.
            atomic_counter(&session, &path, &tries)?
                .force_set(value)
                .await?;
            match tries.json {
                true => println!(
                    "{}",
                    serde_json::json!({ "path": path, "succeeded": true, "post_value": value })
                ),
                false => println!("{value}"),
            }
            0
        }
        CounterCommand::Set {
            path, value, tries, ..
        } => {
            let result = atomic_counter(&session, &path, &tries)?
                .try_set(value)
                .await?;
            report(&path, &format!("setting {value}"), &result, tries.json)
        }
        CounterCommand::Cas {
            path,
            expected,
            value,
            json,
        } => {
            let result = dlock::AtomicCounter::new(&session, &path)?
                .compare_and_set(expected, value)
                .await?;
            report(&path, &format!("{expected} -> {value}"), &result, json)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn control_characters_in_node_data_are_shown_escaped() {
        assert_eq!(
            printable(b"10.0.0.5\n\x1b[2Jgone"),
            "10.0.0.5\\n\\u{1b}[2Jgone"
        );
        assert_eq!(printable("café\t".as_bytes()), "café\\t");
    }
}
