//! [`Lease`]: one lease of a [`Semaphore`](super::Semaphore).

use std::sync::Arc;

use crate::error::Result;
use crate::recipes::guard::{deref_hold, Acquisition};
use crate::recipes::queue::HeldNode;

/// One lease of a [`Semaphore`](super::Semaphore) (Curator's `Lease`): an
/// owned object, free to move between tasks. Give it back with
/// [`release`](Self::release); dropping it gives it back in the background.
/// If the session that made it is lost, the lease is gone too
/// ([`lost`](Acquisition::lost) tells).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// let session = dlock::connect("embedded").await?;
/// let semaphore = dlock::Semaphore::new(&session, "/doc/lease", 1)?.with_data(b"worker-7".to_vec());
/// let lease = semaphore.acquire_one().await?;
/// assert!(lease.name().contains("lease-") && lease.data() == b"worker-7");
/// let elsewhere = tokio::spawn(async move { lease.release().await }); // any task may give it back
/// elsewhere.await.unwrap()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "dropping the lease gives it back"]
pub struct Lease {
    acquisition: Acquisition,
    data: Vec<u8>,
    released: bool,
}

deref_hold!(Lease => acquisition: Acquisition);

impl Lease {
    pub(super) fn new(node: Arc<HeldNode>, data: Vec<u8>) -> Self {
        Lease {
            acquisition: Acquisition::new(node),
            data,
            released: false,
        }
    }

    /// The lease node's name (Curator's `getNodeName`).
    pub fn name(&self) -> &str {
        self.held_node().created.name()
    }

    /// The data stored in the lease node.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// Gives the lease back: deletes its node. Reports
    /// [`Error::Lost`](crate::Error::Lost) if the lease had been lost
    /// before, or its node was found gone (revoked by force: Curator's
    /// release would say nothing), so the caller learns its work was not
    /// protected —
    /// [`Error::Closed`](crate::Error::Closed) if its session was closed (which took the node).
    ///
    /// Cancellation-safe: if this future is dropped before the node is
    /// deleted, the lease is given back in the background.
    pub async fn release(mut self) -> Result<()> {
        let released = self.held_node().release().await;
        self.released = true;
        released
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.released {
            self.held_node().let_go_in_background();
        }
    }
}

/// Gives leases back, ignoring errors (Curator's `returnAll`).
pub(super) async fn return_all(leases: impl IntoIterator<Item = Lease>) {
    for lease in leases {
        let _ = lease.release().await;
    }
}
