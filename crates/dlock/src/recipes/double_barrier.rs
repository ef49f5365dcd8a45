//! [`DoubleBarrier`]: members enter together and leave together — Curator's
//! `DistributedDoubleBarrier`, node for node.
//!
//! Layout (a compatibility contract with Curator 5.4):
//! - `<path>/<uuid>`: one `EPHEMERAL` node per member, named by a random
//!   UUID in its canonical form (`8-4-4-4-12` lowercase hex), holding the
//!   session's default data; `<path>` and its ancestors are created as
//!   containers.
//! - `<path>/ready`: `PERSISTENT`, default data, created (an existing one is
//!   fine) by the member that finds at least `count` members present; its
//!   existence lets everyone in, also late arrivals.
//!
//! Entering creates the member node and waits for `ready`; leaving deletes
//! the member node, waits until no member node is left and deletes `ready`
//! (a missing one is fine). Every child but `ready` counts as a member, so
//! dlock and Curator members on one path count together. (Curator 5.4's
//! leave sorts the members by name: the lowest keeps its node, watching the
//! highest, until it is alone; the others delete theirs and watch the
//! lowest; whoever finds at most itself left deletes `ready`. A dlock
//! member that is gone early only lets those watches fire sooner.)
//!
//! Unlike Curator: a timed-out or cancelled `enter` deletes its member node;
//! entering waits for each member, not only for `ready` (Curator 5.4 could
//! pass a timed enter early on a spurious wake-up, fixed after 5.9); and
//! leaving waits until no member is left, where a Curator member that is
//! not the lowest may end once one other member is left.
//!
//! As in Curator, one barrier path serves one round at a time: `ready` is
//! deleted only by a member whose `leave` finds no member left. Members
//! that drop their `BarrierMember`, time out leaving, or crash leave it
//! behind, and so does a next round's member that enters before the last
//! round's members all left: then the next round's `enter` passes at once,
//! with fewer than `count` in. Use a fresh path per round where rounds can
//! overlap or members can fail.

use std::time::Duration;

use super::deadline::Deadline;
use super::guard::{deref_hold, Acquisition};
use super::queue::{HeldNode, PendingNode};
use crate::error::{Error, Result};
use crate::path;
use crate::session::Session;
use crate::store::{CreateMode, CreateOptions, Created};

/// Curator's name of the node that opens the barrier.
///
/// ```
/// assert_eq!(dlock::recipes::double_barrier::READY_NODE, "ready");
/// ```
pub const READY_NODE: &str = "ready";

/// A double barrier for `count` members at one path. Each
/// [`enter`](Self::enter) is one member (so tasks sharing a `DoubleBarrier`
/// count as several), and [`BarrierMember::leave`] ends it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// let session = dlock::connect("embedded").await?;
/// let barrier = dlock::DoubleBarrier::new(&session, "/barriers/double-doc", 2)?;
/// let (a, b) = tokio::try_join!(barrier.enter(), barrier.enter())?; // both in
/// // ... compute ...
/// tokio::try_join!(a.leave(), b.leave())?; // both out
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct DoubleBarrier {
    session: Session,
    path: String,
    count: usize,
}

impl DoubleBarrier {
    /// A barrier at `path` (not the root) that opens once `count` members
    /// (at least 1) are in; more may enter (a threshold, not a limit).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// assert!(dlock::DoubleBarrier::new(&session, "/d", 0).is_err());
    /// assert_eq!(dlock::DoubleBarrier::new(&session, "/d", 3)?.count(), 3);
    /// # Ok(()) }
    /// ```
    pub fn new(session: &Session, path: &str, count: usize) -> Result<Self> {
        path::validate_recipe(path, "a double barrier")?;
        if count == 0 {
            return Err(Error::InvalidArgument(
                "a double barrier needs at least one member".into(),
            ));
        }
        Ok(DoubleBarrier {
            session: session.clone(),
            path: path.to_string(),
            count,
        })
    }

    /// The barrier's directory.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// assert_eq!(dlock::DoubleBarrier::new(&session, "/d", 3)?.path(), "/d");
    /// # Ok(()) }
    /// ```
    pub fn path(&self) -> &str {
        &self.path
    }

    /// How many members open the barrier.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// assert_eq!(dlock::DoubleBarrier::new(&session, "/d", 3)?.count(), 3);
    /// # Ok(()) }
    /// ```
    pub fn count(&self) -> usize {
        self.count
    }

    /// Enters as a new member and waits until `count` members are in.
    ///
    /// Cancellation-safe: dropping the future removes the member node.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let alone = dlock::DoubleBarrier::new(&session, "/barriers/enter", 1)?;
    /// let member = alone.enter().await?; // one is enough
    /// assert!(member.path().starts_with("/barriers/enter/"));
    /// member.leave().await?;
    /// # Ok(()) }
    /// ```
    pub async fn enter(&self) -> Result<BarrierMember> {
        Deadline::within(None, &self.session, |d| self.enter_until(d)).await
    }

    /// Enters, waiting at most `timeout` for the others; fails with
    /// [`Error::Timeout`] (leaving no member node behind) if they did not
    /// all come in time.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// # use std::time::Duration;
    /// let pair = dlock::DoubleBarrier::new(&session, "/barriers/late", 2)?;
    /// let entered = pair.enter_timeout(Duration::from_millis(50)).await;
    /// assert!(matches!(entered, Err(dlock::Error::Timeout(_))));
    /// # Ok(()) }
    /// ```
    pub async fn enter_timeout(&self, timeout: Duration) -> Result<BarrierMember> {
        Deadline::within(Some(timeout), &self.session, |d| self.enter_until(d)).await
    }

    async fn enter_until(&self, deadline: Deadline) -> Result<Option<BarrierMember>> {
        let session = &self.session;
        let id = uuid::Uuid::new_v4().to_string();
        let node = path::join(&self.path, &id);
        // Armed before the create: if we are dropped while it is under way,
        // the node it may have made goes too.
        let pending = PendingNode::new(session, &node);
        let data = &session.options().default_data;
        let opts = CreateOptions::new(CreateMode::Ephemeral).with_parents();
        let stat = match session.create_or_undo(&node, data, opts).await {
            Ok(created) => created.stat,
            // A create whose reply was lost, retried.
            Err(Error::NodeExists { .. }) => session.exists(&node).await?.unwrap_or_default(),
            Err(e) => return Err(e),
        };
        pending.disarm();
        let created = Created { path: node, stat };
        let mut member = BarrierMember {
            acquisition: Acquisition::new(HeldNode::new(session, &self.path, "member", created)),
            dir: self.path.clone(),
            armed: true,
        };
        let ready = path::join(&self.path, READY_NODE);
        loop {
            let (children, watch) = match session.children_watch(&self.path).await {
                Ok(listed) => listed,
                // Reaped: our node went first, with our session.
                Err(Error::NoNode { .. }) => return Err(member.lost()),
                Err(e) => return Err(e),
            };
            if children.iter().any(|c| c.name == READY_NODE) {
                return Ok(Some(member));
            }
            if !children.iter().any(|c| c.name == id) {
                return Err(member.lost());
            }
            if children.len() >= self.count {
                let opts = CreateOptions::new(CreateMode::Persistent);
                return match session
                    .retrying(|| session.create(&ready, data, opts))
                    .await
                {
                    Ok(_) | Err(Error::NodeExists { .. }) => Ok(Some(member)),
                    Err(e) => Err(e),
                };
            }
            if deadline.race(watch.changed()).await.is_none() {
                member.delete().await?;
                return Ok(None);
            }
        }
    }
}

/// One member inside a [`DoubleBarrier`]. [`leave`](Self::leave) it once
/// its work is done; dropping it instead removes its node in the background
/// (the others then stop waiting for it).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// # let session = dlock::connect("embedded").await?;
/// let barrier = dlock::DoubleBarrier::new(&session, "/barriers/member", 1)?;
/// let member = barrier.enter().await?;
/// assert!(session.exists(member.path()).await?.is_some());
/// assert!(!member.is_lost() && member.token().0 > 0); // an Acquisition
/// member.leave().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a member that is dropped leaves without waiting for the others"]
pub struct BarrierMember {
    acquisition: Acquisition,
    dir: String,
    armed: bool,
}

impl BarrierMember {
    /// This member's node (`<path>/<uuid>`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let member = dlock::DoubleBarrier::new(&session, "/barriers/p", 1)?.enter().await?;
    /// assert_eq!(member.path().len(), "/barriers/p/".len() + 36);
    /// # member.leave().await?; Ok(()) }
    /// ```
    pub fn path(&self) -> &str {
        self.acquisition.node()
    }

    /// Leaves, and waits until every member has left.
    ///
    /// Cancellation-safe: dropping the future still removes the member node
    /// (the wait for the others is what is given up).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let member = dlock::DoubleBarrier::new(&session, "/barriers/leave", 1)?.enter().await?;
    /// member.leave().await?;
    /// assert!(session.children("/barriers/leave").await.map_or(true, |c| c.is_empty()));
    /// # Ok(()) }
    /// ```
    pub async fn leave(self) -> Result<()> {
        let session = self.acquisition.held_node().session.clone();
        Deadline::within(None, &session, |d| self.leave_until(d)).await
    }

    /// Leaves, waiting at most `timeout` for the others to leave; fails
    /// with [`Error::Timeout`] if some are still in then (this member is
    /// out either way).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// # use std::time::Duration;
    /// let member = dlock::DoubleBarrier::new(&session, "/barriers/leave-t", 1)?.enter().await?;
    /// member.leave_timeout(Duration::from_secs(5)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn leave_timeout(self, timeout: Duration) -> Result<()> {
        let session = self.acquisition.held_node().session.clone();
        Deadline::within(Some(timeout), &session, |d| self.leave_until(d)).await
    }

    async fn leave_until(mut self, deadline: Deadline) -> Result<Option<()>> {
        self.delete().await?;
        let session = &self.acquisition.held_node().session;
        loop {
            let (children, watch) = match session.children_watch(&self.dir).await {
                Ok(listed) => listed,
                Err(Error::NoNode { .. }) => return Ok(Some(())),
                Err(e) => return Err(e),
            };
            if children.iter().all(|c| c.name == READY_NODE) {
                // Only the ready node there now (a later round's would be
                // another creation), and guaranteed: a delete failing on the
                // connection goes on in the background, and the barrier is
                // done for us.
                let ready = path::join(&self.dir, READY_NODE);
                let Some(stat) = session.retrying(|| session.exists(&ready)).await? else {
                    return Ok(Some(()));
                };
                return match session
                    .delete_created_read(&ready, stat.czxid, stat.version)
                    .await
                {
                    Ok(_) => Ok(Some(())),
                    Err(e) if e.is_retryable() => Ok(Some(())),
                    Err(e) => Err(e),
                };
            }
            if deadline.race(watch.changed()).await.is_none() {
                return Ok(None);
            }
        }
    }

    /// Deletes the member node (gone already: fine) and disarms the drop.
    async fn delete(&mut self) -> Result<()> {
        let session = &self.acquisition.held_node().session;
        session.delete_guaranteed(self.acquisition.node()).await?;
        self.armed = false;
        Ok(())
    }

    fn lost(mut self) -> Error {
        self.armed = false;
        Error::Lost {
            what: "double barrier membership",
            path: self.dir.clone(),
        }
    }
}

deref_hold!(
    /// A member is an [`Acquisition`]: its node's creation is its fencing
    /// token, and it is lost with its session.
    BarrierMember => acquisition: Acquisition
);

impl Drop for BarrierMember {
    fn drop(&mut self) {
        if self.armed {
            let session = &self.acquisition.held_node().session;
            session.delete_in_background(self.acquisition.node().to_string());
        }
    }
}
