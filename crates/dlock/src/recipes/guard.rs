//! [`LockGuard`]: one hold of a lock node — the guard every lock recipe
//! (mutex, read and write halves) hands out.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::queue::HeldNode;
use crate::error::{Error, Result};
use crate::store::{FencingToken, Op, OpResult, SessionState};

/// One hold of a lock. The lock is released when the last hold is released
/// — with [`release`](Self::release), or by dropping, which deletes the node
/// in the background.
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock"]
pub struct LockGuard {
    held: Arc<Held>,
    state: GuardState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GuardState {
    /// This hold counts.
    Held,
    /// The last hold is deleting the node.
    Releasing,
    /// Done.
    Released,
}

#[derive(Debug)]
struct Held {
    node: Arc<HeldNode>,
    holds: AtomicUsize,
}

impl LockGuard {
    pub(crate) fn new(node: Arc<HeldNode>) -> Self {
        LockGuard {
            held: Arc::new(Held {
                node,
                holds: AtomicUsize::new(1),
            }),
            state: GuardState::Held,
        }
    }

    pub(crate) fn held_node(&self) -> &Arc<HeldNode> {
        &self.held.node
    }

    /// The fencing token of this acquisition: larger than that of every
    /// earlier acquisition of any lock in the store.
    pub fn token(&self) -> FencingToken {
        self.held.node.created.token()
    }

    /// The full path of our lock node.
    pub fn node(&self) -> &str {
        &self.held.node.created.path
    }

    /// How many holds (this one included) are still unreleased.
    pub fn holds(&self) -> usize {
        self.held.holds.load(Ordering::SeqCst)
    }

    /// Acquires again without a round trip; release the new guard too.
    /// Fails with [`Error::Lost`] if the lock was lost meanwhile.
    pub fn reenter(&self) -> Result<LockGuard> {
        if self.is_lost() {
            return Err(self.held.node.lost_error());
        }
        self.held.holds.fetch_add(1, Ordering::SeqCst);
        Ok(LockGuard {
            held: self.held.clone(),
            state: GuardState::Held,
        })
    }

    /// Whether the session that acquired the lock is over: then another
    /// participant may hold it now.
    pub fn is_lost(&self) -> bool {
        self.held.node.is_lost()
    }

    /// Whether the connection is down right now: the lock may or may not
    /// still be ours until the session reconnects or is lost.
    pub fn is_suspended(&self) -> bool {
        self.held.node.session.state() == SessionState::Suspended
    }

    /// Resolves when the lock is lost (the session expired, was closed, or was
    /// replaced). Use it to stop the protected work:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// # let session = dlock::connect("embedded").await?;
    /// # let mutex = dlock::Mutex::new(&session, "/locks/lost-doc")?;
    /// let guard = mutex.acquire().await?;
    /// tokio::select! {
    ///     _ = guard.lost() => println!("lost the lock: stop writing"),
    ///     _ = async { /* protected work */ } => {}
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn lost(&self) {
        let node = &self.held.node;
        node.session.lost(node.session_id).await
    }

    /// Applies `ops` atomically only if we still hold the lock (our node
    /// still exists): a write that cannot land after the lock is lost.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// use dlock::store::{CreateMode, CreateOptions, Op};
    /// # let session = dlock::connect("embedded").await?;
    /// session.create("/doc/guarded/stock", b"5", CreateOptions::new(CreateMode::Persistent).with_parents()).await?;
    /// let guard = dlock::Mutex::new(&session, "/doc/guarded/lock")?.acquire().await?;
    /// guard.guarded(&[Op::SetData { path: "/doc/guarded/stock".into(), data: b"4".to_vec(), version: None }]).await?;
    /// # guard.release().await?; session.delete("/doc/guarded/stock", None).await?;
    /// # Ok(()) }
    /// ```
    pub async fn guarded(&self, ops: &[Op]) -> Result<Vec<OpResult>> {
        self.held.node.guarded(ops).await
    }

    /// Releases this hold; the last one deletes the lock node. Reports
    /// [`Error::Lost`] if the lock had been lost before (the node is gone
    /// either way), so the caller learns its work was not protected —
    /// [`Error::Closed`] if its session was closed (which took the node).
    pub async fn release(mut self) -> Result<()> {
        if self.held.holds.fetch_sub(1, Ordering::SeqCst) > 1 {
            self.state = GuardState::Released;
            return Ok(());
        }
        // If this future is dropped before the delete completes, the drop
        // finishes the job in the background.
        self.state = GuardState::Releasing;
        let result = self.held.node.release().await;
        self.state = GuardState::Released;
        result
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let last = match self.state {
            GuardState::Held => self.held.holds.fetch_sub(1, Ordering::SeqCst) == 1,
            GuardState::Releasing => true,
            GuardState::Released => false,
        };
        if last {
            let node = &self.held.node;
            node.session.delete_in_background(node.created.path.clone());
        }
    }
}

impl HeldNode {
    /// Applies `ops` only if our node still exists.
    pub(crate) async fn guarded(&self, ops: &[Op]) -> Result<Vec<OpResult>> {
        if self.is_lost() {
            return Err(self.lost_error());
        }
        let mut all = Vec::with_capacity(ops.len() + 1);
        all.push(Op::Check {
            path: self.created.path.clone(),
            version: None,
        });
        all.extend_from_slice(ops);
        match self.session.multi(&all).await {
            Ok(mut results) => {
                results.remove(0);
                Ok(results)
            }
            Err(Error::MultiFailed { index: 0, .. }) => Err(self.lost_error()),
            Err(Error::MultiFailed { index, source }) => Err(Error::MultiFailed {
                index: index - 1,
                source,
            }),
            Err(e) => Err(e),
        }
    }
}
