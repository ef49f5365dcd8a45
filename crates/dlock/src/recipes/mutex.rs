//! [`Mutex`]: a fair, re-entrant distributed lock — Curator's
//! `InterProcessMutex`, node for node.
//!
//! Layout (a compatibility contract with Curator 5.4): participants create
//! `<path>/_c_<uuid>-lock-<seq>` ephemeral-sequential nodes (parents as
//! containers); the lowest sequence holds; each waiter watches only its
//! predecessor. A dlock `Mutex` and a Java `InterProcessMutex` on one path
//! exclude each other.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::queue::{deadline, FirstN, HeldNode, Participant, WaitQueue};
use crate::error::{Error, Result};
use crate::session::Session;
use crate::store::{CreateMode, FencingToken, Op, OpResult, SessionState};

/// Curator's node name for mutex participants.
pub(crate) const LOCK_NAME: &str = "lock-";

/// A fair, re-entrant lock shared by every session that names the same path.
///
/// Each [`acquire`](Self::acquire) queues a new participant, so two tasks
/// sharing one `Mutex` exclude each other like two processes. Re-entrancy is
/// explicit, because async tasks have no thread identity: the holder
/// re-enters through its guard ([`MutexGuard::reenter`]) and releases as many
/// times.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// let session = dlock::connect("embedded").await?;
/// let mutex = dlock::Mutex::new(&session, "/locks/mutex-doc")?;
/// let guard = mutex.acquire().await?;
/// let inner = guard.reenter()?;               // no round trip
/// assert!(mutex.try_acquire().await?.is_none()); // another participant must wait
/// inner.release().await?;
/// guard.release().await?;                     // the node goes with the last hold
/// assert!(mutex.try_acquire().await?.is_some());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Mutex {
    queue: WaitQueue,
    data: Option<Vec<u8>>,
}

impl Mutex {
    /// A mutex at `path` (a ZooKeeper-style path), used through `session`.
    pub fn new(session: &Session, path: &str) -> Result<Self> {
        Ok(Mutex {
            queue: WaitQueue::new(session, path, LOCK_NAME, &[LOCK_NAME])?,
            data: None,
        })
    }

    /// Stores `data` in this mutex's lock nodes instead of the session's
    /// default data (Curator stores the host address).
    pub fn with_data(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.data = Some(data.into());
        self
    }

    /// The lock's path.
    pub fn path(&self) -> &str {
        &self.queue.dir
    }

    /// The session this mutex uses.
    pub fn session(&self) -> &Session {
        &self.queue.session
    }

    /// Every participant (holder first, then waiters in queue order), with
    /// node, session, fencing token and data.
    pub async fn participants(&self) -> Result<Vec<Participant>> {
        self.queue.participants(&FirstN(1)).await
    }

    /// Waits as long as it takes to acquire the lock.
    ///
    /// Cancellation-safe: dropping the future removes our queue node.
    pub async fn acquire(&self) -> Result<MutexGuard> {
        self.acquire_until(None)
            .await?
            .ok_or_else(|| Error::Backend("acquire without deadline timed out".into()))
    }

    /// Waits at most `timeout`; fails with [`Error::Timeout`] (leaving no node
    /// behind) if the lock could not be had in time.
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<MutexGuard> {
        self.acquire_until(Some(timeout))
            .await?
            .ok_or(Error::Timeout(timeout))
    }

    /// Acquires only if the lock is free now.
    pub async fn try_acquire(&self) -> Result<Option<MutexGuard>> {
        // Somebody queued already: we could not be first, so spare the
        // store a create and a delete.
        if !self.queue.sorted_children(false).await?.0.is_empty() {
            return Ok(None);
        }
        self.acquire_until(Some(Duration::ZERO)).await
    }

    async fn acquire_until(&self, timeout: Option<Duration>) -> Result<Option<MutexGuard>> {
        let session = &self.queue.session;
        let data = self.data.as_deref().unwrap_or(&session.options().default_data);
        let created = self
            .queue
            .acquire(data, CreateMode::EphemeralSequential, &FirstN(1), deadline(timeout), None)
            .await?;
        Ok(created.map(|created| MutexGuard {
            held: Arc::new(Held {
                node: HeldNode::new(session, self.path(), "lock", created),
                holds: AtomicUsize::new(1),
            }),
            released: false,
        }))
    }
}

#[derive(Debug)]
struct Held {
    node: Arc<HeldNode>,
    holds: AtomicUsize,
}

/// One hold of a [`Mutex`]. The lock is released when the last hold is
/// released — with [`release`](Self::release), or by dropping, which deletes
/// the node in the background.
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock"]
pub struct MutexGuard {
    held: Arc<Held>,
    released: bool,
}

impl MutexGuard {
    /// The fencing token of this acquisition: larger than that of every
    /// earlier acquisition of any lock in the store.
    pub fn token(&self) -> FencingToken {
        self.held.node.created.token()
    }

    /// The full path of our lock node.
    pub fn node(&self) -> &str {
        &self.held.node.created.path
    }

    /// How many holds (this one included) are still unreleased.
    pub fn holds(&self) -> usize {
        self.held.holds.load(Ordering::SeqCst)
    }

    /// Acquires again without a round trip; release the new guard too.
    /// Fails with [`Error::Lost`] if the lock was lost meanwhile.
    pub fn reenter(&self) -> Result<MutexGuard> {
        if self.is_lost() {
            return Err(self.held.node.lost_error());
        }
        self.held.holds.fetch_add(1, Ordering::SeqCst);
        Ok(MutexGuard {
            held: self.held.clone(),
            released: false,
        })
    }

    /// Whether the session that acquired the lock is over: then another
    /// participant may hold it now.
    pub fn is_lost(&self) -> bool {
        self.held.node.is_lost()
    }

    /// Whether the connection is down right now: the lock may or may not
    /// still be ours until the session reconnects or is lost.
    pub fn is_suspended(&self) -> bool {
        self.held.node.session.state() == SessionState::Suspended
    }

    /// Resolves when the lock is lost (the session expired, was closed, or was
    /// replaced). Use it to stop the protected work:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// # let mutex = dlock::Mutex::new(&session, "/locks/lost-doc")?;
    /// let guard = mutex.acquire().await?;
    /// tokio::select! {
    ///     _ = guard.lost() => println!("lost the lock: stop writing"),
    ///     _ = async { /* protected work */ } => {}
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn lost(&self) {
        let node = &self.held.node;
        node.session.lost(node.session_id).await
    }

    /// Applies `ops` atomically only if we still hold the lock (our node
    /// still exists): a write that cannot land after the lock is lost.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// use dlock::store::{CreateMode, CreateOptions, Op};
    /// # let session = dlock::connect("embedded").await?;
    /// session.create("/doc/guarded/stock", b"5", CreateOptions::new(CreateMode::Persistent).with_parents()).await?;
    /// let guard = dlock::Mutex::new(&session, "/doc/guarded/lock")?.acquire().await?;
    /// guard.guarded(&[Op::SetData { path: "/doc/guarded/stock".into(), data: b"4".to_vec(), version: None }]).await?;
    /// # guard.release().await?; session.delete("/doc/guarded/stock", None).await?;
    /// # Ok(()) }
    /// ```
    pub async fn guarded(&self, ops: &[Op]) -> Result<Vec<OpResult>> {
        let node = &self.held.node;
        if self.is_lost() {
            return Err(node.lost_error());
        }
        let mut all = Vec::with_capacity(ops.len() + 1);
        all.push(Op::Check {
            path: node.created.path.clone(),
            version: None,
        });
        all.extend_from_slice(ops);
        match node.session.multi(&all).await {
            Ok(mut results) => {
                results.remove(0);
                Ok(results)
            }
            Err(Error::MultiFailed { index: 0, .. }) => Err(node.lost_error()),
            Err(Error::MultiFailed { index, source }) => Err(Error::MultiFailed {
                index: index - 1,
                source,
            }),
            Err(e) => Err(e),
        }
    }

    /// Releases this hold; the last one deletes the lock node. Reports
    /// [`Error::Lost`] if the lock had been lost before (the node is gone
    /// either way), so the caller learns its work was not protected.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        if self.held.holds.fetch_sub(1, Ordering::SeqCst) > 1 {
            return Ok(());
        }
        self.held.node.release().await
    }
}

impl Drop for MutexGuard {
    fn drop(&mut self) {
        if !self.released && self.held.holds.fetch_sub(1, Ordering::SeqCst) == 1 {
            let node = &self.held.node;
            node.session.delete_in_background(node.created.path.clone());
        }
    }
}
