//! [`Deadline`]: how long an acquisition may wait, in one type for every
//! recipe, with the one error a wait that ran out reports.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::session::Session;
use crate::store::SessionState;

/// How far ahead an instant is ever set: a longer timeout or hold limit
/// (`Duration::MAX`, say) means "never", and must not overflow the clock.
const FAR_AHEAD: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

tokio::task_local! {
    /// Past when the timed wait this task runs retries no failed request:
    /// its deadline and the clean-up grace.
    static RETRIES_END: Instant;
}

/// The pause before a retry of a failed request in the timed wait this
/// task runs: `pause`, cut to end with the wait (its deadline and the
/// clean-up grace); `None` once that is past — then the request's failure
/// is the answer. Requests that fail on a live connection (a cluster
/// without a leader, one that times requests out, while renewals still get
/// through) would otherwise be retried through the whole retry policy,
/// seconds past a deadline the caller set. Outside a timed wait, `pause`.
pub(crate) fn retry_pause_within(pause: Duration) -> Option<Duration> {
    match RETRIES_END.try_with(|end| *end) {
        Ok(end) => {
            let left = end.saturating_duration_since(Instant::now());
            (!left.is_zero()).then(|| pause.min(left))
        }
        Err(_) => Some(pause),
    }
}

/// `work` bounded as the timed wait this task runs bounds its retries: for
/// work spawned as a task of its own (which task-locals do not reach) that
/// the wait awaits.
pub(crate) fn within_this_wait<F: Future>(work: F) -> impl Future<Output = F::Output> {
    let end = RETRIES_END.try_with(|end| *end).ok();
    async move {
        match end {
            Some(end) => RETRIES_END.scope(end, work).await,
            None => work.await,
        }
    }
}

/// `after` from `start`, no further than [`FAR_AHEAD`].
pub(crate) fn instant_after(start: Instant, after: Duration) -> Instant {
    start + after.min(FAR_AHEAD)
}

/// When a wait gives up: never, or at an instant `timeout` after it began
/// (kept, so that [`Error::Timeout`] names what the caller asked for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deadline {
    Never,
    At { at: Instant, timeout: Duration },
}

impl Deadline {
    /// `timeout` from now; `None` waits forever.
    pub fn after(timeout: Option<Duration>) -> Self {
        match timeout {
            None => Deadline::Never,
            Some(timeout) => Deadline::At {
                at: instant_after(Instant::now(), timeout),
                timeout,
            },
        }
    }

    /// Time left (zero once passed); `None` without a deadline.
    pub fn remaining(&self) -> Option<Duration> {
        match self {
            Deadline::Never => None,
            Deadline::At { at, .. } => Some(at.saturating_duration_since(Instant::now())),
        }
    }

    /// Whether the deadline has passed: then a look must not wait.
    pub fn passed(&self) -> bool {
        self.remaining() == Some(Duration::ZERO)
    }

    /// Runs `wait` until it ends or the deadline passes (`None`).
    pub async fn race<T>(&self, wait: impl Future<Output = T>) -> Option<T> {
        let expired = async {
            match self {
                Deadline::Never => std::future::pending().await,
                Deadline::At { at, .. } => tokio::time::sleep_until(*at).await,
            }
        };
        tokio::select! {
            done = wait => Some(done),
            () = expired => None,
        }
    }

    /// What an acquisition that ran out of time reports:
    /// [`Error::Timeout`] with the timeout asked for. Without a deadline
    /// nothing can time out, so getting here is a broken contract (a
    /// [`Lockable`](super::multi_lock::Lockable) that gave up when told to
    /// wait forever): [`Error::Backend`] says so, rather than
    /// [`Error::Closed`], which would send the caller after a session that
    /// is fine.
    pub fn timed_out_error(&self) -> Error {
        match self {
            Deadline::At { timeout, .. } => Error::Timeout(*timeout),
            Deadline::Never => {
                Error::Backend("a wait without a deadline gave up (a broken contract)".into())
            }
        }
    }

    /// `got`, or the [`timed_out_error`](Self::timed_out_error) if the wait
    /// ran out.
    pub fn or_timed_out<T>(&self, got: Option<T>) -> Result<T> {
        got.ok_or_else(|| self.timed_out_error())
    }

    /// Runs `until` by a deadline `timeout` from now (none: forever); the
    /// `None` it returns when that passes becomes the timed-out error, and
    /// so does a [cut-off](Self::cut_off) in `session`.
    pub async fn within<T, F>(
        timeout: Option<Duration>,
        session: &Session,
        until: impl FnOnce(Self) -> F,
    ) -> Result<T>
    where
        F: Future<Output = Result<Option<T>>>,
    {
        let deadline = Deadline::after(timeout);
        let got = deadline.run(session, until(deadline)).await?;
        deadline.or_timed_out(got)
    }

    /// Runs `until` with a deadline of now (take it only if it can be had
    /// now): its answer, or [`Error::ConnectionLoss`] on a
    /// [cut-off](Self::cut_off) in `session`.
    pub async fn now<T, F>(session: &Session, until: impl FnOnce(Self) -> F) -> Result<Option<T>>
    where
        F: Future<Output = Result<Option<T>>>,
    {
        let deadline = Deadline::after(Some(Duration::ZERO));
        tokio::select! {
            got = deadline.bounding_retries(until(deadline)) => got,
            () = deadline.cut_off(session) => Err(Error::ConnectionLoss),
        }
    }

    /// Runs `wait` by this deadline, which it keeps itself (`None` once
    /// passed); `None` too on a [cut-off](Self::cut_off) in `session`.
    pub async fn run<T>(
        &self,
        session: &Session,
        wait: impl Future<Output = Result<Option<T>>>,
    ) -> Result<Option<T>> {
        tokio::select! {
            got = self.bounding_retries(wait) => match got {
                // A request that kept failing on the connection until the
                // deadline (its retries end there): the wait ran out, as
                // when the connection is down ([`cut_off`](Self::cut_off)).
                Err(e) if e.is_retryable() && self.passed() => {
                    tracing::debug!(error = %e, "a timed wait's requests failed until its deadline");
                    Ok(None)
                }
                got => got,
            },
            () = self.cut_off(session) => Ok(None),
        }
    }

    /// Runs `wait` with the retries of its requests ending by this deadline
    /// and the clean-up grace ([`retry_pause_within`]).
    async fn bounding_retries<T>(&self, wait: impl Future<Output = T>) -> T {
        match *self {
            Deadline::Never => wait.await,
            Deadline::At { at, .. } => {
                let end = instant_after(at, CLEANUP_GRACE);
                RETRIES_END.scope(end, wait).await
            }
        }
    }

    /// Resolves once the deadline is [`CLEANUP_GRACE`] past while
    /// `session`'s connection is down — suspended, or lost and not yet
    /// replaced: a wait's store calls would wait for it to come back (a
    /// lost session's next call makes a new one, through the same
    /// connection), which its caller did not agree to. A wait on a live
    /// connection keeps its own deadline, however many round trips it
    /// takes.
    async fn cut_off(&self, session: &Session) {
        let Deadline::At { at, .. } = *self else {
            return std::future::pending().await;
        };
        tokio::time::sleep_until(instant_after(at, CLEANUP_GRACE)).await;
        let mut status = session.watch_status();
        let down = |state| matches!(state, SessionState::Suspended | SessionState::Lost);
        // A session gone with its channel cuts off too.
        let _ = status.wait_for(|s| down(s.state)).await;
    }
}

/// How long past its deadline a wait whose connection is down may go on
/// (cleaning up after itself, if the connection comes back) before it is
/// dropped, leaving its clean-up to the background.
pub(crate) const CLEANUP_GRACE: Duration = Duration::from_secs(1);

/// The three ways to acquire that every lock-like recipe offers over its
/// `$until(args.., deadline) -> Result<Option<$hold>>`: wait as long as it
/// takes, wait at most a timeout ([`Error::Timeout`] after it; while the
/// connection is down, at most [`CLEANUP_GRACE`] late; a request failing
/// on a live connection is not retried past that either), or only if it
/// can be had now (`None` if not; [`Error::ConnectionLoss`] if the
/// connection is down, or requests keep failing, [`CLEANUP_GRACE`] after
/// asking). Written once here, with each
/// recipe's own names and docs; inside an `impl` of the recipe.
macro_rules! timed_acquire {
    (
        $(#[$wait_doc:meta])* $wait:ident,
        $(#[$timeout_doc:meta])* $timeout:ident,
        $(#[$now_doc:meta])* $now:ident
        => $until:ident($($arg:ident: $ty:ty),*) -> $hold:ty
    ) => {
        $(#[$wait_doc])*
        pub async fn $wait(&self $(, $arg: $ty)*) -> Result<$hold> {
            Deadline::within(None, self.session(), |d| self.$until($($arg,)* d)).await
        }

        $(#[$timeout_doc])*
        pub async fn $timeout(&self $(, $arg: $ty)*, timeout: Duration) -> Result<$hold> {
            Deadline::within(Some(timeout), self.session(), |d| self.$until($($arg,)* d)).await
        }

        $(#[$now_doc])*
        pub async fn $now(&self $(, $arg: $ty)*) -> Result<Option<$hold>> {
            Deadline::now(self.session(), |d| self.$until($($arg,)* d)).await
        }
    };
}
pub(crate) use timed_acquire;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_deadline_runs_out_and_names_its_timeout() {
        let d = Deadline::after(Some(Duration::from_secs(1)));
        assert_eq!(d.remaining(), Some(Duration::from_secs(1)));
        assert_eq!(d.race(std::future::pending::<()>()).await, None);
        assert!(d.passed());
        assert_eq!(
            d.or_timed_out(None::<()>),
            Err(Error::Timeout(Duration::from_secs(1)))
        );
        let never = Deadline::after(None);
        assert_eq!((never.remaining(), never.passed()), (None, false));
        assert_eq!(never.race(async { 7 }).await, Some(7));
        assert!(matches!(never.timed_out_error(), Error::Backend(_)));
    }
}
