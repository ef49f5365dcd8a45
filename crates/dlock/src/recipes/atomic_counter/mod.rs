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
//! takes a [`Mutex`](crate::Mutex) at the lock path: Curator's
//! `InterProcessMutex` nodes (`<lock path>/_c_<uuid>-lock-<seq>`), so a
//! Java `DistributedAtomicLong` promoted to the same lock path queues with
//! dlock's.
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

mod tries;
mod value;

use std::time::Duration;

pub use self::value::{decode, encode, AtomicStats, AtomicValue, PromotedToLock};
use crate::error::{Error, Result};
use crate::path;
use crate::session::{RetryPolicy, Session};

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
        self.update(|pre| {
            self.no_overflow(pre.checked_add(delta), || {
                format!("adding {delta} to {pre}")
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
        self.update(|pre| {
            let doing = || format!("subtracting {delta} from {pre}");
            self.no_overflow(pre.checked_sub(delta), doing)
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
}
