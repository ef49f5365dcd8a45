//! The store contract: the one interface every recipe is written against.
//!
//! A [`Store`] is one client session of a coordination store with ZooKeeper's
//! data model: a tree of nodes with data, versions and modes, one-shot
//! watches, sessions whose ephemeral nodes vanish with them, and atomic
//! multi-operations. Four backends implement it: [`embedded`] (in-process,
//! with fault injection), `zookeeper`, `etcd` (feature `etcd`) and `consul`
//! (feature `consul`).
//!
//! Recipes never name a backend: they use [`Session`](crate::Session), the
//! cheap handle around an `Arc<dyn Store>`, which adds what is the same for
//! every backend (path checks, protected creates, guaranteed deletes,
//! retries, waiting for session states).
//!
//! What the contract promises, and the conformance suite pins:
//! - **Sessions** report `Connected → Suspended → Reconnected | Lost` (plus
//!   `Closed`) through [`Store::status`]; after `Lost` the next operation
//!   runs in a *new* session, so everything the old one held is gone.
//! - **Fencing tokens**: [`Stat::czxid`] of a created node only ever grows for
//!   later creations anywhere in the store (ZooKeeper's czxid, etcd's create
//!   revision).
//! - **Watches** are one-shot and also fire on any session state change, so a
//!   waiter never sleeps through a suspension or an expiry.
//! - **Ordering** of sequential children follows [`sort_sequenced`].
//! - **Tags** ([`CreateOptions::with_tag`]): a 64-bit mark a node is
//!   created with, for the store's own tools to recognise it by (Consul:
//!   the key's `Flags`, which `api.Lock` and `api.Semaphore` check).
//!   Backends without such a field (embedded, ZooKeeper, etcd) drop it. A
//!   tagged node's data version still serves compare-and-set, and a set
//!   changes it: where the store keeps its own version, 0 at creation and
//!   +1 per set; on Consul (where `Flags` hold the tag instead of the
//!   version) the key's `ModifyIndex` modulo 2^31, which a key made again
//!   in its place never repeats (so a compare-and-set read from the old key
//!   cannot land on the new one). Tags are at least [`TAG_MIN`], so that
//!   no backend can mistake one for a version.
//! - **Native session ids** ([`Store::native_session_id`]): the session's
//!   identity as the store's own tools write it (Consul: the session
//!   UUID), for layouts shared with them. Path-safe, and paired with the
//!   [`SessionId`] ephemeral nodes of that session report as their owner.

#[cfg(feature = "consul")]
pub mod consul;
pub(crate) mod create;
pub mod embedded;
#[cfg(feature = "etcd")]
pub mod etcd;
// The renewal loop of the etcd and Consul sessions.
#[cfg(any(feature = "etcd", feature = "consul"))]
mod keepalive;
// The nodes a session of etcd or Consul holds.
#[cfg(any(feature = "etcd", feature = "consul"))]
mod owned;
/// How many digits a sequence suffix has (as ZooKeeper's `%010d`).
///
/// ```
/// assert_eq!(dlock::store::SEQUENCE_DIGITS, 10);
/// ```
pub const SEQUENCE_DIGITS: usize = 10;

/// The trailing [`SEQUENCE_DIGITS`] digits of a node name, if it ends with
/// at least that many (the shape of every backend's sequence suffixes).
///
/// ```
/// use dlock::store::sequence_suffix;
/// assert_eq!(sequence_suffix("_c_x-lock-0000000042"), Some("0000000042"));
/// assert_eq!(sequence_suffix("lock-42"), None);
/// ```
pub fn sequence_suffix(name: &str) -> Option<&str> {
    let digits = name.bytes().rev().take_while(u8::is_ascii_digit).count();
    (digits >= SEQUENCE_DIGITS).then(|| &name[name.len() - SEQUENCE_DIGITS..])
}

// Used by the etcd backend (namespaces); ZooKeeper chroots are native.
#[cfg(any(feature = "etcd", test))]
mod namespace;
pub(crate) mod status;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{oneshot, watch};

use self::create::CreateRequest;
use self::status::SessionMachine;
use crate::error::{Found, Result};

/// A session's identity, as the store numbers it (ZooKeeper session id, etcd
/// lease id). Zero means "no session".
pub type SessionId = i64;

/// How long a node lives and whether the store appends a sequence number.
///
/// ```
/// use dlock::store::CreateMode;
/// assert!(CreateMode::EphemeralSequential.is_ephemeral());
/// assert!(CreateMode::EphemeralSequential.is_sequential());
/// assert!(!CreateMode::Container.is_sequential());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CreateMode {
    /// Lives until deleted.
    Persistent,
    /// Deleted when the creating session ends.
    Ephemeral,
    /// Persistent, with a 10-digit sequence appended to the name.
    PersistentSequential,
    /// Ephemeral, with a 10-digit sequence appended to the name.
    EphemeralSequential,
    /// Persistent, but removed by the store once it had children and has
    /// none left (ZooKeeper 3.5+ containers; embedded). On etcd and Consul
    /// a container made explicitly is a persistent key that stays: there,
    /// only the parents a create makes implicitly (see
    /// [`CreateOptions::with_parents`]) vanish with their last child, as
    /// directories in a key space do.
    Container,
}

impl CreateMode {
    /// Whether the node dies with its session.
    pub fn is_ephemeral(self) -> bool {
        matches!(
            self,
            CreateMode::Ephemeral | CreateMode::EphemeralSequential
        )
    }

    /// Whether the store appends a sequence number to the name.
    pub fn is_sequential(self) -> bool {
        matches!(
            self,
            CreateMode::PersistentSequential | CreateMode::EphemeralSequential
        )
    }
}

/// The smallest valid tag ([`CreateOptions::with_tag`]): 2^32, above every
/// data version, so that a store keeping versions and tags in one field
/// (Consul's `Flags`) tells them apart.
pub const TAG_MIN: u64 = 1 << 32;

/// Options of a create.
///
/// ```
/// use dlock::store::{CreateMode, CreateOptions};
/// let opts = CreateOptions::new(CreateMode::EphemeralSequential).with_parents();
/// assert!(opts.create_parents);
/// let tagged = CreateOptions::new(CreateMode::Ephemeral).with_tag(0x2ddccbc058a50c18);
/// assert_eq!(tagged.tag, Some(0x2ddccbc058a50c18));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateOptions {
    /// The node's mode.
    pub mode: CreateMode,
    /// Create missing ancestors, as empty [`CreateMode::Container`] nodes
    /// (Curator's `creatingParentContainersIfNeeded`).
    pub create_parents: bool,
    /// A mark for the store's own tools (see the [module docs](self)):
    /// Consul's `Flags`; dropped by backends without such a field. At
    /// least [`TAG_MIN`].
    pub tag: Option<u64>,
}

impl CreateOptions {
    /// Options with the given mode and no parent creation.
    pub fn new(mode: CreateMode) -> Self {
        CreateOptions {
            mode,
            create_parents: false,
            tag: None,
        }
    }

    /// Tags the node (Consul: the key's `Flags`); a create with a tag below
    /// [`TAG_MIN`] fails with [`Error::InvalidArgument`](crate::Error::InvalidArgument).
    pub fn with_tag(mut self, tag: u64) -> Self {
        self.tag = Some(tag);
        self
    }

    /// Also create missing ancestors as containers.
    pub fn with_parents(mut self) -> Self {
        self.create_parents = true;
        self
    }
}

/// A fencing token: a number that only ever grows for later exclusive
/// holds of one lock (a store-wide transaction id: ZooKeeper's `czxid`,
/// etcd's create revision). Pass it to the resource you protect and let it
/// reject writes that carry a smaller token than one it has seen. (A read
/// hold made by downgrading a write hold keeps the write hold's token.)
///
/// ```
/// use dlock::FencingToken;
/// assert!(FencingToken(7) < FencingToken(9));
/// assert_eq!(FencingToken(9).to_string(), "9");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct FencingToken(pub i64);

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A node's metadata, in ZooKeeper's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stat {
    /// Transaction id (etcd: revision) that created the node: the fencing
    /// token of a lock node.
    pub czxid: i64,
    /// Transaction id (etcd: revision) of the last data change.
    pub mzxid: i64,
    /// Data version: 0 at creation, +1 on every set.
    pub version: i32,
    /// Number of child creations and deletions so far.
    pub cversion: i32,
    /// Owning session of an ephemeral node, 0 otherwise.
    pub ephemeral_owner: SessionId,
    /// Number of children.
    pub num_children: i32,
    /// Length of the data in bytes.
    pub data_length: i32,
}

impl Stat {
    /// The node's fencing token (its creation transaction id).
    pub fn token(&self) -> FencingToken {
        FencingToken(self.czxid)
    }
}

/// The result of a create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    /// The full path of the new node (with the sequence, if sequential).
    pub path: String,
    /// Its metadata.
    pub stat: Stat,
}

impl Created {
    /// The node's last path segment.
    pub fn name(&self) -> &str {
        crate::path::node_name(&self.path)
    }

    /// The node's fencing token.
    pub fn token(&self) -> FencingToken {
        self.stat.token()
    }
}

/// One child of a node, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Child {
    /// The child's name (last path segment).
    pub name: String,
    /// The store's native creation order, for backends that have one (etcd:
    /// create revision). `None` for ZooKeeper-style stores, where the order
    /// comes from the sequence suffix in the name.
    ///
    /// Either way, a node created without a sequence but named with the
    /// sequence suffix of a sequential sibling from the same session sorts
    /// at that sibling's place, for as long as it lives (the read-write
    /// lock's downgrade needs it): ZooKeeper-style stores get this from the
    /// name, etcd keeps the sibling's revision for it (see `store::etcd`).
    pub created: Option<i64>,
    /// The child's [`Stat::czxid`] as listed, for backends whose listing
    /// tells it (etcd). Names can be used again — on etcd the wait queue
    /// reuses them on purpose — and a node created again under a listed
    /// name has another czxid: so a waiter can tell that the node it means
    /// to wait for is gone, even if its name is back.
    pub czxid: Option<i64>,
    /// The session holding the child now, as the listing tells it, for
    /// backends where a node can outlive its session: on Consul a session
    /// that ends with behavior `release` (as `consul lock`'s do) leaves its
    /// keys, held by nobody (`Some(0)`). `None` where the listing does not
    /// tell: where an ephemeral node goes with its session (ZooKeeper,
    /// etcd, embedded), and for an implicit directory (no key of its own).
    pub owner: Option<SessionId>,
}

impl Child {
    /// A child known only by name (ZooKeeper-style stores).
    pub fn named(name: impl Into<String>) -> Self {
        Child {
            name: name.into(),
            created: None,
            czxid: None,
            owner: None,
        }
    }
}

/// A digest of a children listing, for backends that keep listings (etcd,
/// Consul): equal digests, same children — a child deleted and created
/// again under its name counts as a change, by its [`Child::czxid`], and
/// so does a child whose [`Child::owner`] changed (on Consul, a holder's
/// session that ended: who waits on a semaphore's entries must wake).
#[cfg_attr(not(any(feature = "etcd", feature = "consul")), allow(dead_code))]
pub(crate) fn listing_digest(children: &[Child]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut names: Vec<(&str, Option<i64>, Option<SessionId>)> = children
        .iter()
        .map(|c| (c.name.as_str(), c.czxid, c.owner))
        .collect();
    names.sort_unstable();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    names.hash(&mut hasher);
    hasher.finish()
}

/// Sorts sequenced children the way every participant of a recipe must, or
/// exclusion breaks:
/// - when the store gives a native creation order ([`Child::created`]), by
///   that order, ties broken by name;
/// - otherwise as Curator 5.4 does: by the part of the name after the *last*
///   occurrence of a lock name (the first of `lock_names` found, applied in
///   turn: the read-write lock strips `__READ__` then `__WRIT__`), compared as
///   strings; a name without any lock name is compared whole;
/// - where only some tell their creation, those that do not come first.
///
/// ```
/// use dlock::store::{sort_sequenced, Child};
/// let mut kids = vec![
///     Child::named("_c_b-lock-0000000002"),
///     Child::named("_c_a-lock-0000000010"),
///     Child::named("_c_c-lock-0000000001"),
/// ];
/// sort_sequenced(&mut kids, &["lock-"]);
/// let names: Vec<_> = kids.iter().map(|c| c.name.as_str()).collect();
/// assert_eq!(names, ["_c_c-lock-0000000001", "_c_b-lock-0000000002", "_c_a-lock-0000000010"]);
/// ```
pub fn sort_sequenced(children: &mut [Child], lock_names: &[&str]) {
    // A stable sort keeps listing order for equal keys, as Java's
    // Collections.sort does.
    // A total order even where only some children tell their creation
    // (sorting panics on one that is not): those that do not come first.
    children.sort_by(|a, b| match (a.created, b.created) {
        (Some(x), Some(y)) => x.cmp(&y).then_with(|| a.name.cmp(&b.name)),
        (None, None) => sequence_key(&a.name, lock_names).cmp(sequence_key(&b.name, lock_names)),
        (None, Some(_)) => std::cmp::Ordering::Less,
        (Some(_), None) => std::cmp::Ordering::Greater,
    });
}

/// The part of `name` Curator sorts by: what follows the last occurrence of
/// each lock name in turn (Curator's `standardFixForSorting`).
pub fn sequence_key<'a>(name: &'a str, lock_names: &[&str]) -> &'a str {
    let mut key = name;
    for lock_name in lock_names {
        if let Some(i) = key.rfind(lock_name) {
            key = &key[i + lock_name.len()..];
        }
    }
    key
}

/// A session's connection state, as Curator reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionState {
    /// The first successful connection.
    Connected,
    /// The connection is down; the session may still be alive on the
    /// server. Locks and leadership cannot be trusted until `Reconnected`.
    Suspended,
    /// Connected again after `Suspended` (same session) or after `Lost`
    /// (a new session: everything held before is gone).
    Reconnected,
    /// The session expired, or was suspended longer than its timeout: every
    /// ephemeral node it held is (or must be assumed) gone.
    Lost,
    /// Closed by its owner; no further operations are possible.
    Closed,
}

impl SessionState {
    /// Whether operations can be served now.
    pub fn is_connected(self) -> bool {
        matches!(self, SessionState::Connected | SessionState::Reconnected)
    }
}

/// A snapshot of a client's session: its state and which session it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionStatus {
    /// The connection state.
    pub state: SessionState,
    /// The session currently (or last) in use.
    pub session_id: SessionId,
    /// Counts state changes, so that observers can tell two snapshots apart
    /// even when a transition was too quick to see.
    pub changes: u64,
}

/// What woke a one-shot [`Watch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEvent {
    /// The watched node was created.
    NodeCreated,
    /// The watched node was deleted.
    NodeDeleted,
    /// The watched node's data changed.
    DataChanged,
    /// A child of the watched node was created or deleted.
    ChildrenChanged,
    /// The session changed state; the watch may or may not still be armed on
    /// the server, so the watcher must look again.
    Session(SessionState),
}

/// A one-shot watch armed by a read. It resolves on the first node event or
/// on any session state change, whichever comes first; dropping it is
/// always fine.
#[must_use = "a watch does nothing unless awaited"]
pub struct Watch {
    node: oneshot::Receiver<WatchEvent>,
    session: watch::Receiver<SessionStatus>,
    /// The sender of a node event that never comes, kept so that `node`
    /// stays open ([`session_only`](Self::session_only)).
    _never: Option<oneshot::Sender<WatchEvent>>,
}

impl Watch {
    /// Arms a watch from a backend's node-event receiver and the session's
    /// status channel (whose current value counts as already seen).
    pub fn new(
        node: oneshot::Receiver<WatchEvent>,
        mut session: watch::Receiver<SessionStatus>,
    ) -> Self {
        session.borrow_and_update();
        Watch::since_read(node, session)
    }

    /// [`new`](Self::new), with the status channel as subscribed before the
    /// read that armed the watch: a change while the read was in flight
    /// (an etcd read succeeds after its lease is lost) counts.
    pub fn since_read(
        node: oneshot::Receiver<WatchEvent>,
        session: watch::Receiver<SessionStatus>,
    ) -> Self {
        Watch {
            node,
            session,
            _never: None,
        }
    }

    /// A watch no node event ever fires, only a session's change: the
    /// root's on a store where the root has no key of its own (etcd,
    /// Consul), which has no data to change and is never deleted.
    pub fn session_only(session: watch::Receiver<SessionStatus>) -> Self {
        let (never, node) = oneshot::channel();
        Watch {
            _never: Some(never),
            ..Watch::since_read(node, session)
        }
    }

    /// Waits for the event.
    pub async fn changed(mut self) -> WatchEvent {
        tokio::select! {
            biased;
            event = &mut self.node => match event {
                Ok(event) => event,
                // The store dropped the watch: its session is over.
                Err(_) => WatchEvent::Session(self.session.borrow().state),
            },
            changed = self.session.changed() => match changed {
                Ok(()) => WatchEvent::Session(self.session.borrow().state),
                Err(_) => WatchEvent::Session(SessionState::Closed),
            },
        }
    }
}

impl fmt::Debug for Watch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watch").finish_non_exhaustive()
    }
}

/// One operation of an atomic [`Store::multi`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Require the node to exist (with this data version, if given).
    Check {
        /// The node.
        path: String,
        /// The required version, or any.
        version: Option<i32>,
    },
    /// Create a node.
    Create {
        /// The node (prefix, if sequential).
        path: String,
        /// Its data.
        data: Vec<u8>,
        /// Its mode (parents are never created inside a multi).
        mode: CreateMode,
    },
    /// Replace a node's data.
    SetData {
        /// The node.
        path: String,
        /// The new data.
        data: Vec<u8>,
        /// The required version, or any.
        version: Option<i32>,
    },
    /// Delete a node.
    Delete {
        /// The node.
        path: String,
        /// The required version, or any.
        version: Option<i32>,
    },
}

impl Op {
    /// The node the operation acts on (for errors that name it).
    ///
    /// ```
    /// use dlock::store::Op;
    /// assert_eq!(Op::Delete { path: "/a".into(), version: None }.path(), "/a");
    /// ```
    pub fn path(&self) -> &str {
        match self {
            Op::Check { path, .. }
            | Op::Create { path, .. }
            | Op::SetData { path, .. }
            | Op::Delete { path, .. } => path,
        }
    }
}

/// The result of one [`Op`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult {
    /// The check passed.
    Checked,
    /// The node was created.
    Created(Created),
    /// The data was set.
    Set(Stat),
    /// The node was deleted.
    Deleted,
}

/// Which kind of store a session talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// The in-process store.
    Embedded,
    /// Apache ZooKeeper.
    ZooKeeper,
    /// etcd v3.
    Etcd,
    /// HashiCorp Consul (its KV store and sessions).
    Consul,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Embedded => "embedded",
            BackendKind::ZooKeeper => "zookeeper",
            BackendKind::Etcd => "etcd",
            BackendKind::Consul => "consul",
        })
    }
}

/// One client session of a coordination store. See the [module
/// docs](self) for what every implementation must guarantee.
///
/// Paths given to these methods are already valid (the
/// [`Session`](crate::Session) wrapper checks them).
///
/// dlock's backends are its only implementations: each runs its session on
/// the crate's one session-status machine, which the provided methods
/// reach (status, session timeout, the faults every create goes through),
/// so the trait cannot be implemented outside the crate.
#[async_trait]
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// Which kind of store this is.
    fn backend(&self) -> BackendKind;

    /// Whether a directory is only the nodes below it (etcd, Consul): made
    /// by `create_parents` it writes nothing and goes with its last child,
    /// and one made on purpose is a key that stays. Elsewhere (ZooKeeper,
    /// embedded) a directory is a node: a container, reaped once empty,
    /// or a persistent node, kept.
    fn has_implicit_parents(&self) -> bool {
        false
    }

    /// The backend's session-status machine (`store::status`), whatever it
    /// keeps per session.
    #[doc(hidden)]
    fn machine(&self) -> &dyn SessionMachine;

    /// The session's status channel: the current snapshot, and every change.
    fn status(&self) -> watch::Receiver<SessionStatus> {
        self.machine().subscribe()
    }

    /// The session timeout the server granted.
    fn session_timeout(&self) -> Duration {
        self.machine().session_timeout()
    }

    /// The current session as the store's own tools name it (Consul: its
    /// UUID; elsewhere its id in 16 hex digits), with the [`SessionId`]
    /// its ephemeral nodes report as their owner. Path-safe (no `/`).
    fn native_session_id(&self) -> (SessionId, String) {
        let id = self.status().borrow().session_id;
        (id, format!("{:016x}", id as u64))
    }

    /// Creates a node. A sequential node's path is `path` followed by the
    /// 10-digit sequence (ZooKeeper: the parent's cversion). An ephemeral
    /// node whose name is still under a lock delay (Consul: the key's
    /// earlier holder's session was invalidated and had one) fails with
    /// [`Error::LockDelay`](crate::Error::LockDelay); stores without lock
    /// delays never return it.
    async fn create(&self, path: &str, data: &[u8], opts: CreateOptions) -> Result<Created> {
        Ok(create::run(self, CreateRequest::new(path, data, opts))
            .await?
            .0)
    }

    /// Creates a node and then lists the children of `list`, as one round
    /// trip where the backend can (ZooKeeper: pipelined; etcd, Consul: one
    /// transaction). The listing reflects the create.
    async fn create_and_list(
        &self,
        path: &str,
        data: &[u8],
        opts: CreateOptions,
        list: &str,
    ) -> Result<(Created, Vec<Child>)> {
        let request = CreateRequest::new(path, data, opts).listing(Some(list));
        let (created, children) = create::run(self, request).await?;
        Ok((created, children.unwrap_or_default()))
    }

    /// The backend's one create, [`create`](Self::create) and
    /// [`create_and_list`](Self::create_and_list) alike: creates
    /// `request.path` and lists `request.list` (`Some` listing exactly
    /// then), with the contract of both. Faults on the reply are injected
    /// after it, once for every backend (`store::create::run`, which the
    /// session calls directly: `create` and `create_and_list` are not
    /// overridden).
    #[doc(hidden)]
    async fn create_in(&self, request: CreateRequest<'_>) -> Result<(Created, Option<Vec<Child>>)>;

    /// Takes note of the reply to `request` (the fence of an ephemeral
    /// node), once it arrived: after the lost-reply fault it is not called,
    /// so the store is left as a real lost reply leaves it — until the
    /// session finds the node and takes it as ours, as if from that reply
    /// (`Session::adopt`, and a protected create's retry). Nothing for
    /// backends that learn nothing from a reply.
    #[doc(hidden)]
    fn learn_created(&self, _request: &CreateRequest<'_>, _created: &Created) {}

    /// Deletes a node, if its version matches.
    async fn delete(&self, path: &str, version: Option<i32>) -> Result<()>;

    /// Replaces a node's data, if its version matches.
    async fn set_data(&self, path: &str, data: &[u8], version: Option<i32>) -> Result<Stat>;

    /// Reads a node's data; with `watch`, arms a watch for its deletion or
    /// data change (only if the node exists).
    async fn get_data(&self, path: &str, watch: bool) -> Result<(Vec<u8>, Stat, Option<Watch>)>;

    /// Reads a node's metadata if it exists; with `watch`, arms a watch for
    /// its creation, deletion or data change.
    async fn exists(&self, path: &str, watch: bool) -> Result<(Option<Stat>, Option<Watch>)>;

    /// Lists a node's children (in no particular order); with `watch`, arms a
    /// watch for a child creation or deletion, or the node's deletion.
    async fn children(&self, path: &str, watch: bool) -> Result<(Vec<Child>, Option<Watch>)>;

    /// Lists a node's children, unwatched: those created up to the
    /// transaction `since` (a zxid, an etcd revision: a node's
    /// [`Stat::czxid`]) as they were at some moment no earlier than
    /// `since` — not necessarily now, and normally no earlier than the
    /// last event a [`watch_child`](Self::watch_child) watch on one of
    /// them delivered. Children created after `since` may be missing —
    /// also one that takes the place of a child created earlier
    /// ([`Child::created`]): a queue whose nodes can do that, or whose
    /// waiters count the nodes behind them, lists instead.
    /// A backend that keeps what its watches deliver may answer without a
    /// round trip; the others list.
    ///
    /// Enough for a wait queue: a node created up to `since` that is
    /// missing is gone for good; nodes created later queue behind the
    /// waiter anyway; and a node still listed after its deletion is
    /// watched again, which fires once the deletion reaches the watch.
    async fn children_seen(&self, path: &str, since: i64) -> Result<Vec<Child>> {
        let _ = since;
        Ok(self.children(path, false).await?.0)
    }

    /// Watches `child` of `dir`, as a listing showed it, for its deletion
    /// (a data change may fire it too). `None` if it is gone already — or back under its
    /// name as a newer node (etcd reuses names; [`Child::czxid`] tells
    /// them apart): that one came after the listing. May answer, like
    /// [`children_seen`](Self::children_seen), from what the watches have
    /// delivered.
    async fn watch_child(&self, dir: &str, child: &Child) -> Result<Option<Watch>> {
        read_and_watch_child(self, dir, child).await
    }

    /// Who owns the node at `path`, if that is a client other than dlock:
    /// the name its session gave itself, on a backend whose sessions carry
    /// names (Consul: `consul lock` names its session
    /// `Consul lock for '<command>' at '<prefix>'`; dlock names its own
    /// `dlock`). `None` for
    /// a node no session owns, a node of dlock's, or a backend without
    /// session names (ZooKeeper, etcd, embedded: there nodes say who wrote
    /// them, if anything does, by their names). `inspect` uses it to name
    /// the holders of Consul's own layouts that dlock did not write.
    async fn foreign_owner(&self, path: &str) -> Result<Option<String>> {
        let _ = path;
        Ok(None)
    }

    /// The [tag](CreateOptions::with_tag) of the node at `path`, where the
    /// store keeps tags (Consul: the key's `Flags`, when they hold a tag
    /// rather than a version); `None` for an untagged node, and on the
    /// backends that drop tags. [`Error::NoNode`](crate::Error::NoNode) if there is no node.
    async fn tag(&self, path: &str) -> Result<Option<u64>> {
        self.get_data(path, false).await.map(|_| None)
    }

    /// Whether this session's [`delete`](Self::delete) of `path` without a
    /// version removes only the node created at `czxid`, so that a holder
    /// deletes its own node in one round trip: `Some(true)` where the store
    /// remembers the nodes its session made and fences their deletes by
    /// the session (etcd, Consul), `Some(false)` where it knows its
    /// session's node at `path` is a later one, `None` where it cannot tell
    /// (ZooKeeper, embedded, a node of an earlier session): then read the
    /// node's creation first.
    fn deletes_only_created(&self, path: &str, czxid: i64) -> Option<bool> {
        let _ = (path, czxid);
        None
    }

    /// Applies all operations atomically, or none; the error names the first
    /// failing operation ([`Error::MultiFailed`](crate::Error::MultiFailed)).
    /// Each result describes the node as its operation left it; ZooKeeper's
    /// tells no created node's stat (czxid -1). A node deleted and made
    /// again in one multi keeps the deleted node's czxid on etcd (the key's
    /// create revision survives a delete and put in one transaction), so
    /// such a create is no new fence there.
    async fn multi(&self, ops: &[Op]) -> Result<Vec<OpResult>>;

    /// Test and chaos hooks, for backends that can inject faults.
    fn faults(&self) -> Option<&dyn Faults> {
        None
    }

    /// Ends the session: its ephemeral nodes are deleted and later
    /// operations fail with [`Error::Closed`](crate::Error::Closed).
    async fn close(&self);
}

/// The direct children of a node, from the keys below it of a key-value
/// store (etcd, Consul). Every key below the node starts with `prefix`; a
/// key right below is a child, a deeper one makes an implicit child
/// directory — unless it is the child's position marker,
/// `<child><marker><index>` — and one that starts with the byte `hidden`
/// is no node. Each key comes with its create index and holder. A child's
/// `created` is its marker's index if it has one, else its own key's, or
/// for an implicit directory the smallest below it; `czxid` and `owner`
/// are its own key's.
#[cfg_attr(not(any(feature = "etcd", feature = "consul")), allow(dead_code))]
pub(crate) fn children_from_keys<'k>(
    prefix: &[u8],
    marker: &[u8],
    hidden: u8,
    keys: impl IntoIterator<Item = (&'k [u8], i64, Option<SessionId>)>,
) -> Vec<Child> {
    #[derive(Default)]
    struct Found {
        key: Option<i64>,
        owner: Option<SessionId>,
        marker: Option<i64>,
        deepest: Option<i64>,
    }
    let mut found: std::collections::BTreeMap<&[u8], Found> = Default::default();
    for (key, created, owner) in keys {
        let Some(rest) = key.strip_prefix(prefix) else {
            continue;
        };
        if rest.first().is_none_or(|&b| b == hidden) {
            continue;
        }
        match rest.iter().position(|&b| b == b'/') {
            None => {
                let f = found.entry(rest).or_default();
                (f.key, f.owner) = (Some(created), owner);
            }
            Some(i) => {
                let (name, deeper) = rest.split_at(i);
                let f = found.entry(name).or_default();
                match deeper.strip_prefix(marker) {
                    Some(at) => {
                        f.marker = std::str::from_utf8(at).ok().and_then(|at| at.parse().ok())
                    }
                    None => f.deepest = Some(f.deepest.map_or(created, |d| d.min(created))),
                }
            }
        }
    }
    found
        .into_iter()
        .filter_map(|(name, f)| {
            let created = match f.key {
                Some(own) => f.marker.unwrap_or(own),
                None => f.deepest?,
            };
            Some(Child {
                name: String::from_utf8_lossy(name).into_owned(),
                created: Some(created),
                czxid: f.key,
                owner: f.owner,
            })
        })
        .collect()
}

/// [`Store::watch_child`] by a read that arms a data watch.
pub(crate) async fn read_and_watch_child<S: Store + ?Sized>(
    store: &S,
    dir: &str,
    child: &Child,
) -> Result<Option<Watch>> {
    let node = crate::path::join(dir, &child.name);
    let read = store.get_data(&node, true).await.found()?;
    Ok(read
        .filter(|(_, stat, _)| child.czxid.is_none_or(|listed| listed == stat.czxid))
        .map(|(_, _, watch)| watch.expect("the store armed the requested watch")))
}

/// The lost-reply faults a store arms ([`Faults::lose_next_create_reply`],
/// [`Faults::lose_next_delete_reply`]): each is taken by the next operation
/// of its kind that succeeds.
#[derive(Debug, Default)]
pub(crate) struct LostReplies {
    pub create: ArmedFault,
    pub delete: ArmedFault,
    /// How many reads are still to fail ([`Faults::fail_next_reads`]).
    pub reads: std::sync::atomic::AtomicU32,
    /// How many `set_data`s are still to fail ([`Faults::fail_next_sets`]).
    pub sets: std::sync::atomic::AtomicU32,
    /// How many deletes are still to fail ([`Faults::fail_next_deletes`]).
    pub deletes: std::sync::atomic::AtomicU32,
    /// How many creates are still to fail ([`Faults::fail_next_creates`]).
    pub creates: std::sync::atomic::AtomicU32,
}

impl LostReplies {
    /// `ConnectionLoss` if a read is still to fail (one fewer then).
    pub fn failing_read(&self) -> Result<()> {
        Self::failing(&self.reads)
    }

    /// `ConnectionLoss` if a `set_data` is still to fail (one fewer then).
    pub fn failing_set(&self) -> Result<()> {
        Self::failing(&self.sets)
    }

    /// `ConnectionLoss` if a delete is still to fail (one fewer then).
    pub fn failing_delete(&self) -> Result<()> {
        Self::failing(&self.deletes)
    }

    /// `ConnectionLoss` if a create is still to fail (one fewer then).
    pub fn failing_create(&self) -> Result<()> {
        Self::failing(&self.creates)
    }

    /// [`Faults::fail_next_creates`].
    pub fn fail_creates(&self, n: u32) {
        self.creates.store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// [`Faults::fail_next_deletes`].
    pub fn fail_deletes(&self, n: u32) {
        self.deletes.store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// [`Faults::fail_next_reads`].
    pub fn fail_reads(&self, n: u32) {
        self.reads.store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// [`Faults::fail_next_sets`].
    pub fn fail_sets(&self, n: u32) {
        self.sets.store(n, std::sync::atomic::Ordering::SeqCst);
    }

    fn failing(left: &std::sync::atomic::AtomicU32) -> Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        let take = |n: u32| n.checked_sub(1);
        match left.fetch_update(SeqCst, SeqCst, take) {
            Ok(_) => Err(crate::Error::ConnectionLoss),
            Err(_) => Ok(()),
        }
    }
}

/// A one-shot fault: armed once, taken once.
#[derive(Debug, Default)]
pub(crate) struct ArmedFault(std::sync::atomic::AtomicBool);

impl ArmedFault {
    pub fn arm(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether it was armed (and now is not).
    pub fn take(&self) -> bool {
        self.0.swap(false, std::sync::atomic::Ordering::SeqCst)
    }
}

/// Fault injection, for tests of recipes and of users' own code.
#[async_trait]
pub trait Faults: Send + Sync {
    /// Drops the connection for `duration`: the session reports `Suspended`
    /// at once, then `Reconnected` — or `Lost` if `duration` reaches the
    /// session timeout, because the server expires the session meanwhile.
    /// Operations issued meanwhile wait for the connection.
    fn suspend(&self, duration: Duration);

    /// Expires the session now, as the server would after a long silence:
    /// its ephemeral nodes vanish and it reports `Lost`.
    async fn expire(&self) -> Result<()>;

    /// Ends the session on the server without telling this client, as an
    /// operator's `etcdctl lease revoke` or `consul session destroy` does,
    /// or Consul when a health check of the session's node fails: its
    /// ephemeral nodes vanish, and the client learns of it only from the
    /// next request or renewal the server refuses (that request fails with
    /// [`Error::SessionExpired`](crate::Error::SessionExpired); the session
    /// reports `Lost` and is renewed). On ZooKeeper the server closes the
    /// session's connection, so the client learns at once: this is
    /// [`expire`](Self::expire) there.
    async fn end_on_server(&self) -> Result<()>;

    /// The next create is applied by the server, but its reply is lost: the
    /// caller gets [`Error::ConnectionLoss`](crate::Error::ConnectionLoss)
    /// and the connection blips (`Suspended`, then `Reconnected`).
    fn lose_next_create_reply(&self);

    /// The next delete is applied by the server, but its reply is lost: the
    /// caller gets [`Error::ConnectionLoss`](crate::Error::ConnectionLoss)
    /// and the connection blips (`Suspended`, then `Reconnected`), so a
    /// retry finds the node gone (`NoNode`). Recipes name every node
    /// uniquely, so such a retry can never remove a newer holder's node
    /// (etcd#22082).
    fn lose_next_delete_reply(&self);

    /// The next `n` reads (`get_data`, `exists`, `children`, of any path)
    /// fail with [`Error::ConnectionLoss`](crate::Error::ConnectionLoss)
    /// without reaching the server, while the connection stays up: as
    /// requests that time out on a live connection (an overloaded server,
    /// a lost packet). The session's retries take them as any such
    /// failure.
    fn fail_next_reads(&self, n: u32);

    /// The next `n` [`set_data`](Store::set_data)s fail with
    /// [`Error::ConnectionLoss`](crate::Error::ConnectionLoss) without
    /// reaching the server, while the connection stays up: as writes that
    /// time out on a live connection. Whoever retries them must pace and
    /// bound its retries.
    fn fail_next_sets(&self, n: u32);

    /// The next `n` [`delete`](Store::delete)s fail with
    /// [`Error::ConnectionLoss`](crate::Error::ConnectionLoss) without
    /// reaching the server, while the connection stays up: as deletes that
    /// time out on a live connection. A guaranteed delete goes on in the
    /// background.
    fn fail_next_deletes(&self, n: u32);

    /// The next `n` creates fail with
    /// [`Error::ConnectionLoss`](crate::Error::ConnectionLoss) without
    /// reaching the server, while the connection stays up: as creates that
    /// time out on a live connection (a cluster without a leader, an
    /// overloaded one). A timed acquire must not retry them past its
    /// deadline.
    fn fail_next_creates(&self, n: u32);
}
