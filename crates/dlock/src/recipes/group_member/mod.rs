//! [`GroupMember`]: group membership with a payload per member — Curator's
//! `GroupMember`, node for node.
//!
//! Layout (a compatibility contract with Curator 5.4, whose `GroupMember`
//! is a `PersistentNode` plus a `CuratorCache`): each member is one
//! **ephemeral** node `<membershipPath>/<memberId>` whose data is the
//! member's payload (default: the session's default data, Curator's local
//! address); missing ancestors are created as containers. Every child of
//! the membership path is a member: its name is the id, its data the
//! payload. A Java `GroupMember` and a dlock `GroupMember` on one path see
//! each other with their payloads.
//!
//! As Curator's `PersistentNode` does, a member keeps its node: it watches
//! it, and creates it again (with the latest payload) when it vanishes — a
//! deletion by someone else, or its session's loss. Member ids must be
//! unique in a group (as in Curator): a second member with the same id
//! starts (its start does not wait), but leaves the first one's node and
//! payload alone until that node is gone, then takes the name.
//!
//! Everyone's view of the group is a [`ChildrenCache`] of the membership
//! path: [`current_members`](GroupMember::current_members) reads it without
//! a round trip (and, as Curator's `getCurrentMembers`, always includes the
//! member itself), and [`events`](GroupMember::events) tells joins, payload
//! updates and departures as they happen. [`watch_group`] gives the same
//! view without joining.

mod events;
mod keeper;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex as StdMutex};

use futures::stream::BoxStream;

pub use self::events::{member_events, members_of, watch_group, MemberEvent};
use self::keeper::{ensure_node, keep_node};
use super::children_cache::ChildrenCache;
use super::lifecycle::{lock, Lifecycle, State};
use crate::error::{Error, Result};
use crate::path;
use crate::session::Session;
use crate::store::SessionState;

/// One member of a group (Curator's `GroupMember`): see the [module
/// docs](self) for the layout.
///
/// [`start`](Self::start) joins (creates the member's node, then follows
/// the group), [`set_payload`](Self::set_payload) changes what the others
/// see, [`close`](Self::close) leaves. Dropping the last clone leaves too,
/// in the background.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// use dlock::recipes::group_member::{GroupMember, MemberEvent};
/// use futures::StreamExt;
/// let (a, b) = (dlock::connect("embedded").await?, dlock::connect("embedded").await?);
/// let alice = GroupMember::new(&a, "/doc/group", "alice")?.with_payload(b"10.0.0.1:80".to_vec());
/// alice.start().await?;
/// let bob = GroupMember::new(&b, "/doc/group", "bob")?;
/// bob.start().await?;
/// assert_eq!(bob.current_members()["alice"], b"10.0.0.1:80");
///
/// let mut seen_by_bob = bob.events();
/// alice.set_payload(b"10.0.0.1:81".to_vec()).await?;
/// assert_eq!(
///     seen_by_bob.next().await,
///     Some(MemberEvent::Updated { id: "alice".into(), payload: b"10.0.0.1:81".to_vec() })
/// );
/// alice.close().await?;
/// assert_eq!(seen_by_bob.next().await, Some(MemberEvent::Left { id: "alice".into() }));
/// bob.close().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct GroupMember {
    inner: Arc<Inner>,
}

struct Inner {
    session: Session,
    dir: String,
    id: String,
    node: String,
    /// The payload the node is (re)created with.
    payload: Arc<StdMutex<Vec<u8>>>,
    cache: ChildrenCache,
    /// Runs the keeper of the member's node.
    lifecycle: Lifecycle,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let started = self.lifecycle.state() == State::Started;
        self.lifecycle.abort();
        if started {
            leave_in_background(&self.session, &self.node);
        }
    }
}

/// Leaves in the background (see [`delete_if_ours`]), reading the node
/// again until it is read or the session ends.
fn leave_in_background(session: &Session, node: &str) {
    let node = node.to_string();
    session.retry_in_background(move |session| {
        let node = node.clone();
        async move {
            match session.exists(&node).await? {
                Some(stat) if stat.ephemeral_owner == session.session_id() => {
                    session.delete_created_eventually(&node, stat.czxid).await
                }
                _ => Ok(()),
            }
        }
    });
}

/// Deletes the member's node if this session owns it: a node of the same
/// id owned by someone else is theirs. Only the node read goes (by its
/// creation): a delete retried after a lost reply must not take the node
/// the next member with this id made meanwhile. The delete is guaranteed
/// (it goes on in the background if it fails on the connection); so is
/// the read before it: a close that failed is done all the same (a second
/// one does nothing).
async fn delete_if_ours(session: &Session, node: &str) -> Result<()> {
    match session.retrying(|| session.exists(node)).await {
        Ok(Some(stat)) if stat.ephemeral_owner == session.session_id() => {
            session.delete_created(node, stat.czxid).await.map(drop)
        }
        Ok(_) | Err(Error::Closed) => Ok(()),
        Err(e) => {
            if e.is_retryable() {
                leave_in_background(session, node);
            }
            Err(e)
        }
    }
}

impl fmt::Debug for GroupMember {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupMember")
            .field("node", &self.inner.node)
            .field("state", &self.inner.lifecycle.state())
            .finish_non_exhaustive()
    }
}

impl GroupMember {
    /// A member `id` of the group at `membership_path` (not the root),
    /// through `session`, with the session's default data as payload.
    /// Fails with [`Error::InvalidArgument`] for an id that is empty or not
    /// one path segment. Nothing happens in the store until
    /// [`start`](Self::start).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # use dlock::recipes::group_member::GroupMember;
    /// let session = dlock::connect("embedded").await?;
    /// assert!(GroupMember::new(&session, "/g", "a/b").is_err());
    /// assert!(GroupMember::new(&session, "/g", "").is_err());
    /// assert_eq!(GroupMember::new(&session, "/g", "a")?.node(), "/g/a");
    /// # Ok(()) }
    /// ```
    pub fn new(session: &Session, membership_path: &str, id: &str) -> Result<Self> {
        path::validate_recipe(membership_path, "a group")?;
        let node = path::join(membership_path, id);
        if id.is_empty() || id.contains('/') || path::validate(&node).is_err() {
            return Err(Error::InvalidArgument(format!(
                "member id {id:?} of the group at {membership_path} must be one non-empty path segment"
            )));
        }
        Ok(GroupMember {
            inner: Arc::new(Inner {
                session: session.clone(),
                dir: membership_path.to_string(),
                id: id.to_string(),
                node,
                payload: Arc::new(StdMutex::new(session.options().default_data.clone())),
                cache: ChildrenCache::new(session, membership_path)?,
                lifecycle: Lifecycle::new("group member"),
            }),
        })
    }

    /// Uses `payload` as the member's data (Curator's `payload` argument).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # use dlock::recipes::group_member::GroupMember;
    /// # let session = dlock::connect("embedded").await?;
    /// let m = GroupMember::new(&session, "/g", "a")?.with_payload(b"p".to_vec());
    /// assert_eq!(m.payload(), b"p");
    /// # Ok(()) }
    /// ```
    pub fn with_payload(self, payload: impl Into<Vec<u8>>) -> Self {
        *lock(&self.inner.payload) = payload.into();
        self
    }

    /// The member's id.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// assert_eq!(dlock::GroupMember::new(&session, "/g", "a")?.id(), "a");
    /// # Ok(()) }
    /// ```
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The membership path.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// assert_eq!(dlock::GroupMember::new(&session, "/g", "a")?.path(), "/g");
    /// # Ok(()) }
    /// ```
    pub fn path(&self) -> &str {
        &self.inner.dir
    }

    /// The member's node, `<membershipPath>/<id>`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// assert_eq!(dlock::GroupMember::new(&session, "/g", "a")?.node(), "/g/a");
    /// # Ok(()) }
    /// ```
    pub fn node(&self) -> &str {
        &self.inner.node
    }

    /// The member's payload, as it will be (re)written.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let m = dlock::GroupMember::new(&session, "/g", "a")?;
    /// assert_eq!(m.payload(), session.options().default_data);
    /// # Ok(()) }
    /// ```
    pub fn payload(&self) -> Vec<u8> {
        lock(&self.inner.payload).clone()
    }

    /// Joins: creates the member's node (waiting until it exists — Curator
    /// waits with `waitForInitialCreate`), reads the group, and from then
    /// on keeps the node and follows the group in the background.
    ///
    /// Fails with [`Error::InvalidArgument`] if started twice or after
    /// [`close`](Self::close).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let m = dlock::GroupMember::new(&session, "/doc/group-start", "a")?;
    /// m.start().await?;
    /// assert!(session.exists("/doc/group-start/a").await?.is_some());
    /// assert!(m.start().await.is_err());
    /// # m.close().await?; Ok(()) }
    /// ```
    pub async fn start(&self) -> Result<()> {
        let inner = &self.inner;
        // Cancelled after making the node, it leaves nobody's node behind.
        let (session, node) = (&inner.session, inner.node.as_str());
        let begun = inner.lifecycle.begin_start(node)?;
        let begun = begun.on_cancel(move || leave_in_background(session, node));
        let joined = async {
            let watch = ensure_node(&inner.session, &inner.node, &inner.payload).await?;
            // Started already by a start that was cancelled after it.
            if inner.cache.is_latent() {
                inner.cache.start().await?;
            }
            Ok::<_, Error>(watch)
        }
        .await;
        let (session, node) = (inner.session.clone(), inner.node.clone());
        let payload = inner.payload.clone();
        let started = begun.launch(joined, |watch| keep_node(session, node, payload, watch));
        // Failed, or closed while joining (the close found no node yet to
        // delete): the node made goes, not to be a member after the close.
        if started.is_err() && inner.session.state() != SessionState::Closed {
            let _ = delete_if_ours(&self.inner.session, &self.inner.node).await;
        }
        started
    }

    /// Changes the member's payload (Curator's `setThisData`): written to
    /// its node now if it is a member, and used whenever the node is created
    /// again.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let m = dlock::GroupMember::new(&session, "/doc/group-payload", "a")?;
    /// m.start().await?;
    /// m.set_payload(b"busy".to_vec()).await?;
    /// assert_eq!(session.get_data("/doc/group-payload/a").await?.0, b"busy");
    /// # m.close().await?; Ok(()) }
    /// ```
    pub async fn set_payload(&self, payload: impl Into<Vec<u8>>) -> Result<()> {
        let payload = payload.into();
        *lock(&self.inner.payload) = payload.clone();
        if self.inner.lifecycle.state() != State::Started {
            return Ok(());
        }
        let session = &self.inner.session;
        let node = &self.inner.node;
        loop {
            // Only into our own node: another member's of the same id
            // holds the name until it goes (then the keeper makes ours,
            // with this payload).
            let found = session.retrying(|| session.exists(node)).await?;
            let Some(stat) = found.filter(|s| s.ephemeral_owner == session.session_id()) else {
                return Ok(());
            };
            let version = Some(stat.version);
            match session
                .retrying(|| session.set_data(node, &payload, version))
                .await
            {
                // Gone: the keeper creates it again with this payload.
                Ok(_) | Err(Error::NoNode { .. }) => return Ok(()),
                Err(Error::BadVersion { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The group as this member last saw it: id → payload, this member
    /// always included (Curator's `getCurrentMembers`). No round trip.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let m = dlock::GroupMember::new(&session, "/doc/group-members", "a")?.with_payload(b"1".to_vec());
    /// m.start().await?;
    /// assert_eq!(m.current_members().into_iter().collect::<Vec<_>>(), [("a".to_string(), b"1".to_vec())]);
    /// # m.close().await?; Ok(()) }
    /// ```
    pub fn current_members(&self) -> BTreeMap<String, Vec<u8>> {
        let mut members = members_of(&self.inner.cache);
        members
            .entry(self.inner.id.clone())
            .or_insert_with(|| self.payload());
        members
    }

    /// Every membership change from now on, as seen by this member. Ends
    /// when the member is closed or dropped.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # use futures::StreamExt;
    /// # let session = dlock::connect("embedded").await?;
    /// let m = dlock::GroupMember::new(&session, "/doc/group-events", "a")?;
    /// let mut events = m.events();
    /// m.start().await?;
    /// assert_eq!(events.next().await.unwrap().id(), "a"); // itself, joining
    /// # m.close().await?; Ok(()) }
    /// ```
    pub fn events(&self) -> BoxStream<'static, MemberEvent> {
        member_events(self.inner.cache.events())
    }

    /// Leaves: stops keeping the node, deletes it (if this session owns it)
    /// and stops following the group; [`events`](Self::events) streams end.
    /// Idempotent.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let m = dlock::GroupMember::new(&session, "/doc/group-close", "a")?;
    /// m.start().await?;
    /// m.close().await?;
    /// m.close().await?; // twice is fine
    /// assert!(session.exists("/doc/group-close/a").await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn close(&self) -> Result<()> {
        let was = self.inner.lifecycle.state();
        self.inner.lifecycle.stop().await;
        self.inner.cache.close().await;
        match was {
            State::Started => delete_if_ours(&self.inner.session, &self.inner.node).await,
            _ => Ok(()),
        }
    }
}
