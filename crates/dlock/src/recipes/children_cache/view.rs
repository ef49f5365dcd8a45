//! The local copy of a [`ChildrenCache`](super::ChildrenCache) and its
//! subscribers: applying what was read, telling what changed, catching up
//! a subscriber that fell behind. No I/O.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex as StdMutex};

use futures::stream::{BoxStream, StreamExt};
use tokio::sync::broadcast;

use super::{CacheEvent, CachedChild};
use crate::recipes::lifecycle::lock;
use crate::store::Child;

/// How many events a subscriber may fall behind before it is brought up to
/// date by comparing copies instead (it then sees the net changes).
const EVENT_CAPACITY: usize = 256;

/// The copy and its event channel, shared by the cache, its task and its
/// subscribers.
pub(super) struct Shared {
    pub(super) view: StdMutex<View>,
}

pub(super) struct View {
    pub(super) children: BTreeMap<String, CachedChild>,
    /// Dropped on close, which ends the subscribers' streams.
    events: Option<broadcast::Sender<CacheEvent>>,
}

impl Shared {
    pub(super) fn new() -> Self {
        Shared {
            view: StdMutex::new(View {
                children: BTreeMap::new(),
                events: Some(broadcast::channel(EVENT_CAPACITY).0),
            }),
        }
    }

    pub(super) fn close(&self) {
        lock(&self.view).events = None;
    }

    /// Applies a child as read, telling what changed.
    pub(super) fn put(&self, child: CachedChild) {
        let mut view = lock(&self.view);
        let old = view.children.get(&child.name).cloned();
        let events = match old {
            None => vec![CacheEvent::Added(child.clone())],
            // The same node: only newer data counts (a read may answer
            // from before a write we already applied).
            Some(old) if old.stat.czxid == child.stat.czxid => {
                if child.stat.mzxid <= old.stat.mzxid {
                    return;
                }
                vec![CacheEvent::Updated {
                    old,
                    new: child.clone(),
                }]
            }
            // A newer node under the old name.
            Some(old) => vec![CacheEvent::Removed(old), CacheEvent::Added(child.clone())],
        };
        view.children.insert(child.name.clone(), child);
        view.send(events);
    }

    /// Drops a child, if it is there.
    pub(super) fn remove(&self, name: &str) {
        let mut view = lock(&self.view);
        if let Some(old) = view.children.remove(name) {
            view.send(vec![CacheEvent::Removed(old)]);
        }
    }

    /// Takes a child's creation order from a listing, for a child read
    /// before it was listed (re-read under its name after a deletion). Not
    /// a change anyone is told of.
    pub(super) fn listed(&self, child: &Child) {
        let mut view = lock(&self.view);
        if let Some(cached) = view.children.get_mut(&child.name) {
            let same_node = child.czxid.is_none_or(|czxid| czxid == cached.stat.czxid);
            if same_node && child.created.is_some() {
                cached.created = child.created;
            }
        }
    }

    /// Drops every child not in `keep`.
    pub(super) fn retain(&self, keep: &dyn Fn(&str) -> bool) {
        let mut view = lock(&self.view);
        let gone: Vec<String> = view
            .children
            .keys()
            .filter(|name| !keep(name))
            .cloned()
            .collect();
        let events = gone
            .iter()
            .filter_map(|name| view.children.remove(name))
            .map(CacheEvent::Removed)
            .collect();
        view.send(events);
    }

    /// The copy now and the changes after it, as one stream of events.
    pub(super) fn subscribe(
        self: &Arc<Self>,
    ) -> (
        BTreeMap<String, CachedChild>,
        BoxStream<'static, CacheEvent>,
    ) {
        let view = lock(&self.view);
        let snapshot = view.children.clone();
        let Some(events) = view.events.as_ref().map(|tx| tx.subscribe()) else {
            return (snapshot, futures::stream::empty().boxed());
        };
        drop(view);
        let follower = Follower {
            shared: self.clone(),
            events,
            seen: snapshot.clone(),
            pending: VecDeque::new(),
        };
        let stream = futures::stream::unfold(follower, |mut f| async move {
            let event = f.next().await?;
            Some((event, f))
        });
        (snapshot, stream.boxed())
    }
}

impl View {
    fn send(&self, events: Vec<CacheEvent>) {
        if let Some(tx) = &self.events {
            for event in events {
                // No subscriber: nobody to tell.
                let _ = tx.send(event);
            }
        }
    }
}

/// One subscriber's stream: the events in order, and, if it fell too far
/// behind, the difference between what it saw and the copy now.
struct Follower {
    shared: Arc<Shared>,
    events: broadcast::Receiver<CacheEvent>,
    seen: BTreeMap<String, CachedChild>,
    pending: VecDeque<CacheEvent>,
}

impl Follower {
    async fn next(&mut self) -> Option<CacheEvent> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(event);
            }
            match self.events.recv().await {
                Ok(event) => {
                    match &event {
                        CacheEvent::Added(c) | CacheEvent::Updated { new: c, .. } => {
                            self.seen.insert(c.name.clone(), c.clone());
                        }
                        CacheEvent::Removed(c) => {
                            self.seen.remove(&c.name);
                        }
                    }
                    return Some(event);
                }
                Err(broadcast::error::RecvError::Closed) => return None,
                Err(broadcast::error::RecvError::Lagged(_)) => self.catch_up(),
            }
        }
    }

    /// Replaces the missed events by the net change since the last one seen.
    fn catch_up(&mut self) {
        let view = lock(&self.shared.view);
        // Events still queued are already in the copy: start after them.
        self.events = self.events.resubscribe();
        let now = view.children.clone();
        drop(view);
        for (name, old) in &self.seen {
            match now.get(name) {
                None => self.pending.push_back(CacheEvent::Removed(old.clone())),
                Some(new) if new.stat.czxid != old.stat.czxid => {
                    self.pending.push_back(CacheEvent::Removed(old.clone()));
                    self.pending.push_back(CacheEvent::Added(new.clone()));
                }
                Some(new) if new != old => self.pending.push_back(CacheEvent::Updated {
                    old: old.clone(),
                    new: new.clone(),
                }),
                Some(_) => {}
            }
        }
        for (name, new) in &now {
            if !self.seen.contains_key(name) {
                self.pending.push_back(CacheEvent::Added(new.clone()));
            }
        }
        self.seen = now;
    }
}
