//! The nodes of the wait queue: one still queueing ([`PendingNode`], gone
//! unless kept) and one that holds ([`HeldNode`], what guards point at).

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::recipes::deadline::instant_after;
use crate::recipes::lifecycle::Backoff;
use crate::session::{Gone, Session};
use crate::store::{Created, SessionId, SessionState, WatchEvent};

/// A node in the queue that is deleted (in the background) unless
/// [`disarm`](Self::disarm)ed: makes acquisition cancellation-safe — a
/// dropped, timed-out or failed acquire leaves nothing behind. (A create
/// still in flight is the protected create's to clean up.)
pub(crate) struct PendingNode {
    session: Session,
    path: String,
    armed: bool,
}

impl PendingNode {
    /// Our node at `path`, armed.
    pub fn new(session: &Session, path: &str) -> Self {
        PendingNode {
            session: session.clone(),
            path: path.to_string(),
            armed: true,
        }
    }

    pub fn disarm(mut self) {
        self.armed = false;
    }

    /// Deletes the node now (retrying), instead of in the background.
    pub async fn delete(mut self) -> Result<()> {
        // Disarmed only once done: if this future is dropped midway, the
        // drop deletes the node in the background.
        let result = self.session.delete_protected(&self.path).await.map(drop);
        self.armed = false;
        result
    }
}

impl Drop for PendingNode {
    fn drop(&mut self) {
        if self.armed {
            self.session
                .delete_in_background(std::mem::take(&mut self.path));
        }
    }
}

/// Shared state of a held node: what guards point at.
#[derive(Debug)]
pub(crate) struct HeldNode {
    pub session: Session,
    /// Shared with the metrics labels of the release.
    pub recipe_path: Arc<str>,
    pub what: &'static str,
    pub created: Created,
    pub session_id: SessionId,
    pub acquired_at: Instant,
    /// How the hold ended, other than with its session: a [`Fate`]. An
    /// atomic and a `Notify` (no allocation, no lock on the release path
    /// but the notify's), because every acquisition and release pays for
    /// it.
    fate: AtomicU8,
    /// Wakes whoever waits for the fate to change.
    fate_changed: Notify,
    /// Whether a task already watches the node for its deletion.
    watched: AtomicBool,
    /// Whether other holders make nodes at the same name (a `ConsulLock`'s
    /// `.lock`): then a release deletes the node only if it is still the
    /// one this hold created, which every store can tell (ZooKeeper's
    /// delete by name cannot).
    shared_name: bool,
}

/// How a hold stands, its session aside. Only the first change from
/// [`Fate::Held`] counts: a hold released by its holder cannot be revoked
/// afterwards, and one revoked or expired stays lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Fate {
    /// Ours, as far as the node goes.
    Held,
    /// Given back (or being given back) by its holder.
    Released,
    /// Its node was deleted by someone else: revoked by force.
    Removed,
    /// Its maximum hold time passed: the library deleted its node.
    Expired,
}

impl Fate {
    fn from_u8(value: u8) -> Fate {
        match value {
            0 => Fate::Held,
            1 => Fate::Released,
            2 => Fate::Removed,
            _ => Fate::Expired,
        }
    }

    /// Whether the hold was taken away.
    pub fn taken(self) -> bool {
        matches!(self, Fate::Removed | Fate::Expired)
    }
}

impl HeldNode {
    pub fn new(
        session: &Session,
        recipe_path: &str,
        what: &'static str,
        created: Created,
    ) -> Arc<Self> {
        Self::build(session, recipe_path, what, created, false)
    }

    /// [`new`](Self::new), for a node at a name every holder uses in turn.
    pub fn at_shared_name(
        session: &Session,
        recipe_path: &str,
        what: &'static str,
        created: Created,
    ) -> Arc<Self> {
        Self::build(session, recipe_path, what, created, true)
    }

    fn build(
        session: &Session,
        recipe_path: &str,
        what: &'static str,
        created: Created,
        shared_name: bool,
    ) -> Arc<Self> {
        // The node's owner is the session it was acquired in, even if the
        // client has moved to a new session since (then it is lost already).
        let session_id = match created.stat.ephemeral_owner {
            0 => session.session_id(),
            owner => owner,
        };
        Arc::new(HeldNode {
            session: session.clone(),
            recipe_path: Arc::from(recipe_path),
            what,
            session_id,
            created,
            acquired_at: Instant::now(),
            fate: AtomicU8::new(Fate::Held as u8),
            fate_changed: Notify::new(),
            watched: AtomicBool::new(false),
            shared_name,
        })
    }

    /// Whether the session that created the node is over, or the hold was
    /// taken away (revoked by force, or past its maximum hold time).
    pub fn is_lost(&self) -> bool {
        self.session_over() || self.fate().taken()
    }

    /// Whether the hold still stands: its session lives, and it was
    /// neither given back nor taken away.
    pub fn is_held(&self) -> bool {
        !self.session_over() && self.fate() == Fate::Held
    }

    fn session_over(&self) -> bool {
        let s = self.session.status();
        s.session_id != self.session_id
            || matches!(s.state, SessionState::Lost | SessionState::Closed)
    }

    /// Moves the fate from [`Fate::Held`] to `to`; the fate before (so
    /// `Held` if this call changed it).
    fn settle(&self, to: Fate) -> Fate {
        let held = Fate::Held as u8;
        match self
            .fate
            .compare_exchange(held, to as u8, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => {
                self.fate_changed.notify_waiters();
                Fate::Held
            }
            Err(before) => Fate::from_u8(before),
        }
    }

    fn fate(&self) -> Fate {
        Fate::from_u8(self.fate.load(Ordering::SeqCst))
    }

    /// Resolves once the fate satisfies `settled`.
    async fn fate_settles(&self, settled: impl Fn(Fate) -> bool) {
        loop {
            // Armed before looking: a change between the look and the
            // wait still wakes it.
            let changed = self.fate_changed.notified();
            if settled(self.fate()) {
                return;
            }
            changed.await;
        }
    }

    /// The holder gives the hold back (its node is being deleted): whatever
    /// watches or limits the hold stands down. The fate before.
    pub fn let_go(&self) -> Fate {
        self.settle(Fate::Released)
    }

    /// Gives the hold back in the background (a dropped guard).
    pub fn let_go_in_background(&self) {
        // Taken away or expired: the node is gone already, and its name may
        // be someone else's by now.
        let fate = self.let_go();
        if fate == Fate::Expired || fate.taken() {
            return;
        }
        let (session, path) = (self.session.clone(), self.created.path.clone());
        match self.shared_name {
            true => {
                let czxid = self.created.stat.czxid;
                let what = format!("releasing {path}");
                let release = async move {
                    session
                        .delete_protected_created(&path, czxid)
                        .await
                        .map(drop)
                };
                crate::recipes::entry::in_background(&self.session, what, release);
            }
            false => session.delete_in_background(path),
        }
    }

    /// Whether the node at our name still is ours, where a guarded write's
    /// own check cannot tell: a name every holder uses in turn. A store
    /// that fences its session's nodes by creation (etcd, Consul) knows
    /// whether our session's node there is a later one — made by another
    /// hold of the same session after ours was deleted by force, which the
    /// check would accept. Elsewhere (ZooKeeper, embedded) the check only
    /// finds *a* node there, so its creation is read.
    pub async fn still_ours(&self) -> Result<bool> {
        let (path, czxid) = (&self.created.path, self.created.stat.czxid);
        if !self.shared_name {
            return Ok(true);
        }
        if let Some(ours) = self.session.store().deletes_only_created(path, czxid) {
            return Ok(ours);
        }
        let now = self.session.exists(path).await?;
        Ok(now.is_some_and(|stat| stat.czxid == czxid))
    }

    /// A guarded write found our node gone.
    pub fn found_gone(&self) {
        if !self.session_over() {
            self.settle(Fate::Removed);
        }
    }

    /// Resolves when the hold is taken away (not when the session ends).
    /// The first call starts watching the node for its deletion by anyone
    /// else — one watch per hold, and none for holds nobody asks about.
    pub async fn taken_away(self: &Arc<Self>) {
        if !self.watched.swap(true, Ordering::SeqCst) {
            let node = self.clone();
            self.session
                .spawn_background(async move { node.watch_removal().await });
        }
        self.fate_settles(Fate::taken).await;
    }

    /// Watches our node until it is deleted (then, unless we let it go,
    /// it was revoked), we let go of it, or the session is over.
    async fn watch_removal(&self) {
        let store = self.session.store();
        let path = &self.created.path;
        let mut backoff = Backoff::default();
        loop {
            if self.fate() != Fate::Held || self.session_over() {
                return;
            }
            let found = self.session.retrying(|| store.exists(path, true)).await;
            let watch = match found {
                // Gone — or its name is on a newer node (etcd reuses names).
                Ok((stat, _)) if stat.map(|s| s.czxid) != Some(self.created.stat.czxid) => {
                    self.found_gone();
                    return;
                }
                Ok((_, Some(watch))) => watch,
                // Requests failing on a live session (timing out, or
                // refused by a server in trouble): look again after a
                // pause. Given up, nothing would tell the holder of a
                // forced removal for the rest of its hold.
                Err(e) if !e.is_session_lost() => {
                    if !e.is_retryable() {
                        tracing::debug!(%path, error = %e, "watching a held node: looking again");
                    }
                    let done = self.fate_settles(|f| f != Fate::Held);
                    match backoff.pause(&self.session, done).await {
                        true => continue,
                        false => return,
                    }
                }
                Ok((_, None)) | Err(_) => return,
            };
            backoff.reset();
            tokio::select! {
                event = watch.changed() => {
                    if event == WatchEvent::NodeDeleted {
                        self.found_gone();
                        return;
                    }
                    // Data changed (a revocation request) or a session
                    // event: look again.
                }
                () = self.fate_settles(|f| f != Fate::Held) => return,
            }
        }
    }

    /// With a `max_hold`, ends the hold after it, from a task of its own
    /// (so even if the holder's task is stuck): deletes the node, which
    /// fires the lost signal and lets the next waiter in. Stands down if
    /// the hold ends first.
    pub fn limited(self: Arc<Self>, max_hold: Option<Duration>) -> Arc<Self> {
        let Some(max_hold) = max_hold else {
            return self;
        };
        let node = self.clone();
        self.session.spawn_background(async move {
            let limit = instant_after(node.acquired_at, max_hold);
            let at_limit = tokio::time::sleep_until(limit);
            tokio::select! {
                () = at_limit => {}
                () = node.fate_settles(|f| f != Fate::Held) => return,
            }
            if node.session_over() || node.settle(Fate::Expired) != Fate::Held {
                return;
            }
            tracing::debug!(node = %node.created.path, ?max_hold, "maximum hold time passed: releasing");
            let (path, czxid) = (&node.created.path, node.created.stat.czxid);
            if let Err(e) = node.session.delete_protected_created(path, czxid).await.map(drop) {
                tracing::warn!(node = %node.created.path, error = %e, "releasing a hold past its maximum failed");
            }
        });
        self
    }

    pub fn lost_error(&self) -> Error {
        Error::Lost {
            what: self.what,
            path: self.recipe_path.to_string(),
        }
    }

    /// Deletes the node; reports [`Error::Lost`] if it was lost before
    /// (see [`lost_by_release`]).
    pub async fn release(&self) -> Result<()> {
        let fate = self.let_go();
        let lost = self.session_over() || fate.taken();
        let labels = [
            ("recipe", metrics::SharedString::const_str(self.what)),
            (
                "path",
                metrics::SharedString::from_shared(self.recipe_path.clone()),
            ),
        ];
        metrics::histogram!("dlock_hold_seconds", &labels)
            .record(self.acquired_at.elapsed().as_secs_f64());
        tracing::debug!(node = %self.created.path, token = self.created.token().0, lost, "release");
        // An expired hold's node is the limit's to delete (once: a
        // protection prefix is recycled with its delete); a hold taken away
        // has no node left, and its name may be someone else's by now.
        let (path, czxid) = (&self.created.path, self.created.stat.czxid);
        let deleted = match fate {
            Fate::Expired | Fate::Removed => Ok(Gone(false)),
            _ if self.shared_name => self.session.delete_protected_created(path, czxid).await,
            _ => self.session.delete_protected(path).await,
        };
        if lost_by_release(lost, deleted)? {
            metrics::counter!("dlock_losses_total", &labels).increment(1);
            Err(self.lost_error())
        } else {
            Ok(())
        }
    }
}

/// Whether a hold was lost, as its release tells: `lost` before, or its
/// node found gone by the release's delete (`deleted`) — in a live
/// session, taken away by someone else (revoked by force) while nobody
/// watched for it. A hold lost before is reported so when its delete
/// failed on the connection (it goes on in the background): the outage
/// that failed it is likely the one that lost the hold, and the caller
/// must learn that its work was unprotected. (A closed session is
/// `Closed`, as ever.)
pub(crate) fn lost_by_release(lost: bool, deleted: Result<Gone>) -> Result<bool> {
    match deleted {
        Ok(Gone(gone)) => Ok(lost || gone),
        Err(e) if lost && e.is_retryable() => Ok(true),
        Err(e) => Err(e),
    }
}
