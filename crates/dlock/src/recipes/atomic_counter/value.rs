//! An [`AtomicCounter`](super::AtomicCounter)'s bytes, results and
//! promotion to a lock: the data of the recipe, no I/O.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::path;
use crate::session::RetryPolicy;

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

/// The result of an [`AtomicCounter`](super::AtomicCounter) operation
/// (Curator's `AtomicValue<Long>`). Check [`succeeded`](Self::succeeded):
/// an update that lost every try changed nothing.
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
    pub(super) fn unset() -> Self {
        AtomicValue {
            succeeded: false,
            pre_value: 0,
            post_value: 0,
            stats: AtomicStats::default(),
        }
    }
}

/// The lock an [`AtomicCounter`](super::AtomicCounter) falls back to when
/// its optimistic tries fail (Curator's `PromotedToLock`): a
/// [`Mutex`](crate::Mutex) at `lock_path`, waited for at most [`with_timeout`](Self::with_timeout) (default: as long as
/// it takes), then tries per [`with_retry`](Self::with_retry) (default:
/// one try, as Curator's builder). A lock not had in time — also because
/// the store's requests kept failing until then — leaves the update not
/// [`succeeded`](super::AtomicValue::succeeded), as a lost race does.
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
    pub(super) lock_path: String,
    pub(super) timeout: Option<Duration>,
    pub(super) retry: RetryPolicy,
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
