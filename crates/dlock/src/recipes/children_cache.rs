//! [`ChildrenCache`]: a local copy of one directory's children and their
//! data, kept fresh by the store's watches — the part of Curator 5.4's
//! `CuratorCache` that [`GroupMember`](super::group_member::GroupMember)
//! and the leader [observer](super::observe) need.
//!
//! It reads nothing but what is there (a compatibility contract only in that
//! it writes nothing): the directory's children (one watch on the listing)
//! and each child's data (one data watch per child). Every event is
//! answered by reading again what it names, so the copy converges on the
//! store:
//! - a listing change (a child created or deleted, the directory created or
//!   deleted): list again, read the new children, drop the missing ones;
//! - a child's data change or deletion: read that child again (dropped if
//!   gone; a newer node under its name replaces it);
//! - any session state change (a suspension, a reconnection, a new session
//!   after a loss): list and read everything again, since watches may have
//!   been lost with the connection (Curator re-syncs on `RECONNECTED` too).
//!
//! No polling: between events the cache costs nothing. Changes are told as
//! [`CacheEvent`]s (Curator's `CuratorCacheListener`: created, changed,
//! deleted), each in the order the cache applied it. A child deleted and
//! created again under its name is a [`CacheEvent::Removed`] then a
//! [`CacheEvent::Added`] when the cache sees both nodes, as it tells them
//! apart by their creation transaction.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex as StdMutex};

use futures::future::BoxFuture;
use futures::stream::{BoxStream, FuturesUnordered, StreamExt};
use tokio::sync::broadcast;

use super::lifecycle::{lock, Backoff, Lifecycle};
use crate::error::{Error, Result};
use crate::path;
use crate::session::Session;
use crate::store::{Child, SessionState, Stat, Watch, WatchEvent};

/// How many events a subscriber may fall behind before it is brought up to
/// date by comparing copies instead (it then sees the net changes).
const EVENT_CAPACITY: usize = 256;

/// One child of the cached directory, as last read.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// use dlock::recipes::children_cache::ChildrenCache;
/// use dlock::store::{CreateMode, CreateOptions};
/// let session = dlock::connect("embedded").await?;
/// let opts = CreateOptions::new(CreateMode::Ephemeral).with_parents();
/// session.create("/doc/cached-child/a", b"hello", opts).await?;
/// let cache = ChildrenCache::new(&session, "/doc/cached-child")?;
/// cache.start().await?;
/// let a = cache.get("a").unwrap();
/// assert_eq!((a.name.as_str(), a.path.as_str(), &a.data[..]), ("a", "/doc/cached-child/a", &b"hello"[..]));
/// assert_eq!(a.stat.ephemeral_owner, session.session_id());
/// # cache.close().await; Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedChild {
    /// The child's name (last path segment).
    pub name: String,
    /// Its full path.
    pub path: String,
    /// Its data.
    pub data: Vec<u8>,
    /// Its metadata when the data was read.
    pub stat: Stat,
    /// The store's native creation order, as listed ([`Child::created`]).
    created: Option<i64>,
}

impl CachedChild {
    /// The child as a listing names it, for sorting sequenced children
    /// ([`sort_sequenced`](crate::store::sort_sequenced)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # use dlock::recipes::children_cache::ChildrenCache;
    /// # use dlock::store::{CreateMode, CreateOptions};
    /// # let session = dlock::connect("embedded").await?;
    /// # let opts = CreateOptions::new(CreateMode::Ephemeral).with_parents();
    /// # session.create("/doc/cached-as-child/b", b"", opts).await?;
    /// # let cache = ChildrenCache::new(&session, "/doc/cached-as-child")?;
    /// # cache.start().await?;
    /// assert_eq!(cache.get("b").unwrap().as_child().name, "b");
    /// # cache.close().await; Ok(()) }
    /// ```
    pub fn as_child(&self) -> Child {
        Child {
            name: self.name.clone(),
            created: self.created,
            czxid: Some(self.stat.czxid),
        }
    }
}

/// A change of the cached directory (Curator's `CuratorCacheListener`).
///
/// ```
/// use dlock::recipes::children_cache::CacheEvent;
/// fn describe(event: &CacheEvent) -> String {
///     match event {
///         CacheEvent::Added(c) => format!("+{}", c.name),
///         CacheEvent::Updated { new, .. } => format!("~{}", new.name),
///         CacheEvent::Removed(c) => format!("-{}", c.name),
///     }
/// }
/// # let _ = describe;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheEvent {
    /// A child appeared.
    Added(CachedChild),
    /// A child's data changed.
    Updated {
        /// The child as it was.
        old: CachedChild,
        /// The child as it is now.
        new: CachedChild,
    },
    /// A child disappeared (as it was last seen).
    Removed(CachedChild),
}

impl CacheEvent {
    /// The child the event is about (for an update, as it is now).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # use dlock::recipes::children_cache::{CacheEvent, ChildrenCache};
    /// # use futures::StreamExt;
    /// # use dlock::store::{CreateMode, CreateOptions};
    /// # let session = dlock::connect("embedded").await?;
    /// let cache = ChildrenCache::new(&session, "/doc/cache-event")?;
    /// cache.start().await?;
    /// let mut events = cache.events();
    /// session.create("/doc/cache-event/x", b"1", CreateOptions::new(CreateMode::Ephemeral).with_parents()).await?;
    /// let event = events.next().await.unwrap();
    /// assert!(matches!(event, CacheEvent::Added(_)) && event.child().name == "x");
    /// # cache.close().await; Ok(()) }
    /// ```
    pub fn child(&self) -> &CachedChild {
        match self {
            CacheEvent::Added(c) | CacheEvent::Removed(c) => c,
            CacheEvent::Updated { new, .. } => new,
        }
    }
}

/// A directory's children with their data, kept fresh in the background
/// (see the [module docs](self)).
///
/// [`start`](Self::start) reads the directory (it need not exist) and
/// starts following it; [`snapshot`](Self::snapshot) and
/// [`get`](Self::get) read the local copy without a round trip;
/// [`events`](Self::events) streams the changes. [`close`](Self::close) (or
/// dropping the last clone) stops it and ends the streams.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// use dlock::recipes::children_cache::{CacheEvent, ChildrenCache};
/// use dlock::store::{CreateMode, CreateOptions};
/// use futures::StreamExt;
/// let session = dlock::connect("embedded").await?;
/// let cache = ChildrenCache::new(&session, "/doc/children-cache")?;
/// cache.start().await?;
/// assert!(cache.snapshot().is_empty());
/// let mut events = cache.events();
/// let opts = CreateOptions::new(CreateMode::Ephemeral).with_parents();
/// session.create("/doc/children-cache/a", b"one", opts).await?;
/// assert!(matches!(events.next().await, Some(CacheEvent::Added(c)) if c.data == b"one"));
/// session.set_data("/doc/children-cache/a", b"two", None).await?;
/// assert!(matches!(events.next().await, Some(CacheEvent::Updated { new, .. }) if new.data == b"two"));
/// session.delete("/doc/children-cache/a", None).await?;
/// assert!(matches!(events.next().await, Some(CacheEvent::Removed(c)) if c.name == "a"));
/// cache.close().await;
/// assert!(events.next().await.is_none(), "the stream ends with the cache");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ChildrenCache {
    inner: Arc<Inner>,
}

struct Inner {
    session: Session,
    path: String,
    shared: Arc<Shared>,
    lifecycle: Lifecycle,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self.lifecycle.force_close() {
            task.abort();
        }
        self.shared.close();
    }
}

impl fmt::Debug for ChildrenCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChildrenCache")
            .field("path", &self.inner.path)
            .field("children", &lock(&self.inner.shared.view).children.len())
            .finish_non_exhaustive()
    }
}

/// The copy and its event channel, shared by the cache, its task and its
/// subscribers.
struct Shared {
    view: StdMutex<View>,
}

struct View {
    children: BTreeMap<String, CachedChild>,
    /// Dropped on close, which ends the subscribers' streams.
    events: Option<broadcast::Sender<CacheEvent>>,
}

impl Shared {
    fn new() -> Self {
        Shared {
            view: StdMutex::new(View {
                children: BTreeMap::new(),
                events: Some(broadcast::channel(EVENT_CAPACITY).0),
            }),
        }
    }

    fn close(&self) {
        lock(&self.view).events = None;
    }

    /// Applies a child as read, telling what changed.
    fn put(&self, child: CachedChild) {
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
    fn remove(&self, name: &str) {
        let mut view = lock(&self.view);
        if let Some(old) = view.children.remove(name) {
            view.send(vec![CacheEvent::Removed(old)]);
        }
    }

    /// Takes a child's creation order from a listing, for a child read
    /// before it was listed (re-read under its name after a deletion). Not
    /// a change anyone is told of.
    fn listed(&self, child: &Child) {
        let mut view = lock(&self.view);
        if let Some(cached) = view.children.get_mut(&child.name) {
            let same_node = child.czxid.is_none_or(|czxid| czxid == cached.stat.czxid);
            if same_node && child.created.is_some() {
                cached.created = child.created;
            }
        }
    }

    /// Drops every child not in `keep`.
    fn retain(&self, keep: &dyn Fn(&str) -> bool) {
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
    fn subscribe(
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

impl ChildrenCache {
    /// A cache of the children of `path` (not the root), read through
    /// `session`. Nothing happens in the store until [`start`](Self::start).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # use dlock::recipes::children_cache::ChildrenCache;
    /// let session = dlock::connect("embedded").await?;
    /// assert!(ChildrenCache::new(&session, "/").is_err());
    /// assert_eq!(ChildrenCache::new(&session, "/dir")?.path(), "/dir");
    /// # Ok(()) }
    /// ```
    pub fn new(session: &Session, path: &str) -> Result<Self> {
        path::validate_recipe(path, "a children cache")?;
        Ok(ChildrenCache {
            inner: Arc::new(Inner {
                session: session.clone(),
                path: path.to_string(),
                shared: Arc::new(Shared::new()),
                lifecycle: Lifecycle::new("children cache"),
            }),
        })
    }

    /// The cached directory.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// # use dlock::recipes::children_cache::ChildrenCache;
    /// assert_eq!(ChildrenCache::new(&session, "/d")?.path(), "/d");
    /// # Ok(()) }
    /// ```
    pub fn path(&self) -> &str {
        &self.inner.path
    }

    /// Reads the directory and its children (a missing directory is empty)
    /// and starts following them; when it returns, the copy is complete.
    ///
    /// Fails with [`Error::InvalidArgument`] if started twice or after
    /// [`close`](Self::close), and with the store's error if the first read
    /// fails (then it may be started again).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # use dlock::recipes::children_cache::ChildrenCache;
    /// # let session = dlock::connect("embedded").await?;
    /// let cache = ChildrenCache::new(&session, "/doc/cache-start")?;
    /// cache.start().await?;
    /// assert!(cache.start().await.is_err(), "started once only");
    /// # cache.close().await; Ok(()) }
    /// ```
    pub async fn start(&self) -> Result<()> {
        let inner = &self.inner;
        inner.lifecycle.begin(&inner.path)?;
        let mut syncer = Syncer {
            session: inner.session.clone(),
            dir: inner.path.clone(),
            shared: inner.shared.clone(),
            watches: FuturesUnordered::new(),
            armed: HashMap::new(),
            generation: 0,
        };
        match syncer.resync().await {
            Ok(dir_watch) => {
                let task = tokio::spawn(syncer.run(dir_watch));
                inner.lifecycle.attach(task).map_err(|task| {
                    task.abort();
                    Error::Closed
                })
            }
            Err(e) => {
                inner.lifecycle.unbegin();
                Err(e)
            }
        }
    }

    /// Stops following the directory; the copy keeps what it last saw and
    /// every [`events`](Self::events) stream ends. Idempotent.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # use dlock::recipes::children_cache::ChildrenCache;
    /// # let session = dlock::connect("embedded").await?;
    /// let cache = ChildrenCache::new(&session, "/doc/cache-close")?;
    /// cache.start().await?;
    /// cache.close().await;
    /// cache.close().await; // twice is fine
    /// # Ok(()) }
    /// ```
    pub async fn close(&self) {
        let task = self.inner.lifecycle.force_close();
        self.inner.shared.close();
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
    }

    /// The children as last seen, by name (no round trip).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # use dlock::recipes::children_cache::ChildrenCache;
    /// # use dlock::store::{CreateMode, CreateOptions};
    /// # let session = dlock::connect("embedded").await?;
    /// session.create("/doc/cache-snap/k", b"v", CreateOptions::new(CreateMode::Ephemeral).with_parents()).await?;
    /// let cache = ChildrenCache::new(&session, "/doc/cache-snap")?;
    /// cache.start().await?;
    /// assert_eq!(cache.snapshot().keys().collect::<Vec<_>>(), ["k"]);
    /// # cache.close().await; Ok(()) }
    /// ```
    pub fn snapshot(&self) -> BTreeMap<String, CachedChild> {
        lock(&self.inner.shared.view).children.clone()
    }

    /// One child as last seen (no round trip).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # use dlock::recipes::children_cache::ChildrenCache;
    /// # let session = dlock::connect("embedded").await?;
    /// let cache = ChildrenCache::new(&session, "/doc/cache-get")?;
    /// cache.start().await?;
    /// assert!(cache.get("nobody").is_none());
    /// # cache.close().await; Ok(()) }
    /// ```
    pub fn get(&self, name: &str) -> Option<CachedChild> {
        lock(&self.inner.shared.view).children.get(name).cloned()
    }

    /// Every change from now on, in the order applied. Ends when the cache
    /// is closed or dropped. A subscriber that falls far behind gets the net
    /// change instead of each step.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # use dlock::recipes::children_cache::ChildrenCache;
    /// # use futures::StreamExt;
    /// # let session = dlock::connect("embedded").await?;
    /// let cache = ChildrenCache::new(&session, "/doc/cache-events")?;
    /// let mut events = cache.events(); // before the start: sees the first read too
    /// # cache.close().await;
    /// # assert!(events.next().await.is_none());
    /// # Ok(()) }
    /// ```
    pub fn events(&self) -> BoxStream<'static, CacheEvent> {
        self.inner.shared.subscribe().1
    }

    /// The copy now and every change after it, with nothing missed or told
    /// twice in between.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # use dlock::recipes::children_cache::ChildrenCache;
    /// # let session = dlock::connect("embedded").await?;
    /// let cache = ChildrenCache::new(&session, "/doc/cache-sub")?;
    /// cache.start().await?;
    /// let (now, _changes) = cache.snapshot_and_events();
    /// assert!(now.is_empty());
    /// # cache.close().await; Ok(()) }
    /// ```
    pub fn snapshot_and_events(
        &self,
    ) -> (
        BTreeMap<String, CachedChild>,
        BoxStream<'static, CacheEvent>,
    ) {
        self.inner.shared.subscribe()
    }
}

/// What woke the syncer.
enum Wake {
    Listing(WatchEvent),
    Child(String, u64, WatchEvent),
}

/// The background side: reads what the watches name and applies it.
struct Syncer {
    session: Session,
    dir: String,
    shared: Arc<Shared>,
    /// One armed data watch per child, each tagged with its generation.
    watches: FuturesUnordered<BoxFuture<'static, (String, u64, WatchEvent)>>,
    /// The generation of each child's live watch: a watch of an older one
    /// (a child read again since) is left to fire unheeded.
    armed: HashMap<String, u64>,
    generation: u64,
}

impl Syncer {
    /// Follows the directory until the session is closed (or the task is
    /// aborted).
    async fn run(mut self, dir_watch: Watch) {
        let mut listing: BoxFuture<'static, WatchEvent> = Box::pin(dir_watch.changed());
        let mut backoff = Backoff::default();
        loop {
            let wake = tokio::select! {
                event = &mut listing => Wake::Listing(event),
                Some((name, generation, event)) = self.watches.next(), if !self.watches.is_empty() => {
                    Wake::Child(name, generation, event)
                }
            };
            let outcome = match wake {
                Wake::Listing(WatchEvent::Session(SessionState::Closed))
                | Wake::Child(_, _, WatchEvent::Session(SessionState::Closed)) => return,
                Wake::Listing(WatchEvent::Session(_))
                | Wake::Child(_, _, WatchEvent::Session(_)) => self.resync().await.map(Some),
                Wake::Listing(_) => self.relist().await.map(Some),
                Wake::Child(name, generation, _) if self.armed.get(&name) == Some(&generation) => {
                    self.armed.remove(&name);
                    // Even after a deletion: a newer node may have the name
                    // already, and a listing made meanwhile took it for the
                    // old one (whose watch was still armed).
                    self.read_child(&name, None).await.map(|()| None)
                }
                // A watch of a child read again since: the newer one counts.
                Wake::Child(..) => Ok(None),
            };
            match outcome {
                Ok(Some(watch)) => {
                    backoff.reset();
                    listing = Box::pin(watch.changed());
                }
                Ok(None) => backoff.reset(),
                Err(Error::Closed) => return,
                Err(e) => {
                    self.failed(e, &mut backoff).await;
                    // Start over: a resync re-arms the listing watch.
                    listing = Box::pin(async { WatchEvent::Session(SessionState::Reconnected) });
                }
            }
        }
    }

    async fn failed(&mut self, error: Error, backoff: &mut Backoff) {
        tracing::warn!(path = %self.dir, %error, "children cache: reading failed; trying again");
        backoff
            .pause(&self.session, std::future::pending::<()>())
            .await;
    }

    /// Forgets every watch, then lists and reads everything again.
    async fn resync(&mut self) -> Result<Watch> {
        self.watches = FuturesUnordered::new();
        self.armed.clear();
        self.relist().await
    }

    /// Lists the directory (watching it), drops the children that are
    /// gone, and reads those without a live watch. A missing directory is
    /// watched for its creation.
    async fn relist(&mut self) -> Result<Watch> {
        let session = &self.session;
        loop {
            match session.retrying(|| session.children_watch(&self.dir)).await {
                Ok((children, watch)) => {
                    let names: std::collections::HashSet<&str> =
                        children.iter().map(|c| c.name.as_str()).collect();
                    self.shared.retain(&|name| names.contains(name));
                    self.armed.retain(|name, _| names.contains(name.as_str()));
                    for child in &children {
                        if self.armed.contains_key(&child.name) {
                            self.shared.listed(child);
                        } else {
                            self.read_child(&child.name, child.created).await?;
                        }
                    }
                    return Ok(watch);
                }
                Err(Error::NoNode { .. }) => {
                    self.shared.retain(&|_| false);
                    self.armed.clear();
                    match session.retrying(|| session.exists_watch(&self.dir)).await? {
                        (None, watch) => return Ok(watch),
                        // Created meanwhile: list it.
                        (Some(_), _) => continue,
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads one child (arming its data watch) and applies it; a child gone
    /// meanwhile is dropped.
    async fn read_child(&mut self, name: &str, created: Option<i64>) -> Result<()> {
        let node = path::join(&self.dir, name);
        let session = &self.session;
        match session.retrying(|| session.get_data_watch(&node)).await {
            Ok((data, stat, watch)) => {
                let created = created.or_else(|| {
                    lock(&self.shared.view)
                        .children
                        .get(name)
                        .filter(|c| c.stat.czxid == stat.czxid)
                        .and_then(|c| c.created)
                });
                self.shared.put(CachedChild {
                    name: name.to_string(),
                    path: node,
                    data,
                    stat,
                    created,
                });
                self.generation += 1;
                let generation = self.generation;
                self.armed.insert(name.to_string(), generation);
                let name = name.to_string();
                self.watches.push(Box::pin(async move {
                    (name, generation, watch.changed().await)
                }));
                Ok(())
            }
            Err(Error::NoNode { .. }) => {
                self.shared.remove(name);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}
