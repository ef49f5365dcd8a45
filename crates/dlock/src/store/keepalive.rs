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
//! A backend supplies only how to renew once ([`Renewer::renew_once`]),
//! what to do when the session ran out ([`Renewer::expired`]), and its
//! cadence ([`Cadence`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::status::StatusMachine;
use super::SessionId;

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
    /// The pause between answered renewals (and how long one may take).
    pub interval: Duration,
    /// The pause before trying again after a failed renewal.
    pub retry: Duration,
}

/// A backend's side of the loop.
#[async_trait::async_trait]
pub(crate) trait Renewer: Send + Sync + 'static {
    /// What the backend keeps per session in the status machine's slot.
    type Slot: Send;
    /// What the loop keeps for its session between renewals (a stream, the
    /// session's name).
    type Loop: Send;

    /// The status machine the loop feeds.
    fn machine(&self) -> &StatusMachine<Self::Slot>;

    /// Notified to wake the loop at once: the end of a suspension, a close.
    fn kick(&self) -> &Notify;

    /// Renews session `id` once, answering within `timeout`.
    async fn renew_once(&self, id: SessionId, state: &mut Self::Loop, timeout: Duration)
        -> Renewed;

    /// No renewal was answered for a whole TTL: declare `id` lost and let
    /// its keys go on the server, where it may still live.
    fn expired(self: &Arc<Self>, id: SessionId, state: Self::Loop);
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
    loop {
        let Some(this) = keeper() else {
            return;
        };
        let machine = this.machine();
        if !machine.is_current(id) {
            return;
        }
        let now = Instant::now();
        if now >= confirmed + ttl {
            this.expired(id, state);
            return;
        }
        if now >= next && !machine.fault_suspended() {
            let sent = Instant::now();
            match this.renew_once(id, &mut state, interval).await {
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
            () = this.kick().notified() => next = Instant::now(),
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
