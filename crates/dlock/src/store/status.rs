//! The one session-status machine every backend runs on.
//!
//! Curator's connection states (`Connected → Suspended → Reconnected |
//! Lost`, plus `Closed`), the fault epoch that makes a stale suspension
//! timer harmless, "wait out a suspension, open a new session after a
//! loss", and the renewal that swaps a lost session for a new one are the
//! same on every store; only how a session is kept alive differs. So a
//! backend owns a [`StatusMachine`] and feeds it events — its client saw
//! the connection drop ([`disconnected`](StatusMachine::disconnected)) or
//! come back ([`connected`](StatusMachine::connected)), the server said
//! the session is gone ([`lose`](StatusMachine::lose)) — and supplies how to
//! open a new session ([`renew`](StatusMachine::renew)): a ZooKeeper
//! client, an etcd lease, an embedded session.
//!
//! Whatever the backend keeps per session (its client, its lease and TTL)
//! lives in the machine's slot, `S`, behind the same lock as the fault
//! flags, and every status change is published while that lock is held: a
//! reader that looks at the status and the slot under the lock sees them
//! agree (never `Connected` without a client).
//!
//! The conformance suite (`tests/conformance.rs`) pins these semantics once
//! for every backend.

use std::future::Future;
use std::sync::{Mutex as StdMutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::store::{ArmedFault, LostReplies, SessionId, SessionState, SessionStatus};

/// A backend's per-session slot: it knows the session timeout the server
/// granted that session.
pub(crate) trait GrantedTimeout: Send + 'static {
    /// The granted session timeout (ZooKeeper: negotiated; etcd: the
    /// lease's TTL; Consul: the session's TTL).
    fn granted_timeout(&self) -> Duration;
}

/// What the store contract's provided methods reach of a backend's machine
/// ([`Store::machine`](super::Store::machine)), whatever its slot: one
/// place for the status channel, the session timeout and the lost-reply
/// fault every create goes through.
pub trait SessionMachine: Send + Sync {
    /// Every status change, from now on.
    fn subscribe(&self) -> watch::Receiver<SessionStatus>;

    /// The current session's granted timeout.
    fn session_timeout(&self) -> Duration;

    /// After a create the server applied: `ConnectionLoss` if
    /// `Faults::lose_next_create_reply` was armed (and the status blips
    /// `Suspended` → `Reconnected`).
    fn lost_create_reply(&self) -> Result<()>;

    /// `ConnectionLoss` if a create is still to fail
    /// ([`Faults::fail_next_creates`](super::Faults::fail_next_creates)).
    fn failing_create(&self) -> Result<()>;
}

impl<S: GrantedTimeout> SessionMachine for StatusMachine<S> {
    fn subscribe(&self) -> watch::Receiver<SessionStatus> {
        StatusMachine::subscribe(self)
    }

    fn session_timeout(&self) -> Duration {
        self.lock().backend.granted_timeout()
    }

    fn lost_create_reply(&self) -> Result<()> {
        self.take_lost_reply(&self.lost_replies.create)
    }

    fn failing_create(&self) -> Result<()> {
        self.lost_replies.failing_create()
    }
}

/// What changes with each session, behind one lock.
pub(crate) struct Slot<S> {
    /// What the backend keeps for the current session.
    pub backend: S,
    /// Bumped by every suspension, loss, renewal and close: a stale
    /// suspension timer does nothing.
    fault_epoch: u64,
    /// A `Faults::suspend` is in effect: stay `Suspended` whatever the
    /// connection does, until its timer ends it.
    fault_suspended: bool,
    /// This session is being ended on purpose (an expiry): operations wait
    /// for it to be `Lost`, and a disconnection meanwhile is no suspension.
    expiring: Option<SessionId>,
}

/// The outcome of [`StatusMachine::renew`].
pub(crate) enum Renewal<S> {
    /// The lost session was replaced already (or the store closed) by
    /// someone else: nothing to do.
    NotNeeded,
    /// The new session is installed: the backend starts keeping it alive.
    #[cfg_attr(
        not(any(feature = "zookeeper", feature = "etcd", feature = "consul")),
        allow(dead_code)
    )]
    Installed(SessionId),
    /// The store closed while the new session was opened: the backend ends
    /// it.
    Abandoned(S),
}

/// The status channel, the fault flags and the backend's per-session slot.
pub(crate) struct StatusMachine<S> {
    status: watch::Sender<SessionStatus>,
    slot: StdMutex<Slot<S>>,
    /// Serialises renewals after a loss.
    renewing: tokio::sync::Mutex<()>,
    /// The armed lost-reply faults.
    pub lost_replies: LostReplies,
}

impl<S> std::fmt::Debug for StatusMachine<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.snapshot().fmt(f)
    }
}

impl<S> StatusMachine<S> {
    /// How a store of a server shows itself in `{:?}`: as `name`, with its
    /// `endpoint` and its status.
    #[cfg_attr(
        not(any(feature = "zookeeper", feature = "etcd", feature = "consul")),
        allow(dead_code)
    )]
    pub fn fmt_store(
        &self,
        f: &mut std::fmt::Formatter<'_>,
        name: &str,
        endpoint: &str,
    ) -> std::fmt::Result {
        f.debug_struct(name)
            .field("endpoint", &endpoint)
            .field("status", self)
            .finish_non_exhaustive()
    }

    /// A machine whose first session, `session_id`, is `Connected`.
    pub fn new(session_id: SessionId, backend: S) -> Self {
        StatusMachine {
            status: watch::channel(SessionStatus {
                state: SessionState::Connected,
                session_id,
                changes: 0,
            })
            .0,
            slot: StdMutex::new(Slot {
                backend,
                fault_epoch: 0,
                fault_suspended: false,
                expiring: None,
            }),
            renewing: tokio::sync::Mutex::new(()),
            lost_replies: LostReplies::default(),
        }
    }

    /// The slot, locked.
    pub fn lock(&self) -> MutexGuard<'_, Slot<S>> {
        // Every critical section leaves the slot consistent.
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every status change, from now on.
    pub fn subscribe(&self) -> watch::Receiver<SessionStatus> {
        self.status.subscribe()
    }

    /// The current status.
    pub fn snapshot(&self) -> SessionStatus {
        *self.status.borrow()
    }

    /// Whether `session` is the current session, neither lost nor closed.
    pub fn is_current(&self, session: SessionId) -> bool {
        let s = self.snapshot();
        s.session_id == session && !matches!(s.state, SessionState::Lost | SessionState::Closed)
    }

    /// Whether a `Faults::suspend` is in effect.
    #[cfg_attr(not(any(feature = "etcd", feature = "consul")), allow(dead_code))]
    pub fn fault_suspended(&self) -> bool {
        self.lock().fault_suspended
    }

    /// Moves the status of `session` to `to` if its state satisfies `from`.
    /// Call with the slot locked.
    fn transition(
        &self,
        session: SessionId,
        from: impl Fn(SessionState) -> bool,
        to: SessionState,
    ) -> bool {
        self.status.send_if_modified(|s| {
            let change = s.session_id == session && from(s.state) && s.state != to;
            if change {
                s.state = to;
                s.changes += 1;
            }
            change
        })
    }

    /// What an operation runs with: `usable` picks it from the slot while
    /// the session is connected. Waits out a suspension (and a session being
    /// ended on purpose), opens a new session with `renew` after a loss (as
    /// Curator does after `LOST`), fails once closed.
    pub async fn ready<T, Fut>(
        &self,
        usable: impl Fn(&S, SessionId) -> Option<T>,
        renew: impl Fn(SessionId) -> Fut,
    ) -> Result<T>
    where
        Fut: Future<Output = Result<()>>,
    {
        let mut rx = self.status.subscribe();
        loop {
            let (status, expiring) = {
                let slot = self.lock();
                let status = *rx.borrow_and_update();
                if status.state.is_connected() {
                    if let Some(found) = usable(&slot.backend, status.session_id) {
                        return Ok(found);
                    }
                }
                (status, slot.expiring == Some(status.session_id))
            };
            match status.state {
                SessionState::Closed => return Err(Error::Closed),
                SessionState::Lost => renew(status.session_id).await?,
                _ if status.state == SessionState::Suspended || expiring => {
                    if rx.changed().await.is_err() {
                        return Err(Error::Closed);
                    }
                }
                // Connected with nothing usable cannot happen (both change
                // under the lock); treat it as a loss rather than spin.
                _ => {
                    self.lose(status.session_id);
                }
            }
        }
    }

    /// [`ready`](Self::ready) for a backend that runs operations by session
    /// id alone (nothing from the slot): the id of the connected session.
    /// Its fast path takes no lock — one status read per operation, as on
    /// the hot path of every acquire and release.
    pub async fn ready_session<Fut>(&self, renew: impl Fn(SessionId) -> Fut) -> Result<SessionId>
    where
        Fut: Future<Output = Result<()>>,
    {
        let status = self.snapshot();
        if status.state.is_connected() {
            return Ok(status.session_id);
        }
        self.ready(|_, session| Some(session), renew).await
    }

    /// Replaces the lost session `lost` by the one `open` makes; the status
    /// becomes `Reconnected` with the new session's id. Only one renewal
    /// runs at a time, and one that finds the loss dealt with does nothing.
    /// An unreachable store is a `ConnectionLoss` to the operation, which
    /// the session's retry policy then retries.
    pub async fn renew<Fut>(
        &self,
        lost: SessionId,
        open: impl FnOnce() -> Fut,
    ) -> Result<Renewal<S>>
    where
        Fut: Future<Output = Result<(SessionId, S)>>,
    {
        let _renewing = self.renewing.lock().await;
        let status = self.snapshot();
        if status.state != SessionState::Lost || status.session_id != lost {
            return Ok(Renewal::NotNeeded);
        }
        let (id, backend) = match open().await {
            Ok(opened) => opened,
            Err(Error::Unreachable(why)) => {
                tracing::warn!("no new session after a loss: {why}");
                return Err(Error::ConnectionLoss);
            }
            Err(e) => return Err(e),
        };
        let mut slot = self.lock();
        let renewed = self.status.send_if_modified(|s| {
            let change = s.state == SessionState::Lost && s.session_id == lost;
            if change {
                s.state = SessionState::Reconnected;
                s.session_id = id;
                s.changes += 1;
            }
            change
        });
        if !renewed {
            return Ok(Renewal::Abandoned(backend));
        }
        slot.backend = backend;
        slot.fault_epoch += 1;
        slot.fault_suspended = false;
        slot.expiring = None;
        Ok(Renewal::Installed(id))
    }

    /// Declares `session` lost (if it is current and not already lost or
    /// closed). Returns whether that changed anything.
    pub fn lose(&self, session: SessionId) -> bool {
        self.lose_taking(session, |_| ()).0
    }

    /// [`lose`](Self::lose), taking what `take` hands out of the slot under
    /// the same lock (the lost session's client, to let go of).
    pub fn lose_taking<T>(&self, session: SessionId, take: impl FnOnce(&mut S) -> T) -> (bool, T) {
        let mut slot = self.lock();
        let changed = self.transition(
            session,
            |s| !matches!(s, SessionState::Lost | SessionState::Closed),
            SessionState::Lost,
        );
        let taken = take(&mut slot.backend);
        if changed {
            slot.fault_epoch += 1;
            slot.fault_suspended = false;
            slot.expiring = None;
            tracing::debug!(session = format_args!("{session:#x}"), "session lost");
        }
        (changed, taken)
    }

    /// The connection of `session` dropped (or its keep-alive failed):
    /// `Suspended`, unless it is being ended on purpose. Returns whether
    /// `session` is still the current one.
    #[cfg_attr(
        not(any(feature = "zookeeper", feature = "etcd", feature = "consul")),
        allow(dead_code)
    )]
    pub fn disconnected(&self, session: SessionId) -> bool {
        let slot = self.lock();
        if slot.expiring != Some(session) {
            self.transition(session, SessionState::is_connected, SessionState::Suspended);
        }
        drop(slot);
        self.is_current(session)
    }

    /// The connection of `session` is back (or a keep-alive was answered):
    /// `Reconnected` after `Suspended`, unless a fault suspension holds it
    /// there or it is being ended. Returns whether `session` is still the
    /// current one.
    pub fn connected(&self, session: SessionId) -> bool {
        let slot = self.lock();
        if !slot.fault_suspended && slot.expiring != Some(session) {
            self.transition(
                session,
                |s| s == SessionState::Suspended,
                SessionState::Reconnected,
            );
        }
        drop(slot);
        self.is_current(session)
    }

    /// After a delete the server applied: `ConnectionLoss` if
    /// `Faults::lose_next_delete_reply` was armed (see
    /// [`take_lost_reply`](Self::take_lost_reply)).
    pub fn lost_delete_reply(&self) -> Result<()> {
        self.take_lost_reply(&self.lost_replies.delete)
    }

    /// A lost reply, if `armed` was (one of the `lose_*_reply` faults): the
    /// connection blips (`Suspended`, then `Reconnected`) and the caller
    /// gets `ConnectionLoss`.
    fn take_lost_reply(&self, armed: &ArmedFault) -> Result<()> {
        if !armed.take() {
            return Ok(());
        }
        let _slot = self.lock();
        let session = self.snapshot().session_id;
        if self.transition(session, SessionState::is_connected, SessionState::Suspended) {
            self.transition(
                session,
                |s| s == SessionState::Suspended,
                SessionState::Reconnected,
            );
        }
        Err(Error::ConnectionLoss)
    }

    /// Marks the store closed (later operations fail with `Closed`),
    /// handing out what `take` takes from the slot. Returns whether it was
    /// open until now.
    pub fn shut<T>(&self, take: impl FnOnce(&mut S) -> T) -> (bool, T) {
        let mut slot = self.lock();
        slot.fault_epoch += 1;
        slot.fault_suspended = false;
        let was_open = self.status.send_if_modified(|s| {
            let change = s.state != SessionState::Closed;
            if change {
                s.state = SessionState::Closed;
                s.changes += 1;
            }
            change
        });
        (was_open, take(&mut slot.backend))
    }

    /// Starts a `Faults::suspend`: `Suspended` at once, held there until
    /// [`end_suspension`](Self::end_suspension) with the returned epoch.
    /// `None` if there is no session to suspend (lost or closed).
    pub fn begin_suspension(&self) -> Option<Suspension> {
        let mut slot = self.lock();
        let status = self.snapshot();
        if !status.state.is_connected() && status.state != SessionState::Suspended {
            return None;
        }
        slot.fault_epoch += 1;
        slot.fault_suspended = true;
        self.transition(
            status.session_id,
            SessionState::is_connected,
            SessionState::Suspended,
        );
        Some(Suspension {
            session: status.session_id,
            epoch: slot.fault_epoch,
        })
    }

    /// Whether `suspension` is still the one in effect (no later
    /// suspension, loss, renewal or close).
    pub fn in_force(&self, suspension: Suspension) -> bool {
        let slot = self.lock();
        slot.fault_epoch == suspension.epoch && slot.fault_suspended
    }

    /// Ends `suspension` if it is still in effect; returns whether it was.
    /// The backend then reports the connection as it finds it.
    pub fn end_suspension(&self, suspension: Suspension) -> bool {
        let mut slot = self.lock();
        let in_force = slot.fault_epoch == suspension.epoch && slot.fault_suspended;
        if in_force {
            slot.fault_suspended = false;
        }
        in_force
    }

    /// `Faults::expire`: fails once closed, does nothing once lost, else
    /// ends the current session by `end` (which declares it lost).
    pub async fn expire_with<Fut>(&self, end: impl FnOnce(SessionId) -> Fut) -> Result<()>
    where
        Fut: Future<Output = Result<()>>,
    {
        let status = self.snapshot();
        match status.state {
            SessionState::Closed => Err(Error::Closed),
            SessionState::Lost => Ok(()),
            _ => end(status.session_id).await,
        }
    }

    /// Starts ending `session` on purpose (an expiry), if `take` hands out
    /// its client: until [`lose`](Self::lose), operations wait and a
    /// disconnection is no suspension.
    #[cfg_attr(not(feature = "zookeeper"), allow(dead_code))]
    pub fn begin_expiry<T>(
        &self,
        session: SessionId,
        take: impl FnOnce(&mut S) -> Option<T>,
    ) -> Option<T> {
        let mut slot = self.lock();
        let taken = take(&mut slot.backend);
        if taken.is_some() {
            slot.expiring = Some(session);
        }
        taken
    }
}

/// A `Faults::suspend` in effect: its session and fault epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Suspension {
    /// The suspended session.
    pub session: SessionId,
    epoch: u64,
}
