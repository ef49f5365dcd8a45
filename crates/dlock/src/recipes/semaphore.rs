//! [`Semaphore`]: a counting semaphore of leases — Curator's
//! `InterProcessSemaphoreV2`, node for node.
//!
//! Layout (a compatibility contract with Curator 5.4), for a semaphore at
//! `<path>`:
//! - `<path>/locks`: an internal [`Mutex`] (`_c_<uuid>-lock-<seq>` nodes)
//!   that serialises acquirers;
//! - `<path>/leases`: one `_c_<uuid>-lease-<seq>` ephemeral-sequential node
//!   per lease (data: the semaphore's node data, else the session's default
//!   data).
//!
//! Acquiring one lease is exactly Curator's algorithm: take the `locks`
//! mutex, create the lease node, wait (watching the children of `leases`)
//! until there are at most `max` lease nodes — ours included — then release
//! the mutex. Only the acquirer at the head of the `locks` queue ever watches
//! `leases`; everyone else waits in the mutex's queue, in order. Because dlock
//! serialises through the same mutex, dlock and Java clients can share one
//! semaphore safely.
//!
//! Differences from Curator, all client-side: `qty == 0`, `qty > max` and a
//! maximum of 0 fail at once with [`Error::InvalidArgument`] (Curator
//! self-deadlocks on `qty > max` until its timeout), and every lease is an
//! owned [`Lease`] with a fencing token and a lost signal, released in the
//! background if dropped.

use std::ops::Deref;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::guard::Acquisition;
use super::mutex::Mutex;
use super::queue::{
    deadline, position, HeldNode, Participant, Predicate, Stop, Verdict, WaitQueue,
};
use super::shared_count::{SharedCount, VersionedValue};
use crate::error::{Error, Result};
use crate::path;
use crate::session::Session;
use crate::store::{Child, CreateMode};

/// Curator's node name for lease nodes.
pub(crate) const LEASE_NAME: &str = "lease-";
/// The internal mutex's directory under the semaphore's path.
pub(crate) const LOCK_PARENT: &str = "locks";
/// The leases' directory under the semaphore's path.
pub(crate) const LEASE_PARENT: &str = "leases";

/// Whether children named `names` are a semaphore's: its `locks` or
/// `leases` directory (either may be gone while the other is not).
pub(crate) fn is_layout(names: &[&str]) -> bool {
    names
        .iter()
        .any(|n| *n == LOCK_PARENT || *n == LEASE_PARENT)
}

/// Where the maximum number of leases comes from.
#[derive(Debug, Clone)]
enum Max {
    Fixed(u32),
    Count(SharedCount),
}

impl Max {
    fn current(&self) -> i64 {
        match self {
            Max::Fixed(n) => i64::from(*n),
            Max::Count(count) => i64::from(count.get()),
        }
    }

    fn subscribe(&self) -> Option<tokio::sync::watch::Receiver<VersionedValue<i32>>> {
        match self {
            Max::Fixed(_) => None,
            Max::Count(count) => Some(count.subscribe()),
        }
    }
}

/// Curator's semaphore predicate: our node is there (else `NoNode`, "Sequential
/// path not found") and there are at most `max` lease nodes, ours included;
/// otherwise wait for the set of leases to change.
struct LeaseCount<'a>(&'a Max);

impl Predicate for LeaseCount<'_> {
    fn check(&self, sorted: &[Child], ours: &str) -> Result<Verdict> {
        position(sorted, ours)?;
        Ok(if sorted.len() as i64 <= self.0.current() {
            Verdict::Acquired
        } else {
            Verdict::WatchChildren
        })
    }
}

/// Who holds, as far as a listing can tell: everyone when there are at most
/// `max` leases; otherwise the newest lease is taken to be the one waiting
/// (the head acquirer's node is created last).
struct Holders<'a>(&'a Max);

impl Predicate for Holders<'_> {
    fn check(&self, sorted: &[Child], ours: &str) -> Result<Verdict> {
        let index = position(sorted, ours)?;
        Ok(
            if sorted.len() as i64 <= self.0.current() || index + 1 < sorted.len() {
                Verdict::Acquired
            } else {
                Verdict::WatchChildren
            },
        )
    }
}

/// A counting semaphore shared by every session that names the same path
/// (Curator's `InterProcessSemaphoreV2`).
///
/// Each acquisition yields owned [`Lease`]s; a lease is given back with
/// [`Lease::release`] or by dropping it. The maximum is either a number
/// ([`new`](Self::new)) — a convention every participant must agree on, as
/// in Curator — or a [`SharedCount`] ([`with_count`](Self::with_count)):
/// raising the count wakes the waiting acquirer at once; lowering it never
/// revokes leases, it only holds back new ones.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// use dlock::recipes::semaphore::Semaphore;
/// let session = dlock::connect("embedded").await?;
/// let semaphore = Semaphore::new(&session, "/doc/semaphore", 2)?;
/// let mut leases = semaphore.acquire(2).await?;    // both leases
/// assert!(semaphore.try_acquire(1).await?.is_none()); // none left
/// let lease = leases.pop().unwrap();
/// println!("lease {} with fencing token {}", lease.name(), lease.token());
/// lease.release().await?;                          // one back
/// let again = semaphore.acquire_one().await?;
/// # again.release().await?; for l in leases { l.release().await?; }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore {
    path: String,
    locks: Mutex,
    leases: WaitQueue,
    max: Max,
    data: Option<Vec<u8>>,
}

/// How one attempt at one lease ended.
enum Attempt {
    Acquired(Lease),
    TimedOut,
    /// Our lease node vanished while waiting (its session was lost, or it
    /// was deleted): try again with a new one (Curator's
    /// `RETRY_DUE_TO_MISSING_NODE`).
    MissingNode,
}

impl Semaphore {
    /// A semaphore at `path` admitting at most `max` leases at a time. Fails
    /// with [`Error::InvalidArgument`] if `max` is 0.
    pub fn new(session: &Session, path: &str, max: u32) -> Result<Self> {
        if max == 0 {
            return Err(Error::InvalidArgument(format!(
                "the semaphore at {path} needs a maximum of at least 1 lease, got 0"
            )));
        }
        Self::with_max(session, path, Max::Fixed(max))
    }

    /// A semaphore at `path` whose maximum is the value of `count` (started
    /// or not; it should be started to follow changes). Raising the count
    /// wakes a waiting acquirer at once; lowering it never revokes leases.
    pub fn with_count(session: &Session, path: &str, count: SharedCount) -> Result<Self> {
        Self::with_max(session, path, Max::Count(count))
    }

    fn with_max(session: &Session, path: &str, max: Max) -> Result<Self> {
        path::validate(path)?;
        if path == "/" {
            return Err(Error::InvalidPath {
                path: path.into(),
                reason: "a semaphore cannot live at the root".into(),
            });
        }
        Ok(Semaphore {
            path: path.to_string(),
            locks: Mutex::new(session, &path::join(path, LOCK_PARENT))?,
            leases: WaitQueue::new(
                session,
                &path::join(path, LEASE_PARENT),
                LEASE_NAME,
                &[LEASE_NAME],
            )?,
            max,
            data: None,
        })
    }

    /// Stores `data` in this semaphore's lease nodes instead of the session's
    /// default data (Curator's `setNodeData`).
    pub fn with_data(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.data = Some(data.into());
        self
    }

    /// The semaphore's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The session this semaphore uses.
    pub fn session(&self) -> &Session {
        &self.leases.session
    }

    /// The maximum number of leases now (from the number, or the count's
    /// current value).
    pub fn max_leases(&self) -> i64 {
        self.max.current()
    }

    /// Every lease node, in sequence order, with node, session, fencing token
    /// and data (Curator's `getParticipantNodes`, with details). `holds` is
    /// inferred from the listing: when there are more nodes than the maximum,
    /// the newest is taken to be the one still waiting.
    pub async fn participants(&self) -> Result<Vec<Participant>> {
        self.leases.participants(&Holders(&self.max)).await
    }

    /// Waits as long as it takes to acquire `qty` leases.
    ///
    /// Cancellation-safe: dropping the future gives back the leases taken so
    /// far and removes every node it made. Fails at once with
    /// [`Error::InvalidArgument`] if `qty` is 0 or more than the maximum.
    pub async fn acquire(&self, qty: u32) -> Result<Vec<Lease>> {
        self.acquire_until(qty, None)
            .await?
            .ok_or_else(|| Error::Backend("acquire without deadline timed out".into()))
    }

    /// Acquires one lease, waiting as long as it takes.
    pub async fn acquire_one(&self) -> Result<Lease> {
        let mut leases = self.acquire(1).await?;
        Ok(leases.pop().expect("one lease"))
    }

    /// Waits at most `timeout` (for all `qty` leases together); fails with
    /// [`Error::Timeout`] if they could not be had in time, giving back those
    /// already taken and leaving no node behind.
    pub async fn acquire_timeout(&self, qty: u32, timeout: Duration) -> Result<Vec<Lease>> {
        self.acquire_until(qty, Some(timeout))
            .await?
            .ok_or(Error::Timeout(timeout))
    }

    /// Acquires `qty` leases only if they can be had without waiting.
    pub async fn try_acquire(&self, qty: u32) -> Result<Option<Vec<Lease>>> {
        self.acquire_until(qty, Some(Duration::ZERO)).await
    }

    fn check_qty(&self, qty: u32) -> Result<()> {
        if qty == 0 {
            return Err(Error::InvalidArgument(format!(
                "qty cannot be 0: acquire at least 1 lease of the semaphore at {}",
                self.path
            )));
        }
        let max = self.max.current();
        if max <= 0 {
            return Err(Error::InvalidArgument(format!(
                "the semaphore at {} has a maximum of {max} leases: nothing can be acquired",
                self.path
            )));
        }
        if i64::from(qty) > max {
            return Err(Error::InvalidArgument(format!(
                "cannot acquire {qty} leases of the semaphore at {}: its maximum is {max}",
                self.path
            )));
        }
        Ok(())
    }

    async fn acquire_until(
        &self,
        qty: u32,
        timeout: Option<Duration>,
    ) -> Result<Option<Vec<Lease>>> {
        self.check_qty(qty)?;
        let deadline = deadline(timeout);
        let retry_policy = self.session().options().retry;
        // Not `with_capacity(qty)`: a huge `qty` (up to u32::MAX is allowed
        // under a huge maximum) would abort the process on allocation.
        let mut leases = Vec::new();
        while leases.len() < qty as usize {
            let mut retry = 0;
            loop {
                let attempt = match self.acquire_lease(deadline).await {
                    Ok(attempt) => attempt,
                    Err(e) => {
                        return_all(leases).await;
                        return Err(e);
                    }
                };
                match attempt {
                    Attempt::Acquired(lease) => {
                        leases.push(lease);
                        break;
                    }
                    Attempt::TimedOut => {
                        return_all(leases).await;
                        return Ok(None);
                    }
                    Attempt::MissingNode if retry < retry_policy.max_retries => {
                        tokio::time::sleep(retry_policy.sleep_for(retry)).await;
                        retry += 1;
                    }
                    Attempt::MissingNode => {
                        return_all(leases).await;
                        return Err(Error::NoNode {
                            path: format!(
                                "{}: sequential path not found - possible session loss",
                                self.leases.dir
                            ),
                        });
                    }
                }
            }
        }
        Ok(Some(leases))
    }

    /// One lease, Curator's `internalAcquire1Lease`: under the `locks` mutex,
    /// create the lease node and wait until the leases fit the maximum.
    async fn acquire_lease(&self, deadline: Option<Instant>) -> Result<Attempt> {
        let lock = match deadline {
            None => self.locks.acquire().await?,
            Some(d) => match self.locks.acquire_timeout(remaining(d)).await {
                Ok(guard) => guard,
                Err(Error::Timeout(_)) => return Ok(Attempt::TimedOut),
                Err(e) => return Err(e),
            },
        };
        let attempt = self.lease_under_lock(deadline).await;
        match (attempt, to_completion(lock.release()).await) {
            (Ok(attempt), Ok(())) => Ok(attempt),
            // The session that held the mutex is gone: our lease was not
            // admitted under it, whichever session made it. Give it back and
            // start over.
            (Ok(attempt), Err(Error::Lost { .. })) => {
                return_attempt(attempt).await;
                Ok(Attempt::MissingNode)
            }
            (Ok(attempt), Err(e)) => {
                return_attempt(attempt).await;
                Err(e)
            }
            (Err(e), _) => Err(e),
        }
    }

    async fn lease_under_lock(&self, deadline: Option<Instant>) -> Result<Attempt> {
        let session = &self.leases.session;
        // Subscribe before looking, so that no change of the maximum is missed.
        let changes = self.max.subscribe();
        let data = self
            .data
            .as_deref()
            .unwrap_or(&session.options().default_data);
        let (pending, created, children) = match self
            .leases
            .enter(data, CreateMode::EphemeralSequential)
            .await
        {
            Ok(entered) => entered,
            // The container reaper removed the empty `leases` directory
            // between its creation and ours: go again.
            Err(Error::NoNode { .. }) => return Ok(Attempt::MissingNode),
            Err(e) => return Err(e),
        };
        let wake = Notify::new();
        let predicate = LeaseCount(&self.max);
        let waited = tokio::select! {
            waited = self.leases.wait(&created, children, &predicate, deadline, Some(&wake)) => waited,
            never = forward_changes(changes, &wake) => match never {},
        };
        match waited {
            Ok(()) => {
                pending.disarm();
                let node = HeldNode::new(session, &self.path, "lease", created);
                Ok(Attempt::Acquired(Lease {
                    acquisition: Acquisition::new(node),
                    data: data.to_vec(),
                    released: false,
                }))
            }
            Err(Stop::TimedOut) => {
                to_completion(pending.delete()).await?;
                Ok(Attempt::TimedOut)
            }
            Err(Stop::Failed(Error::NoNode { .. })) => {
                to_completion(pending.delete()).await?;
                Ok(Attempt::MissingNode)
            }
            Err(Stop::Failed(e)) => {
                // Keep the primary error; the node goes in the background.
                drop(pending);
                Err(e)
            }
        }
    }
}

/// Turns changes of the maximum into wake-ups of the waiting acquirer.
/// Never returns.
async fn forward_changes(
    changes: Option<tokio::sync::watch::Receiver<VersionedValue<i32>>>,
    wake: &Notify,
) -> std::convert::Infallible {
    if let Some(mut changes) = changes {
        while changes.changed().await.is_ok() {
            // A permit is kept if the waiter is not listening yet.
            wake.notify_one();
        }
    }
    std::future::pending().await
}

/// Runs a clean-up (a release or a delete) to completion even if the caller
/// is cancelled meanwhile: a half-done release must not orphan a node that
/// blocks every other acquirer.
async fn to_completion(
    cleanup: impl std::future::Future<Output = Result<()>> + Send + 'static,
) -> Result<()> {
    tokio::spawn(cleanup)
        .await
        .unwrap_or_else(|e| Err(Error::Backend(format!("clean-up task failed: {e}"))))
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

async fn return_attempt(attempt: Attempt) {
    if let Attempt::Acquired(lease) = attempt {
        let _ = lease.release().await;
    }
}

/// Gives leases back, ignoring errors (Curator's `returnAll`).
async fn return_all(leases: Vec<Lease>) {
    for lease in leases {
        let _ = lease.release().await;
    }
}

/// One lease of a [`Semaphore`] (Curator's `Lease`): an owned object, free to
/// move between tasks. Give it back with [`release`](Self::release); dropping
/// it gives it back in the background. If the session that made it is lost,
/// the lease is gone too ([`lost`](Self::lost) tells).
#[derive(Debug)]
#[must_use = "dropping the lease gives it back"]
pub struct Lease {
    acquisition: Acquisition,
    data: Vec<u8>,
    released: bool,
}

impl Deref for Lease {
    type Target = Acquisition;

    fn deref(&self) -> &Acquisition {
        &self.acquisition
    }
}

impl Lease {
    /// The lease node's name (Curator's `getNodeName`).
    pub fn name(&self) -> &str {
        self.held_node().created.name()
    }

    /// The data stored in the lease node.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// Gives the lease back: deletes its node (a node already gone is fine,
    /// as in Curator). Reports [`Error::Lost`] if the lease had been lost
    /// before, so the caller learns its work was not protected —
    /// [`Error::Closed`] if its session was closed (which took the node).
    ///
    /// Cancellation-safe: if this future is dropped before the node is
    /// deleted, the lease is given back in the background.
    pub async fn release(mut self) -> Result<()> {
        let released = self.held_node().release().await;
        self.released = true;
        released
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.released {
            let node = self.held_node();
            node.session.delete_in_background(node.created.path.clone());
        }
    }
}
