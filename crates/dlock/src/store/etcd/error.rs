//! What etcd's (and the client's) errors mean for the store contract.

use crate::error::Error;

/// The gRPC status codes this backend tells apart (numbered as gRPC does).
mod code {
    pub const CANCELLED: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const NOT_FOUND: i32 = 5;
    pub const PERMISSION_DENIED: i32 = 7;
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    pub const FAILED_PRECONDITION: i32 = 9;
    pub const ABORTED: i32 = 10;
    pub const OUT_OF_RANGE: i32 = 11;
    pub const UNAVAILABLE: i32 = 14;
    pub const UNAUTHENTICATED: i32 = 16;
}

/// A classified failure of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Failure {
    /// The request may or may not have been applied: the connection, the
    /// member or the cluster's leader failed, or it timed out.
    Connection(String),
    /// The lease the request used (or kept alive) no longer exists.
    LeaseGone,
    /// The credentials were rejected (or are needed).
    Auth(String),
    /// The token predates a change to users or roles ("revision of auth
    /// store is old"): refused unapplied; a fresh token serves.
    StaleToken,
    /// The user lacks the permission.
    NoAuth(String),
    /// The revision asked for was compacted away.
    Compacted,
    /// The request was malformed (too many operations, too large...).
    InvalidArgument(String),
    /// Anything else.
    Other(String),
}

impl Failure {
    /// The contract's error for a request on `path`.
    pub fn into_error(self, path: &str) -> Error {
        match self {
            Failure::Connection(_) | Failure::StaleToken => Error::ConnectionLoss,
            Failure::LeaseGone => Error::SessionExpired,
            Failure::Auth(why) => Error::AuthFailed(why),
            Failure::NoAuth(_) => Error::NoAuth {
                path: path.to_string(),
            },
            Failure::Compacted => Error::Backend(format!("etcd: revision compacted ({path})")),
            Failure::InvalidArgument(why) => {
                Error::InvalidArgument(format!("etcd: {why} ({path})"))
            }
            Failure::Other(why) => Error::Backend(format!("etcd: {why} ({path})")),
        }
    }
}

/// Classifies a client error (`endpoint` only names the cluster in
/// messages).
pub(super) fn map_error(e: &etcd_client::Error, endpoint: &str) -> Failure {
    use etcd_client::Error as E;
    match e {
        E::GRpcStatus(status) => {
            let message = status.message().to_string();
            let lower = message.to_ascii_lowercase();
            let status_code: i32 = status.code().into();
            match status_code {
                code::NOT_FOUND if lower.contains("lease not found") => Failure::LeaseGone,
                // A full database (NOSPACE, until an operator compacts and
                // disarms the alarm) or a message over gRPC's size limit:
                // trying again changes nothing.
                code::RESOURCE_EXHAUSTED
                    if lower.contains("space exceeded") || lower.contains("larger than max") =>
                {
                    Failure::Other(message)
                }
                code::UNAVAILABLE
                | code::DEADLINE_EXCEEDED
                | code::CANCELLED
                | code::ABORTED
                | code::UNKNOWN
                | code::RESOURCE_EXHAUSTED => Failure::Connection(format!("{endpoint}: {message}")),
                code::UNAUTHENTICATED => Failure::Auth(message),
                code::PERMISSION_DENIED => Failure::NoAuth(message),
                code::OUT_OF_RANGE if lower.contains("compacted") => Failure::Compacted,
                _ if lower.contains("revision of auth store is old") => Failure::StaleToken,
                code::INVALID_ARGUMENT | code::FAILED_PRECONDITION
                    if lower.contains("auth") || lower.contains("user name is empty") =>
                {
                    Failure::Auth(message)
                }
                code::INVALID_ARGUMENT => Failure::InvalidArgument(message),
                _ => Failure::Other(message),
            }
        }
        E::LeaseKeepAliveError(why) if why.contains("lease not found") => Failure::LeaseGone,
        E::TransportError(e) => Failure::Connection(format!("{endpoint}: {e}")),
        E::IoError(e) => Failure::Connection(format!("{endpoint}: {e}")),
        E::LeaseKeepAliveError(why) | E::WatchError(why) => Failure::Connection(why.clone()),
        E::InvalidArgs(why) => Failure::InvalidArgument(why.clone()),
        other => Failure::Other(other.to_string()),
    }
}
