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
//! A `SharedCount` is a [`SharedValue`] typed `i32`: the same node, watch
//! and compare-and-set, with the 4-byte codec below; a `SharedValue` of
//! bytes on the same path reads the count's 4 bytes, and the reverse.

use super::shared_value::{SharedValue, ValueCodec};
use crate::error::{Error, Result};
use crate::store::Stat;

pub use super::shared_value::VersionedValue;

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
///
/// ```
/// use dlock::recipes::shared_count::{decode, encode};
/// assert_eq!(decode("/c", &encode(-7)).unwrap(), -7);
/// assert!(decode("/c", b"12345").is_err());
/// ```
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

/// Curator's `SharedCount` bytes: 4, big-endian ([`encode`], [`decode`]).
impl ValueCodec for i32 {
    const KIND: &'static str = "shared count";

    fn to_bytes(&self) -> Vec<u8> {
        encode(*self).to_vec()
    }

    fn from_bytes(path: &str, data: &[u8]) -> Result<Self> {
        decode(path, data)
    }
}

/// A shared counter (Curator's `SharedCount`).
///
/// Create it with [`new`](SharedValue::new), then [`start`](SharedValue::start) it: that
/// creates the node with the seed if nobody did before, reads the value and
/// starts a background watcher that keeps the local copy fresh.
/// [`get`](SharedValue::get) and [`versioned`](SharedValue::versioned) read the local
/// copy (no round trip); [`subscribe`](SharedValue::subscribe) and
/// [`changes`](SharedValue::changes) report every change seen. [`close`](SharedValue::close)
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
///
/// It is a [`SharedValue<i32>`]: every method is documented there.
pub type SharedCount = SharedValue<i32>;
