//! [`observe`]: an election's leader and candidates, followed as they
//! change, without taking part — etcd's `Election.Observe`, for the
//! elections of [`LeaderLatch`](super::leader_latch::LeaderLatch) and
//! [`LeaderSelector`](super::leader_selector::LeaderSelector) (and so of
//! Curator's, which write the same nodes).
//!
//! The observer writes nothing: it is a
//! [`ChildrenCache`] of the election's
//! path, read the way the candidates list themselves (Curator's
//! `getParticipants`, see [`election`](super::election)): the `latch-` nodes
//! of a latch, else the `lock-` nodes of a selector (and kazoo's
//! `__lock__` candidates among them), in queue order; the
//! first leads; each id is its node's data as UTF-8. Its cost is one watch
//! on the listing and one per candidate, and no polling.
//!
//! On etcd, the candidates of etcd's Go client (`concurrency.Election`,
//! `etcdctl elect`: one key `<prefix>/<lease id in hex>` per candidate, the
//! value its proposal; see `recipes/etcd_go.rs`) are followed too, alone or
//! queued with dlock's, as etcd's own `Observe` does: the oldest create
//! revision leads, and a Go leader's id is its proposal.

use std::collections::BTreeMap;

use futures::stream::{BoxStream, StreamExt};

use super::children_cache::{CacheEvent, CachedChild, ChildrenCache};
use super::election::LeaderParticipant;
use super::queue::MUTEX_SORT_NAMES;
use super::{etcd_go, leader_latch, mutex};
use crate::error::Result;
use crate::session::Session;
use crate::store::{sort_sequenced, Child};

/// An election as seen at one moment: its candidates in queue order, the
/// leader first.
///
/// ```
/// use dlock::recipes::observe::Observation;
/// let nobody = Observation::default();
/// assert!(nobody.leader().is_none() && nobody.participants.is_empty());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observation {
    /// Every candidate, in queue order; the first (if any) leads.
    pub participants: Vec<LeaderParticipant>,
}

impl Observation {
    /// The leader, if there is any candidate.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// let session = dlock::connect("embedded").await?;
    /// let latch = dlock::LeaderLatch::new(&session, "/doc/observation")?.with_id("me");
    /// latch.start()?;
    /// latch.await_leadership().await?;
    /// let seen = dlock::recipes::observe::observe(&session, "/doc/observation").await?;
    /// assert_eq!(seen.current().leader().unwrap().id, "me");
    /// # seen.close().await; latch.close().await?; Ok(()) }
    /// ```
    pub fn leader(&self) -> Option<&LeaderParticipant> {
        self.participants.first()
    }

    fn of(children: &BTreeMap<String, CachedChild>) -> Self {
        let latch = children.keys().any(|n| leader_latch::is_node(n));
        // A selector's candidates are Curator's or kazoo's lock nodes.
        let (is_node, sort_names): (fn(&str) -> bool, &[&str]) = if latch {
            (leader_latch::is_node, &[leader_latch::LATCH_NAME])
        } else {
            (mutex::is_node, MUTEX_SORT_NAMES)
        };
        // Candidates of etcd's Go `Election` queue with ours (etcd_go).
        let mut order: Vec<Child> = children
            .values()
            .map(CachedChild::as_child)
            .filter(|c| is_node(&c.name) || etcd_go::is_contender(c))
            .collect();
        sort_sequenced(&mut order, sort_names);
        let participants = order
            .iter()
            .filter_map(|child| children.get(&child.name))
            .enumerate()
            .map(|(i, cached)| LeaderParticipant {
                id: String::from_utf8_lossy(&cached.data).into_owned(),
                is_leader: i == 0,
                node: cached.path.clone(),
                epoch: cached.stat.token(),
            })
            .collect();
        Observation { participants }
    }
}

/// An election followed without taking part (see the [module docs](self)).
/// Made by [`observe`]; [`close`](Self::close) (or dropping it) stops it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// use dlock::recipes::observe::observe;
/// use futures::StreamExt;
/// let (a, b) = (dlock::connect("embedded").await?, dlock::connect("embedded").await?);
/// let observer = observe(&b, "/doc/observe").await?;
/// let mut leaders = observer.leader_changes();
/// assert_eq!(leaders.next().await, Some(None)); // nobody yet
///
/// let latch = dlock::LeaderLatch::new(&a, "/doc/observe")?.with_id("a");
/// latch.start()?;
/// assert_eq!(leaders.next().await.unwrap().unwrap().id, "a");
/// latch.close().await?;
/// assert_eq!(leaders.next().await, Some(None));
/// observer.close().await;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct LeaderObserver {
    cache: ChildrenCache,
}

/// Starts following the election at `path` (it need not exist yet).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// let session = dlock::connect("embedded").await?;
/// let observer = dlock::recipes::observe::observe(&session, "/doc/observe-empty").await?;
/// assert!(observer.current().leader().is_none());
/// # observer.close().await; Ok(()) }
/// ```
pub async fn observe(session: &Session, path: &str) -> Result<LeaderObserver> {
    let cache = ChildrenCache::new(session, path)?;
    cache.start().await?;
    Ok(LeaderObserver { cache })
}

impl LeaderObserver {
    /// The election now, as last seen (no round trip).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let observer = dlock::recipes::observe::observe(&session, "/doc/observe-now").await?;
    /// assert!(observer.current().participants.is_empty());
    /// # observer.close().await; Ok(()) }
    /// ```
    pub fn current(&self) -> Observation {
        Observation::of(&self.cache.snapshot())
    }

    /// The election now, then after every change of its candidates (a
    /// join, a departure, a new id). Ends when the observer is closed or
    /// dropped.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # use futures::StreamExt;
    /// # let session = dlock::connect("embedded").await?;
    /// let observer = dlock::recipes::observe::observe(&session, "/doc/observe-changes").await?;
    /// let mut changes = observer.changes();
    /// assert_eq!(changes.next().await, Some(Default::default()));
    /// # observer.close().await; Ok(()) }
    /// ```
    pub fn changes(&self) -> BoxStream<'static, Observation> {
        let (now, events) = self.cache.snapshot_and_events();
        let first = Observation::of(&now);
        let later = events.scan(now, |view, event| {
            match event {
                CacheEvent::Added(c) | CacheEvent::Updated { new: c, .. } => {
                    view.insert(c.name.clone(), c);
                }
                CacheEvent::Removed(c) => {
                    view.remove(&c.name);
                }
            }
            futures::future::ready(Some(Observation::of(view)))
        });
        futures::stream::once(futures::future::ready(first))
            .chain(later)
            .scan(None::<Observation>, |last, now| {
                let changed = last.as_ref() != Some(&now);
                *last = Some(now.clone());
                futures::future::ready(Some(changed.then_some(now)))
            })
            .filter_map(futures::future::ready)
            .boxed()
    }

    /// The leader now (`None`: no candidate), then each new leader — a
    /// different node, or the same node with a new id — in the order they
    /// took over, as `etcdctl elect --listen` prints them. A leader whose
    /// term was too short to be seen may be skipped. Ends when the observer
    /// is closed or dropped.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # use futures::StreamExt;
    /// # let session = dlock::connect("embedded").await?;
    /// let observer = dlock::recipes::observe::observe(&session, "/doc/observe-leaders").await?;
    /// assert_eq!(observer.leader_changes().next().await, Some(None));
    /// # observer.close().await; Ok(()) }
    /// ```
    pub fn leader_changes(&self) -> BoxStream<'static, Option<LeaderParticipant>> {
        self.changes()
            .scan(None::<Option<(String, String)>>, |last, seen| {
                let leader = seen.leader().cloned();
                let key = leader.as_ref().map(|l| (l.node.clone(), l.id.clone()));
                let changed = last.as_ref() != Some(&key);
                *last = Some(key);
                futures::future::ready(Some(changed.then_some(leader)))
            })
            .filter_map(futures::future::ready)
            .boxed()
    }

    /// Stops following; the streams end. Idempotent.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let observer = dlock::recipes::observe::observe(&session, "/doc/observe-close").await?;
    /// observer.close().await;
    /// # Ok(()) }
    /// ```
    pub async fn close(&self) {
        self.cache.close().await;
    }
}
