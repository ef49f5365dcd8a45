//! [`Deadline`]: how long an acquisition may wait, in one type for every
//! recipe, with the one error a wait that ran out reports.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};

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
                at: Instant::now() + timeout,
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
    /// so does `until` still running [`CLEANUP_GRACE`] after it (its store
    /// calls waiting out a suspension): it is dropped then, and acquisitions
    /// are cancellation-safe.
    pub async fn within<T, F>(timeout: Option<Duration>, until: impl FnOnce(Self) -> F) -> Result<T>
    where
        F: Future<Output = Result<Option<T>>>,
    {
        let deadline = Deadline::after(timeout);
        match deadline.with_grace().race(until(deadline)).await {
            Some(got) => deadline.or_timed_out(got?),
            None => Err(deadline.timed_out_error()),
        }
    }

    /// Runs `until` with a deadline of now (take it only if it can be had
    /// now): its answer, or [`Error::ConnectionLoss`] if the store did not
    /// give one within [`CLEANUP_GRACE`] (the connection is down).
    pub async fn now<T, F>(until: impl FnOnce(Self) -> F) -> Result<Option<T>>
    where
        F: Future<Output = Result<Option<T>>>,
    {
        let deadline = Deadline::after(Some(Duration::ZERO));
        let answer = deadline.with_grace().race(until(deadline)).await;
        answer.unwrap_or(Err(Error::ConnectionLoss))
    }

    /// This deadline, [`CLEANUP_GRACE`] later.
    fn with_grace(&self) -> Self {
        match *self {
            Deadline::Never => Deadline::Never,
            Deadline::At { at, timeout } => Deadline::At {
                at: at + CLEANUP_GRACE,
                timeout,
            },
        }
    }
}

/// How long past its deadline a wait may take to clean up after itself (a
/// delete: one round trip) before it is dropped, leaving that to the
/// background. It bounds every timed acquisition, even while the
/// connection is down and store calls wait for it to come back.
pub(crate) const CLEANUP_GRACE: Duration = Duration::from_secs(1);

/// The three ways to acquire that every lock-like recipe offers over its
/// `$until(args.., deadline) -> Result<Option<$hold>>`: wait as long as it
/// takes, wait at most a timeout ([`Error::Timeout`] after it, at most
/// [`CLEANUP_GRACE`] late even while the connection is down), or only if
/// it can be had now (`None` if not; [`Error::ConnectionLoss`] if the store
/// cannot say within [`CLEANUP_GRACE`]). Written once here, with each
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
            Deadline::within(None, |d| self.$until($($arg,)* d)).await
        }

        $(#[$timeout_doc])*
        pub async fn $timeout(&self $(, $arg: $ty)*, timeout: Duration) -> Result<$hold> {
            Deadline::within(Some(timeout), |d| self.$until($($arg,)* d)).await
        }

        $(#[$now_doc])*
        pub async fn $now(&self $(, $arg: $ty)*) -> Result<Option<$hold>> {
            Deadline::now(|d| self.$until($($arg,)* d)).await
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
