//! `dlock`'s exit codes, for scripts.

use std::fmt;

/// Why dlock ended, as an exit code. Commands that run a CMD otherwise exit
/// with CMD's own code (128 + N if a signal N ended it, or ended dlock
/// while it waited or gave back).
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
    /// What we held was lost while CMD ran; CMD was stopped (or had just
    /// ended).
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
    /// Ctrl-C (SIGINT) ended the run early (a waiting `lock`, a demo).
    Interrupted = 130,
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
    /// Every code dlock chooses itself, in the order of the table.
    pub const ALL: [Exit; 9] = [
        Exit::Usage,
        Exit::Timeout,
        Exit::Lost,
        Exit::Unreachable,
        Exit::Revoked,
        Exit::Internal,
        Exit::CannotRun,
        Exit::NotFound,
        Exit::Interrupted,
    ];

    /// What the code tells a script, as the exit-code table says it.
    pub fn meaning(self) -> &'static str {
        match self {
            Exit::Usage => {
                "usage error: a bad flag or path, a missing `--`, an endpoint the command cannot use"
            }
            Exit::Timeout => "the lock, leases or leadership could not be had within --timeout",
            Exit::Lost => "what dlock held was lost while CMD ran; CMD was stopped (or had just ended)",
            Exit::Unreachable => "no server of the endpoint could be reached",
            Exit::Revoked => {
                "a revocation was requested (--revocable); CMD was stopped, the hold released"
            }
            Exit::Internal => "any other error",
            Exit::CannotRun => "CMD exists but cannot be run",
            Exit::NotFound => "CMD was not found",
            Exit::Interrupted => {
                "interrupted by Ctrl-C (SIGINT); a demo's holders first count themselves out"
            }
        }
    }

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

/// The rows of the exit-code table that no [`Exit`] names: the outcomes
/// that are a command's own.
pub const OWN_CODES: [(&str, &str); 3] = [
    ("0", "success (with CMD: CMD exited 0)"),
    (
        "CMD's",
        "commands that run CMD exit with its code (128+N: signal N ended it, or dlock)",
    ),
    (
        "1",
        "`count cas`, `counter add`, `set`, `cas`: no effect; `revoke`: no such node",
    ),
];

/// The exit-code table, as `dlock --help` ends (README.md has the same
/// rows; a CLI test compares them).
pub fn table() -> String {
    let mut rows: Vec<(String, &str)> = OWN_CODES
        .iter()
        .map(|(code, meaning)| (code.to_string(), *meaning))
        .collect();
    rows.extend(
        Exit::ALL
            .iter()
            .map(|e| ((*e as u8).to_string(), e.meaning())),
    );
    let mut table = String::from("Exit codes:\n");
    for (code, meaning) in rows {
        table.push_str(&format!("  {code:<6} {meaning}\n"));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Exit::ALL` lists every variant once: adding a variant without a
    /// row fails to compile here (the match) or fails this test.
    #[test]
    fn the_table_lists_every_exit_code_once() {
        for (i, exit) in Exit::ALL.iter().enumerate() {
            let place = match exit {
                Exit::Usage => 0,
                Exit::Timeout => 1,
                Exit::Lost => 2,
                Exit::Unreachable => 3,
                Exit::Revoked => 4,
                Exit::Internal => 5,
                Exit::CannotRun => 6,
                Exit::NotFound => 7,
                Exit::Interrupted => 8,
            };
            assert_eq!(place, i, "{exit:?} out of place in Exit::ALL");
        }
        let table = table();
        for exit in Exit::ALL {
            let row = format!("  {:<6} {}\n", exit as u8, exit.meaning());
            assert_eq!(table.matches(&row).count(), 1, "{row:?} in\n{table}");
        }
    }
}
