//! A group as everyone sees it: [`MemberEvent`]s and the view of a group
//! from its membership path's [`ChildrenCache`], joined or not.

use std::collections::BTreeMap;

use futures::stream::{BoxStream, StreamExt};

use crate::error::Result;
use crate::recipes::children_cache::{CacheEvent, ChildrenCache};
use crate::session::Session;

/// A change of a group's membership.
///
/// ```
/// use dlock::recipes::group_member::MemberEvent;
/// let joined = MemberEvent::Joined { id: "a".into(), payload: b"10.0.0.1".to_vec() };
/// assert_eq!(joined.id(), "a");
/// assert_eq!(MemberEvent::Left { id: "a".into() }.id(), "a");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberEvent {
    /// A member joined, with its payload.
    Joined {
        /// The member's id.
        id: String,
        /// Its payload.
        payload: Vec<u8>,
    },
    /// A member changed its payload.
    Updated {
        /// The member's id.
        id: String,
        /// Its new payload.
        payload: Vec<u8>,
    },
    /// A member left (or its session ended).
    Left {
        /// The member's id.
        id: String,
    },
}

impl MemberEvent {
    /// The member the event is about.
    ///
    /// ```
    /// use dlock::recipes::group_member::MemberEvent;
    /// assert_eq!(MemberEvent::Updated { id: "m".into(), payload: vec![] }.id(), "m");
    /// ```
    pub fn id(&self) -> &str {
        match self {
            MemberEvent::Joined { id, .. }
            | MemberEvent::Updated { id, .. }
            | MemberEvent::Left { id } => id,
        }
    }

    fn from_cache(event: CacheEvent) -> Self {
        match event {
            CacheEvent::Added(c) => MemberEvent::Joined {
                id: c.name,
                payload: c.data,
            },
            CacheEvent::Updated { new, .. } => MemberEvent::Updated {
                id: new.name,
                payload: new.data,
            },
            CacheEvent::Removed(c) => MemberEvent::Left { id: c.name },
        }
    }
}

/// A group's members without joining it: the cache of its membership path,
/// started. Close it with [`ChildrenCache::close`] (or drop it).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// use dlock::recipes::group_member::{members_of, watch_group, GroupMember};
/// let (a, b) = (dlock::connect("embedded").await?, dlock::connect("embedded").await?);
/// let member = GroupMember::new(&a, "/doc/watch-group", "a")?.with_payload(b"x".to_vec());
/// member.start().await?;
/// let group = watch_group(&b, "/doc/watch-group").await?; // a complete copy once started
/// assert_eq!(members_of(&group)["a"], b"x");
/// member.close().await?;
/// # group.close().await; Ok(()) }
/// ```
pub async fn watch_group(session: &Session, membership_path: &str) -> Result<ChildrenCache> {
    let cache = ChildrenCache::new(session, membership_path)?;
    cache.start().await?;
    Ok(cache)
}

/// The members a group's cache (from [`watch_group`]) has seen: id →
/// payload.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// # use dlock::recipes::group_member::{members_of, watch_group};
/// # let session = dlock::connect("embedded").await?;
/// let group = watch_group(&session, "/doc/members-of").await?;
/// assert!(members_of(&group).is_empty());
/// # group.close().await; Ok(()) }
/// ```
pub fn members_of(cache: &ChildrenCache) -> BTreeMap<String, Vec<u8>> {
    cache
        .snapshot()
        .into_iter()
        .map(|(id, child)| (id, child.data))
        .collect()
}

/// A group's membership changes as [`MemberEvent`]s, from a cache's events.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// # use dlock::recipes::group_member::{member_events, watch_group, GroupMember, MemberEvent};
/// # use futures::StreamExt;
/// # let (a, b) = (dlock::connect("embedded").await?, dlock::connect("embedded").await?);
/// let group = watch_group(&b, "/doc/member-events").await?;
/// let mut events = member_events(group.events());
/// let member = GroupMember::new(&a, "/doc/member-events", "a")?;
/// member.start().await?;
/// assert_eq!(events.next().await.unwrap().id(), "a");
/// # member.close().await?; group.close().await; Ok(()) }
/// ```
pub fn member_events(events: BoxStream<'static, CacheEvent>) -> BoxStream<'static, MemberEvent> {
    events.map(MemberEvent::from_cache).boxed()
}
