//! What several suites' cases share, written once: their opening (sessions,
//! a path below the test's root, a recipe on it), Curator's scenarios that
//! run on more than one recipe (`test2Clients`, `testKilledSession`,
//! `testContainerCleanup`, generic over [`Lockable`]), waiting for queued
//! acquires and tasks, counting who is inside a guarded section, and a
//! harness on a private etcd server.

use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dlock::store::embedded::{EmbeddedServer, WatchStats};
use dlock::{Hold, Lockable, Session, SharedCount};
use dlock_testkit::EtcdServer;
use tokio::task::JoinHandle;

use super::{queued, reaped_after_lock_rounds, Backend, Harness};

/// How long a step may take before the case counts as hung.
const WITHIN: Duration = Duration::from_secs(20);

/// A session, the path `rest` below the test's root, and the recipe `make`
/// builds on them.
pub async fn recipe_on<R>(
    h: &Harness,
    rest: &str,
    make: impl FnOnce(&Session, &str) -> dlock::Result<R>,
) -> Result<(Session, String, R)> {
    let session = h.session().await;
    let path = h.path(rest);
    let recipe = make(&session, &path)?;
    Ok((session, path, recipe))
}

/// A session and a started [`SharedCount`] at `rest` (its path), seeded
/// with `seed`.
pub async fn started_count(
    h: &Harness,
    rest: &str,
    seed: i32,
) -> Result<(Session, String, SharedCount)> {
    let (session, path, count) = recipe_on(h, rest, |s, p| SharedCount::new(s, p, seed)).await?;
    count.start().await?;
    Ok((session, path, count))
}

/// Deletes `path` if it is there.
pub async fn remove(session: &Session, path: &str) -> Result<()> {
    match session.delete(path, None).await {
        Ok(()) | Err(dlock::Error::NoNode { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Two sessions contending for one path below the test's root, each with
/// its own recipe there.
pub struct Rivals<R> {
    /// The session that takes the recipe first.
    pub first: Session,
    /// The session that contends with it.
    pub second: Session,
    /// The recipe's path.
    pub path: String,
    /// The first session's recipe.
    pub mine: R,
    /// The second session's recipe.
    pub theirs: R,
}

/// [`Rivals`] at `rest`, each recipe built by `make`.
pub async fn rivals<R>(
    h: &Harness,
    rest: &str,
    make: impl Fn(&Session, &str) -> dlock::Result<R>,
) -> Result<Rivals<R>> {
    let (first, second) = (h.session().await, h.session().await);
    let path = h.path(rest);
    let (mine, theirs) = (make(&first, &path)?, make(&second, &path)?);
    Ok(Rivals {
        first,
        second,
        path,
        mine,
        theirs,
    })
}

/// A waiting acquire of a [`Lockable`].
pub type Waiter = JoinHandle<dlock::Result<Option<Box<dyn Hold>>>>;

/// Rivals once the first holds and the second waits behind it.
pub struct Queued {
    /// The holder's session.
    pub first: Session,
    /// The waiter's session.
    pub second: Session,
    /// The lock's path.
    pub path: String,
    /// The first rival's hold.
    pub held: Box<dyn Hold>,
    /// The second rival's acquire, queued.
    pub waiter: Waiter,
}

impl<L: Lockable + 'static> Rivals<L> {
    /// The first rival holds; the second queues behind it, until its queue
    /// (the lock's path and `queue_below`: `""` for a `Mutex`, `"/leases"`
    /// for a `SemaphoreMutex`), listed by the second session, has `nodes`
    /// nodes.
    pub async fn hold_and_queue(self, queue_below: &str, nodes: usize) -> Result<Queued> {
        let held = self
            .mine
            .lock_for(None)
            .await?
            .context("held, without a timeout")?;
        let queue = format!("{}{queue_below}", self.path);
        let waiter = queued_lock(&self.second, &queue, nodes, self.theirs).await?;
        Ok(Queued {
            first: self.first,
            second: self.second,
            path: self.path,
            held,
            waiter,
        })
    }
}

/// Starts acquiring `lock` in the background and returns the acquire once
/// `queue` (as `observer` lists it) has `nodes` nodes.
pub async fn queued_lock<L: Lockable + 'static>(
    observer: &Session,
    queue: &str,
    nodes: usize,
    lock: L,
) -> Result<Waiter> {
    queued(observer, queue, nodes, WITHIN, async move {
        lock.lock_for(None).await
    })
    .await
}

/// What `task` ended with, within `within`.
pub async fn finished<T, E: Into<anyhow::Error>>(
    task: JoinHandle<Result<T, E>>,
    within: Duration,
) -> Result<T> {
    tokio::time::timeout(within, task)
        .await
        .with_context(|| format!("the task did not finish within {within:?}"))??
        .map_err(Into::into)
}

/// The hold a queued acquire got within `within`.
pub async fn got_within(waiter: Waiter, within: Duration) -> Result<Box<dyn Hold>> {
    finished(waiter, within)
        .await?
        .context("held, without a timeout")
}

/// `held` releases and the queued `waiter` gets the lock within the test's
/// bound, with a larger token (else fails, saying `larger_token`).
pub async fn hand_to(
    held: Box<dyn Hold>,
    waiter: Waiter,
    larger_token: &str,
) -> Result<Box<dyn Hold>> {
    let first_token = held.token();
    held.release().await?;
    let next = got_within(waiter, WITHIN).await?;
    ensure!(next.token() > first_token, "{larger_token}");
    Ok(next)
}

/// The last name of `node`, checked as a Curator protected sequential name
/// of `lock_name` (`lock-`, `lease-`): `_c_<uuid>-<lock_name><10 digits>`.
pub fn curator_protected_name(node: &str, lock_name: &str) -> Result<String> {
    let name = node.rsplit('/').next().unwrap_or(node).to_string();
    let digits = 40 + lock_name.len();
    ensure!(name.len() == digits + 10, "{name}");
    ensure!(
        name.starts_with("_c_") && name.as_bytes()[39] == b'-',
        "{name}"
    );
    uuid::Uuid::parse_str(&name[3..39])?;
    ensure!(
        name[40..].starts_with(lock_name) && name[digits..].bytes().all(|b| b.is_ascii_digit()),
        "{name}"
    );
    Ok(name)
}

/// Curator's `test2Clients`, for any lock: the first rival holds while the
/// second waits (see [`Rivals::hold_and_queue`] for `queue_below`); when
/// the first releases, the second gets the lock with a larger token.
/// Returns the first rival's lock (for the caller to see that it is held
/// now) and the second's hold.
pub async fn clients_take_turns<L: Lockable + Clone + 'static>(
    rivals: Rivals<L>,
    queue_below: &str,
) -> Result<(L, Box<dyn Hold>)> {
    let mine = rivals.mine.clone();
    let Queued { held, waiter, .. } = rivals.hold_and_queue(queue_below, 2).await?;
    ensure!(!waiter.is_finished(), "the second client waits");
    let next = hand_to(held, waiter, "a later acquisition has a larger token").await?;
    Ok((mine, next))
}

/// Waits until `waiters` node watches are armed on `server`, and sees no
/// more than that: every waiter watches exactly one node (its predecessor).
pub async fn one_watch_per_waiter(
    server: &EmbeddedServer,
    waiters: usize,
    within: Duration,
) -> Result<WatchStats> {
    tokio::time::timeout(within, async {
        while server.watch_stats().node_watches < waiters {
            tokio::task::yield_now().await;
        }
    })
    .await?;
    let stats = server.watch_stats();
    ensure!(
        stats.node_watches == waiters,
        "{} watches for {waiters} waiters",
        stats.node_watches
    );
    Ok(stats)
}

/// Whether `dir` has no children (or is gone).
pub async fn no_children(session: &Session, dir: &str) -> bool {
    session
        .children(dir)
        .await
        .map(|c| c.is_empty())
        .unwrap_or(true)
}

/// A lock's last holder and the one it handed over to.
pub struct Handover {
    /// The hold whose session was killed.
    pub lost: Box<dyn Hold>,
    /// The waiter's hold.
    pub next: Box<dyn Hold>,
}

/// Curator's `testKilledSession`, for any lock: the first rival holds, the
/// second waits (see [`Rivals::hold_and_queue`]), and the holder's session
/// expires. The holder learns it (its lost signal fires); the waiter gets
/// the lock within `handover` from then, with a larger token, and holds
/// it.
pub async fn killed_holder_hands_over<L: Lockable + 'static>(
    rivals: Rivals<L>,
    queue_below: &str,
    nodes: usize,
    handover: Duration,
) -> Result<Handover> {
    let Queued {
        first,
        held: lost,
        waiter,
        ..
    } = rivals.hold_and_queue(queue_below, nodes).await?;
    first.faults().context("faults")?.expire().await?;
    tokio::time::timeout(WITHIN, lost.acquisition().lost())
        .await
        .context("the killed holder's lost signal")?;
    ensure!(lost.acquisition().is_lost());
    let next = got_within(waiter, handover).await?;
    ensure!(
        next.token() > lost.token(),
        "a later acquisition has a larger token"
    );
    ensure!(lost.acquisition().is_lost() && !next.acquisition().is_lost());
    Ok(Handover { lost, next })
}

/// Curator's `testContainerCleanup`, for any lock made by `make`: `clients`
/// fresh locks at `/locks/our-lock` take turns three rounds each, and then
/// `/locks` is reaped.
pub async fn lock_directories_are_reaped<L: Lockable + 'static>(
    h: &Harness,
    clients: usize,
    make: impl Fn(&Session, &str) -> dlock::Result<L>,
) -> Result<()> {
    let s = h.session().await;
    let lock = || make(&s, &h.path("/locks/our-lock"));
    reaped_after_lock_rounds(&s, clients, lock, &h.path("/locks"), WITHIN).await
}

/// A harness on a private etcd server, for the cases whose server-wide
/// counts (requests, watchers) or compactions must be the test's alone;
/// `per_backend!(private_etcd => PrivateEtcd::start(); ..)` runs them.
pub struct PrivateEtcd {
    /// The server, for its metrics and a plain client.
    pub server: EtcdServer,
    harness: Harness,
}

impl PrivateEtcd {
    /// Starts the server.
    pub fn start() -> Self {
        let server = EtcdServer::start().expect("start a private etcd");
        let harness = Harness::new(Backend::Etcd(server.endpoint()));
        PrivateEtcd { server, harness }
    }

    /// As [`Harness::finish`]; the server stops after it.
    pub async fn finish(self) {
        self.harness.finish().await;
    }
}

impl Deref for PrivateEtcd {
    type Target = Harness;

    fn deref(&self) -> &Harness {
        &self.harness
    }
}

/// How many tasks are inside a section guarded by a lock now, and the most
/// that ever were at once.
#[derive(Debug, Default)]
pub struct Occupancy {
    inside: AtomicUsize,
    peak: AtomicUsize,
}

impl Occupancy {
    /// One more inside; returns how many are inside now.
    pub fn enter(&self) -> usize {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        now
    }

    /// One fewer inside.
    pub fn leave(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    /// How many are inside now.
    pub fn now(&self) -> usize {
        self.inside.load(Ordering::SeqCst)
    }

    /// The most that were inside at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    /// Inside for a moment (one yield to the other tasks): fails, saying
    /// `two_at_once`, if anyone else is inside too.
    pub async fn alone(&self, two_at_once: &str) -> Result<()> {
        ensure!(self.enter() == 1, "{two_at_once}");
        tokio::task::yield_now().await;
        self.leave();
        Ok(())
    }
}

/// Waits for every task; fails with the first one that failed.
pub async fn joined(tasks: Vec<JoinHandle<Result<()>>>) -> Result<()> {
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// A try's hold, `tried`, released: the lock was free (else fails, saying
/// `free`).
pub async fn release_tried<G: Hold + 'static>(tried: Option<G>, free: &str) -> Result<()> {
    let hold: Box<dyn Hold> = Box::new(tried.with_context(|| free.to_string())?);
    hold.release().await?;
    Ok(())
}

/// The `waiting` acquire gets in within the test's bound with its node at
/// `node`, not lost, and lets go.
pub async fn gets_in_at<G: Hold + 'static>(
    waiting: JoinHandle<dlock::Result<G>>,
    node: &str,
) -> Result<()> {
    let hold: Box<dyn Hold> = Box::new(finished(waiting, WITHIN).await?);
    let acquisition = hold.acquisition();
    ensure!(
        acquisition.node() == node && !acquisition.is_lost(),
        "got in at {} (lost: {}), not at {node}",
        acquisition.node(),
        acquisition.is_lost()
    );
    hold.release().await?;
    Ok(())
}

/// Recipes made by `make` refuse bad paths (relative, with an empty
/// segment or a trailing slash, the root, empty) with `InvalidPath`.
pub async fn refuses_bad_paths<R: std::fmt::Debug>(
    h: &Harness,
    make: impl Fn(&Session, &str) -> dlock::Result<R>,
) -> Result<()> {
    let s = h.session().await;
    for bad in ["relative", "/a//b", "/trailing/", "/", ""] {
        let err = make(&s, bad).unwrap_err();
        ensure!(
            matches!(err, dlock::Error::InvalidPath { .. }),
            "{bad:?}: {err}"
        );
    }
    Ok(())
}
