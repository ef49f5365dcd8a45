//! [`Semaphore`]: a counting semaphore of leases — Curator's
//! `InterProcessSemaphoreV2`, node for node.
//!
//! Layout (a compatibility contract with Curator 5.4), for a semaphore at
//! `<path>`:
//! - `<path>/locks`: an internal [`Mutex`] (`_c_<uuid>-lock-<seq>` nodes)
//!   that serialises acquirers;
//! - `<path>/leases`: one `_c_<uuid>-lease-<seq>` ephemeral-sequential node
//!   per lease (data: the semaphore's node data, else the session's default
//!   data; none if [revocable](Semaphore::revocable), which uses the
//!   mutex's revocation protocol on the lease node — an addition Curator's
//!   semaphore does not have and ignores).
//!
//! Acquiring one lease is exactly Curator's algorithm: take the `locks`
//! mutex, create the lease node, wait (watching the children of `leases`)
//! until there are at most `max` lease nodes — ours included — then release
//! the mutex. Only the acquirer at the head of the `locks` queue ever watches
//! `leases`; everyone else waits in the mutex's queue, in order. Because dlock
//! serialises through the same mutex, dlock and Java clients can share one
//! semaphore safely.
//!
//! With [`Semaphore::with_layout`]`(`[`Layout::Kazoo`]`)` the semaphore is
//! kazoo's instead, node for node and step for step (see `kazoo.rs` and
//! the contract in [`layout`](super::layout)): Python clients of kazoo's
//! `Semaphore` and dlock clients then share it. The two layouts do not
//! mix: a Curator-layout and a kazoo-layout semaphore on one path count
//! different nodes.
//!
//! Differences from Curator, all client-side: `qty == 0`, `qty > max` and a
//! maximum of 0 fail at once with [`Error::InvalidArgument`] (Curator
//! self-deadlocks on `qty > max` until its timeout), and every lease is an
//! owned [`Lease`] with a fencing token and a lost signal, released in the
//! background if dropped. `acquire(qty)` takes all its leases under one
//! hold of the internal lock, where Curator takes the lock once per lease
//! and two acquirers of several leases each can deadlock.

mod acquire;
mod kazoo;
mod lease;
mod max;

use std::time::Duration;

pub(crate) use self::kazoo::{is_lease_name as is_kazoo_lease, lock_path as kazoo_lock_path};
pub use self::lease::Lease;
use self::max::{Holders, Max};
use super::deadline::{timed_acquire, Deadline};
use super::layout::Layout;
use super::mutex::Mutex;
use super::queue::{Participant, WaitQueue};
use super::shared_count::SharedCount;
use crate::error::{Error, Result};
use crate::path;
use crate::session::Session;

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
    /// kazoo's lease pool, in kazoo's layout.
    kazoo: Option<kazoo::Pool>,
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
        path::validate_recipe(path, "a semaphore")?;
        Ok(Semaphore {
            path: path.to_string(),
            locks: Mutex::new(session, &path::join(path, LOCK_PARENT))?,
            // Its predicate counts every lease, ours and those behind.
            leases: WaitQueue::new(
                session,
                &path::join(path, LEASE_PARENT),
                LEASE_NAME,
                &[LEASE_NAME],
            )?
            .listing_when_woken(),
            max,
            data: None,
            kazoo: None,
        })
    }

    /// Uses `layout`'s nodes and algorithm: [`Layout::Curator`] (the
    /// default) or [`Layout::Kazoo`] — kazoo's `Semaphore`: leases are
    /// `<path>/<uuid hex>` nodes, the maximum is stored in `<path>`, and
    /// acquirers take turns under a kazoo lock at `<path>-__lock__` (both
    /// persistent, as kazoo leaves them).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for [`Layout::Consul`] (that is the
    /// [`KvSemaphore`](crate::KvSemaphore)), and for [`Layout::Kazoo`] with
    /// a maximum from a [`SharedCount`] (kazoo's maximum is fixed).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// use dlock::{Layout, Semaphore};
    /// let session = dlock::connect("embedded").await?;
    /// let sem = Semaphore::new(&session, "/doc/kazoo-sem", 2)?.with_layout(Layout::Kazoo)?;
    /// let lease = sem.acquire_one().await?;
    /// assert_eq!(session.get_data("/doc/kazoo-sem").await?.0, b"2"); // kazoo's max_leases
    /// assert_eq!(lease.name().len(), 32); // a uuid in hex
    /// let taller = Semaphore::new(&session, "/doc/kazoo-sem", 3)?.with_layout(Layout::Kazoo)?;
    /// assert!(taller.try_acquire(1).await.is_err()); // kazoo refuses another maximum too
    /// lease.release().await?;
    /// # session.delete("/doc/kazoo-sem", None).await?; session.delete("/doc/kazoo-sem-__lock__", None).await?; Ok(()) }
    /// ```
    pub fn with_layout(mut self, layout: Layout) -> Result<Self> {
        let session = self.leases.session.clone();
        match (layout, &self.max) {
            (Layout::Curator, _) => {
                self.locks = Mutex::new(&session, &path::join(&self.path, LOCK_PARENT))?;
                self.kazoo = None;
            }
            (Layout::Kazoo, Max::Fixed(max)) => {
                self.locks = Mutex::new(&session, &kazoo::lock_path(&self.path))?
                    .with_layout(Layout::Kazoo)?;
                self.kazoo = Some(kazoo::Pool::new(&session, &self.path, *max));
            }
            (Layout::Kazoo, Max::Count(_)) => {
                return Err(Error::InvalidArgument(format!(
                    "the semaphore at {}: kazoo's layout stores a fixed maximum, not a SharedCount",
                    self.path
                )))
            }
            (other, _) => {
                return Err(Error::InvalidArgument(format!(
                    "the semaphore at {} has no {other} layout (see KvSemaphore)",
                    self.path
                )))
            }
        }
        Ok(self)
    }

    /// Whose nodes this semaphore uses.
    pub fn layout(&self) -> Layout {
        match self.kazoo {
            Some(_) => Layout::Kazoo,
            None => Layout::Curator,
        }
    }

    /// Stores `data` in this semaphore's lease nodes instead of the session's
    /// default data (Curator's `setNodeData`).
    pub fn with_data(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.data = Some(data.into());
        self
    }

    /// Makes every lease revocable (CURATOR-650; in Curator's layout — a
    /// kazoo-layout semaphore does not listen): `listener` is called with
    /// the lease node's path whenever someone asks for it with
    /// [`revoke`](crate::revoke) — while the lease is held or being
    /// acquired. Cooperative: the holder decides to give the lease back.
    /// The protocol is the mutex's (Curator's `Revoker`: `__REVOKE__`
    /// written into the lease node, which its owner watches), so a
    /// revocable lease node carries no data, and Curator's own semaphore —
    /// which has no revocation — simply ignores requests.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// let session = dlock::connect("embedded").await?;
    /// let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    /// let sem = dlock::Semaphore::new(&session, "/doc/sem-revocable", 2)?
    ///     .revocable(move |node: &str| { let _ = tx.send(node.to_string()); });
    /// let lease = sem.acquire_one().await?;
    /// dlock::revoke(&session, lease.node()).await?;
    /// assert_eq!(rx.recv().await.as_deref(), Some(lease.node()));
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn revocable(mut self, listener: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.leases.revocation = Some(super::revocation::Listener::new(listener));
        self
    }

    /// Limits every lease to `max_hold` (Redisson's
    /// `PermitExpirableSemaphore`): at the limit the library deletes the
    /// lease node from a task of its own, the lease's
    /// [`lost`](crate::Acquisition::lost) signal fires, its guarded writes
    /// are refused, and a waiting acquirer gets the permit at once.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// use std::time::Duration;
    /// let session = dlock::connect("embedded").await?;
    /// let sem = dlock::Semaphore::new(&session, "/doc/sem-max-hold", 1)?.with_max_hold(Duration::from_millis(50));
    /// let lease = sem.acquire_one().await?;
    /// let next = sem.acquire_one().await?;         // waits until the first permit expires
    /// assert!(lease.is_lost());
    /// # next.release().await?; let _ = lease.release().await;
    /// # Ok(()) }
    /// ```
    pub fn with_max_hold(mut self, max_hold: Duration) -> Self {
        self.leases.max_hold = Some(max_hold);
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
        if let Some(pool) = &self.kazoo {
            return pool.participants().await;
        }
        // An acquirer waits only while it holds the internal lock: one
        // listing tells (its nodes' data is not needed).
        let acquiring = match self.session().children(self.locks.path()).await {
            Ok(locks) => !locks.is_empty(),
            Err(Error::NoNode { .. }) => false,
            Err(e) => return Err(e),
        };
        let holders = Holders {
            max: &self.max,
            acquiring,
        };
        self.leases.participants(&holders).await
    }

    /// The leases held now, in sequence order, without acquiring
    /// (CURATOR-230): [`participants`](Self::participants) less the one an
    /// acquirer still waits on.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// let session = dlock::connect("embedded").await?;
    /// let sem = dlock::Semaphore::new(&session, "/doc/sem-holders", 2)?.with_data(b"worker-7".to_vec());
    /// let lease = sem.acquire_one().await?;
    /// let holders = sem.holders().await?;
    /// assert!(holders.len() == 1 && holders[0].data == b"worker-7" && holders[0].token == lease.token());
    /// # lease.release().await?; Ok(()) }
    /// ```
    pub async fn holders(&self) -> Result<Vec<Participant>> {
        let mut all = self.participants().await?;
        all.retain(|p| p.holds);
        Ok(all)
    }

    /// How many leases could be had now, without acquiring (CURATOR-230):
    /// the maximum less the leases held (never below 0, as a lowered
    /// [`SharedCount`] maximum never revokes leases).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// let session = dlock::connect("embedded").await?;
    /// let sem = dlock::Semaphore::new(&session, "/doc/sem-available", 3)?;
    /// let leases = sem.acquire(2).await?;
    /// assert_eq!(sem.available_permits().await?, 1);
    /// # for l in leases { l.release().await?; } Ok(()) }
    /// ```
    pub async fn available_permits(&self) -> Result<i64> {
        let held = self.holders().await?.len() as i64;
        Ok((self.max.current() - held).max(0))
    }

    timed_acquire! {
        /// Waits as long as it takes to acquire `qty` leases.
        ///
        /// Cancellation-safe: dropping the future gives back the leases taken so
        /// far and removes every node it made. Fails at once with
        /// [`Error::InvalidArgument`] if `qty` is 0 or more than the maximum.
        acquire,
        /// Waits at most `timeout` (for all `qty` leases together); fails with
        /// [`Error::Timeout`] if they could not be had in time, giving back those
        /// already taken and leaving no node behind.
        acquire_timeout,
        /// Acquires `qty` leases only if they can be had without waiting.
        try_acquire
        => acquire_until(qty: u32) -> Vec<Lease>
    }

    /// Acquires one lease, waiting as long as it takes.
    pub async fn acquire_one(&self) -> Result<Lease> {
        let mut leases = self.acquire(1).await?;
        Ok(leases.pop().expect("one lease"))
    }
}
