//! [`Mutex`]: a fair, re-entrant distributed lock — Curator's
//! `InterProcessMutex`, node for node.
//!
//! Layout (a compatibility contract with Curator 5.4): participants create
//! `<path>/_c_<uuid>-lock-<seq>` ephemeral-sequential nodes (parents as
//! containers); the lowest sequence holds; each waiter watches only its
//! predecessor. A dlock `Mutex` and a Java `InterProcessMutex` on one path
//! exclude each other.
//!
//! kazoo's lock nodes (`<uuid hex>__lock__<seq>`, `__rlock__`) on the path
//! are ordered among ours by their sequence, so a kazoo holder keeps a
//! dlock `Mutex` out; with [`Layout::Kazoo`] dlock
//! writes kazoo's names, so that kazoo keeps out of a dlock holder too. The
//! contract is in [`layout`](super::layout).

use std::time::Duration;

use super::deadline::{timed_acquire, Deadline};
use super::guard::LockGuard;
use super::layout::Layout;
use super::queue::{is_kazoo_node, is_sequenced, FirstN, Participant, WaitQueue, CURATOR_LOCK};
use crate::error::Result;
use crate::session::Session;
use crate::store::CreateMode;

/// Curator's node name for mutex participants.
pub(crate) const LOCK_NAME: &str = CURATOR_LOCK;

/// Whether `name` is a queue node of a mutex — or of a leader selector,
/// which queues on a mutex: the two layouts are one (as in Curator) — in
/// Curator's layout or kazoo's.
pub(crate) fn is_node(name: &str) -> bool {
    is_sequenced(name, LOCK_NAME) || is_kazoo_node(name)
}

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
            queue: WaitQueue::mutex(session, path)?,
            data: None,
        })
    }

    /// Writes `layout`'s nodes: [`Layout::Curator`] (the default) or
    /// [`Layout::Kazoo`] (`<uuid hex>__lock__<seq>` in a persistent
    /// directory, which kazoo's `Lock` and `Election` see without
    /// `extra_lock_patterns`). Either way kazoo's nodes on the path are
    /// ordered among ours.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for
    /// [`Layout::Consul`] (that is [`ConsulLock`](crate::ConsulLock)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// use dlock::{Layout, Mutex};
    /// let session = dlock::connect("embedded").await?;
    /// let mutex = Mutex::new(&session, "/doc/kazoo-mutex")?.with_layout(Layout::Kazoo)?;
    /// let guard = mutex.acquire().await?;
    /// assert!(guard.node().contains("__lock__"));
    /// guard.release().await?;
    /// assert!(Mutex::new(&session, "/doc/m")?.with_layout(Layout::Consul).is_err());
    /// # session.delete("/doc/kazoo-mutex", None).await?; Ok(()) }
    /// ```
    pub fn with_layout(mut self, layout: Layout) -> Result<Self> {
        self.queue = self.queue.with_layout(layout)?;
        Ok(self)
    }

    /// Whose nodes this mutex writes.
    pub fn layout(&self) -> Layout {
        self.queue.layout()
    }

    /// Stores `data` in this mutex's lock nodes instead of the session's
    /// default data (Curator stores the host address).
    pub fn with_data(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.data = Some(data.into());
        self
    }

    /// Makes the mutex revocable: `listener` is called with our node's path
    /// whenever someone asks for it with [`revoke`](crate::revoke) — while we
    /// hold the lock or wait for it. Cooperative: the holder decides to
    /// release. Revocable lock nodes carry no data, as in Curator.
    pub fn revocable(mut self, listener: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.queue.revocation = Some(super::revocation::Listener::new(listener));
        self
    }

    /// Limits every hold of this mutex to `max_hold` (Redisson's
    /// `leaseTime`): at the limit the library itself deletes the lock node —
    /// from a task of its own, so even if the holder is stuck — the hold's
    /// [`lost`](crate::Acquisition::lost) signal fires, its guarded writes
    /// are refused, and the next waiter gets the lock at once, without
    /// waiting for the session to expire. Releasing earlier stands the
    /// limit down.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// use std::time::Duration;
    /// let session = dlock::connect("embedded").await?;
    /// let mutex = dlock::Mutex::new(&session, "/doc/max-hold")?.with_max_hold(Duration::from_millis(50));
    /// let guard = mutex.acquire().await?;
    /// guard.lost().await;                          // the limit passed
    /// assert!(guard.is_lost());
    /// let next = mutex.acquire().await?;           // free again at once
    /// assert!(matches!(guard.release().await, Err(dlock::Error::Lost { .. })));
    /// # next.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn with_max_hold(mut self, max_hold: Duration) -> Self {
        self.queue.max_hold = Some(max_hold);
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

    timed_acquire! {
        /// Waits as long as it takes to acquire the lock.
        ///
        /// Cancellation-safe: dropping the future removes our queue node.
        acquire,
        /// Waits at most `timeout`; fails with [`Error::Timeout`](crate::Error::Timeout) (leaving no node
        /// behind) if the lock could not be had in time.
        acquire_timeout,
        /// Acquires only if the lock is free now.
        try_acquire
        => acquire_until() -> MutexGuard
    }

    /// Acquires by `deadline`; `None` if it passed first.
    pub(crate) async fn acquire_until(&self, deadline: Deadline) -> Result<Option<MutexGuard>> {
        if self.queue.taken_now(deadline, |_| true).await? {
            return Ok(None);
        }
        let session = &self.queue.session;
        let data = self
            .data
            .as_deref()
            .unwrap_or(&session.options().default_data);
        let created = self
            .queue
            .acquire(
                data,
                CreateMode::EphemeralSequential,
                &FirstN(1),
                deadline,
                None,
            )
            .await?;
        Ok(created.map(|created| LockGuard::new(self.queue.hold(self.path(), "lock", created))))
    }
}

/// One hold of a [`Mutex`]; see [`LockGuard`].
pub type MutexGuard = LockGuard;
