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

mod syncer;
mod view;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use futures::stream::BoxStream;

use self::syncer::Syncer;
use self::view::Shared;
use super::lifecycle::{lock, Lifecycle};
use crate::error::Result;
use crate::path;
use crate::session::Session;
use crate::store::{Child, Stat};

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
            owner: None,
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
        self.lifecycle.abort();
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
    /// Fails with [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// if started twice or after [`close`](Self::close), and with the
    /// store's error if the first read fails (then it may be started again).
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
        let begun = inner.lifecycle.begin_start(&inner.path)?;
        let mut syncer = Syncer::new(&inner.session, &inner.path, &inner.shared);
        let first = syncer.resync().await;
        begun.launch(first, |dir_watch| syncer.run(dir_watch))
    }

    /// Whether it was never started (a group member whose start was
    /// cancelled after starting it does not start it again).
    pub(crate) fn is_latent(&self) -> bool {
        self.inner.lifecycle.state() == super::lifecycle::State::Latent
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
        self.inner.shared.close();
        self.inner.lifecycle.stop().await;
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
