//! Where a [`Semaphore`](super::Semaphore)'s maximum comes from, and the
//! predicates that read the lease nodes against it.

use tokio::sync::watch::Receiver;
use tokio::sync::Notify;

use crate::error::Result;
use crate::recipes::queue::{position, Predicate, Verdict};
use crate::recipes::shared_count::{SharedCount, VersionedValue};
use crate::store::Child;

/// Where the maximum number of leases comes from.
#[derive(Debug, Clone)]
pub(super) enum Max {
    Fixed(u32),
    Count(SharedCount),
}

impl Max {
    pub(super) fn current(&self) -> i64 {
        match self {
            Max::Fixed(n) => i64::from(*n),
            Max::Count(count) => i64::from(count.get()),
        }
    }

    pub(super) fn subscribe(&self) -> Option<Receiver<VersionedValue<i32>>> {
        match self {
            Max::Fixed(_) => None,
            Max::Count(count) => Some(count.subscribe()),
        }
    }
}

/// Curator's semaphore predicate: our node is there (else `NoNode`, "Sequential
/// path not found") and there are at most `max` lease nodes, ours included;
/// otherwise wait for the set of leases to change.
pub(super) struct LeaseCount<'a>(pub(super) &'a Max);

impl Predicate for LeaseCount<'_> {
    fn check(&self, sorted: &[Child], ours: &str) -> Result<Verdict> {
        position(sorted, ours)?;
        Ok(if sorted.len() as i64 <= self.0.current() {
            Verdict::Acquired
        } else {
            Verdict::WatchChildren
        })
    }
}

/// Who holds, as far as a listing can tell: everyone when there are at most
/// `max` leases, or when nobody acquires (holds the internal lock:
/// `acquiring` is false), as after the maximum was lowered; otherwise the
/// newest lease is taken to be the one waiting (the head acquirer's node
/// is created last).
pub(super) struct Holders<'a> {
    pub max: &'a Max,
    pub acquiring: bool,
}

impl Predicate for Holders<'_> {
    fn check(&self, sorted: &[Child], ours: &str) -> Result<Verdict> {
        let index = position(sorted, ours)?;
        let within = sorted.len() as i64 <= self.max.current();
        Ok(if within || !self.acquiring || index + 1 < sorted.len() {
            Verdict::Acquired
        } else {
            Verdict::WatchChildren
        })
    }
}

/// Turns changes of the maximum into wake-ups of the waiting acquirer.
/// Never returns.
pub(super) async fn forward_changes(
    changes: Option<Receiver<VersionedValue<i32>>>,
    wake: &Notify,
) -> std::convert::Infallible {
    if let Some(mut changes) = changes {
        while changes.changed().await.is_ok() {
            // A permit is kept if the waiter is not listening yet.
            wake.notify_one();
        }
    }
    std::future::pending().await
}
