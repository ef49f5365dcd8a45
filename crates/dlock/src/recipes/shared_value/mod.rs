//! [`SharedValue`]: versioned bytes every session can read, watch and
//! update — Curator's `SharedValue`, byte for byte; [`SharedCount`] is the
//! same recipe seen as a number.
//!
//! Layout (a compatibility contract with Curator 5.4): one **persistent**
//! node at the value's path (parents as containers) whose data is the value
//! itself. The first session to create the node decides the initial value
//! (its seed); later seeds are ignored. Updates are plain `setData`
//! (unconditional) or `setData` with the version last read
//! (compare-and-set), so a Java `SharedValue` and a dlock `SharedValue` on
//! one path see and update the same bytes.
//!
//! A value is typed by its [`ValueCodec`]: `Vec<u8>` stores the bytes as
//! they are (Curator's `SharedValue`), `i32` stores 4 bytes big-endian
//! (Curator's `SharedCount`, see [`SharedCount`]).
//!
//! The local copy is kept fresh by a watch on the node, re-armed after every
//! event, and re-read whenever the session reports a state change (Curator
//! re-reads on `RECONNECTED`, CURATOR-311), so it converges even when a
//! change happened while the connection was down. Nothing polls.
//!
//! [`SharedCount`]: super::shared_count::SharedCount

mod value;
mod watcher;

use std::fmt;
use std::sync::Arc;

use futures::stream::{BoxStream, StreamExt};
use tokio::sync::watch;

use self::value::Cache;
pub use self::value::{ValueCodec, VersionedValue};
use self::watcher::watch_loop;
use super::lifecycle::Lifecycle;
use crate::error::{Error, Result};
use crate::path;
use crate::session::Session;
use crate::store::{CreateMode, CreateOptions, Watch};

/// A shared value (Curator's `SharedValue`), typed by its codec: bytes by
/// default; [`SharedCount`](super::shared_count::SharedCount) is the `i32`
/// one.
///
/// Create it with [`new`](Self::new), then [`start`](Self::start) it: that
/// creates the node with the seed if nobody did before, reads the value and
/// starts a background watcher that keeps the local copy fresh.
/// [`get`](Self::get) and [`versioned`](Self::versioned) read the local
/// copy (no round trip); [`read`](Self::read) asks the store;
/// [`subscribe`](Self::subscribe) and [`changes`](Self::changes) report
/// every change seen (Curator's `SharedValueListener`).
/// [`close`](Self::close) (or dropping the last clone) stops the watcher;
/// the node stays.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// use dlock::SharedValue;
/// let session = dlock::connect("embedded").await?;
/// let value = SharedValue::new(&session, "/doc/shared-value", b"v1".to_vec())?;
/// value.start().await?;
/// assert_eq!(value.get(), b"v1");
///
/// // Compare-and-set: succeeds only against the latest version.
/// let seen = value.versioned();
/// assert!(value.try_set(&seen, b"v2".to_vec()).await?);
/// assert!(!value.try_set(&seen, b"v3".to_vec()).await?, "stale version");
/// assert_eq!(value.get(), b"v2");
///
/// value.close().await;
/// # session.delete("/doc/shared-value", None).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SharedValue<T: ValueCodec = Vec<u8>> {
    inner: Arc<Inner<T>>,
}

struct Inner<T: ValueCodec> {
    session: Session,
    path: String,
    seed: T,
    cache: Arc<Cache<T>>,
    /// Runs the watcher task.
    lifecycle: Lifecycle,
}

impl<T: ValueCodec> Drop for Inner<T> {
    fn drop(&mut self) {
        self.lifecycle.abort();
    }
}

impl<T: ValueCodec> fmt::Debug for SharedValue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedValue")
            .field("kind", &T::KIND)
            .field("path", &self.inner.path)
            .field("value", &*self.inner.cache.current.borrow())
            .finish_non_exhaustive()
    }
}

impl<T: ValueCodec> SharedValue<T> {
    /// A value at `path` (not the root), used through `session`, created
    /// with `seed` if it does not exist when [`start`](Self::start)ed.
    /// Nothing happens in the store until then.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// let session = dlock::connect("embedded").await?;
    /// assert!(dlock::SharedValue::new(&session, "/", Vec::new()).is_err());
    /// let value = dlock::SharedValue::new(&session, "/v", b"seed".to_vec())?;
    /// assert_eq!(value.get(), b"seed", "the seed until started");
    /// # Ok(()) }
    /// ```
    pub fn new(session: &Session, path: &str, seed: T) -> Result<Self> {
        path::validate_recipe(path, &format!("a {}", T::KIND))?;
        Ok(SharedValue {
            inner: Arc::new(Inner {
                session: session.clone(),
                path: path.to_string(),
                seed: seed.clone(),
                cache: Arc::new(Cache::new(seed)),
                lifecycle: Lifecycle::new(T::KIND),
            }),
        })
    }

    /// The value's path.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// assert_eq!(dlock::SharedValue::new(&session, "/v", vec![])?.path(), "/v");
    /// # Ok(()) }
    /// ```
    pub fn path(&self) -> &str {
        &self.inner.path
    }

    /// The session this value uses.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let value = dlock::SharedValue::new(&session, "/v", vec![])?;
    /// assert_eq!(value.session().session_id(), session.session_id());
    /// # Ok(()) }
    /// ```
    pub fn session(&self) -> &Session {
        &self.inner.session
    }

    /// Creates the node with the seed unless it exists (the first creator's
    /// seed wins), reads the value and starts watching it.
    ///
    /// Fails with [`Error::MalformedData`] if the stored data is not a
    /// value of this type, and with [`Error::InvalidArgument`] if started
    /// twice or after [`close`](Self::close).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let first = dlock::SharedValue::new(&session, "/doc/sv-start", b"a".to_vec())?;
    /// let second = dlock::SharedValue::new(&session, "/doc/sv-start", b"b".to_vec())?;
    /// first.start().await?;
    /// second.start().await?;
    /// assert_eq!(second.get(), b"a", "the first seed wins");
    /// assert!(first.start().await.is_err(), "started twice");
    /// # first.close().await; second.close().await;
    /// # session.delete("/doc/sv-start", None).await?; Ok(()) }
    /// ```
    pub async fn start(&self) -> Result<()> {
        let inner = &self.inner;
        let begun = inner.lifecycle.begin_start(&inner.path)?;
        let first = self.start_inner().await;
        let (session, path, cache) = (
            inner.session.clone(),
            inner.path.clone(),
            inner.cache.clone(),
        );
        // Closed while starting: the watcher must not outlive it.
        begun.launch(first, |watch| watch_loop(session, path, cache, Some(watch)))
    }

    async fn start_inner(&self) -> Result<Watch> {
        let session = &self.inner.session;
        let path = &self.inner.path;
        let seed = self.inner.seed.to_bytes();
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
        self.inner.cache.update(&stat, T::from_bytes(path, &data)?);
        Ok(watch)
    }

    /// Stops the watcher; the local copy keeps its last value and
    /// [`subscribe`](Self::subscribe)rs and [`changes`](Self::changes)
    /// streams end. The node is not deleted. Idempotent.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let value = dlock::SharedValue::new(&session, "/doc/sv-close", vec![1])?;
    /// value.start().await?;
    /// value.close().await;
    /// assert!(value.set(vec![2]).await.is_err(), "closed");
    /// assert!(session.exists("/doc/sv-close").await?.is_some(), "the node stays");
    /// # session.delete("/doc/sv-close", None).await?; Ok(()) }
    /// ```
    pub async fn close(&self) {
        self.inner.cache.close();
        self.inner.lifecycle.stop().await;
    }

    fn ensure_started(&self) -> Result<()> {
        self.inner.lifecycle.ensure_started(&self.inner.path)
    }

    /// The current value (the local copy; no round trip). Before
    /// [`start`](Self::start), the seed.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let value = dlock::SharedValue::new(&session, "/v", b"seed".to_vec())?;
    /// assert_eq!(value.get(), b"seed");
    /// # Ok(()) }
    /// ```
    pub fn get(&self) -> T {
        self.inner.cache.current.borrow().value.clone()
    }

    /// The current value with the version it was read at, for
    /// [`try_set`](Self::try_set). Version −1 before the first read.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let value = dlock::SharedValue::new(&session, "/doc/sv-versioned", vec![7])?;
    /// assert_eq!(value.versioned().version, -1);
    /// value.start().await?;
    /// assert_eq!(value.versioned().version, 0);
    /// # value.close().await; session.delete("/doc/sv-versioned", None).await?; Ok(()) }
    /// ```
    pub fn versioned(&self) -> VersionedValue<T> {
        self.inner.cache.current.borrow().clone()
    }

    /// Sets the value unconditionally (Curator's `setValue`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let value = dlock::SharedValue::new(&session, "/doc/sv-set", vec![])?;
    /// value.start().await?;
    /// value.set(b"new".to_vec()).await?;
    /// assert_eq!(session.get_data("/doc/sv-set").await?.0, b"new");
    /// # value.close().await; session.delete("/doc/sv-set", None).await?; Ok(()) }
    /// ```
    pub async fn set(&self, value: T) -> Result<()> {
        self.ensure_started()?;
        let session = &self.inner.session;
        let data = value.to_bytes();
        let stat = session
            .retrying(|| session.set_data(&self.inner.path, &data, None))
            .await?;
        self.inner.cache.update(&stat, value);
        Ok(())
    }

    /// Sets the value only if it still is `previous` (same version and
    /// value); returns whether it was set (Curator's `trySetValue`).
    ///
    /// As in Curator 5.4, `previous` is first compared with the local copy
    /// (no round trip if it differs); then the write carries
    /// `previous.version`, so it fails if anyone wrote since. After a
    /// failed write the local copy is refreshed from the store, so
    /// [`versioned`](Self::versioned) is then fit for a retry.
    ///
    /// A lost connection is returned as [`Error::ConnectionLoss`] rather than
    /// retried: the write may or may not have been applied.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let value = dlock::SharedValue::new(&session, "/doc/sv-try", b"a".to_vec())?;
    /// value.start().await?;
    /// let seen = value.versioned();
    /// session.set_data("/doc/sv-try", b"b", None).await?; // someone else writes
    /// assert!(!value.try_set(&seen, b"c".to_vec()).await?, "stale");
    /// assert!(value.try_set(&value.versioned(), b"c".to_vec()).await?, "fresh");
    /// # value.close().await; session.delete("/doc/sv-try", None).await?; Ok(()) }
    /// ```
    pub async fn try_set(&self, previous: &VersionedValue<T>, value: T) -> Result<bool> {
        self.ensure_started()?;
        // Only -1: other negative versions are ZooKeeper's past 2^31 writes
        // (CURATOR-688), and -1 would make the write unconditional
        // (ZOOKEEPER-4743).
        if previous.version == -1 {
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
            .set_data(&self.inner.path, &value.to_bytes(), Some(previous.version))
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

    /// Reads the value and its version from the store now (one round trip)
    /// and refreshes the local copy with it. Works before
    /// [`start`](Self::start) too.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// # use dlock::store::{CreateMode, CreateOptions};
    /// session.create("/doc/sv-read", b"x", CreateOptions::new(CreateMode::Persistent).with_parents()).await?;
    /// let value = dlock::SharedValue::new(&session, "/doc/sv-read", vec![])?;
    /// let read = value.read().await?;
    /// assert_eq!((read.version, read.value), (0, b"x".to_vec()));
    /// # session.delete("/doc/sv-read", None).await?; Ok(()) }
    /// ```
    pub async fn read(&self) -> Result<VersionedValue<T>> {
        let session = &self.inner.session;
        let path = &self.inner.path;
        let (data, stat) = session.retrying(|| session.get_data(path)).await?;
        let value = T::from_bytes(path, &data)?;
        self.inner.cache.update(&stat, value.clone());
        Ok(VersionedValue::new(stat.version, value))
    }

    /// A receiver of the current value that is told of every change
    /// (Curator's `SharedValueListener`): `changed().await` resolves when
    /// the value changes; `borrow()` reads it. Several quick changes may be
    /// seen as one, the last. Ends (`changed()` errs) when the value is
    /// closed or dropped.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let value = dlock::SharedValue::new(&session, "/doc/sv-sub", vec![])?;
    /// value.start().await?;
    /// let mut rx = value.subscribe();
    /// session.set_data("/doc/sv-sub", b"from elsewhere", None).await?;
    /// rx.changed().await.unwrap();
    /// assert_eq!(rx.borrow().value, b"from elsewhere");
    /// # value.close().await; session.delete("/doc/sv-sub", None).await?;
    /// # Ok(()) }
    /// ```
    pub fn subscribe(&self) -> watch::Receiver<VersionedValue<T>> {
        let mut rx = self.inner.cache.current.clone();
        rx.mark_unchanged();
        rx
    }

    /// Every new value, as a stream (see [`subscribe`](Self::subscribe)).
    /// Ends when the value is closed or dropped.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// use futures::StreamExt;
    /// let value = dlock::SharedValue::new(&session, "/doc/sv-changes", vec![])?;
    /// value.start().await?;
    /// let mut changes = value.changes();
    /// value.set(vec![1]).await?;
    /// assert_eq!(changes.next().await.unwrap().value, [1]);
    /// # value.close().await; session.delete("/doc/sv-changes", None).await?;
    /// # Ok(()) }
    /// ```
    pub fn changes(&self) -> BoxStream<'static, VersionedValue<T>> {
        futures::stream::unfold(self.subscribe(), |mut rx| async move {
            rx.changed().await.ok()?;
            let value = rx.borrow_and_update().clone();
            Some((value, rx))
        })
        .boxed()
    }
}
