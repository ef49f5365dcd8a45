//! Who holds a [`ReadWriteLock`](super::ReadWriteLock) through one value
//! (and its clones), so that a holder is refused what would wait for
//! itself: as Curator's locks belong to threads, a hold belongs to the task
//! that took it (outside a task, to the thread: the blocking API).

use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::thread::ThreadId;

use crate::recipes::lifecycle::lock;
use crate::recipes::queue::HeldNode;

/// The task (or, outside one, the thread) that takes a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    Task(tokio::task::Id),
    Thread(ThreadId),
}

impl Owner {
    fn current() -> Self {
        match tokio::task::try_id() {
            Some(task) => Owner::Task(task),
            None => Owner::Thread(std::thread::current().id()),
        }
    }
}

/// Whether a hold is of the write lock or the read lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Half {
    Read,
    Write,
}

/// The holds taken through one value and its clones: each with its owner
/// and its node, which tells whether it still holds (given back, lost or
/// taken away, it refuses nothing).
#[derive(Debug, Default)]
pub(super) struct Holds(StdMutex<Vec<(Owner, Half, Weak<HeldNode>)>>);

impl Holds {
    /// Notes `node`, just acquired by the current task.
    pub fn note(&self, half: Half, node: &Arc<HeldNode>) {
        let mut holds = lock(&self.0);
        holds.retain(|(_, _, node)| node.strong_count() > 0);
        holds.push((Owner::current(), half, Arc::downgrade(node)));
    }

    /// Whether the current task holds `half` still.
    pub fn held_here(&self, half: Half) -> bool {
        let me = Owner::current();
        lock(&self.0).iter().any(|(owner, h, node)| {
            *owner == me && *h == half && node.upgrade().is_some_and(|n| n.is_held())
        })
    }
}
