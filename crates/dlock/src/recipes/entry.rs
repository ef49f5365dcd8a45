//! [`Entry`]: an ephemeral node at a name of our choosing (not a queue's
//! sequenced node), marked as ours by a random token. Consul's layouts hold
//! this way — [`ConsulLock`](super::consul_lock::ConsulLock)'s
//! `<prefix>/.lock` and the [`KvSemaphore`](super::kv_semaphore::KvSemaphore)'s
//! contender entries — and both build on it.
//!
//! The token tells our node from anyone else's at that name: a create whose
//! reply was lost is recognised by reading the node back, and an entry
//! dropped before it was kept (its acquire cancelled, timed out or failed,
//! even with its create in flight) is deleted in the background — only if
//! it still holds our token, never a node someone else made there since.

use std::future::Future;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::recipes::deadline::within_this_wait;
use crate::session::{Session, ANY_CREATION};
use crate::store::{CreateOptions, Created, SessionId, Stat, Watch};

/// Our node at `path`: deleted (if still ours) when dropped, unless kept.
pub(crate) struct Entry {
    pub session: Session,
    pub path: String,
    token: Vec<u8>,
    armed: bool,
    /// Held while a create of ours is on its way: the removal waits for it.
    creating: Arc<tokio::sync::Mutex<()>>,
}

/// What [`Entry::claim`] found at the entry's path.
pub(crate) enum Claim {
    /// Ours, owned by the session we named it for.
    Ours(Created),
    /// Someone else's node — or (`stale`) our own create's, owned by
    /// another session than we named it for (the session was renewed in
    /// between), which goes when the entry is dropped. `watch` fires when
    /// it changes (none for a node we created just now).
    Other {
        stat: Stat,
        watch: Option<Watch>,
        stale: bool,
    },
}

impl Entry {
    /// Our entry at `path`, with a new token; armed before its create, so
    /// that a create cancelled in flight is cleaned up too.
    pub fn new(session: &Session, path: String) -> Self {
        let token = uuid::Uuid::new_v4().to_string().into_bytes();
        Entry {
            session: session.clone(),
            path,
            token,
            armed: true,
            creating: Arc::default(),
        }
    }

    /// Creates the node with `opts` for the session `owner`. A node there
    /// already — also our own, when a create's reply was lost and its retry
    /// found it — is read back (arming a watch on it): ours if it holds our
    /// token and `owner` owns it. A connection lost through every retry,
    /// with no node of ours there, is the error.
    pub async fn claim(&self, opts: CreateOptions, owner: SessionId) -> Result<Claim> {
        let session = &self.session;
        let (stat, watch, mine) = loop {
            let lost = match self.create(opts).await {
                Ok(created) => break (created.stat, None, true),
                Err(Error::NodeExists { .. }) => false,
                Err(Error::ConnectionLoss) => true,
                Err(e) => return Err(e),
            };
            match session.get_data_watch(&self.path).await {
                Ok((data, stat, watch)) => break (stat, Some(watch), data == self.token),
                // The connection failed through every retry and our create
                // never landed: that is the answer, not another round.
                Err(Error::NoNode { .. }) if lost => return Err(Error::ConnectionLoss),
                // Gone since: create again.
                Err(Error::NoNode { .. }) => {}
                Err(e) => return Err(e),
            }
        };
        Ok(match stat.ephemeral_owner == owner && mine {
            true => {
                let created = Created {
                    path: self.path.clone(),
                    stat,
                };
                // Read back after a lost reply: the store learns it as from
                // that reply (its fence, which guarded writes compare).
                if watch.is_some() {
                    session.adopt(opts, &created);
                }
                Claim::Ours(created)
            }
            false => Claim::Other {
                stat,
                watch,
                stale: mine,
            },
        })
    }

    /// Creates the node, retrying a lost reply with the session's backoff
    /// (a retry that finds the node is read back by the caller). A create
    /// sent may land after its caller gave up, even after a later read on
    /// another connection (Consul's and etcd's requests are not ordered):
    /// so it runs as a task of its own, and the removal waits for it.
    async fn create(&self, opts: CreateOptions) -> Result<Created> {
        let landing = self.creating.clone().lock_owned().await;
        let (session, path, token) = (self.session.clone(), self.path.clone(), self.token.clone());
        let (tx, rx) = tokio::sync::oneshot::channel();
        // Its retries bounded as the timed wait awaiting it bounds its own.
        let create = within_this_wait(async move {
            session
                .retrying(|| session.create(&path, &token, opts))
                .await
        });
        self.session.spawn_background(async move {
            let _ = tx.send(create.await);
            drop(landing);
        });
        rx.await.unwrap_or(Err(Error::Closed))
    }

    /// Keeps the node (it now holds, or someone else removes it): dropping
    /// no longer deletes it.
    pub fn keep(&mut self) {
        self.armed = false;
    }

    /// Deletes the node, in the background, while it holds our token:
    /// tried again, pausing as the retry policy says, until it is done or
    /// the session is closed (a node of ours left by one failed delete
    /// would hold, or wait, for as long as the session lives, with nobody
    /// to give it up).
    fn remove_in_background(&self) {
        let (path, token) = (self.path.clone(), self.token.clone());
        let creating = self.creating.clone();
        // Our node, whenever its create lands, is on its way out: a claim
        // of this session at the name waits for it rather than taking it
        // for another handle's.
        let departing = Arc::new(self.session.departing(&self.path, ANY_CREATION));
        self.session.retry_in_background(move |session| {
            let (path, token) = (path.clone(), token.clone());
            let (creating, departing) = (creating.clone(), departing.clone());
            async move {
                let _departing = departing;
                let _landed = creating.lock().await;
                let (data, stat) = match session.get_data(&path).await {
                    Ok(read) => read,
                    Err(Error::NoNode { .. }) => return Ok(()),
                    Err(e) => return Err(e),
                };
                if data != token {
                    return Ok(());
                }
                // Ours: deleted by its creation, written since (a revocation
                // request) or not; a failure on the connection goes on in a
                // loop of its own, not this one.
                session.delete_created_eventually(&path, stat.czxid).await
            }
        });
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        if self.armed {
            self.remove_in_background();
        }
    }
}

/// Runs a clean-up in the background; a closed session took its nodes
/// already, anything else is worth a warning.
pub(crate) fn in_background(
    session: &Session,
    what: String,
    cleanup: impl Future<Output = Result<()>> + Send + 'static,
) {
    session.spawn_background(async move {
        match cleanup.await {
            Ok(()) | Err(Error::Closed) => {}
            Err(e) => tracing::warn!(error = %e, "{what} failed"),
        }
    });
}
