//! [`AtomicCounter`]: a 64-bit counter updated by compare-and-set, with an
//! optional fall-back to a lock — Curator's `DistributedAtomicLong`, byte
//! for byte.
//!
//! Layout (a compatibility contract with Curator 5.4): one **persistent**
//! node at the counter's path whose data is the value as **8 bytes,
//! big-endian** (Java's `ByteBuffer.putLong`). Ancestors are created as
//! containers, the node itself as a plain persistent node (Curator's
//! `EnsureContainers` + `create()`). A missing node and empty data both
//! read as 0; the first update creates the node. The promoted-to-lock mode
//! takes a [`Mutex`] at the lock path: Curator's `InterProcessMutex` nodes
//! (`<lock path>/_c_<uuid>-lock-<seq>`), so a Java `DistributedAtomicLong`
//! promoted to the same lock path queues with dlock's.
//!
//! Every update is Curator's `trySet`: read the value and its version
//! (`getData`), compute the new value, write it with that version
//! (`setData` with version, or `create` if the node is missing). A write
//! that loses a race (`BadVersion`, `NodeExists`, `NoNode`) is tried again
//! per the counter's [`RetryPolicy`]; when those optimistic tries all lose,
//! a counter with a [`PromotedToLock`] takes the lock and tries again per
//! the lock's policy. Every result is an [`AtomicValue`]: whether it
//! succeeded, the value before and after, and [`AtomicStats`] — check
//! [`AtomicValue::succeeded`], as in Curator: an update can lose every try.
//!
//! Where dlock differs from Curator 5.4, on purpose:
//! - data of any length but 0 or 8 bytes is [`Error::MalformedData`]
//!   (Curator reads the first 8 bytes of a longer value);
//! - an update that would overflow an `i64` is [`Error::InvalidArgument`]
//!   (Java wraps around);
//! - a read creates nothing (Curator's `get` creates missing ancestors);
//! - a write whose connection is lost is returned as
//!   [`Error::ConnectionLoss`], never retried blindly: it may have been
//!   applied, and applying an increment twice would count it twice;
//! - a failed update reports the value it saw as its `post_value` (Curator
//!   reports 0).

use std::time::{Duration, Instant};

use super::mutex::Mutex;
use crate::error::{Error, Result};
use crate::path;
use crate::session::{RetryPolicy, Session};
use crate::store::{CreateMode, CreateOptions, Stat};

/// Encodes a counter value as Curator does: 8 bytes, big-endian.
///
/// ```
/// use dlock::recipes::atomic_counter::{decode, encode};
/// assert_eq!(encode(258), [0, 0, 0, 0, 0, 0, 1, 2]);
/// assert_eq!(decode("/c", &encode(-7)).unwrap(), -7);
/// ```
pub fn encode(value: i64) -> [u8; 8] {
    value.to_be_bytes()
}

/// Decodes a counter stored at `path`: empty data is 0 (as in Curator),
/// 8 bytes are a big-endian `i64`, anything else is
/// [`Error::MalformedData`] naming the path and the bytes.
///
/// ```
/// use dlock::recipes::atomic_counter::decode;
/// assert_eq!(decode("/c", b"").unwrap(), 0);
/// let err = decode("/c", b"foo").unwrap_err();
/// assert!(err.to_string().contains("8 bytes"), "{err}");
/// ```
pub fn decode(path: &str, data: &[u8]) -> Result<i64> {
    if data.is_empty() {
        return Ok(0);
    }
    let bytes: [u8; 8] = data.try_into().map_err(|_| Error::MalformedData {
        path: path.to_string(),
        reason: format!(
            "an atomic counter is 8 bytes (a big-endian i64), found {} bytes: [{}]",
            data.len(),
            data.iter()
                .take(16)
                .map(|b| format!("{b:#04x}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })?;
    Ok(i64::from_be_bytes(bytes))
}

/// How an update went (Curator's `AtomicStats`): how many tries each
/// phase took and how long.
///
/// ```
/// let stats = dlock::AtomicStats::default();
/// assert_eq!((stats.optimistic_tries, stats.promoted_lock_tries), (0, 0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtomicStats {
    /// Compare-and-set tries without the lock.
    pub optimistic_tries: u32,
    /// Compare-and-set tries while holding the promoted lock.
    pub promoted_lock_tries: u32,
    /// Time spent in the optimistic tries, backoff included.
    pub optimistic_time: Duration,
    /// Time spent in the promoted phase, waiting for the lock included.
    pub promoted_time: Duration,
}

/// The result of an [`AtomicCounter`] operation (Curator's
/// `AtomicValue<Long>`). Check [`succeeded`](Self::succeeded): an update
/// that lost every try changed nothing.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// let session = dlock::connect("embedded").await?;
/// let counter = dlock::AtomicCounter::new(&session, "/doc/atomic-value")?;
/// let v = counter.add(5).await?;
/// assert!(v.succeeded);
/// assert_eq!((v.pre_value, v.post_value), (0, 5));
/// assert_eq!(v.stats.optimistic_tries, 1);
/// # session.delete("/doc/atomic-value", None).await?; Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicValue {
    /// Whether the operation took effect.
    pub succeeded: bool,
    /// The value before (0 for a missing node or empty data).
    pub pre_value: i64,
    /// The value after; if the operation failed, the value last seen.
    pub post_value: i64,
    /// How many tries it took, and how long.
    pub stats: AtomicStats,
}

impl AtomicValue {
    fn unset() -> Self {
        AtomicValue {
            succeeded: false,
            pre_value: 0,
            post_value: 0,
            stats: AtomicStats::default(),
        }
    }
}

/// The lock an [`AtomicCounter`] falls back to when its optimistic tries
/// fail (Curator's `PromotedToLock`): a [`Mutex`] at `lock_path`, waited
/// for at most [`with_timeout`](Self::with_timeout) (default: as long as
/// it takes), then tries per [`with_retry`](Self::with_retry) (default:
/// one try, as Curator's builder).
///
/// ```
/// use std::time::Duration;
/// let promoted = dlock::PromotedToLock::new("/locks/counter")?
///     .with_timeout(Duration::from_secs(5));
/// assert_eq!(promoted.lock_path(), "/locks/counter");
/// assert!(dlock::PromotedToLock::new("no-slash").is_err());
/// # Ok::<(), dlock::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromotedToLock {
    lock_path: String,
    timeout: Option<Duration>,
    retry: RetryPolicy,
}

impl PromotedToLock {
    /// Promotion to the mutex at `lock_path` (not the root).
    ///
    /// ```
    /// assert!(dlock::PromotedToLock::new("/").is_err());
    /// ```
    pub fn new(lock_path: &str) -> Result<Self> {
        path::validate_recipe(lock_path, "a promoted lock")?;
        Ok(PromotedToLock {
            lock_path: lock_path.to_string(),
            timeout: None,
            retry: RetryPolicy {
                base_sleep: Duration::ZERO,
                max_sleep: Duration::ZERO,
                max_retries: 0,
            },
        })
    }

    /// Waits at most `timeout` for the lock; an update that does not get
    /// it in time fails (not succeeded), as in Curator.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let p = dlock::PromotedToLock::new("/l")?.with_timeout(Duration::from_secs(1));
    /// # Ok::<(), dlock::Error>(())
    /// ```
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// How the tries under the lock are repeated when they lose (to
    /// optimistic writers who do not take the lock).
    ///
    /// ```
    /// # use std::time::Duration;
    /// let retry = dlock::RetryPolicy { base_sleep: Duration::from_millis(1), max_sleep: Duration::from_millis(10), max_retries: 100 };
    /// let p = dlock::PromotedToLock::new("/l")?.with_retry(retry);
    /// # Ok::<(), dlock::Error>(())
    /// ```
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The lock's path.
    ///
    /// ```
    /// assert_eq!(dlock::PromotedToLock::new("/l")?.lock_path(), "/l");
    /// # Ok::<(), dlock::Error>(())
    /// ```
    pub fn lock_path(&self) -> &str {
        &self.lock_path
    }
}

/// A distributed 64-bit counter (Curator's `DistributedAtomicLong`): see
/// the [module docs](self) for its node and algorithm.
///
/// Nothing is cached: every call reads the store. Updates return an
/// [`AtomicValue`]; only [`get`](Self::get) always succeeds.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// let session = dlock::connect("embedded").await?;
/// let counter = dlock::AtomicCounter::new(&session, "/counters/doc")?
///     .promoted_to_lock(dlock::PromotedToLock::new("/counters/doc-lock")?);
/// assert!(counter.increment().await?.succeeded);
/// assert!(counter.add(10).await?.succeeded);
/// assert_eq!(counter.get().await?.post_value, 11);
/// // Compare-and-set: only from the value it has now.
/// assert!(!counter.compare_and_set(5, 0).await?.succeeded);
/// assert!(counter.compare_and_set(11, 0).await?.succeeded);
/// # session.delete("/counters/doc", None).await?; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct AtomicCounter {
    session: Session,
    path: String,
    retry: RetryPolicy,
    promoted: Option<PromotedToLock>,
}

impl AtomicCounter {
    /// The optimistic tries' default policy: ten retries, backing off from
    /// 1 ms to at most 100 ms with jitter, so that writers who collided
    /// spread out.
    ///
    /// ```
    /// assert_eq!(dlock::AtomicCounter::DEFAULT_RETRY.max_retries, 10);
    /// ```
    pub const DEFAULT_RETRY: RetryPolicy = RetryPolicy {
        base_sleep: Duration::from_millis(1),
        max_sleep: Duration::from_millis(100),
        max_retries: 10,
    };

    /// A counter at `path` (not the root), used through `session`, in
    /// optimistic mode with [`DEFAULT_RETRY`](Self::DEFAULT_RETRY). Nothing
    /// happens in the store until it is used.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// let session = dlock::connect("embedded").await?;
    /// assert!(dlock::AtomicCounter::new(&session, "/").is_err());
    /// assert!(dlock::AtomicCounter::new(&session, "/c/").is_err());
    /// # Ok(()) }
    /// ```
    pub fn new(session: &Session, path: &str) -> Result<Self> {
        path::validate_recipe(path, "an atomic counter")?;
        Ok(AtomicCounter {
            session: session.clone(),
            path: path.to_string(),
            retry: Self::DEFAULT_RETRY,
            promoted: None,
        })
    }

    /// Sets how the optimistic tries are repeated (Curator's `retryPolicy`):
    /// at most `1 + max_retries` tries, sleeping
    /// [`RetryPolicy::sleep_for`] between them.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # use std::time::Duration;
    /// # let session = dlock::connect("embedded").await?;
    /// let once = dlock::RetryPolicy { base_sleep: Duration::ZERO, max_sleep: Duration::ZERO, max_retries: 0 };
    /// let counter = dlock::AtomicCounter::new(&session, "/c")?.with_retry(once);
    /// # Ok(()) }
    /// ```
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Falls back to a lock when the optimistic tries fail (Curator's
    /// promoted-to-lock mode).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let counter = dlock::AtomicCounter::new(&session, "/c")?
    ///     .promoted_to_lock(dlock::PromotedToLock::new("/c-lock")?);
    /// # Ok(()) }
    /// ```
    pub fn promoted_to_lock(mut self, promoted: PromotedToLock) -> Self {
        self.promoted = Some(promoted);
        self
    }

    /// The counter's node.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// assert_eq!(dlock::AtomicCounter::new(&session, "/c")?.path(), "/c");
    /// # Ok(()) }
    /// ```
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The current value (0 if the node is missing or empty), as
    /// succeeded with `pre_value == post_value`. One round trip.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let counter = dlock::AtomicCounter::new(&session, "/doc/counter-get")?;
    /// let v = counter.get().await?;
    /// assert!(v.succeeded && v.post_value == 0);
    /// assert!(session.exists("/doc/counter-get").await?.is_none(), "a read creates nothing");
    /// # Ok(()) }
    /// ```
    pub async fn get(&self) -> Result<AtomicValue> {
        let value = self.read().await?.map_or(0, |(v, _)| v);
        Ok(AtomicValue {
            succeeded: true,
            pre_value: value,
            post_value: value,
            stats: AtomicStats::default(),
        })
    }

    /// Adds 1 (see [`add`](Self::add)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let counter = dlock::AtomicCounter::new(&session, "/doc/counter-inc")?;
    /// assert_eq!(counter.increment().await?.post_value, 1);
    /// # session.delete("/doc/counter-inc", None).await?; Ok(()) }
    /// ```
    pub async fn increment(&self) -> Result<AtomicValue> {
        self.add(1).await
    }

    /// Subtracts 1 (see [`add`](Self::add)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let counter = dlock::AtomicCounter::new(&session, "/doc/counter-dec")?;
    /// assert_eq!(counter.decrement().await?.post_value, -1);
    /// # session.delete("/doc/counter-dec", None).await?; Ok(()) }
    /// ```
    pub async fn decrement(&self) -> Result<AtomicValue> {
        self.add(-1).await
    }

    /// Adds `delta` atomically: optimistic tries, then the promoted lock if
    /// any. A missing node counts as 0 and is created.
    ///
    /// Fails with [`Error::InvalidArgument`] if the sum would overflow,
    /// [`Error::MalformedData`] if the node holds no counter, and
    /// [`Error::ConnectionLoss`] if a write's connection was lost (it may
    /// or may not have been applied).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let counter = dlock::AtomicCounter::new(&session, "/doc/counter-add")?;
    /// let v = counter.add(7).await?;
    /// assert_eq!((v.succeeded, v.pre_value, v.post_value), (true, 0, 7));
    /// assert_eq!(session.get_data("/doc/counter-add").await?.0, 7i64.to_be_bytes());
    /// assert!(counter.add(i64::MAX).await.is_err(), "overflow");
    /// # session.delete("/doc/counter-add", None).await?; Ok(()) }
    /// ```
    pub async fn add(&self, delta: i64) -> Result<AtomicValue> {
        let path = &self.path;
        self.update(|pre| {
            pre.checked_add(delta).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "adding {delta} to {pre} at {path} overflows a 64-bit counter"
                ))
            })
        })
        .await
    }

    /// Subtracts `delta` atomically (see [`add`](Self::add)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let counter = dlock::AtomicCounter::new(&session, "/doc/counter-sub")?;
    /// assert_eq!(counter.subtract(3).await?.post_value, -3);
    /// # session.delete("/doc/counter-sub", None).await?; Ok(()) }
    /// ```
    pub async fn subtract(&self, delta: i64) -> Result<AtomicValue> {
        let path = &self.path;
        self.update(|pre| {
            pre.checked_sub(delta).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "subtracting {delta} from {pre} at {path} overflows a 64-bit counter"
                ))
            })
        })
        .await
    }

    /// Sets `value` whatever the value is, through the same tries as an
    /// update (Curator's `trySet`): it fails only if every try lost a race.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let counter = dlock::AtomicCounter::new(&session, "/doc/counter-tryset")?;
    /// counter.add(2).await?;
    /// let v = counter.try_set(40).await?;
    /// assert_eq!((v.succeeded, v.pre_value, v.post_value), (true, 2, 40));
    /// # session.delete("/doc/counter-tryset", None).await?; Ok(()) }
    /// ```
    pub async fn try_set(&self, value: i64) -> Result<AtomicValue> {
        self.update(|_| Ok(value)).await
    }

    /// Sets `value` only if the counter holds `expected` now: one try, no
    /// retries, no lock (Curator's `compareAndSet`). As in Curator, a
    /// missing node or empty data never matches (the stored bytes are
    /// compared).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let counter = dlock::AtomicCounter::new(&session, "/doc/counter-cas")?;
    /// assert!(!counter.compare_and_set(0, 1).await?.succeeded, "no node yet");
    /// assert!(counter.initialize(0).await?);
    /// let v = counter.compare_and_set(0, 1).await?;
    /// assert_eq!((v.succeeded, v.pre_value, v.post_value), (true, 0, 1));
    /// assert!(!counter.compare_and_set(0, 2).await?.succeeded, "it is 1 now");
    /// # session.delete("/doc/counter-cas", None).await?; Ok(()) }
    /// ```
    pub async fn compare_and_set(&self, expected: i64, value: i64) -> Result<AtomicValue> {
        let mut result = AtomicValue::unset();
        let Some((data, stat)) = self.read_raw().await? else {
            return Ok(result);
        };
        result.pre_value = decode(&self.path, &data)?;
        result.post_value = result.pre_value;
        if data != encode(expected) {
            return Ok(result);
        }
        match (self.session)
            .set_data(&self.path, &encode(value), Some(stat.version))
            .await
        {
            Ok(_) => {
                result.succeeded = true;
                result.post_value = value;
            }
            Err(Error::BadVersion { .. } | Error::NoNode { .. }) => {}
            Err(e) => return Err(e),
        }
        Ok(result)
    }

    /// Sets `value` unconditionally, creating the node if needed (Curator's
    /// `forceSet`): no atomicity with concurrent updates.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let counter = dlock::AtomicCounter::new(&session, "/doc/counter-force")?;
    /// counter.force_set(-5).await?;
    /// assert_eq!(counter.get().await?.post_value, -5);
    /// # session.delete("/doc/counter-force", None).await?; Ok(()) }
    /// ```
    pub async fn force_set(&self, value: i64) -> Result<()> {
        let (session, path, data) = (&self.session, &self.path, encode(value));
        loop {
            match session
                .retrying(|| session.set_data(path, &data, None))
                .await
            {
                Ok(_) => return Ok(()),
                Err(Error::NoNode { .. }) => {}
                Err(e) => return Err(e),
            }
            match session
                .retrying(|| session.create(path, &data, Self::node_options()))
                .await
            {
                Ok(_) => return Ok(()),
                // Created meanwhile (or a reaped parent): set it again.
                Err(Error::NodeExists { .. } | Error::NoNode { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Creates the node with `value` unless it exists; returns whether it
    /// did (Curator's `initialize`). A lost connection is returned as
    /// [`Error::ConnectionLoss`]: the node may or may not have been made.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// let counter = dlock::AtomicCounter::new(&session, "/doc/counter-init")?;
    /// assert!(counter.initialize(100).await?);
    /// assert!(!counter.initialize(200).await?, "already there");
    /// assert_eq!(counter.get().await?.post_value, 100);
    /// # session.delete("/doc/counter-init", None).await?; Ok(()) }
    /// ```
    pub async fn initialize(&self, value: i64) -> Result<bool> {
        let data = encode(value);
        let create = || self.session.create(&self.path, &data, Self::node_options());
        match self.session.retrying_reaped(create).await {
            Ok(_) => Ok(true),
            Err(Error::NodeExists { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The node: persistent, its ancestors containers.
    fn node_options() -> CreateOptions {
        CreateOptions::new(CreateMode::Persistent).with_parents()
    }

    /// The node's data and stat, `None` if it is missing.
    async fn read_raw(&self) -> Result<Option<(Vec<u8>, Stat)>> {
        let (session, path) = (&self.session, &self.path);
        match session.retrying(|| session.get_data(path)).await {
            Ok(found) => Ok(Some(found)),
            Err(Error::NoNode { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The value and stat, `None` if the node is missing.
    async fn read(&self) -> Result<Option<(i64, Stat)>> {
        match self.read_raw().await? {
            Some((data, stat)) => Ok(Some((decode(&self.path, &data)?, stat))),
            None => Ok(None),
        }
    }

    /// Curator's `trySet(MakeValue)`: optimistic tries, then the promoted
    /// lock's.
    async fn update(&self, make: impl Fn(i64) -> Result<i64>) -> Result<AtomicValue> {
        let mut result = AtomicValue::unset();
        let started = Instant::now();
        let mut retry = 0;
        loop {
            result.stats.optimistic_tries += 1;
            if self.try_once(&mut result, &make).await? {
                break;
            }
            if retry >= self.retry.max_retries {
                break;
            }
            tokio::time::sleep(self.retry.sleep_for(retry)).await;
            retry += 1;
        }
        result.stats.optimistic_time = started.elapsed();
        if let (false, Some(promoted)) = (result.succeeded, &self.promoted) {
            let started = Instant::now();
            let mutex = Mutex::new(&self.session, &promoted.lock_path)?;
            let guard = match promoted.timeout {
                Some(t) => match mutex.acquire_timeout(t).await {
                    Ok(guard) => Some(guard),
                    Err(Error::Timeout(_)) => None,
                    Err(e) => return Err(e),
                },
                None => Some(mutex.acquire().await?),
            };
            if let Some(guard) = guard {
                let mut retry = 0;
                let tried = loop {
                    result.stats.promoted_lock_tries += 1;
                    match self.try_once(&mut result, &make).await {
                        Ok(true) => break Ok(()),
                        Ok(false) if retry < promoted.retry.max_retries => {
                            tokio::time::sleep(promoted.retry.sleep_for(retry)).await;
                            retry += 1;
                        }
                        Ok(false) => break Ok(()),
                        Err(e) => break Err(e),
                    }
                };
                let released = guard.release().await;
                tried?;
                released?;
            }
            result.stats.promoted_time = started.elapsed();
        }
        Ok(result)
    }

    /// One compare-and-set: read, compute, write with the version read (or
    /// create). Whether it won; a lost race is `false`.
    async fn try_once(
        &self,
        result: &mut AtomicValue,
        make: &impl Fn(i64) -> Result<i64>,
    ) -> Result<bool> {
        let (session, path) = (&self.session, &self.path);
        let read = self.read().await?;
        result.pre_value = read.map_or(0, |(v, _)| v);
        result.post_value = result.pre_value;
        let value = make(result.pre_value)?;
        let data = encode(value);
        let written = match read {
            Some((_, stat)) => session
                .set_data(path, &data, Some(stat.version))
                .await
                .map(drop),
            None => session
                .create(path, &data, Self::node_options())
                .await
                .map(drop),
        };
        match written {
            Ok(()) => {
                result.succeeded = true;
                result.post_value = value;
                Ok(true)
            }
            Err(Error::BadVersion { .. } | Error::NodeExists { .. } | Error::NoNode { .. }) => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}
