//! The per-recipe half of the wait queue: a [`Predicate`] decides, from the
//! sorted siblings, whether a participant holds and what it watches if not.

use crate::error::{Error, Result};
use crate::store::Child;

/// What a recipe's predicate decides for one participant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The participant holds.
    Acquired,
    /// Wait until this sibling, as listed, changes or goes.
    WatchNode(Child),
    /// Wait until the set of siblings changes.
    WatchChildren,
}

/// A recipe's rule for "do I hold?", given the siblings in queue order.
pub(crate) trait Predicate: Send + Sync {
    /// Decides for our node `ours` (a name among `sorted`). Errors with
    /// `NoNode` if our node is not there (its session was lost).
    fn check(&self, sorted: &[Child], ours: &str) -> Result<Verdict>;
}

/// Curator's standard driver: the first `max_leases` participants hold; a
/// waiter watches the participant `max_leases` places ahead of it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FirstN(pub usize);

impl Predicate for FirstN {
    fn check(&self, sorted: &[Child], ours: &str) -> Result<Verdict> {
        let index = position(sorted, ours)?;
        Ok(if index < self.0 {
            Verdict::Acquired
        } else {
            Verdict::WatchNode(sorted[index - self.0].clone())
        })
    }
}

/// Our node's place in the queue, or `NoNode` if it is gone (Curator's
/// `validateOurIndex`: "Sequential path not found").
pub(crate) fn position(sorted: &[Child], ours: &str) -> Result<usize> {
    sorted
        .iter()
        .position(|c| c.name == ours)
        .ok_or_else(|| Error::NoNode {
            path: format!("sequential node {ours} not found"),
        })
}
