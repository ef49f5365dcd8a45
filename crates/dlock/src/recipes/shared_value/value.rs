//! A [`SharedValue`](super::SharedValue)'s value: its type's codec, its
//! version, and the local copy that only ever moves to newer data.

use std::fmt;
use std::sync::Mutex as StdMutex;

use tokio::sync::watch;

use crate::error::Result;
use crate::recipes::lifecycle::lock;
use crate::store::Stat;

/// A value together with the node version it was read at (Curator's
/// `VersionedValue`): what [`SharedValue::try_set`](super::SharedValue::try_set) compares against.
///
/// ```
/// use dlock::recipes::shared_value::VersionedValue;
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
    ///
    /// ```
    /// use dlock::recipes::shared_value::VersionedValue;
    /// assert_eq!(VersionedValue::new(0, b"x".to_vec()).version, 0);
    /// ```
    pub fn new(version: i32, value: T) -> Self {
        VersionedValue { version, value }
    }
}

/// The version of a value that was never read (Curator's
/// `UNINITIALIZED_VERSION`).
pub(super) const UNINITIALIZED: i32 = -1;

/// How a [`SharedValue`](super::SharedValue)'s type is stored in its node.
///
/// ```
/// use dlock::recipes::shared_value::ValueCodec;
/// assert_eq!(258i32.to_bytes(), [0, 0, 1, 2]);
/// assert_eq!(i32::from_bytes("/c", &[0, 0, 1, 2]).unwrap(), 258);
/// assert_eq!(<Vec<u8>>::from_bytes("/v", b"any").unwrap(), b"any");
/// ```
pub trait ValueCodec: Clone + PartialEq + fmt::Debug + Send + Sync + 'static {
    /// What the recipe is called in messages ("shared value").
    const KIND: &'static str;
    /// The node data for this value.
    fn to_bytes(&self) -> Vec<u8>;
    /// The value stored at `path`, or [`Error::MalformedData`] naming the
    /// path if the data is no such value.
    ///
    /// [`Error::MalformedData`]: crate::Error::MalformedData
    fn from_bytes(path: &str, data: &[u8]) -> Result<Self>;
}

/// Bytes as they are: Curator's `SharedValue`.
impl ValueCodec for Vec<u8> {
    const KIND: &'static str = "shared value";

    fn to_bytes(&self) -> Vec<u8> {
        self.clone()
    }

    fn from_bytes(_path: &str, data: &[u8]) -> Result<Self> {
        Ok(data.to_vec())
    }
}

/// The local copy, shared with the watcher task.
pub(super) struct Cache<T> {
    /// The sender, dropped on close so that subscribers see the end.
    state: StdMutex<CacheState<T>>,
    /// For reading the current value without locking.
    pub(super) current: watch::Receiver<VersionedValue<T>>,
}

struct CacheState<T> {
    tx: Option<watch::Sender<VersionedValue<T>>>,
    /// Transaction id of the last data change applied: only newer data
    /// replaces the copy (Curator 5.7 orders by mzxid, as the version can
    /// wrap; CURATOR-688).
    mzxid: i64,
}

impl<T> Cache<T> {
    pub(super) fn new(seed: T) -> Self {
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
    pub(super) fn update(&self, stat: &Stat, value: T) {
        let mut state = lock(&self.state);
        if stat.mzxid <= state.mzxid {
            return;
        }
        state.mzxid = stat.mzxid;
        if let Some(tx) = &state.tx {
            tx.send_replace(VersionedValue::new(stat.version, value));
        }
    }

    pub(super) fn close(&self) {
        lock(&self.state).tx = None;
    }
}
