//! `dlock`'s exit codes, for scripts.

use std::fmt;

/// Why dlock ended, as an exit code. Commands that run a CMD otherwise exit
/// with CMD's own code (128 + N if a signal N ended it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// Something else went wrong.
    Internal = 70,
    /// The command line is wrong (bad flag, invalid path, missing `--`,
    /// an endpoint this command cannot use).
    Usage = 64,
    /// The lock, leases or leadership could not be had within `--timeout`.
    Timeout = 65,
    /// What we held was lost while CMD ran; CMD was stopped.
    Lost = 66,
    /// No server of the endpoint could be reached.
    Unreachable = 67,
    /// A revocation was requested while CMD ran (`--revocable`); CMD was
    /// stopped and the hold released.
    Revoked = 68,
    /// CMD exists but cannot be run.
    CannotRun = 126,
    /// CMD was not found.
    NotFound = 127,
}

/// An error that knows its exit code.
#[derive(Debug)]
pub struct Failure {
    pub code: Exit,
    pub message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

impl Exit {
    /// An error with this exit code.
    pub fn with(self, message: impl Into<String>) -> Failure {
        Failure {
            code: self,
            message: message.into(),
        }
    }

    /// The exit code for an error from anywhere in dlock.
    pub fn of(error: &anyhow::Error) -> Exit {
        if let Some(f) = error.downcast_ref::<Failure>() {
            return f.code;
        }
        match error.downcast_ref::<dlock::Error>() {
            Some(
                dlock::Error::InvalidPath { .. }
                | dlock::Error::InvalidArgument(_)
                | dlock::Error::InvalidEndpoint { .. },
            ) => Exit::Usage,
            Some(dlock::Error::Timeout(_)) => Exit::Timeout,
            Some(dlock::Error::Lost { .. }) => Exit::Lost,
            Some(dlock::Error::Unreachable(_)) => Exit::Unreachable,
            _ => Exit::Internal,
        }
    }
}
