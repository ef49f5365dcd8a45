//! Revocation. Cooperative, as Curator's `Revoker`: anyone may ask the
//! owner of a lock node to give it up by writing `__REVOKE__` to the node; a
//! revocable participant watches its own node and is told. Revocable are
//! the [`Mutex`](crate::Mutex), the [`ReadWriteLock`](crate::ReadWriteLock),
//! the [`SemaphoreMutex`](crate::SemaphoreMutex), the
//! [`ConsulLock`](crate::ConsulLock) (while held: its waiters have no node),
//! [`Semaphore`](crate::Semaphore) leases and
//! [`KvSemaphore`](crate::KvSemaphore) slots — each with the same protocol
//! on its own node (layout: a revocable node carries no data until a
//! request writes `__REVOKE__`; the token in a KvSemaphore entry or a
//! ConsulLock's `.lock` is replaced by it). Or by force ([`revoke_forced`], CURATOR-150): the node is
//! deleted, and the hold — of any recipe — is lost at once.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
//! let session = dlock::connect("embedded").await?;
//! let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
//! let mutex = dlock::Mutex::new(&session, "/doc/revocable")?
//!     .revocable(move |node: &str| { let _ = tx.send(node.to_string()); });
//! let guard = mutex.acquire().await?;
//! dlock::revoke(&session, guard.node()).await?;      // from anyone, anywhere
//! assert_eq!(rx.recv().await.as_deref(), Some(guard.node()));
//! guard.release().await?;                            // the holder cooperates
//! # Ok(()) }
//! ```

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::session::Session;
use crate::store::{Created, WatchEvent};

/// The bytes a revocation request writes (Curator's `REVOKE_MESSAGE`).
///
/// ```
/// assert_eq!(dlock::recipes::revocation::REVOKE_MESSAGE, b"__REVOKE__");
/// ```
pub const REVOKE_MESSAGE: &[u8] = b"__REVOKE__";

/// Told the node path when its revocation is requested.
#[derive(Clone)]
pub(crate) struct Listener(Arc<dyn Fn(&str) + Send + Sync>);

impl Listener {
    pub(crate) fn new(f: impl Fn(&str) + Send + Sync + 'static) -> Self {
        Listener(Arc::new(f))
    }
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Listener")
    }
}

/// Asks the owner of lock node `node` to release it (Curator's
/// `Revoker.attemptRevoke`). Cooperative: nothing is deleted; a node that is
/// already gone is fine. A node no session owns (a lock's directory, a
/// count, a record) is no participant's: [`Error::InvalidArgument`], and
/// its data is left as it was. Each request is written and told, also
/// one over an earlier request — except on Consul for a
/// [`ConsulLock`](crate::ConsulLock)'s or a
/// [`KvSemaphore`](crate::KvSemaphore)'s key, whose tag keeps its flags:
/// Consul records no write that changes nothing.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// let session = dlock::connect("embedded").await?;
/// let mutex = dlock::Mutex::new(&session, "/locks/revoke-doc")?;
/// let guard = mutex.acquire().await?;
/// dlock::revoke(&session, guard.node()).await?; // the holder's listener decides
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub async fn revoke(session: &Session, node: &str) -> Result<()> {
    // Each request is written, even over an earlier one: the holder is
    // told of every write. Only our own, whose reply was lost, is not
    // written again.
    let mut written = false;
    loop {
        let read = session.retrying(|| session.get_data(node)).await;
        let (data, stat) = match read {
            Ok(read) => read,
            Err(Error::NoNode { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        refuse_ownerless(node, stat.ephemeral_owner, "asked to give way")?;
        if written && data == REVOKE_MESSAGE {
            return Ok(());
        }
        written = true;
        // On the version read: never over a node made since, or a write
        // that made the node someone else's.
        let request =
            session.retrying(|| session.set_data(node, REVOKE_MESSAGE, Some(stat.version)));
        match request.await {
            Ok(_) | Err(Error::NoNode { .. }) => return Ok(()),
            Err(Error::BadVersion { .. }) => {}
            Err(e) => return Err(e),
        }
    }
}

/// A node no session owns is no holder's or waiter's: nothing of it is
/// ours to revoke.
fn refuse_ownerless(node: &str, owner: crate::store::SessionId, how: &str) -> Result<()> {
    match owner {
        0 => Err(Error::InvalidArgument(format!(
            "{node} is no holder's or waiter's node (no session owns it), so it cannot be {how}: \
             name a participant's node, as `dlock inspect` lists them"
        ))),
        _ => Ok(()),
    }
}

/// Takes the hold of node `node` away by force (CURATOR-150): deletes it,
/// from any session. Works on every kind of hold — a mutex or read-write
/// lock node, a semaphore lease, a [`KvSemaphore`](crate::KvSemaphore)
/// entry, a leader's node. The holder's [`lost`](crate::Acquisition::lost)
/// signal fires as soon as its client sees the deletion, its guarded
/// writes are refused from then on (they check the node), and the next
/// waiter — who watches that node, or the directory — proceeds at once.
/// For a `KvSemaphore`, the holder stays listed in the record until the
/// next contender (or the holder's release) prunes it, as a dead holder.
/// In [`Layout::Consul`](crate::Layout::Consul), a `consul lock -n` holder
/// whose contender key is deleted this way notices at once too: Consul's
/// `api.Semaphore` monitors the whole prefix and judges holders alive by
/// their keys' sessions, so it finds itself dead and stops its command. A
/// node that is already gone is fine; a node no session owns (a lock's
/// directory, a count) is [`Error::InvalidArgument`], and left.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// let (holder, operator) = (dlock::connect("embedded").await?, dlock::connect("embedded").await?);
/// let guard = dlock::Mutex::new(&holder, "/doc/revoke-forced")?.acquire().await?;
/// dlock::revoke_forced(&operator, guard.node()).await?;
/// guard.lost().await;                                  // the holder learns it
/// assert!(guard.is_lost());
/// # let _ = guard.release().await;
/// # Ok(()) }
/// ```
pub async fn revoke_forced(session: &Session, node: &str) -> Result<()> {
    loop {
        let stat = match session.retrying(|| session.exists(node)).await? {
            Some(stat) => stat,
            None => return Ok(()),
        };
        refuse_ownerless(node, stat.ephemeral_owner, "revoked")?;
        let deleted = session.retrying(|| session.delete(node, Some(stat.version)));
        match deleted.await {
            Ok(()) | Err(Error::NoNode { .. }) => return Ok(()),
            // Changed since the look (a revocation request, say): look again.
            Err(Error::BadVersion { .. }) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Watches our own node `created` and tells `listener` of every revocation
/// request, until the node is gone — or its name is on another node (a
/// `ConsulLock`'s `.lock` is every holder's in turn).
pub(crate) fn watch(session: &Session, created: &Created, listener: Listener) {
    let watcher = session.clone();
    let (node, czxid) = (created.path.clone(), created.stat.czxid);
    session.spawn_background(async move {
        // The write of the last request told: a look again after a
        // connection event finds the same one, which is no new request.
        let mut told = None;
        let mut failed = 0;
        loop {
            match watcher.get_data_watch(&node).await {
                Ok((_, stat, _)) if stat.czxid != czxid => return,
                Ok((data, stat, watch)) => {
                    failed = 0;
                    if data == REVOKE_MESSAGE && told != Some(stat.mzxid) {
                        told = Some(stat.mzxid);
                        (listener.0)(&node);
                    }
                    if watch.changed().await == WatchEvent::NodeDeleted {
                        return;
                    }
                }
                Err(e) if e.is_retryable() => {
                    watcher.background_pause(failed).await;
                    failed += 1;
                }
                // Gone (released, or its session is over): nothing to revoke.
                Err(_) => return,
            }
        }
    });
}
