//! [`KvLease`]: a slot of a [`KvSemaphore`](super::KvSemaphore).

use super::place::Place;
use crate::error::Result;
use crate::recipes::guard::{deref_hold, Acquisition};

/// A slot of a [`KvSemaphore`](super::KvSemaphore): an owned object, free to move between
/// tasks. Give it back with [`release`](Self::release); dropping it gives it
/// back in the background. If the session is lost, so is the slot: the
/// others prune it ([`lost`](crate::Acquisition::lost) tells).
#[derive(Debug)]
#[must_use = "dropping the lease gives it back"]
pub struct KvLease {
    pub(super) acquisition: Acquisition,
    pub(super) place: Place,
    pub(super) id: String,
    pub(super) released: bool,
}

deref_hold!(
    /// The slot's acquisition. Its [`token`](Acquisition::token) is the
    /// transaction id of the record write that admitted us, larger than that
    /// of every earlier admission (and every earlier write) in the store; its
    /// node is our contender entry, and guarded writes land only while the
    /// entry (so the slot) is still ours.
    KvLease => acquisition: Acquisition
);

impl KvLease {
    /// Our holder id (the session id in hex), as listed in the record.
    pub fn holder(&self) -> &str {
        &self.id
    }

    /// Gives the slot back: removes us from the record (by compare-and-set,
    /// pruning dead holders) and deletes our entry. Reports [`Error::Lost`](crate::Error::Lost)
    /// if the slot had been lost before — [`Error::Closed`](crate::Error::Closed) if its session
    /// was closed (which took the entry; the others prune the record).
    ///
    /// Cancellation-safe: if this future is dropped before it is done, the
    /// slot is given back in the background.
    pub async fn release(mut self) -> Result<()> {
        let taken = self.held_node().let_go().taken();
        let lost = self.is_lost();
        // A slot taken away has no entry left (revoked by force, or
        // deleted by the limit): only the record is to be tidied.
        let ours = (!taken).then(|| (self.id.as_str(), self.node()));
        let left = self.place.leave(ours).await;
        self.released = true;
        left?;
        if lost {
            Err(self.lost_error())
        } else {
            Ok(())
        }
    }
}

impl Drop for KvLease {
    fn drop(&mut self) {
        if !self.released {
            let taken = self.held_node().let_go().taken();
            let ours = (!taken).then(|| (self.id.clone(), self.node().to_string()));
            self.place.leave_in_background(ours);
        }
    }
}
