//! [`Barrier`]: waiters block while a node exists — Curator's
//! `DistributedBarrier`, node for node.
//!
//! Layout (a compatibility contract with Curator 5.4): the barrier is the
//! single node at `<path>` itself, `PERSISTENT`, holding the session's
//! default data (Curator's: the local address); missing ancestors are
//! created as containers. Setting an existing barrier and removing a
//! missing one are no-ops, as in Curator; waiters watch the node with
//! `exists`. A dlock waiter sees a Curator `setBarrier`/`removeBarrier`, and
//! the reverse.

use std::time::Duration;

use super::deadline::Deadline;
use crate::error::{Error, Result};
use crate::path;
use crate::session::Session;
use crate::store::{CreateMode, CreateOptions};

/// A barrier at one path: [`set_barrier`](Self::set_barrier) closes it,
/// [`remove_barrier`](Self::remove_barrier) opens it, and
/// [`wait_on_barrier`](Self::wait_on_barrier) waits while it is closed.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// let session = dlock::connect("embedded").await?;
/// let barrier = dlock::Barrier::new(&session, "/barriers/doc")?;
/// barrier.set_barrier().await?;
/// let waiter = tokio::spawn({
///     let barrier = barrier.clone();
///     async move { barrier.wait_on_barrier().await }
/// });
/// barrier.remove_barrier().await?;
/// waiter.await.unwrap()?; // the barrier is gone: the waiter goes on
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Barrier {
    session: Session,
    path: String,
}

impl Barrier {
    /// A barrier at `path` (not the root), used through `session`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// let session = dlock::connect("embedded").await?;
    /// assert!(dlock::Barrier::new(&session, "/").is_err());
    /// assert_eq!(dlock::Barrier::new(&session, "/b")?.path(), "/b");
    /// # Ok(()) }
    /// ```
    pub fn new(session: &Session, path: &str) -> Result<Self> {
        path::validate_recipe(path, "a barrier")?;
        Ok(Barrier {
            session: session.clone(),
            path: path.to_string(),
        })
    }

    /// The barrier's node.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// assert_eq!(dlock::Barrier::new(&session, "/b")?.path(), "/b");
    /// # Ok(()) }
    /// ```
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Closes the barrier: creates its node (already there: nothing to do).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let barrier = dlock::Barrier::new(&session, "/barriers/set")?;
    /// barrier.set_barrier().await?;
    /// barrier.set_barrier().await?; // twice is fine
    /// assert!(session.exists("/barriers/set").await?.is_some());
    /// # barrier.remove_barrier().await?; Ok(()) }
    /// ```
    pub async fn set_barrier(&self) -> Result<()> {
        let data = &self.session.options().default_data;
        let opts = CreateOptions::new(CreateMode::Persistent).with_parents();
        match (self.session)
            .retrying(|| self.session.create(&self.path, data, opts))
            .await
        {
            Ok(_) | Err(Error::NodeExists { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Opens the barrier: deletes its node (already gone: nothing to do).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let barrier = dlock::Barrier::new(&session, "/barriers/remove")?;
    /// barrier.remove_barrier().await?; // never set: fine
    /// barrier.set_barrier().await?;
    /// barrier.remove_barrier().await?;
    /// assert!(session.exists("/barriers/remove").await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn remove_barrier(&self) -> Result<()> {
        match (self.session)
            .retrying(|| self.session.delete(&self.path, None))
            .await
        {
            Ok(()) | Err(Error::NoNode { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Waits as long as the barrier is set (returns at once if it is not).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let barrier = dlock::Barrier::new(&session, "/barriers/open")?;
    /// barrier.wait_on_barrier().await?; // not set: no wait
    /// # Ok(()) }
    /// ```
    pub async fn wait_on_barrier(&self) -> Result<()> {
        Deadline::within(None, &self.session, |d| self.wait_until(d)).await
    }

    /// Waits at most `timeout` for the barrier to go; fails with
    /// [`Error::Timeout`] if it is still set then.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// # use std::time::Duration;
    /// let barrier = dlock::Barrier::new(&session, "/barriers/closed")?;
    /// barrier.set_barrier().await?;
    /// let waited = barrier.wait_on_barrier_timeout(Duration::from_millis(50)).await;
    /// assert!(matches!(waited, Err(dlock::Error::Timeout(_))));
    /// # barrier.remove_barrier().await?; Ok(()) }
    /// ```
    pub async fn wait_on_barrier_timeout(&self, timeout: Duration) -> Result<()> {
        Deadline::within(Some(timeout), &self.session, |d| self.wait_until(d)).await
    }

    /// Waits by `deadline` for the node to be gone; `None` if it passed.
    async fn wait_until(&self, deadline: Deadline) -> Result<Option<()>> {
        loop {
            let (stat, watch) = self.session.exists_watch(&self.path).await?;
            if stat.is_none() {
                return Ok(Some(()));
            }
            // Any event (a node event or a session change) means: look again.
            if deadline.race(watch.changed()).await.is_none() {
                return Ok(None);
            }
            if self.session.state() == crate::store::SessionState::Closed {
                return Err(Error::Closed);
            }
        }
    }
}
