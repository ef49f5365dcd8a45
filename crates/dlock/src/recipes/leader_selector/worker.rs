//! The one task that runs a [`LeaderSelector`](super::LeaderSelector)'s
//! turns: queue on the mutex, lead by running `take_leadership`, give the
//! turn back, and queue again if asked.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::watch;

use super::{Phase, Shared, TakeLeadership};
use crate::error::Error;
use crate::recipes::election::Standing;
use crate::recipes::error_policy::ErrorPolicy;
use crate::recipes::guard::LockGuard;
use crate::recipes::lifecycle::Backoff;
use crate::recipes::mutex::Mutex;
use crate::recipes::queue::HeldNode;
use crate::session::Session;
use crate::store::{SessionState, SessionStatus};

/// The one task that runs a selector's turns, one after another.
pub(super) struct Worker {
    pub(super) mutex: Mutex,
    pub(super) policy: ErrorPolicy,
    pub(super) auto_requeue: bool,
    pub(super) grace: Duration,
    pub(super) take: TakeLeadership,
    pub(super) standing: Arc<Standing>,
    pub(super) shared: Arc<Shared>,
}

impl Worker {
    pub(super) async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let session = self.mutex.session().clone();
        let mut backoff = Backoff::default();
        'work: loop {
            // Wait for a turn to be requested.
            while self.shared.queue().phase != Phase::Queued {
                tokio::select! {
                    biased;
                    _ = shutdown.changed() => break 'work,
                    _ = self.shared.wake.notified() => {}
                }
            }
            // Queue; dropping the acquire (on close) withdraws our node.
            let acquired = tokio::select! {
                biased;
                _ = shutdown.changed() => break 'work,
                acquired = self.mutex.acquire() => acquired,
            };
            let guard = match acquired {
                Ok(guard) => {
                    backoff.reset();
                    guard
                }
                Err(Error::Closed) => {
                    self.standing.lifecycle.force_close();
                    break 'work;
                }
                Err(e) => {
                    tracing::warn!(path = %self.mutex.path(), error = %e, "leader selector: queueing failed");
                    self.standing.fail(e);
                    match backoff.pause(&session, shutdown.changed()).await {
                        true => continue,
                        false => break 'work,
                    }
                }
            };
            // Won the turn; lead unless the connection failed us meanwhile
            // (then take_leadership is not even called).
            let since = session.status();
            let usable = !guard.is_lost()
                && !self.policy.is_error_state(since.state)
                && since.session_id == guard.held_node().session_id;
            let shutting = usable && self.lead(&session, &guard, since, &mut shutdown).await;
            release(guard, &session).await;
            if shutting || *shutdown.borrow() || shutdown.has_changed().is_err() {
                break;
            }
            {
                let mut queue = self.shared.queue();
                // A turn we could not use (the connection failed us) is
                // not spent: queue again.
                queue.phase = match queue.again || self.auto_requeue || !usable {
                    true => Phase::Queued,
                    false => Phase::Idle,
                };
                queue.again = false;
            }
            // A store that answers at once (the embedded one) and a
            // take_leadership that returns at once would otherwise never
            // let a single-threaded runtime run anything else.
            tokio::task::yield_now().await;
        }
        self.standing.lose();
    }

    /// Runs one term; returns whether the selector is shutting down.
    async fn lead(
        &self,
        session: &Session,
        guard: &LockGuard,
        since: SessionStatus,
        shutdown: &mut watch::Receiver<bool>,
    ) -> bool {
        let created = guard.held_node().created.clone();
        let node = HeldNode::new(session, self.mutex.path(), "leadership", created);
        self.shared.queue().phase = Phase::Leading;
        let term = self.standing.gain(node, since);
        // Called inside the unwind boundary: a panic before its first await
        // ends the term as one after it does.
        let (take, given) = (self.take.clone(), term.clone());
        let mut work = Box::pin(AssertUnwindSafe(async move { take(given).await }).catch_unwind());
        let mut status = session.watch_status();
        let policy = self.policy;
        let mut shutting = false;
        let returned = tokio::select! {
            biased;
            _ = shutdown.changed() => {
                shutting = true;
                None
            }
            _ = status.wait_for(|now| policy.ends_leadership(&since, now)) => None,
            _ = term.cancelled() => None,
            // Our node deleted by someone else: the next candidate leads.
            // (Found gone while suspended, it went with the session: the
            // term ends when the status says so, as the policy wants.)
            () = async {
                term.lost().await;
                let mut now = session.watch_status();
                let _ = now.wait_for(|s| s.state != SessionState::Suspended).await;
            } => None,
            result = &mut work => Some(result),
        };
        let result = match returned {
            Some(result) => Some(result),
            None => {
                // Cancelled: tell it, give it its grace, then drop it.
                self.standing.cancel();
                match self.grace.is_zero() {
                    true => None,
                    false => tokio::time::timeout(self.grace, &mut work).await.ok(),
                }
            }
        };
        if let Some(Err(panic)) = result {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(path = %self.mutex.path(), panic = %what, "take_leadership panicked");
        }
        // The term is over (its future gone) before the lock is released.
        drop(work);
        self.standing.lose();
        shutting
    }
}

/// Releases the lock: at once if the session can, else in the background as
/// soon as it can.
async fn release(guard: LockGuard, session: &Session) {
    if !session.state().is_connected() {
        drop(guard);
        return;
    }
    match guard.release().await {
        Ok(()) | Err(Error::Lost { .. }) => {}
        Err(e) => tracing::warn!(error = %e, "leader selector: releasing the lock failed"),
    }
}
