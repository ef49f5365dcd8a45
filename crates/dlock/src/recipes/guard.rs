//! The one hold type: [`Acquisition`] carries what every hold of every
//! recipe has — the fencing token, the lost and suspended signals, guarded
//! writes — and [`LockGuard`] (mutex, read and write halves), the
//! semaphores' [`Lease`](crate::Lease) and [`KvLease`](crate::KvLease), and
//! [`Leadership`](crate::Leadership) are built on it: each dereferences to
//! its acquisition and adds only how it is released.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::queue::HeldNode;
use crate::error::{Error, Result};
use crate::store::{FencingToken, Op, OpResult, SessionId, SessionState};

/// `impl Deref` of a hold type to what carries its acquisition (`$field`,
/// an [`Acquisition`] or a guard built on one): how every hold offers the
/// one hold type's token, signals and guarded writes as its own.
macro_rules! deref_hold {
    ($(#[$doc:meta])* $hold:ty => $($field:ident).+ : $target:ty) => {
        $(#[$doc])*
        impl std::ops::Deref for $hold {
            type Target = $target;

            fn deref(&self) -> &$target {
                &self.$($field).+
            }
        }
    };
}
pub(crate) use deref_hold;

/// One acquisition of a lock, lease, slot or leadership: what every hold
/// offers. Every guard dereferences to one, so these methods are called on
/// the guard itself.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// let session = dlock::connect("embedded").await?;
/// let sem = dlock::Semaphore::new(&session, "/doc/acquisition", 2)?;
/// let lease = sem.acquire_one().await?;
/// let acquisition: &dlock::Acquisition = &lease;
/// assert!(!acquisition.is_lost() && acquisition.token().0 > 0);
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Acquisition {
    node: Arc<HeldNode>,
    token: FencingToken,
}

impl Acquisition {
    /// An acquisition whose token is its node's creation.
    pub(crate) fn new(node: Arc<HeldNode>) -> Self {
        let token = node.created.token();
        Acquisition { node, token }
    }

    /// An acquisition fenced by another token than its node's creation: the
    /// KV semaphore's admitting record write, a downgraded write hold's.
    pub(crate) fn with_token(node: Arc<HeldNode>, token: FencingToken) -> Self {
        Acquisition { node, token }
    }

    pub(crate) fn held_node(&self) -> &Arc<HeldNode> {
        &self.node
    }

    /// The fencing token of this acquisition: larger than that of every
    /// earlier exclusive hold of the same lock (a mutex's, a write lock's,
    /// a leader's) — the transaction id of its node's creation, where the
    /// queue serves nodes in the order they were made. A read hold made by
    /// downgrading a write hold keeps the write hold's token: its node is
    /// newer than the writers queued behind it, which hold after it.
    /// Tokens of different locks are not ordered by when they were held.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The full path of the node that holds it.
    pub fn node(&self) -> &str {
        &self.node.created.path
    }

    /// The session it was acquired in.
    pub fn session_id(&self) -> SessionId {
        self.node.session_id
    }

    /// Whether the session that acquired it is over: then another
    /// participant may hold it now.
    pub fn is_lost(&self) -> bool {
        self.node.is_lost()
    }

    /// Whether the connection is down right now: it may or may not still be
    /// ours until the session reconnects or is lost.
    pub fn is_suspended(&self) -> bool {
        self.node.session.state() == SessionState::Suspended
    }

    /// Resolves when it is lost: the session expired, was closed, or was
    /// replaced; or the hold was taken away — its node deleted by someone
    /// else ([`revoke_forced`](crate::revoke_forced)) or by its maximum
    /// hold time (`with_max_hold`). Use it to stop the protected work:
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
        tokio::select! {
            () = self.node.session.lost(self.node.session_id) => {}
            () = self.node.taken_away() => {}
        }
    }

    /// Applies `ops` atomically only while it is held (its node still
    /// exists): a write that cannot land once it is lost — or given back,
    /// even if the same session holds the same lock again (on etcd, under
    /// the same key name), and, for a [`Leadership`](crate::Leadership),
    /// once its term is over. Fails with [`Error::Lost`] otherwise.
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
        guarded_by(&[self], ops).await
    }

    pub(crate) fn lost_error(&self) -> Error {
        self.node.lost_error()
    }

    /// The check that this acquisition still holds, as the first operation
    /// of a guarded write.
    fn check(&self) -> Op {
        Op::Check {
            path: self.node.created.path.clone(),
            version: None,
        }
    }
}

/// Applies `ops` atomically only while every one of `held` is held: one
/// multi-operation whose first operations check their nodes. All must be of
/// one session (a multi runs in one).
pub(crate) async fn guarded_by(held: &[&Acquisition], ops: &[Op]) -> Result<Vec<OpResult>> {
    let Some(first) = held.first() else {
        return Err(Error::InvalidArgument(
            "a guarded write needs something that guards it".into(),
        ));
    };
    // Judged here, not by the check alone: a node of a later hold in the
    // same session may have the name (etcd recycles names), and the check
    // accepts our session's newest node of that name.
    if let Some(ended) = held.iter().find(|a| !a.node.is_held()) {
        return Err(ended.lost_error());
    }
    if held
        .iter()
        .any(|a| !a.node.session.same_session(&first.node.session))
    {
        return Err(Error::InvalidArgument(
            "a guarded write runs in one session: every lock that guards it must be held in the same session"
                .into(),
        ));
    }
    for a in held {
        if !a.node.still_ours().await? {
            a.node.found_gone();
            return Err(a.lost_error());
        }
    }
    let mut all: Vec<Op> = held.iter().map(|a| a.check()).collect();
    all.extend_from_slice(ops);
    match first.node.session.multi(&all).await {
        Ok(mut results) => Ok(results.split_off(held.len())),
        Err(Error::MultiFailed { index, .. }) if index < held.len() => {
            held[index].node.found_gone();
            Err(held[index].lost_error())
        }
        Err(Error::MultiFailed { index, source }) => Err(Error::MultiFailed {
            index: index - held.len(),
            source,
        }),
        Err(e) => Err(e),
    }
}

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
    acquisition: Acquisition,
    holds: AtomicUsize,
}

deref_hold!(LockGuard => held.acquisition: Acquisition);

impl LockGuard {
    pub(crate) fn new(node: Arc<HeldNode>) -> Self {
        Self::of(Acquisition::new(node))
    }

    /// A guard of `acquisition`.
    pub(crate) fn of(acquisition: Acquisition) -> Self {
        LockGuard {
            held: Arc::new(Held {
                acquisition,
                holds: AtomicUsize::new(1),
            }),
            state: GuardState::Held,
        }
    }

    /// How many holds (this one included) are still unreleased.
    pub fn holds(&self) -> usize {
        self.held.holds.load(Ordering::SeqCst)
    }

    /// Acquires again without a round trip; release the new guard too.
    /// Fails with [`Error::Lost`] if the lock was lost meanwhile.
    pub fn reenter(&self) -> Result<LockGuard> {
        if self.is_lost() {
            return Err(self.lost_error());
        }
        self.held.holds.fetch_add(1, Ordering::SeqCst);
        Ok(LockGuard {
            held: self.held.clone(),
            state: GuardState::Held,
        })
    }

    /// Releases this hold; the last one deletes the lock node. Reports
    /// [`Error::Lost`] if the lock had been lost before (the node is gone
    /// either way), so the caller learns its work was not protected —
    /// [`Error::Closed`] if its session was closed (which took the node).
    pub async fn release(mut self) -> Result<()> {
        if self.held.holds.fetch_sub(1, Ordering::SeqCst) > 1 {
            self.state = GuardState::Released;
            // Not the last hold, but its work was no more protected.
            return match self.is_lost() {
                true if self.held_node().session.state() == SessionState::Closed => {
                    Err(Error::Closed)
                }
                true => Err(self.lost_error()),
                false => Ok(()),
            };
        }
        // If this future is dropped before the delete completes, the drop
        // finishes the job in the background.
        self.state = GuardState::Releasing;
        let result = self.held_node().release().await;
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
            self.held_node().let_go_in_background();
        }
    }
}
