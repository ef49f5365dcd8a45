//! [`SemaphoreMutex`]: a non-re-entrant lock whose guard may be released
//! from any task — Curator's `InterProcessSemaphoreMutex`.
//!
//! It is a [`Semaphore`] with a maximum of one lease, on the semaphore's
//! layout (`<path>/locks`, `<path>/leases`), so it excludes Curator's
//! `InterProcessSemaphoreMutex` on the same path. It does **not** exclude a
//! [`Mutex`](crate::Mutex) or Curator's `InterProcessMutex` on that path
//! (different layout), exactly as in Curator.

use std::time::Duration;

use super::deadline::{timed_acquire, Deadline};
use super::queue::Participant;
use super::semaphore::{Lease, Semaphore};
use crate::error::Result;
use crate::session::Session;

/// A non-re-entrant distributed lock (Curator's
/// `InterProcessSemaphoreMutex`).
///
/// Unlike [`Mutex`](crate::Mutex), a holder that acquires again waits for
/// itself (there is no re-entrancy), and the guard is a plain owned
/// [`Lease`]: move it to another task and release it there.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// use dlock::recipes::semaphore_mutex::SemaphoreMutex;
/// let session = dlock::connect("embedded").await?;
/// let lock = SemaphoreMutex::new(&session, "/doc/semaphore-mutex")?;
/// let guard = lock.acquire().await?;
/// assert!(lock.try_acquire().await?.is_none(), "not re-entrant");
/// // Released by another task.
/// tokio::spawn(async move { guard.release().await }).await.unwrap()?;
/// assert!(lock.try_acquire().await?.is_some());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SemaphoreMutex {
    semaphore: Semaphore,
}

/// The hold of a [`SemaphoreMutex`]: its one [`Lease`].
pub type SemaphoreMutexGuard = Lease;

impl SemaphoreMutex {
    /// A lock at `path`, used through `session`.
    pub fn new(session: &Session, path: &str) -> Result<Self> {
        Ok(SemaphoreMutex {
            semaphore: Semaphore::new(session, path, 1)?,
        })
    }

    /// Stores `data` in the lease node instead of the session's default
    /// data.
    pub fn with_data(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.semaphore = self.semaphore.with_data(data);
        self
    }

    /// Makes the lock revocable (see [`Semaphore::revocable`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// let session = dlock::connect("embedded").await?;
    /// let lock = dlock::SemaphoreMutex::new(&session, "/doc/sm-revocable")?
    ///     .revocable(|node: &str| println!("asked to release {node}"));
    /// let guard = lock.acquire().await?;
    /// dlock::revoke(&session, guard.node()).await?;
    /// # guard.release().await?; Ok(()) }
    /// ```
    pub fn revocable(mut self, listener: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.semaphore = self.semaphore.revocable(listener);
        self
    }

    /// Limits every hold to `max_hold` (see [`Semaphore::with_max_hold`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// use std::time::Duration;
    /// let session = dlock::connect("embedded").await?;
    /// let lock = dlock::SemaphoreMutex::new(&session, "/doc/sm-max-hold")?.with_max_hold(Duration::from_millis(50));
    /// let guard = lock.acquire().await?;
    /// guard.lost().await;
    /// # let _ = guard.release().await; Ok(()) }
    /// ```
    pub fn with_max_hold(mut self, max_hold: std::time::Duration) -> Self {
        self.semaphore = self.semaphore.with_max_hold(max_hold);
        self
    }

    /// The lock's path.
    pub fn path(&self) -> &str {
        self.semaphore.path()
    }

    /// The session this lock uses.
    pub fn session(&self) -> &Session {
        self.semaphore.session()
    }

    /// The lease nodes (the holder's, and the head waiter's while it checks).
    pub async fn participants(&self) -> Result<Vec<Participant>> {
        self.semaphore.participants().await
    }

    timed_acquire! {
        /// Waits as long as it takes to acquire the lock. Cancellation-safe.
        acquire,
        /// Waits at most `timeout`; fails with [`Error::Timeout`](crate::Error::Timeout)
        /// (leaving no node behind) if the lock could not be had in time.
        acquire_timeout,
        /// Acquires only if the lock is free now.
        try_acquire
        => acquire_until() -> SemaphoreMutexGuard
    }

    /// Acquires by `deadline`; `None` if it passed first.
    pub(crate) async fn acquire_until(
        &self,
        deadline: Deadline,
    ) -> Result<Option<SemaphoreMutexGuard>> {
        Ok(self.semaphore.acquire_until(1, deadline).await?.map(one))
    }
}

fn one(mut leases: Vec<Lease>) -> Lease {
    leases.pop().expect("one lease")
}
