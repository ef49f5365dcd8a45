//! Who holds a [`ReadWriteLock`](super::ReadWriteLock) through one value
//! (and its clones), so that a holder is refused what would wait for
//! itself: as Curator's locks belong to threads, a hold belongs to the task
//! that took it (outside a task, to the thread: the blocking API).

use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::thread::ThreadId;

use crate::error::{Error, Result};
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

    /// `InvalidArgument` if the current task asking for `wanted` at `path`
    /// holds what would keep it waiting for itself for ever: the read lock
    /// (for either: an upgrade, or a second reader that a writer queued
    /// in between keeps waiting), or the write lock (for either), naming
    /// the way that works.
    pub fn refuse_waiting_for_itself(&self, wanted: Half, path: &str) -> Result<()> {
        let me = Owner::current();
        let (mut reads, mut writes) = (false, false);
        for (owner, half, node) in lock(&self.0).iter() {
            if *owner == me && node.upgrade().is_some_and(|n| n.is_held()) {
                match half {
                    Half::Read => reads = true,
                    Half::Write => writes = true,
                }
            }
        }
        let why = match wanted {
            Half::Write if reads => format!(
                "cannot upgrade a read lock to the write lock at {path}: release the read lock \
                 first (the writer would wait for itself forever)"
            ),
            Half::Write if writes => format!(
                "this task holds the write lock at {path} already: take it again with \
                 WriteGuard::reenter (a second writer would wait for itself forever)"
            ),
            // Free now, it would wait behind a writer queued since: a
            // writer waits for our first read, so for ever.
            Half::Read if reads => format!(
                "this task holds the read lock at {path} already: take it again with \
                 ReadGuard::reenter (a second reader would wait for itself forever behind a \
                 writer queued meanwhile)"
            ),
            Half::Read if writes => format!(
                "this task holds the write lock at {path}: take the read lock with \
                 WriteGuard::read, a downgrade (a reader queued behind its own writer would \
                 wait forever)"
            ),
            _ => return Ok(()),
        };
        Err(Error::InvalidArgument(why))
    }
}
