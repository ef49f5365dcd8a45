//! The one keep-alive loop of the stores whose sessions live by renewal:
//! an etcd lease, a Consul session.
//!
//! Both renew about every third of the TTL and map what they see onto the
//! session-status machine ([`StatusMachine`]) the same way:
//!
//! - an answered renewal makes the session `Connected` (`Reconnected`
//!   after a suspension) and counts from when it was *sent*;
//! - a renewal that fails or goes unanswered makes it `Suspended`, and the
//!   next one is tried again after the backend's retry pause;
//! - the server saying the session is gone, or no answered renewal for a
//!   whole TTL (counted from when the last answered one was sent, so the
//!   client gives up no later than the server can expire the session),
//!   makes it `Lost` — the backend then cleans up
//!   ([`Renewer::expired`]);
//! - during an injected suspension ([`Faults::suspend`](super::Faults)) no
//!   renewal is sent; its end kicks the loop.
//!
//! A backend supplies only how to open a session ([`Renewer::open_session`]),
//! renew it once ([`Renewer::renew_once`]) and end it on the server
//! ([`Renewer::end`]), what to do when it ran out ([`Renewer::expired`]),
//! and its cadence ([`Cadence`]). The rest of a session's life — renewal
//! after a loss, an injected suspension, closing, an injected expiry — is
//! the same for both and written once, as the trait's provided methods.

use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::status::{Renewal, StatusMachine};
use super::{Faults, SessionId};
use crate::error::Result;

/// What one renewal found.
pub(crate) enum Renewed {
    /// The server has the session and renewed it.
    Alive,
    /// The server no longer has the session.
    Gone,
    /// No answer, or a failed request: it is not known.
    Failed(String),
}

/// How often a session is renewed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cadence {
    /// The session's TTL on the server.
    pub ttl: Duration,
    /// The pause between answered renewals, and how long one may take (at
    /// most: no longer than the session has left).
    pub interval: Duration,
    /// The pause before trying again after a failed renewal.
    pub retry: Duration,
}

/// A backend's side of the loop, and of the session's life around it.
#[async_trait::async_trait]
pub(crate) trait Renewer: Send + Sync + 'static {
    /// What the backend keeps per session in the status machine's slot.
    type Slot: Send;
    /// What the loop keeps for its session between renewals (a stream, the
    /// session's name).
    type Loop: Send;
    /// How the server names a session, to end it (etcd: the lease id;
    /// Consul: the session's UUID); its default names none.
    type Name: Display + Default + Clone + PartialEq + Send + Sync + 'static;

    /// The status machine the loop feeds.
    fn machine(&self) -> &StatusMachine<Self::Slot>;

    /// Notified to wake the loop at once: the end of a suspension, a close.
    fn kick(&self) -> &Notify;

    /// The runtime the store was opened on, for its timers and background
    /// work (a store may be dropped or faulted outside of it).
    fn runtime(&self) -> &Handle;

    /// Where `slot` keeps its session's name (the default once taken).
    fn name_in(slot: &mut Self::Slot) -> &mut Self::Name;

    /// The name of the session in `slot`; with `take`, taken out of it (a
    /// close), and `None` if it was taken already.
    fn name(slot: &mut Self::Slot, take: bool) -> Option<Self::Name> {
        let kept = Self::name_in(slot);
        let name = match take {
            true => std::mem::take(kept),
            false => kept.clone(),
        };
        (name != Self::Name::default()).then_some(name)
    }

    /// Opens a new session on the server: its id and slot.
    async fn open_session(&self) -> Result<(SessionId, Self::Slot)>;

    /// Starts the keep-alive loop ([`keep_alive`]) of the new session `id`.
    fn spawn_renewals(self: &Arc<Self>, id: SessionId);

    /// Renews session `id` once, answering within `timeout`.
    async fn renew_once(&self, id: SessionId, state: &mut Self::Loop, timeout: Duration)
        -> Renewed;

    /// Ends the session `name` on the server: its keys go at once.
    async fn end(&self, name: &Self::Name) -> Result<()>;

    /// No renewal was answered for a whole TTL: declare `id` lost and let
    /// its keys go on the server, where it may still live.
    fn expired(self: &Arc<Self>, id: SessionId, state: Self::Loop);

    /// What `Faults::expire` answers when the server did not confirm the
    /// end of session `id` (with `e`).
    fn unconfirmed_end(&self, _id: SessionId, e: crate::Error) -> crate::Error {
        e
    }

    /// Replaces the lost session `lost` by a new one, and keeps it alive.
    async fn renew_after_loss(self: &Arc<Self>, lost: SessionId) -> Result<()> {
        match self.machine().renew(lost, || self.open_session()).await? {
            Renewal::Installed(id) => {
                tracing::debug!(
                    session = format_args!("{id:#x}"),
                    "new session after a loss"
                );
                self.spawn_renewals(id);
            }
            // Closed meanwhile.
            Renewal::Abandoned(mut slot) => {
                if let Some(name) = Self::name(&mut slot, true) {
                    self.end_in_background(name);
                }
            }
            Renewal::NotNeeded => {}
        }
        Ok(())
    }

    /// Ends the session `name` on the server in the background, best
    /// effort (it expires there by itself otherwise).
    fn end_in_background(self: &Arc<Self>, name: Self::Name) {
        let this = self.clone();
        self.runtime().spawn(async move {
            if let Err(e) = this.end(&name).await {
                tracing::debug!(session = %name, "ending a session on the server failed: {e}");
            }
        });
    }

    /// Marks the store closed (later operations fail with `Closed`) and
    /// returns the session to end on the server, if it was open until now.
    fn shut(&self) -> Option<Self::Name> {
        let (was_open, name) = self.machine().shut(|slot| Self::name(slot, true));
        // The loop may sleep until the session's expiry: let it see the
        // close now, and let go of the store.
        self.kick().notify_one();
        name.filter(|_| was_open)
    }

    /// Closes: `Closed` at once, then ends the session on the server (its
    /// keys go) and waits for the answer.
    async fn close_session(&self) {
        if let Some(name) = self.shut() {
            if let Err(e) = self.end(&name).await {
                tracing::debug!(session = %name, "ending the session on close failed: {e}; it expires by itself");
            }
        }
    }

    /// `Faults::suspend`: `Suspended` at once, no renewals for `duration`,
    /// then one at once (`Reconnected` if the server still has the
    /// session). If the session runs out meanwhile, the loop reports `Lost`
    /// when it must have expired on the server.
    fn suspend(self: &Arc<Self>, duration: Duration) {
        let Some(suspension) = self.machine().begin_suspension() else {
            return;
        };
        let this = Arc::downgrade(self);
        self.runtime().spawn(async move {
            tokio::time::sleep(duration).await;
            if let Some(this) = this.upgrade() {
                if this.machine().end_suspension(suspension) {
                    this.kick().notify_one();
                }
            }
        });
    }

    /// `Faults::end_on_server`: ends the session on the server only; the
    /// loop or the next request that needs it finds it gone.
    async fn end_unannounced(&self) -> Result<()> {
        self.machine()
            .expire_with(|_| async move {
                let name = Self::name(&mut self.machine().lock().backend, false);
                match name {
                    Some(name) => self.end(&name).await,
                    None => Ok(()),
                }
            })
            .await
    }

    /// `Faults::expire`: ends the session on the server (its keys go at
    /// once) and declares it `Lost`, whether the server confirmed or not;
    /// the answer is the server's.
    async fn end_now(&self) -> Result<()> {
        self.machine()
            .expire_with(|id| async move {
                let name = Self::name(&mut self.machine().lock().backend, false);
                let ended = match &name {
                    Some(name) => self.end(name).await,
                    None => Ok(()),
                };
                self.machine().lose(id);
                ended.map_err(|e| self.unconfirmed_end(id, e))
            })
            .await
    }
}

/// A store's hold on its session kept by renewal: the keeper (which the
/// store reaches through it), the faults tests inject into the session, and
/// — when the store is dropped — the session's end, in the background.
pub(crate) struct Kept<R: Renewer>(pub Arc<R>);

impl<R: Renewer> std::ops::Deref for Kept<R> {
    type Target = Arc<R>;

    fn deref(&self) -> &Arc<R> {
        &self.0
    }
}

impl<R: Renewer> Drop for Kept<R> {
    fn drop(&mut self) {
        if let Some(name) = self.0.shut() {
            self.0.end_in_background(name);
        }
    }
}

/// The faults act on the session (see each backend's module docs):
/// `suspend` stops renewals for a while, `expire` ends the session on the
/// server, and a lost reply blips the status `Suspended` → `Reconnected`
/// (same session).
#[async_trait::async_trait]
impl<R: Renewer> Faults for Kept<R> {
    fn suspend(&self, duration: Duration) {
        self.0.suspend(duration);
    }

    async fn expire(&self) -> Result<()> {
        self.0.end_now().await
    }

    async fn end_on_server(&self) -> Result<()> {
        self.0.end_unannounced().await
    }

    fn lose_next_create_reply(&self) {
        self.0.machine().lost_replies.create.arm();
    }

    fn lose_next_delete_reply(&self) {
        self.0.machine().lost_replies.delete.arm();
    }

    fn fail_next_reads(&self, n: u32) {
        self.0.machine().lost_replies.fail_reads(n);
    }

    fn fail_next_sets(&self, n: u32) {
        self.0.machine().lost_replies.fail_sets(n);
    }

    fn fail_next_deletes(&self, n: u32) {
        self.0.machine().lost_replies.fail_deletes(n);
    }

    fn fail_next_creates(&self, n: u32) {
        self.0.machine().lost_replies.fail_creates(n);
    }
}

/// Keeps session `id` alive until it is lost, replaced or closed, or the
/// backend is gone (`keeper` answers `None`). `confirmed` is when the
/// session's creation (or last answered renewal) was sent.
pub(crate) async fn keep_alive<R: Renewer>(
    keeper: impl Fn() -> Option<Arc<R>>,
    id: SessionId,
    mut state: R::Loop,
    cadence: Cadence,
    mut confirmed: Instant,
) {
    let Cadence {
        ttl,
        interval,
        retry,
    } = cadence;
    let mut next = confirmed + interval;
    let mut kicked = false;
    loop {
        let Some(this) = keeper() else {
            return;
        };
        let machine = this.machine();
        if !machine.is_current(id) {
            // Lost elsewhere (an operation, an injected expiry) while this
            // loop slept, and replaced: the kick that woke it was meant for
            // the new session's loop, which shares the one `Notify`. Kept
            // here, it would leave that loop asleep through the end of a
            // suspension until its session's expiry, and lose it.
            if kicked {
                this.kick().notify_one();
            }
            return;
        }
        kicked = false;
        let now = Instant::now();
        if now >= confirmed + ttl {
            this.expired(id, state);
            return;
        }
        if now >= next && !machine.fault_suspended() {
            let sent = Instant::now();
            // No longer than the session may still live: an answer after
            // that could not keep it, and meanwhile it would still count
            // as connected.
            let budget = interval.min((confirmed + ttl).saturating_duration_since(sent));
            match this.renew_once(id, &mut state, budget).await {
                Renewed::Alive => {
                    confirmed = sent;
                    next = sent + interval;
                    machine.connected(id);
                }
                Renewed::Gone => {
                    machine.lose(id);
                    return;
                }
                Renewed::Failed(why) => {
                    tracing::debug!(session = format_args!("{id:#x}"), "renewal failed: {why}");
                    next = Instant::now() + retry;
                    machine.disconnected(id);
                }
            }
            continue;
        }
        let wake = wake_at(next, confirmed + ttl, machine.fault_suspended());
        // Holding `this` meanwhile is fine: a close kicks the loop.
        tokio::select! {
            () = tokio::time::sleep_until(wake) => {}
            () = this.kick().notified() => {
                next = Instant::now();
                kicked = true;
            }
        }
    }
}

/// When the loop wakes next: for the next renewal, or when the session
/// must have run out on the server (`expiry`), whichever is first. During
/// a suspension no renewal may be sent — its end kicks the loop — so a
/// renewal already due must not wake it: it would wake at once, again and
/// again, spinning on a core until the suspension ends.
fn wake_at(next: Instant, expiry: Instant, suspended: bool) -> Instant {
    match suspended {
        true => expiry,
        false => next.min(expiry),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_suspended_loop_sleeps_until_the_expiry_even_with_a_renewal_due() {
        let now = Instant::now();
        let (due, expiry) = (
            now - Duration::from_millis(50),
            now + Duration::from_secs(2),
        );
        assert_eq!(wake_at(due, expiry, true), expiry);
        assert_eq!(wake_at(due, expiry, false), due);
        let later = now + Duration::from_secs(1);
        assert_eq!(wake_at(later, expiry, false), later);
        assert_eq!(
            wake_at(expiry + Duration::from_secs(1), expiry, false),
            expiry
        );
    }
}
