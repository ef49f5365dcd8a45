//! [`SharedCount`]: a counter every session can read, watch and update —
//! Curator's `SharedCount`, byte for byte.
//!
//! Layout (a compatibility contract with Curator 5.4): one **persistent**
//! node at the count's path (parents as containers) whose data is the value
//! as **4 bytes, big-endian** (Java's `ByteBuffer.putInt`). The first session
//! to create the node decides the initial value (its seed); later seeds are
//! ignored. Updates are plain `setData` (unconditional) or `setData` with the
//! version last read (compare-and-set), so a Java `SharedCount` and a dlock
//! `SharedCount` on one path see and update the same number.
//!
//! The local copy is kept fresh by a watch on the node, re-armed after every
//! event, and re-read whenever the session reports a state change (Curator
//! re-reads on `RECONNECTED`, CURATOR-311), so it converges even when a
//! change happened while the connection was down.

use std::fmt;
use std::sync::{Arc, Mutex as StdMutex};

use futures::stream::{BoxStream, StreamExt};
use tokio::sync::watch;

use super::lifecycle::{lock, Backoff, Lifecycle};
use crate::error::{Error, Result};
use crate::path;
use crate::session::Session;
use crate::store::{CreateMode, CreateOptions, SessionState, Stat, Watch, WatchEvent};

/// A value together with the node version it was read at (Curator's
/// `VersionedValue`): what [`SharedCount::try_set`] compares against.
///
/// ```
/// use dlock::recipes::shared_count::VersionedValue;
/// let v = VersionedValue { version: 3, value: 42 };
/// assert_eq!(v, VersionedValue::new(3, 42));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VersionedValue<T> {
    /// The node's data version the value was read at; −1 before the first
    /// read.
    pub version: i32,
    /// The value.
    pub value: T,
}

impl<T> VersionedValue<T> {
    /// A value at a version.
    pub fn new(version: i32, value: T) -> Self {
        VersionedValue { version, value }
    }
}

/// The version of a value that was never read (Curator's
/// `UNINITIALIZED_VERSION`).
const UNINITIALIZED: i32 = -1;

/// Encodes a count as Curator does: 4 bytes, big-endian.
///
/// ```
/// use dlock::recipes::shared_count::{decode, encode};
/// assert_eq!(encode(258), [0, 0, 1, 2]);
/// assert_eq!(decode("/c", &encode(-7)).unwrap(), -7);
/// assert!(decode("/c", b"12").is_err());
/// ```
pub fn encode(value: i32) -> [u8; 4] {
    value.to_be_bytes()
}

/// Decodes a count stored at `path`; anything but exactly 4 bytes is
/// [`Error::MalformedData`].
pub fn decode(path: &str, data: &[u8]) -> Result<i32> {
    let bytes: [u8; 4] = data.try_into().map_err(|_| Error::MalformedData {
        path: path.to_string(),
        reason: format!(
            "a shared count is 4 bytes (a big-endian i32), found {} bytes",
            data.len()
        ),
    })?;
    Ok(i32::from_be_bytes(bytes))
}

/// The value of a node that has a count's layout — persistent, childless,
/// exactly 4 bytes — or `None` if it is no count.
pub(crate) fn value_of(data: &[u8], stat: &Stat) -> Option<i32> {
    (stat.ephemeral_owner == 0 && stat.num_children == 0)
        .then(|| decode("", data).ok())
        .flatten()
}

/// A shared counter (Curator's `SharedCount`).
///
/// Create it with [`new`](Self::new), then [`start`](Self::start) it: that
/// creates the node with the seed if nobody did before, reads the value and
/// starts a background watcher that keeps the local copy fresh.
/// [`get`](Self::get) and [`versioned`](Self::versioned) read the local
/// copy (no round trip); [`subscribe`](Self::subscribe) and
/// [`changes`](Self::changes) report every change seen. [`close`](Self::close)
/// (or dropping the last clone) stops the watcher; the node stays.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// use dlock::recipes::shared_count::SharedCount;
/// let session = dlock::connect("embedded").await?;
/// let count = SharedCount::new(&session, "/doc/shared-count", 5)?;
/// count.start().await?;
/// assert_eq!(count.get(), 5);
///
/// // Compare-and-set: succeeds only against the latest version.
/// let seen = count.versioned();
/// assert!(count.try_set(&seen, 6).await?);
/// assert!(!count.try_set(&seen, 7).await?, "stale version");
/// assert_eq!(count.get(), 6);
///
/// count.close().await;
/// # session.delete("/doc/shared-count", None).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SharedCount {
    inner: Arc<Inner>,
}

struct Inner {
    session: Session,
    path: String,
    seed: i32,
    cache: Arc<Cache>,
    /// Runs the watcher task.
    lifecycle: Lifecycle,
}

/// The local copy, shared with the watcher task.
struct Cache {
    /// The sender, dropped on close so that subscribers see the end.
    state: StdMutex<CacheState>,
    /// For reading the current value without locking.
    current: watch::Receiver<VersionedValue<i32>>,
}

struct CacheState {
    tx: Option<watch::Sender<VersionedValue<i32>>>,
    /// Transaction id of the last data change applied: only newer data
    /// replaces the copy (Curator 5.7 orders by mzxid, as the version can
    /// wrap; CURATOR-688).
    mzxid: i64,
}

impl Cache {
    fn new(seed: i32) -> Self {
        let (tx, current) = watch::channel(VersionedValue::new(UNINITIALIZED, seed));
        Cache {
            state: StdMutex::new(CacheState {
                tx: Some(tx),
                mzxid: i64::MIN,
            }),
            current,
        }
    }

    /// Applies a value read or written at `stat`, unless the copy is newer.
    fn update(&self, stat: &Stat, value: i32) {
        let mut state = lock(&self.state);
        if stat.mzxid <= state.mzxid {
            return;
        }
        state.mzxid = stat.mzxid;
        if let Some(tx) = &state.tx {
            tx.send_replace(VersionedValue::new(stat.version, value));
        }
    }

    fn close(&self) {
        lock(&self.state).tx = None;
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self.lifecycle.force_close() {
            task.abort();
        }
    }
}

impl fmt::Debug for SharedCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedCount")
            .field("path", &self.inner.path)
            .field("value", &*self.inner.cache.current.borrow())
            .finish_non_exhaustive()
    }
}

impl SharedCount {
    /// A count at `path`, used through `session`, created with `seed` if it
    /// does not exist when [`start`](Self::start)ed. Nothing happens in the
    /// store until then.
    pub fn new(session: &Session, path: &str, seed: i32) -> Result<Self> {
        path::validate(path)?;
        if path == "/" {
            return Err(Error::InvalidPath {
                path: path.into(),
                reason: "a shared count cannot live at the root".into(),
            });
        }
        Ok(SharedCount {
            inner: Arc::new(Inner {
                session: session.clone(),
                path: path.to_string(),
                seed,
                cache: Arc::new(Cache::new(seed)),
                lifecycle: Lifecycle::new("shared count"),
            }),
        })
    }

    /// The count's path.
    pub fn path(&self) -> &str {
        &self.inner.path
    }

    /// The session this count uses.
    pub fn session(&self) -> &Session {
        &self.inner.session
    }

    /// Creates the node with the seed unless it exists (the first creator's
    /// seed wins), reads the value and starts watching it.
    ///
    /// Fails with [`Error::MalformedData`] if the stored data is not a
    /// 4-byte count, and with [`Error::InvalidArgument`] if started twice or
    /// after [`close`](Self::close).
    pub async fn start(&self) -> Result<()> {
        let lifecycle = &self.inner.lifecycle;
        lifecycle.begin(&self.inner.path)?;
        match self.start_inner().await {
            Ok(watch) => {
                let inner = &self.inner;
                let (session, path) = (inner.session.clone(), inner.path.clone());
                let task =
                    tokio::spawn(watch_loop(session, path, inner.cache.clone(), Some(watch)));
                // Closed while starting: the watcher must not outlive it.
                lifecycle.attach(task).map_err(|task| {
                    task.abort();
                    Error::Closed
                })
            }
            Err(e) => {
                lifecycle.unbegin();
                Err(e)
            }
        }
    }

    async fn start_inner(&self) -> Result<Watch> {
        let session = &self.inner.session;
        let path = &self.inner.path;
        let seed = encode(self.inner.seed);
        let opts = CreateOptions::new(CreateMode::Persistent).with_parents();
        // A NoNode is the container reaper removing an empty parent between
        // its creation and ours: the one reaped-parent loop goes again.
        let created = session
            .retrying_reaped(|| session.retrying(|| session.create(path, &seed, opts)))
            .await;
        match created {
            // NodeExists after a retry may be our own lost create: fine too.
            Ok(_) | Err(Error::NodeExists { .. }) => {}
            Err(e) => return Err(e),
        }
        let (data, stat, watch) = session.retrying(|| session.get_data_watch(path)).await?;
        self.inner.cache.update(&stat, decode(path, &data)?);
        Ok(watch)
    }

    /// Stops the watcher; the local copy keeps its last value and
    /// [`subscribe`](Self::subscribe)rs and [`changes`](Self::changes)
    /// streams end. The node is not deleted. Idempotent.
    pub async fn close(&self) {
        let task = self.inner.lifecycle.force_close();
        self.inner.cache.close();
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
    }

    fn ensure_started(&self) -> Result<()> {
        self.inner.lifecycle.ensure_started(&self.inner.path)
    }

    /// The current value (the local copy; no round trip). Before
    /// [`start`](Self::start), the seed.
    pub fn get(&self) -> i32 {
        self.inner.cache.current.borrow().value
    }

    /// The current value with the version it was read at, for
    /// [`try_set`](Self::try_set).
    pub fn versioned(&self) -> VersionedValue<i32> {
        *self.inner.cache.current.borrow()
    }

    /// Sets the value unconditionally (Curator's `setCount`).
    pub async fn set(&self, value: i32) -> Result<()> {
        self.ensure_started()?;
        let session = &self.inner.session;
        let data = encode(value);
        let stat = session
            .retrying(|| session.set_data(&self.inner.path, &data, None))
            .await?;
        self.inner.cache.update(&stat, value);
        Ok(())
    }

    /// Sets the value only if the count still is `previous` (same version
    /// and value); returns whether it was set (Curator's `trySetCount`).
    ///
    /// As in Curator 5.4, `previous` is first compared with the local copy
    /// (no round trip if it differs); then the write carries
    /// `previous.version`, so it fails if anyone wrote since. After a
    /// failed write the local copy is refreshed from the store, so
    /// [`versioned`](Self::versioned) is then fit for a retry.
    ///
    /// A lost connection is returned as [`Error::ConnectionLoss`] rather than
    /// retried: the write may or may not have been applied.
    pub async fn try_set(&self, previous: &VersionedValue<i32>, value: i32) -> Result<bool> {
        self.ensure_started()?;
        if previous.version < 0 {
            // A version of -1 would make the write unconditional
            // (ZOOKEEPER-4743).
            return Err(Error::InvalidArgument(format!(
                "try_set at {} needs a value that was read (version {})",
                self.inner.path, previous.version
            )));
        }
        if *previous != self.versioned() {
            return Ok(false);
        }
        let session = &self.inner.session;
        match session
            .set_data(&self.inner.path, &encode(value), Some(previous.version))
            .await
        {
            Ok(stat) => {
                self.inner.cache.update(&stat, value);
                Ok(true)
            }
            Err(Error::BadVersion { .. }) => {
                self.read().await?;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Reads the value from the store now (one round trip) and refreshes the
    /// local copy with it.
    pub async fn read(&self) -> Result<VersionedValue<i32>> {
        let session = &self.inner.session;
        let path = &self.inner.path;
        let (data, stat) = session.retrying(|| session.get_data(path)).await?;
        let value = decode(path, &data)?;
        self.inner.cache.update(&stat, value);
        Ok(VersionedValue::new(stat.version, value))
    }

    /// A receiver of the current value that is told of every change (Curator's
    /// `SharedCountListener`): `changed().await` resolves when the value
    /// changes; `borrow()` reads it. Several quick changes may be seen as
    /// one, the last. Ends (`changed()` errs) when the count is closed or
    /// dropped.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # use dlock::recipes::shared_count::SharedCount;
    /// # let session = dlock::connect("embedded").await?;
    /// let count = SharedCount::new(&session, "/doc/shared-count-sub", 0)?;
    /// count.start().await?;
    /// let mut rx = count.subscribe();
    /// count.set(9).await?;
    /// rx.changed().await.unwrap();
    /// assert_eq!(rx.borrow().value, 9);
    /// # count.close().await; session.delete("/doc/shared-count-sub", None).await?;
    /// # Ok(()) }
    /// ```
    pub fn subscribe(&self) -> watch::Receiver<VersionedValue<i32>> {
        let mut rx = self.inner.cache.current.clone();
        rx.mark_unchanged();
        rx
    }

    /// Every new value, as a stream (see [`subscribe`](Self::subscribe)).
    /// Ends when the count is closed or dropped.
    pub fn changes(&self) -> BoxStream<'static, VersionedValue<i32>> {
        futures::stream::unfold(self.subscribe(), |mut rx| async move {
            rx.changed().await.ok()?;
            let value = *rx.borrow_and_update();
            Some((value, rx))
        })
        .boxed()
    }
}

/// Keeps the cache fresh: waits for the watch, re-reads (re-arming it) on
/// every node or session event, and follows the node through deletion and
/// re-creation. Ends when the session is closed (or the task is aborted).
async fn watch_loop(session: Session, path: String, cache: Arc<Cache>, mut watch: Option<Watch>) {
    let mut backoff = Backoff::default();
    loop {
        if let Some(w) = watch.take() {
            if w.changed().await == WatchEvent::Session(SessionState::Closed) {
                return;
            }
        }
        match session.retrying(|| session.get_data_watch(&path)).await {
            Ok((data, stat, w)) => {
                backoff.reset();
                match decode(&path, &data) {
                    Ok(value) => cache.update(&stat, value),
                    Err(e) => {
                        tracing::warn!(error = %e, "shared count: keeping the last good value")
                    }
                }
                watch = Some(w);
            }
            Err(Error::NoNode { .. }) => match session.exists_watch(&path).await {
                // Deleted: wait until someone creates it again.
                Ok((None, w)) => watch = Some(w),
                // Created again meanwhile: read it at once.
                Ok((Some(_), _)) => {}
                Err(Error::Closed) => return,
                Err(e) => {
                    tracing::warn!(%path, error = %e, "shared count: watching failed");
                    backoff.pause(&session, std::future::pending::<()>()).await;
                }
            },
            Err(Error::Closed) => return,
            Err(e) => {
                tracing::warn!(%path, error = %e, "shared count: reading failed");
                backoff.pause(&session, std::future::pending::<()>()).await;
            }
        }
    }
}
