//! What [`inspect`](super::inspect) reports: the recipe recognised at a
//! path and its participants, in the terms `dlock inspect` prints.

use std::fmt;

use crate::store::{FencingToken, SessionId};

/// Which recipe's layout a path holds.
///
/// ```
/// assert_eq!(dlock::RecipeKind::ReadWriteLock.as_str(), "read-write-lock");
/// assert_eq!(dlock::RecipeKind::None.to_string(), "none");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RecipeKind {
    /// A [`Mutex`](crate::Mutex) — or a [`LeaderSelector`](crate::LeaderSelector),
    /// whose layout is a mutex's (as in Curator); also etcd Go `Mutex` keys.
    Mutex,
    /// A [`ReadWriteLock`](crate::ReadWriteLock).
    ReadWriteLock,
    /// A [`Semaphore`](crate::Semaphore) (or a [`SemaphoreMutex`](crate::SemaphoreMutex)).
    Semaphore,
    /// A [`KvSemaphore`](crate::KvSemaphore).
    KvSemaphore,
    /// A [`LeaderLatch`](crate::LeaderLatch).
    LeaderLatch,
    /// A leader election by etcd's Go client (`concurrency.Election`,
    /// `etcdctl elect`).
    LeaderElection,
    /// A [`SharedCount`](crate::SharedCount): see [`Inspection::count`].
    SharedCount,
    /// Nothing recognised (or nothing there).
    None,
}

impl RecipeKind {
    /// The kind's name, as `dlock inspect` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            RecipeKind::Mutex => "mutex",
            RecipeKind::ReadWriteLock => "read-write-lock",
            RecipeKind::Semaphore => "semaphore",
            RecipeKind::KvSemaphore => "kv-semaphore",
            RecipeKind::LeaderLatch => "leader-latch",
            RecipeKind::LeaderElection => "leader-election",
            RecipeKind::SharedCount => "shared-count",
            RecipeKind::None => "none",
        }
    }
}

impl fmt::Display for RecipeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a participant holds (the lock, a lease, leadership) or waits.
///
/// ```
/// assert_eq!(dlock::Role::Holder.as_str(), "holder");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// It holds now.
    Holder,
    /// It waits in the queue.
    Waiter,
}

impl Role {
    /// `"holder"` or `"waiter"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Holder => "holder",
            Role::Waiter => "waiter",
        }
    }
}

/// Which half of a read-write lock a participant is queued for.
///
/// ```
/// assert_eq!(dlock::Access::Write.as_str(), "write");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// The read lock (`__READ__` nodes).
    Read,
    /// The write lock (`__WRIT__` nodes).
    Write,
}

impl Access {
    /// `"read"` or `"write"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
        }
    }
}

/// A participant written by another client library than dlock and Curator
/// (whose nodes are the same as ours, so they are not foreign).
///
/// ```
/// assert_eq!(dlock::Foreign::EtcdGo.as_str(), "etcd-go");
/// assert_eq!(dlock::Foreign::Kazoo.as_str(), "kazoo");
/// assert_eq!(dlock::Foreign::Consul.as_str(), "consul");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Foreign {
    /// etcd's Go `concurrency` package (`etcdctl lock`, `etcdctl elect`):
    /// a key `<prefix>/<lease id in hex>`.
    EtcdGo,
    /// kazoo (Python) `Lock`, `ReadLock`, `WriteLock`, `Election`: a node
    /// `<uuid hex>__lock__<seq>` or `<uuid hex>__rlock__<seq>` — also
    /// dlock's own in [`Layout::Kazoo`](crate::Layout::Kazoo), which writes
    /// the same nodes.
    Kazoo,
    /// Consul's own clients (`consul lock`, `consul lock -n N`, the Go
    /// `api.Lock` and `api.Semaphore`): a key of Consul's lock or
    /// semaphore layout held by a session dlock did not open — told apart
    /// by the session's name, since dlock in
    /// [`Layout::Consul`](crate::Layout::Consul) writes the same keys.
    Consul,
}

impl Foreign {
    /// The client's short name, as `dlock inspect` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            Foreign::EtcdGo => "etcd-go",
            Foreign::Kazoo => "kazoo",
            Foreign::Consul => "consul",
        }
    }
}

/// One participant, as [`inspect`](crate::inspect) found it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// let session = dlock::connect("embedded").await?;
/// let rw = dlock::ReadWriteLock::new(&session, "/doc/contender")?;
/// let read = rw.read().await?;
/// let seen = dlock::inspect(&session, "/doc/contender").await?;
/// let me = &seen.participants[0];
/// assert_eq!((me.role, me.access, me.foreign), (dlock::Role::Holder, Some(dlock::Access::Read), None));
/// assert_eq!((me.session, me.node.as_str()), (session.session_id(), read.node()));
/// # read.release().await?; Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Contender {
    /// Holder or waiter.
    pub role: Role,
    /// The node's fencing token (its creation; for a KV semaphore entry, the
    /// entry's creation, not the record write that admitted it).
    pub token: FencingToken,
    /// The session (etcd: lease) that owns the node.
    pub session: SessionId,
    /// The node (full path).
    pub node: String,
    /// The node's data (Curator: the host address or a participant id).
    pub data: Vec<u8>,
    /// The read-write lock half it is queued for; `None` for other recipes.
    pub access: Option<Access>,
    /// Which foreign client wrote it; `None` for dlock's and Curator's nodes.
    pub foreign: Option<Foreign>,
}

/// What [`inspect`](crate::inspect) found at a path.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Inspection {
    /// The path inspected.
    pub path: String,
    /// The recipe recognised there.
    pub recipe: RecipeKind,
    /// Every participant in the order the recipe serves them, holders
    /// first.
    pub participants: Vec<Contender>,
    /// A shared count's value ([`RecipeKind::SharedCount`] only).
    pub count: Option<i32>,
    /// A KV semaphore's limit, as its holders' record states it
    /// ([`RecipeKind::KvSemaphore`] with a record only): its free slots are
    /// this less its holders (CURATOR-230). A Curator-layout semaphore
    /// stores no limit (each client states its own).
    pub limit: Option<u32>,
}
