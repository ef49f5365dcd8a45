//! [`ConsulLock`]: a mutex with the layout of Consul's `api.Lock`, so that
//! `consul lock <prefix> cmd` and dlock exclude each other on one prefix.
//!
//! # Layout (a compatibility contract)
//!
//! One node, `<prefix>/.lock`: an **ephemeral** node of the holder's
//! session (on Consul: the key acquired by the session), tagged
//! [`CONSUL_LOCK_FLAGS`] (Consul's tools
//! refuse a key without it). Its data is the holder's random token, which
//! tells a create whose reply was lost from someone else's hold.
//!
//! - **Acquire**: create the node if absent. If it exists, wait on a watch
//!   of it (a blocking query on Consul) and try again when it changes. A
//!   node without an owner is one that `api.Lock` released (it clears the
//!   session and deletes the key only later, in `Destroy`): it is free, so
//!   it is deleted by compare-and-set on its version, and the create tried
//!   again at once — if it carries `api.Lock`'s flags. Any other node there
//!   (a semaphore's record, which `consul lock -n` and the
//!   [`KvSemaphore`](crate::KvSemaphore) keep at `.lock` too; on the
//!   backends without tags, every node without an owner) is
//!   [`Error::InvalidArgument`], never deleted.
//! - **Waiters never sleep after a lost race**: `api.Lock` sleeps 5 s
//!   before trying again after losing a race for a released key
//!   (hashicorp/consul#2767); here the loser sees the winner's node and
//!   watches it.
//! - **Release** deletes the node (fenced: never a newer holder's).
//! - **Guarded writes** check the node by its fence on etcd and Consul, so
//!   they fail once a newer holder's node has the name. ZooKeeper (and the
//!   embedded store, which follows it) can only check that the name
//!   exists: there a guarded write first reads the node's creation (one
//!   more round trip), so it lands only if another holder made the name
//!   again between that read and the write.
//! - **Fencing token**: the node's creation index (Consul: `CreateIndex`),
//!   which only grows, store-wide. A key acquired again by `api.Lock`
//!   without being deleted keeps its `CreateIndex`; dlock never does that,
//!   it always creates.
//!
//! - **Lock delay**: `consul lock`'s sessions have a lock delay (15 s):
//!   after such a session is *invalidated* while holding (its TTL ran out,
//!   it was destroyed; not on a normal release), Consul refuses to lock the
//!   key for that long ([`Error::LockDelay`] from the create). An acquire
//!   waits it out, as `api.Lock` does: Consul neither says how long is
//!   left nor tells when it ends, so the create is tried again after a
//!   pause that doubles from 250 ms up to 2 s (about 10 tries over a 15 s
//!   delay; `api.Lock` retries every 5 s), and a holder that gets in
//!   meanwhile is found by that create and watched as usual. dlock's own
//!   sessions use no lock delay unless asked to (`?lock-delay=`). A
//!   `consul lock` killed with -9 thus hands over after its session's
//!   invalidation (up to 2 × its 15 s TTL) plus the 15 s delay: measured
//!   45.8 s (`consul_interop.rs`,
//!   `dlock_lock_waits_out_a_killed_consul_locks_lock_delay`, long).
//!
//! - **Revocation and hold limits**, as every lock of dlock has them: a
//!   [`revocable`](ConsulLock::revocable) holder is told when someone
//!   writes `__REVOKE__` into `.lock` ([`revoke`](crate::revoke); `api.Lock`
//!   judges a hold by the key's session alone, so a `consul lock` holder
//!   ignores the request), and [`with_max_hold`](ConsulLock::with_max_hold)
//!   deletes `.lock` at the limit, which a `consul lock` waiter sees as a
//!   release.
//!
//! On ZooKeeper, etcd and the embedded store it is a plain create-if-absent
//! ephemeral node whose waiters watch it (not fair, unlike
//! [`Mutex`](crate::Mutex)).

use std::time::Duration;

use super::deadline::{timed_acquire, Deadline};
use super::entry::{Claim, Entry};
use super::guard::LockGuard;
use super::layout::CONSUL_LOCK_FLAGS;
use super::queue::HeldNode;
use super::revocation::{self, Listener};
use crate::error::{Error, Result};
use crate::path;
use crate::session::Session;
use crate::store::{CreateMode, CreateOptions, Created};

/// The node's name under the prefix (`consul lock`'s default key).
pub const LOCK_KEY: &str = ".lock";

/// The first pause before trying again while a lock delay is in force.
const LOCK_DELAY_FIRST_PAUSE: Duration = Duration::from_millis(250);
/// The longest pause: how late an acquire may notice a lock delay's end.
const LOCK_DELAY_LAST_PAUSE: Duration = Duration::from_secs(2);

/// A mutex in Consul's `api.Lock` layout. See the [module docs](self).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// let (a, b) = (dlock::connect("embedded").await?, dlock::connect("embedded").await?);
/// let lock = dlock::ConsulLock::new(&a, "/doc/consul-lock")?;
/// let guard = lock.acquire().await?;
/// assert_eq!(guard.node(), "/doc/consul-lock/.lock");
/// let other = dlock::ConsulLock::new(&b, "/doc/consul-lock")?;
/// assert!(other.try_acquire().await?.is_none(), "held");
/// guard.release().await?;
/// other.acquire().await?.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ConsulLock {
    session: Session,
    prefix: String,
    node: String,
    /// Told the node's path when someone asks for the lock.
    revocation: Option<Listener>,
    max_hold: Option<Duration>,
}

impl ConsulLock {
    /// The lock at `prefix` (its node is `<prefix>/.lock`).
    pub fn new(session: &Session, prefix: &str) -> Result<Self> {
        path::validate_recipe(prefix, "a lock")?;
        Ok(ConsulLock {
            session: session.clone(),
            prefix: prefix.to_string(),
            node: path::join(prefix, LOCK_KEY),
            revocation: None,
            max_hold: None,
        })
    }

    /// Makes the lock revocable, as [`Mutex::revocable`](crate::Mutex::revocable)
    /// does: `listener` is called with the node's path whenever someone asks
    /// for the lock with [`revoke`](crate::revoke) while we hold it (there
    /// are no waiters' nodes to ask). The request replaces the node's
    /// token; `consul lock` holders never see one.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// let session = dlock::connect("embedded").await?;
    /// let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    /// let lock = dlock::ConsulLock::new(&session, "/doc/consul-revocable")?
    ///     .revocable(move |node: &str| { let _ = tx.send(node.to_string()); });
    /// let guard = lock.acquire().await?;
    /// dlock::revoke(&session, guard.node()).await?;
    /// assert_eq!(rx.recv().await.as_deref(), Some(guard.node()));
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn revocable(mut self, listener: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.revocation = Some(Listener::new(listener));
        self
    }

    /// Limits every hold to `max_hold`, as
    /// [`Mutex::with_max_hold`](crate::Mutex::with_max_hold) does: at the
    /// limit the library deletes `.lock` (fenced: only the node of this
    /// hold), the hold's lost signal fires, and any waiter — dlock's or a
    /// `consul lock`'s — takes the lock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// use std::time::Duration;
    /// let session = dlock::connect("embedded").await?;
    /// let lock = dlock::ConsulLock::new(&session, "/doc/consul-max-hold")?.with_max_hold(Duration::from_millis(50));
    /// let guard = lock.acquire().await?;
    /// guard.lost().await;                      // the limit passed
    /// let next = lock.acquire().await?;        // free again at once
    /// assert!(matches!(guard.release().await, Err(dlock::Error::Lost { .. })));
    /// # next.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn with_max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// The lock's prefix.
    pub fn path(&self) -> &str {
        &self.prefix
    }

    /// The session this lock uses.
    pub fn session(&self) -> &Session {
        &self.session
    }

    timed_acquire! {
        /// Waits as long as it takes.
        acquire,
        /// Waits at most `timeout`; fails with [`Error::Timeout`].
        acquire_timeout,
        /// Takes the lock only if it is free now.
        try_acquire
        => acquire_until() -> LockGuard
    }

    /// Attempts until one ends other than with the session ended on the
    /// server unannounced: then we go again in its successor.
    pub(crate) async fn acquire_until(&self, deadline: Deadline) -> Result<Option<LockGuard>> {
        let session = &self.session;
        session.retrying_reaped(|| self.attempt(deadline)).await
    }

    async fn attempt(&self, deadline: Deadline) -> Result<Option<LockGuard>> {
        let session = &self.session;
        let mut entry = Entry::new(session, self.node.clone());
        let opts = CreateOptions::new(CreateMode::Ephemeral)
            .with_parents()
            .with_tag(CONSUL_LOCK_FLAGS);
        let mut delayed = LOCK_DELAY_FIRST_PAUSE;
        loop {
            let (stat, watch) = match entry.claim(opts, session.session_id()).await {
                Ok(Claim::Ours(created)) => {
                    entry.keep();
                    return Ok(Some(self.guard(created)));
                }
                // Our own create, landed in a session renewed since we
                // named its owner: claimed again in the live session, it
                // is ours. (Anyone else's now, it is handled as such.)
                Ok(Claim::Other {
                    stale: true, stat, ..
                }) if stat.ephemeral_owner == session.session_id() => continue,
                Ok(Claim::Other { stat, watch, .. }) => (stat, watch),
                // Free, but not yet takeable: nothing announces the end of
                // a lock delay, so try again after a pause.
                Err(Error::LockDelay { .. }) => {
                    if deadline.passed()
                        || deadline.race(tokio::time::sleep(delayed)).await.is_none()
                    {
                        return Ok(None);
                    }
                    delayed = (delayed * 2).min(LOCK_DELAY_LAST_PAUSE);
                    continue;
                }
                Err(e) => return Err(e),
            };
            if stat.ephemeral_owner == 0 {
                // Released by `api.Lock`, not yet destroyed: free — if it is
                // a lock's key. Anything else there (a semaphore's record:
                // `consul lock -n` and the KvSemaphore keep theirs at
                // `.lock` too) is not ours to delete: a conflict, as
                // `api.Lock`'s `ErrLockConflict`.
                match session.tag(&self.node).await {
                    Ok(Some(CONSUL_LOCK_FLAGS)) => {}
                    Ok(_) => {
                        return Err(Error::InvalidArgument(format!(
                            "{} is not a lock's key but someone else's node (a semaphore's \
                             record?): a ConsulLock cannot share its prefix with it",
                            self.node
                        )))
                    }
                    Err(Error::NoNode { .. }) => continue,
                    Err(e) => return Err(e),
                }
                // Whoever changed it first (a Consul waiter acquiring it)
                // wins.
                match session.delete(&self.node, Some(stat.version)).await {
                    Ok(()) | Err(Error::NoNode { .. } | Error::BadVersion { .. }) => continue,
                    Err(e) => return Err(e),
                }
            }
            // Taken (a node of ours from a renewed session's past comes
            // back with a watch).
            let Some(watch) = watch else { continue };
            if deadline.passed() || deadline.race(watch.changed()).await.is_none() {
                return Ok(None);
            }
        }
    }

    fn guard(&self, created: Created) -> LockGuard {
        if let Some(listener) = &self.revocation {
            revocation::watch(&self.session, &created, listener.clone());
        }
        let node = HeldNode::at_shared_name(&self.session, &self.prefix, "lock", created);
        LockGuard::new(node.limited(self.max_hold))
    }
}
