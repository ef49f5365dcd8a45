//! The one error type of the library.

use std::time::Duration;

/// Everything that can go wrong in dlock, from the store up to the recipes.
///
/// Store errors mirror ZooKeeper's result codes so that recipes can react to
/// them the way Curator does (`NoNode` on a vanished predecessor means "look
/// again", `ConnectionLoss` means "retry, and search for the node a lost reply
/// may have created").
///
/// ```
/// use dlock::Error;
/// let e = Error::NoNode { path: "/a".into() };
/// assert_eq!(e.to_string(), "no node at /a");
/// assert!(!e.is_retryable());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The path does not satisfy ZooKeeper's path rules.
    #[error("invalid path {path:?}: {reason}")]
    InvalidPath {
        /// The offending path.
        path: String,
        /// Which rule it breaks.
        reason: String,
    },
    /// An argument is out of range or malformed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An endpoint URL could not be understood.
    #[error("invalid endpoint {url:?}: {reason}")]
    InvalidEndpoint {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The node does not exist.
    #[error("no node at {path}")]
    NoNode {
        /// The path that was looked for.
        path: String,
    },
    /// The node already exists.
    #[error("node already exists at {path}")]
    NodeExists {
        /// The path that was to be created.
        path: String,
    },
    /// The expected version did not match.
    #[error("version mismatch at {path}")]
    BadVersion {
        /// The node whose version differs.
        path: String,
    },
    /// A node with children cannot be deleted.
    #[error("node {path} has children")]
    NotEmpty {
        /// The node that still has children.
        path: String,
    },
    /// Ephemeral nodes cannot have children.
    #[error("ephemeral node {path} cannot have children")]
    NoChildrenForEphemerals {
        /// The ephemeral parent.
        path: String,
    },
    /// The session lacks the permission (ACL) for this operation.
    #[error("permission denied at {path}")]
    NoAuth {
        /// The protected path.
        path: String,
    },
    /// Credentials were rejected by the server.
    #[error("authentication failed: {0}")]
    AuthFailed(String),
    /// The connection dropped while the request was in flight: it may or may
    /// not have been applied.
    #[error("connection lost")]
    ConnectionLoss,
    /// The session expired (ZooKeeper) or its lease ran out (etcd): every
    /// ephemeral node of it is gone.
    #[error("session expired")]
    SessionExpired,
    /// The session or recipe was closed by its owner.
    #[error("closed")]
    Closed,
    /// One operation of an atomic multi-operation failed, so none was applied.
    #[error("multi-operation failed at op {index}: {source}")]
    MultiFailed {
        /// Zero-based index of the failing operation.
        index: usize,
        /// Why it failed.
        source: Box<Error>,
    },
    /// Waiting for a lock, lease or leadership timed out.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The lock, lease or leadership is no longer held: its session was lost
    /// or its node was deleted.
    #[error("{what} at {path} was lost")]
    Lost {
        /// What was lost ("lock", "lease", "leadership").
        what: &'static str,
        /// The recipe path.
        path: String,
    },
    /// The operation needs a held lock that the caller does not hold.
    #[error("not held: {0}")]
    NotHeld(String),
    /// The backend cannot reach any server.
    #[error("backend unreachable: {0}")]
    Unreachable(String),
    /// A stored value could not be decoded.
    #[error("malformed data at {path}: {reason}")]
    MalformedData {
        /// The node holding the data.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Several operations failed (releasing a multi-lock); each error in
    /// order.
    #[error("{} errors: {}", .0.len(), .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Several(Vec<Error>),
    /// Any other backend failure, with its message.
    #[error("backend error: {0}")]
    Backend(String),
    /// The node's name cannot be taken yet: a session that held it was
    /// invalidated, and the store keeps the name from being taken by a
    /// session for a while (Consul's lock delay, 15 s for `consul lock`).
    /// The same create succeeds once the delay is over; the store does not
    /// say when that is.
    #[error("{path} cannot be taken yet: the lock delay of a session that held it is in force")]
    LockDelay {
        /// The node that could not be created.
        path: String,
    },
}

impl Error {
    /// Whether the operation may succeed if simply tried again (after a
    /// transient connection problem).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::ConnectionLoss)
    }

    /// Whether the error means the session and everything it held is gone.
    pub fn is_session_lost(&self) -> bool {
        matches!(self, Error::SessionExpired | Error::Closed)
    }
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A read's answer with a missing node as `None` rather than an error.
pub(crate) trait Found<T> {
    /// `Ok(None)` for [`Error::NoNode`]; any other error stays one.
    fn found(self) -> Result<Option<T>>;
}

impl<T> Found<T> for Result<T> {
    fn found(self) -> Result<Option<T>> {
        match self {
            Ok(value) => Ok(Some(value)),
            Err(Error::NoNode { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}
