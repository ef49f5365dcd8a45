//! The etcd backend: a [`Store`] on etcd v3 (3.4+), through the
//! [`etcd_client`] crate, over a gRPC channel of dlock's own for plain-text
//! members (see `channel.rs`: one HTTP/2 connection, each request's frames
//! written in one go, a frozen or cut-off member left for the next) and
//! tonic's for TLS. Built with the `etcd` feature (its build needs
//! `protoc`, which the build brings along).
//!
//! Connect with an endpoint URL, `etcd://host:port[,host:port...]`,
//! optionally with etcd credentials (`etcd://user:password@host:port`), a
//! namespace (`etcd://host:port/app`) and TLS (`etcds://...?cacert=ca.pem`):
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
//! let session = dlock::connect("etcd://127.0.0.1:2379").await?;
//! println!("lease {:#x}, TTL {:?}", session.session_id(), session.session_timeout());
//! session.close().await;
//! # Ok(()) }
//! ```
//!
//! # How the contract maps onto etcd
//!
//! - **Paths are keys**: the node `/shop/stock` is the etcd key
//!   `/shop/stock` (read and set it with `etcdctl get /shop/stock`), its
//!   data the key's value. The children of `P` are the keys below `P/` with
//!   no further `/`.
//! - **Sessions are leases.** The session timeout is rounded up to whole
//!   seconds and asked for as the lease TTL; the TTL the server granted (at
//!   least its minimum, 2 s on etcd 3.4 defaults) is the
//!   [`session_timeout`](Store::session_timeout). The session id is the
//!   lease id. Our own keep-alive loop renews it about every third of the
//!   TTL: a keep-alive that fails or is not answered within a third of the
//!   TTL makes the session `Suspended`, the next answered one
//!   `Reconnected`; a lease the server no longer has (TTL 0, "lease not
//!   found"), or no answered keep-alive for a whole TTL, makes it `Lost`.
//!   After `Lost` the next operation grants a new lease (`Reconnected`, new
//!   session id). Operations issued while `Suspended` wait for the outcome.
//!   `close` revokes the lease. **Ephemeral nodes** are keys put with the
//!   session's lease.
//! - **Parents are implicit.** etcd has no directories, and this backend
//!   writes none: a path exists if it is a key *or* if keys exist below it
//!   (an implicit directory, with empty data and zero revisions). Missing
//!   parents (the `create_parents` option) cost nothing and leave nothing
//!   behind: an implicit directory vanishes with its last descendant, i.e.
//!   it behaves like a ZooKeeper container that is reaped at once. A create
//!   *without* `create_parents` still fails with `NoNode` if its parent
//!   does not exist (checked by a read before the create), and a create
//!   below an ephemeral key fails with `NoChildrenForEphemerals` (compared
//!   in the create's transaction for every ancestor). `set_data` on an
//!   implicit directory fails with `NoNode` (there is no key to set).
//!   `num_children` counts all keys below a node, not only direct children.
//! - **Versions**: ZooKeeper's data version is etcd's `version − 1`;
//!   versioned writes compare `version` in the transaction. In the
//!   [`Stat`], `czxid` is the create revision (the fencing token: it only
//!   grows, store-wide), `mzxid` the mod revision, `ephemeral_owner` the
//!   lease; `cversion` is always 0 (etcd keeps no child counter).
//! - **Sequential nodes**: etcd has no per-directory counter. The order of
//!   a queue is the create revision: listings return every child with
//!   [`Child::created`] set, and [`sort_sequenced`](super::sort_sequenced)
//!   sorts by it (ties by name). The name still gets a 10-digit suffix, as
//!   on ZooKeeper, so names keep Curator's shape. The digits carry no
//!   order. They are unique among one client's live nodes in a directory
//!   (so the read-write lock's downgrade can name its write node by them);
//!   two clients can draw the same digits, which only matters for names
//!   without a protection prefix, and then the create's compare
//!   (`create_revision == 0`) refuses to overwrite and the create is
//!   retried with a per-client counter that starts at a random number.
//! - **Names are reused on purpose.** etcd keeps every key name ever used
//!   below a directory in its index, as a tombstone, until the next
//!   compaction (which etcd does not run by default), and every range read
//!   of the directory — each queue listing — walks them all: a lock that
//!   got a fresh key per acquisition slowed down with every acquisition
//!   (measured: about +0.2 ms per listing per thousand acquisitions). So an
//!   ephemeral sequential node's digits depend only on its path, and the
//!   session recycles protection prefixes
//!   ([`Session`](crate::Session)): a client acquiring a lock again uses
//!   the same key again. A listing tells each child's own create revision
//!   ([`Child::czxid`]), so a waiter never mistakes a newer node for the
//!   one it queued behind under the same name.
//! - **Position markers (the read-write lock downgrade, CURATOR-621).** A
//!   writer that downgrades creates its read node *while* holding its write
//!   node, named after the write node's suffix, so that it sorts at the
//!   write node's place and no writer queued behind can slip in. Ordered by
//!   create revision it would sort last. So this backend extends the
//!   contract by one rule: *a non-sequential node whose name ends with the
//!   10-digit suffix of a sequential node this client created (in the same
//!   directory, same session) takes that node's place:* its
//!   [`Child::created`] is that node's create revision, for as long as it
//!   lives, even after that node is gone. The create's transaction checks
//!   that the other node still exists (else `NoNode`, naming it) and also
//!   writes a marker key `<node>/\0pos/<revision>` with the same lease;
//!   listings read it with the children (same range, no extra request) and
//!   never show it; deletes remove it with its node. Paths cannot contain
//!   NUL, so no node can collide with a marker.
//! - **One round trip** for "create my node and list the queue"
//!   ([`Store::create_and_list`]): one transaction that compares, puts and
//!   reads the directory (keys only). A delete is one transaction too.
//! - **Watches** are one-shot and miss nothing after the read that armed
//!   them. They are not asked "from the read's revision + 1": whenever the
//!   store moved on in between (always, under contention) etcd files such
//!   a watch as *unsynced* and delivers its events only on its next
//!   catch-up pass, up to 100 ms later — the delay that caps etcd's own
//!   `concurrency.Mutex` (measured here: 8 contending clients handed a
//!   mutex over ~90 times/s that way, 200–300 times/s with synced watches).
//!   Instead a watch starts "now" (synced), and its `created` answer says
//!   from which revision; if the store moved since the read, the node is
//!   read again and the watch fires at once if what it watches differs from
//!   what the arming read saw. All watches of a client share one etcd watch
//!   stream; a broken stream is opened again and every pending watch is
//!   created again the same way (so nothing that happened meanwhile is
//!   missed, and compacted history is never needed); a watch the server
//!   cancels for compaction reads again and fires or re-arms. A children
//!   watch fires on direct child keys only (not on implicit
//!   sub-directories appearing or vanishing).
//! - **A queue's directory is watched once per client, and mirrored.**
//!   Waiters' watches on a directory's children (a queue's nodes, for
//!   their deletion) share one etcd watch on the deletions below the
//!   directory, kept a few seconds after its last waiter: a handoff sends
//!   each client with a waiter one message. Its events also keep a copy of
//!   the directory, started from any listing of it (the one a node queues
//!   with, which has every node created before it); so
//!   [`children_seen`](Store::children_seen) and
//!   [`watch_child`](Store::watch_child) — what a waiter needs after it
//!   queued and once woken — usually cost no request, and a handoff is the
//!   holder's delete alone (why that is safe: `store::etcd::mirror`; the
//!   queues where a node can join ahead of a waiter, the read-write lock's
//!   writers, list when woken).
//! - **Fenced deletes and checks (etcd#22082).** This client remembers the
//!   create revision of each ephemeral node it created in the current
//!   session. An `Op::Check` without version on one compares that
//!   revision, so a guarded write fails if our node was replaced; a delete
//!   of one without a version (one with a version names the node it read)
//!   compares the key's lease with ours, so a delete retried after
//!   a lost reply can never delete another session's newer key of the same
//!   name (it reports `NoNode`, which the guaranteed delete takes as done),
//!   while a newer key in our own lease (a create of it lost its reply)
//!   goes. One exception, for speed: a queue node (protected
//!   and sequential) is deleted with a plain delete, because a transaction
//!   costs etcd 3.4 markedly more and releases are on every lock's hot
//!   path. Its name carries our random protection UUID, so only we make it
//!   again — and we do only once our delete of it was answered; a plain
//!   delete that goes unanswered (it may still land, much later) retires
//!   the name for the life of this client, and its retries compare.
//!   A fence outlives its lease (for the next 8 leases): a check or delete
//!   of "our node" at the name of a node of an earlier lease holds for a
//!   key of that lease (the server may keep a lease the client gave up
//!   on, and the node then still goes) and — a delete — of ours; one
//!   issued in the old lease and sent in the new one fails rather than
//!   land on another session's node that took the name. The table of
//!   fences only moves forward, to the newest lease: an operation of an
//!   older one that finishes late changes nothing in it (a create's late
//!   reply is fenced as of its lease).
//! - **Waiting is safe after a lease loss (the etcd 3.4.3 Jepsen bug).**
//!   After every wake-up the wait queue looks at the directory again (the
//!   copy kept from the shared watch, current up to the event that woke
//!   it, or else a linearizable read) and fails with `NoNode` if our key is
//!   gone, before it claims anything.
//! - **Multi** is one transaction (see the module `multi`): preconditions
//!   become compares, and a failure is diagnosed from reads in the
//!   transaction's else branch, still one round trip. Operations on the
//!   same path in one multi are collapsed into its final state. At most 42
//!   operations.
//! - **A namespace** (`etcd://host:port/app`) puts every key below a
//!   path, as a ZooKeeper chroot does: the node `/shop/stock` is then the
//!   key `/app/shop/stock`. The namespace acts as the root (it always
//!   exists, nothing can delete it); paths in created nodes and errors are
//!   given back relative to it. Several applications can share a cluster
//!   this way, and etcd's role permissions can be granted on the prefix
//!   alone (`etcdctl role grant-permission app readwrite /app/ --prefix`).
//! - **TLS** (`etcds://...` or any of the `cacert`, `cert`, `key`, `domain`
//!   options, see [`Endpoint`]) connects to every member over
//!   `https://`, verifying it against `cacert` (or the system's roots), and
//!   presents a client certificate if one is given.
//!
//! # Faults
//!
//! [`Session::faults`](crate::Session::faults) is available:
//! - [`Faults::expire`] revokes the lease from this client: the server
//!   deletes its keys at once (other clients' watches fire) and the status
//!   is `Lost`; the next operation grants a new lease. If the server did
//!   not confirm the revocation it fails with [`Error::Unreachable`] (the
//!   lease is lost to this client all the same and expires on the server
//!   after its TTL); after `close()`, with [`Error::Closed`].
//! - [`Faults::suspend`] publishes `Suspended`, holds operations issued
//!   meanwhile, and stops the keep-alives for `duration`; then it sends one
//!   at once (`Reconnected` if the lease is still there). If `duration`
//!   reaches the TTL, the lease really expires on the server (nothing is
//!   revoked: its keys go when the server's lessor notices, within about
//!   half a second), and the keep-alive loop reports `Lost` when the TTL
//!   since the last answered keep-alive has passed; held operations then
//!   run with a new lease.
//! - [`Faults::lose_next_create_reply`]: the next create (or create and
//!   list) is applied, but the caller gets `ConnectionLoss`, and the status
//!   blips `Suspended` → `Reconnected`. The client learns nothing from the
//!   lost reply: no fence for the node it made.
//! - [`Faults::lose_next_delete_reply`]: likewise for the next delete. The
//!   fence of a node this lease created is kept (the client would have no
//!   reply to clear it with), so a retry finds `NoNode` even if a newer
//!   node of the same name exists by then — unless that node is in our
//!   own lease (see "Fenced deletes" above).

mod channel;
mod error;
mod keys;
mod lease;
mod mirror;
mod multi;
mod watch;

use async_trait::async_trait;
use etcd_client::{
    Compare, CompareOp, GetOptions, GetResponse, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse,
    TxnResponse,
};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard};

use self::error::{map_error, Failure};
use self::lease::{Config, Lease};
use self::multi::Fence;
use self::watch::{Hub, Kind, Request};
use super::create::CreateRequest;
use super::keepalive::{Kept, Renewer};
use super::namespace::Namespaced;
use super::owned::{Owned, OwnedNodes, Sequence, SEQUENCE_SPACE};
use super::status::SessionMachine;
use super::{BackendKind, Child, Created, Faults, Op, OpResult, SessionId, Stat, Store, Watch};
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::options::SessionOptions;
use crate::path;

/// The session's status as subscribed when a read began: a watch the read
/// arms counts a change since (see [`Watch::since_read`]).
type StatusSince = tokio::sync::watch::Receiver<super::SessionStatus>;

/// Opens a client of the etcd cluster of `endpoint` (an
/// [`Endpoint::Etcd`]): connects (and authenticates, with credentials) and
/// grants the session's lease, asking for `options.session_timeout` rounded
/// up to whole seconds.
///
/// # Errors
///
/// [`Error::Unreachable`] (naming the endpoint) if no member answers;
/// [`Error::AuthFailed`] if the credentials are rejected;
/// [`Error::InvalidEndpoint`] for another kind of endpoint.
pub async fn open(endpoint: &Endpoint, options: &SessionOptions) -> Result<Arc<dyn Store>> {
    let config = Config::from_endpoint(endpoint, options.session_timeout)?;
    let root = config.namespace.clone();
    let lease = Kept(Lease::open(config).await?);
    let hub = Hub::start(lease.client.clone(), &lease.runtime);
    let store = EtcdStore {
        lease,
        hub,
        owned: OwnedNodes::default(),
        doubtful: StdMutex::new(HashSet::new()),
        sequence: Sequence::new(),
        root: root.clone(),
    };
    let store: Arc<dyn Store> = if root == "/" {
        Arc::new(store)
    } else {
        Arc::new(Namespaced::new(store, root))
    };
    Ok(store)
}

/// How often a sequential create is retried when another client drew the
/// same suffix for the same name.
const SEQUENCE_ATTEMPTS: usize = 16;

/// A plain delete on its way: unless its answer came, its name becomes
/// doubtful when this is dropped — the delete may still be applied, even
/// if the caller gave up on it.
struct InFlight<'s> {
    store: &'s EtcdStore,
    path: &'s str,
    answered: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.store.doubt(self.path);
        }
    }
}

/// One client of an etcd cluster: one lease at a time, renewed after it is
/// lost. Dropping it revokes the lease (in the background).
struct EtcdStore {
    lease: Kept<Lease>,
    hub: Hub,
    /// The ephemeral nodes this client created in the current lease, by
    /// their create revision.
    owned: OwnedNodes<i64>,
    /// Nodes whose plain delete went out but was not answered: it may
    /// still be applied, at any later time, so these names are never
    /// created again by this client (see [`EtcdStore::deletes_plainly`]).
    doubtful: StdMutex<HashSet<String>>,
    sequence: Sequence,
    /// The path that acts as the root: `/`, or the namespace (whose keys
    /// the [`Namespaced`] wrapper maps every path below).
    root: String,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.lease.fmt(f)
    }
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        // Then the lease drops, and is revoked in the background.
        self.hub.shutdown();
    }
}

fn keys_only() -> Option<GetOptions> {
    Some(GetOptions::new().with_keys_only())
}

fn count_range((start, end): (Vec<u8>, Vec<u8>)) -> TxnOp {
    TxnOp::get(
        start,
        Some(GetOptions::new().with_range(end).with_count_only()),
    )
}

fn keys_range((start, end): (Vec<u8>, Vec<u8>)) -> TxnOp {
    TxnOp::get(
        start,
        Some(GetOptions::new().with_range(end).with_keys_only()),
    )
}

fn revision(resp: &TxnResponse) -> i64 {
    resp.header().map_or(0, |h| h.revision())
}

/// The range reads of a transaction's executed branch, in order.
fn gets(resp: &TxnResponse) -> Vec<GetResponse> {
    resp.op_responses()
        .into_iter()
        .filter_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g),
            _ => None,
        })
        .collect()
}

fn first(get: Option<&GetResponse>) -> Option<&KeyValue> {
    get.and_then(|g| g.kvs().first())
}

impl EtcdStore {
    fn endpoint(&self) -> &str {
        &self.lease.config.endpoint
    }

    /// Runs a transaction, mapping failures for an operation on `path`; a
    /// lease the server no longer has makes the session `Lost`.
    async fn txn(&self, txn: Txn, path: &str, lease: SessionId) -> Result<TxnResponse> {
        let mut kv = self.lease.client.kv_client();
        self.request(kv.txn(txn), path, lease).await
    }

    /// Awaits a KV request within the operation timeout, mapping failures
    /// as [`txn`](Self::txn) does.
    async fn request<T>(
        &self,
        request: impl std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
        path: &str,
        lease: SessionId,
    ) -> Result<T> {
        match tokio::time::timeout(self.lease.op_timeout(), request).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => {
                let failure = map_error(&e, self.endpoint());
                self.lease.renew_stale_token(&failure).await;
                Err(self.fail(failure, path, lease))
            }
            Err(_) => Err(Error::ConnectionLoss),
        }
    }

    fn fail(&self, failure: Failure, path: &str, lease: SessionId) -> Error {
        if failure == Failure::LeaseGone {
            self.lease.machine.lose(lease);
        }
        failure.into_error(path)
    }

    /// The owned-node table of `lease` (emptied when the lease changed).
    fn owned(&self, lease: SessionId) -> MutexGuard<'_, Owned<i64>> {
        self.owned.of(lease, || self.newest())
    }

    /// The store's newest lease (its status's).
    fn newest(&self) -> SessionId {
        self.lease.machine.snapshot().session_id
    }

    fn remember(&self, lease: SessionId, path: &str, revision: i64, suffix: Option<&str>) {
        self.owned(lease).remember(lease, path, revision, suffix);
    }

    fn forget(&self, lease: SessionId, path: &str) {
        self.owned(lease).forget(lease, path);
    }

    /// What our node at `path` must be, if we have (or had) one there: the
    /// one we created in this lease, or in an earlier one (see
    /// [`Owned::gone`]); for an operation of a lease that is not the newest,
    /// one that lease holds.
    fn fence(&self, lease: SessionId, path: &str) -> Option<Fence> {
        let owned = self.owned(lease);
        if let Some(gone) = owned.gone(path) {
            return Some(Fence::Gone(gone.session));
        }
        let &revision = owned.nodes.get(path)?;
        Some(match owned.is_of(lease) {
            true => Fence::Created(revision),
            false => Fence::Held,
        })
    }

    /// Whether the name `path` followed by `suffix` is one a plain delete
    /// left in doubt.
    fn is_doubtful(&self, path: &str, suffix: &str) -> bool {
        let doubtful = self.doubtful.lock().unwrap_or_else(|e| e.into_inner());
        // Almost always empty: then no name is built on the acquire path.
        !doubtful.is_empty() && doubtful.contains(&format!("{path}{suffix}"))
    }

    fn doubt(&self, path: &str) {
        let mut doubtful = self.doubtful.lock().unwrap_or_else(|e| e.into_inner());
        doubtful.insert(path.to_string());
    }

    /// Whether `path` can be deleted with a plain delete instead of a
    /// transaction that compares its create revision — which etcd 3.4
    /// serves noticeably slower (measured ~100 µs more per release; its
    /// profile shows the transaction's read view), on every release.
    ///
    /// The compare guards against a delete landing on a newer node of the
    /// same name (etcd#22082). For a protected sequential node of ours that
    /// cannot happen: nobody else makes a name with our protection UUID; we
    /// make it again only after our delete of it was answered, when nothing
    /// of that delete is left in flight; and once a plain delete goes
    /// unanswered (it may still land, much later) the name is never made
    /// again ([`reusable_suffix`](Self::reusable_suffix) draws another
    /// suffix) and its retries compare. Sequential nodes never carry
    /// position markers, and ephemeral ones have no children.
    fn deletes_plainly(&self, lease: SessionId, path: &str) -> bool {
        let name = path::node_name(path);
        let Some(suffix) = keys::sequence_suffix(name) else {
            return false;
        };
        if path::protection_prefix(name).is_none() || self.is_doubtful(path, "") {
            return false;
        }
        // Sequenced by us in this lease, and so ephemeral (only ephemeral
        // nodes are remembered) and fenced (`remember` records both,
        // `forget` drops both).
        let owned = self.owned(lease);
        owned.is_of(lease)
            && owned
                .sequenced
                .get(&(path::parent(path).to_string(), suffix.to_string()))
                .is_some_and(|p| p == path)
    }

    /// Deletes our node `path` without a transaction (see
    /// [`deletes_plainly`](Self::deletes_plainly)).
    async fn delete_plainly(&self, path: &str, lease: SessionId) -> Result<()> {
        let mut in_flight = InFlight {
            store: self,
            path,
            answered: false,
        };
        let mut kv = self.lease.client.kv_client();
        let deleted = self
            .request(kv.delete(path, None), path, lease)
            .await?
            .deleted();
        self.lease.machine.lost_delete_reply()?;
        in_flight.answered = true;
        if deleted == 0 {
            // Gone already (an operator, or the lease): the fence stays, as
            // after a fenced delete that found nothing.
            return Err(Error::NoNode {
                path: path.to_string(),
            });
        }
        self.forget(lease, path);
        Ok(())
    }

    /// The node whose place a non-sequential create of `full` takes (see
    /// the module docs): a sequential sibling we created with the same
    /// suffix, and its create revision.
    fn position_of(&self, lease: SessionId, full: &str) -> Option<(String, i64)> {
        let owned = self.owned(lease);
        owned
            .sibling_of(full)
            .map(|(sibling, &revision)| (sibling, revision))
    }

    /// Whether `path` is a namespace's root, which has no key of its own
    /// (and which a role limited to the namespace may not read).
    fn is_keyless(&self, path: &str) -> bool {
        path == self.root && self.root != "/"
    }

    /// The key holding `path`'s own data (see [`keys::own_key`]).
    fn own_key(&self, path: &str) -> String {
        keys::own_key(path, self.is_keyless(path))
    }

    /// A read that counts `path`'s own key: 1 if it has one, else 0.
    fn count_own(&self, path: &str) -> TxnOp {
        TxnOp::get(
            self.own_key(path),
            Some(GetOptions::new().with_count_only()),
        )
    }

    /// The ancestors of `path` strictly below the root: those a create must
    /// check are not ephemeral.
    fn ancestors_below_root<'p>(&self, path: &'p str) -> Vec<&'p str> {
        keys::ancestors_below(&self.root, path)
    }

    /// The suffix for an ephemeral sequential create of `path`: one that
    /// depends only on `path`, so that a client creating the same name
    /// again — as the wait queue does, with its recycled protection
    /// prefixes — reuses the key. Every name ever used below a directory
    /// stays in etcd's index (as a tombstone) until the next compaction,
    /// and every listing of the directory scans them all: fresh names
    /// would make a busy lock slower with every acquisition. Falls back to
    /// the counter while one of our live nodes has that suffix in the
    /// directory (the read-write lock's downgrade finds a sibling by it);
    /// a key that exists is caught by the create's compare.
    fn reusable_suffix(&self, lease: SessionId, path: &str) -> String {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        path.hash(&mut hasher);
        let n = hasher.finish() % SEQUENCE_SPACE;
        let suffix = format!("{n:0width$}", width = keys::SEQUENCE_DIGITS);
        let taken = self
            .owned(lease)
            .sequenced
            .contains_key(&(path::parent(path).to_string(), suffix.clone()));
        if taken || self.is_doubtful(path, &suffix) {
            self.next_suffix()
        } else {
            suffix
        }
    }

    fn next_suffix(&self) -> String {
        self.sequence.next_suffix()
    }

    /// Reads a path: its key (with value), how many keys are below it, and
    /// the read's revision.
    async fn read(&self, path: &str, lease: SessionId) -> Result<(Option<KeyValue>, i64, i64)> {
        let txn = Txn::new().and_then([
            TxnOp::get(self.own_key(path), None),
            count_range(keys::descendants(path)),
        ]);
        let resp = self.txn(txn, path, lease).await?;
        let gets = gets(&resp);
        let key = first(gets.first()).cloned();
        let below = gets.get(1).map_or(0, GetResponse::count);
        Ok((key, below, revision(&resp)))
    }

    /// Whether `path` exists (as a key or an implicit directory).
    async fn path_exists(&self, path: &str, lease: SessionId) -> Result<bool> {
        if path == self.root {
            return Ok(true);
        }
        let (key, below) = self.counts(path, lease).await?;
        Ok(key > 0 || below > 0)
    }

    /// Whether `path` is an implicit directory: no key, keys below.
    async fn is_implicit(&self, path: &str, lease: SessionId) -> Result<bool> {
        let (key, below) = self.counts(path, lease).await?;
        Ok(key == 0 && below > 0)
    }

    /// How many keys `path` is (0 or 1), and how many are below it.
    async fn counts(&self, path: &str, lease: SessionId) -> Result<(i64, i64)> {
        let txn = Txn::new().and_then([self.count_own(path), count_range(keys::descendants(path))]);
        let resp = self.txn(txn, path, lease).await?;
        let gets = gets(&resp);
        Ok((
            gets.first().map_or(0, GetResponse::count),
            gets.get(1).map_or(0, GetResponse::count),
        ))
    }

    /// Arms a watch on `path` after a read at `read_revision` (begun with
    /// the session's `status` subscribed) that saw the key at `revision`
    /// (its mod revision; 0: no key) and, for children watches, a listing
    /// with `digest`. A waiter's watch on a queued node, for its deletion
    /// (`queued`; `revision` is then the node's create revision), is served
    /// by its directory's shared watch.
    fn arm(
        &self,
        path: &str,
        kind: Kind,
        (read_revision, status): (i64, StatusSince),
        revision: i64,
        digest: u64,
        queued: bool,
    ) -> Watch {
        let rx = self.hub.arm(Request {
            path: path.to_string(),
            kind,
            read_revision,
            revision,
            digest,
            keyless: self.is_keyless(path),
            shared: queued && kind == Kind::Data && path::parent(path) != "/",
        });
        Watch::since_read(rx, status)
    }

    /// One attempt at a multi: the plan and the committed transaction, or
    /// the first failing operation.
    async fn multi_once(
        &self,
        ops: &[Op],
        lease: SessionId,
        parents: &HashMap<String, bool>,
        implicit: &HashSet<String>,
        first_path: &str,
    ) -> Result<std::result::Result<(multi::Plan, TxnResponse), (usize, Error)>> {
        let planned = {
            let fence = |p: &str| self.fence(lease, p);
            let parent_exists = |p: &str| parents.get(p).copied().unwrap_or(true);
            let suffix = || self.next_suffix();
            let is_implicit = |p: &str| implicit.contains(p);
            let cx = multi::Context {
                root: &self.root,
                lease,
                fence: &fence,
                parent_exists: &parent_exists,
                suffix: &suffix,
                implicit: &is_implicit,
            };
            multi::plan(ops, &cx)
        };
        let plan = match planned {
            Ok(plan) => plan,
            Err(failure) => {
                // Operation `index` cannot succeed; unless one before it
                // fails first in the store, it is the one to report.
                if !failure.conds.is_empty() {
                    let txn = Txn::new()
                        .when(multi::compares(&failure.conds))
                        .or_else(multi::reads(&failure.conds));
                    let resp = self.txn(txn, first_path, lease).await?;
                    if !resp.succeeded() {
                        let reads: Vec<Vec<KeyValue>> =
                            gets(&resp).iter().map(|g| g.kvs().to_vec()).collect();
                        if let Some(found) = multi::first_failure(&failure.conds, &reads) {
                            return Ok(Err(found));
                        }
                    }
                }
                return Ok(Err((failure.index, failure.error)));
            }
        };
        let txn = Txn::new()
            .when(multi::compares(&plan.conds))
            .and_then(plan.then.clone())
            .or_else(multi::reads(&plan.conds));
        let resp = self.txn(txn, first_path, lease).await?;
        if resp.succeeded() {
            return Ok(Ok((plan, resp)));
        }
        let reads: Vec<Vec<KeyValue>> = gets(&resp).iter().map(|g| g.kvs().to_vec()).collect();
        match multi::first_failure(&plan.conds, &reads) {
            Some(found) => Ok(Err(found)),
            None => Err(Error::Backend(format!(
                "etcd refused a multi on {first_path} for no reason it showed"
            ))),
        }
    }
}

#[async_trait]
impl Store for EtcdStore {
    fn backend(&self) -> BackendKind {
        BackendKind::Etcd
    }

    fn has_implicit_parents(&self) -> bool {
        true
    }

    fn machine(&self) -> &dyn SessionMachine {
        &self.lease.machine
    }

    fn learn_created(&self, request: &CreateRequest<'_>, created: &Created) {
        let fence = created.stat.czxid;
        self.owned.learn(request, created, fence, || self.newest());
    }

    /// Creates the node (with a suffix, if sequential) and, with a listing
    /// asked for, lists that directory in the same transaction.
    async fn create_in(&self, request: CreateRequest<'_>) -> Result<(Created, Option<Vec<Child>>)> {
        let lease = self.lease.current().await?;
        let path = request.path;
        let parent = path::parent(path);
        if !request.opts.create_parents && !self.path_exists(parent, lease).await? {
            return Err(Error::NoNode {
                path: parent.to_string(),
            });
        }
        let ephemeral = request.opts.mode.is_ephemeral();
        let sequential = request.opts.mode.is_sequential();
        let put_options = ephemeral.then(|| PutOptions::new().with_lease(lease));
        let mut attempt = 0;
        loop {
            attempt += 1;
            let full = if sequential {
                let suffix = match ephemeral && attempt == 1 {
                    true => self.reusable_suffix(lease, path),
                    false => self.next_suffix(),
                };
                format!("{path}{suffix}")
            } else {
                path.to_string()
            };
            let position = if sequential {
                None
            } else {
                self.position_of(lease, &full)
            };
            let ancestors = self.ancestors_below_root(&full);

            let mut compares = vec![Compare::create_revision(full.as_str(), CompareOp::Equal, 0)];
            compares.extend(
                ancestors
                    .iter()
                    .map(|a| Compare::lease(*a, CompareOp::Equal, 0)),
            );
            let mut then = vec![TxnOp::put(full.as_str(), request.data, put_options.clone())];
            if let Some((sibling, revision)) = &position {
                compares.push(Compare::create_revision(
                    sibling.as_str(),
                    CompareOp::Equal,
                    *revision,
                ));
                then.push(TxnOp::put(
                    keys::marker(&full, *revision),
                    "",
                    put_options.clone(),
                ));
            }
            if let Some(list) = request.list {
                then.push(keys_range(keys::below(list)));
            }
            // No failure branch: its reads would be written into every
            // create's raft entry (and fsynced); a failure, rare, reads
            // what failed it afterwards.
            let txn = Txn::new().when(compares).and_then(then);
            let resp = self.txn(txn, &full, lease).await?;
            let gets = gets(&resp);
            if resp.succeeded() {
                let rev = revision(&resp);
                let children = request.list.map(|l| {
                    let listed = gets.last().map_or(&[][..], |g| g.kvs());
                    self.hub.mirrors.seed(l, rev, listed);
                    keys::children(l, listed)
                });
                let stat = Stat {
                    czxid: rev,
                    mzxid: rev,
                    ephemeral_owner: if ephemeral { lease } else { 0 },
                    data_length: request.data.len().min(i32::MAX as usize) as i32,
                    ..Stat::default()
                };
                return Ok((Created { path: full, stat }, children));
            }
            let mut reads = vec![TxnOp::get(full.as_str(), keys_only())];
            reads.extend(ancestors.iter().map(|a| TxnOp::get(*a, keys_only())));
            let sibling = position.as_ref().map(|(path, _)| path.as_str());
            reads.extend(sibling.map(|path| TxnOp::get(path, keys_only())));
            let why = self.txn(Txn::new().and_then(reads), &full, lease).await?;
            let gets = self::gets(&why);
            if first(gets.first()).is_some() {
                if sequential && attempt < SEQUENCE_ATTEMPTS {
                    // Another client drew the same suffix for this name, or an
                    // earlier node of this name is still there.
                    continue;
                }
                return Err(Error::NodeExists { path: full });
            }
            for (i, ancestor) in ancestors.iter().enumerate() {
                if first(gets.get(1 + i)).is_some_and(|kv| kv.lease() != 0) {
                    return Err(Error::NoChildrenForEphemerals {
                        path: ancestor.to_string(),
                    });
                }
            }
            if let Some((sibling, revision)) = position {
                let now = first(gets.get(1 + ancestors.len())).map(|kv| kv.create_revision());
                if now != Some(revision) {
                    return Err(Error::NoNode { path: sibling });
                }
            }
            // What failed the create is gone since: create again.
            if attempt < SEQUENCE_ATTEMPTS {
                continue;
            }
            return Err(Error::Backend(format!(
                "etcd refused to create {full} for no reason it showed"
            )));
        }
    }

    async fn delete(&self, path: &str, version: Option<i32>) -> Result<()> {
        if path == self.root {
            return Err(Error::InvalidArgument("the root cannot be deleted".into()));
        }
        self.lease.machine.lost_replies.failing_delete()?;
        let lease = self.lease.current().await?;
        if version.is_none() && self.deletes_plainly(lease, path) {
            return self.delete_plainly(path, lease).await;
        }
        // A node of ours is deleted only while it is in our lease: never
        // another session's newer node of its name (etcd#22082), while ours
        // goes, also one whose create lost its reply. In the name of our
        // node of an earlier lease, that lease's (while the server keeps
        // it), else ours. A delete with a version names the node it read,
        // as on Consul.
        let mut holder = version
            .is_none()
            .then(|| self.owned(lease).holder(lease, path))
            .flatten();
        loop {
            let mut compares = vec![Compare::version(path, CompareOp::Greater, 0)];
            if let Some(v) = version {
                compares.push(Compare::version(path, CompareOp::Equal, v as i64 + 1));
            }
            let (start, end) = keys::descendants(path);
            compares.push(
                Compare::create_revision(start.clone(), CompareOp::Equal, 0)
                    .with_range(end.clone()),
            );
            if let Some(holder) = holder {
                compares.push(Compare::lease(path, CompareOp::Equal, holder));
            }
            let (marker_start, marker_end) = keys::markers(path);
            let txn = Txn::new()
                .when(compares)
                .and_then([
                    TxnOp::delete(path, None),
                    TxnOp::delete(
                        marker_start,
                        Some(etcd_client::DeleteOptions::new().with_range(marker_end)),
                    ),
                ])
                .or_else([TxnOp::get(path, keys_only()), count_range((start, end))]);
            let resp = self.txn(txn, path, lease).await?;
            if resp.succeeded() {
                // A lost reply keeps the fence, so a retry cannot remove
                // another session's newer node of this name (etcd#22082).
                self.lease.machine.lost_delete_reply()?;
                self.forget(lease, path);
                return Ok(());
            }
            let gets = gets(&resp);
            let below = gets.get(1).map_or(0, GetResponse::count);
            let no_node = Error::NoNode {
                path: path.to_string(),
            };
            // A fence stays until a delete succeeds: a later delete of this
            // path must not remove another's node either.
            return match first(gets.first()) {
                None if below > 0 => Err(Error::NotEmpty {
                    path: path.to_string(),
                }),
                None => Err(no_node),
                // Not the earlier lease's node, but one of ours: go again.
                Some(kv) if holder.is_some_and(|h| h != lease) && kv.lease() == lease => {
                    holder = Some(lease);
                    continue;
                }
                // Not our node any more: another session's of the same name.
                Some(kv) if holder.is_some_and(|h| kv.lease() != h) => Err(no_node),
                Some(kv) if version.is_some_and(|v| kv.version() != v as i64 + 1) => {
                    Err(Error::BadVersion {
                        path: path.to_string(),
                    })
                }
                Some(_) => Err(Error::NotEmpty {
                    path: path.to_string(),
                }),
            };
        }
    }

    async fn set_data(&self, path: &str, data: &[u8], version: Option<i32>) -> Result<Stat> {
        self.lease.machine.lost_replies.failing_set()?;
        let lease = self.lease.current().await?;
        let mut compares = vec![Compare::version(path, CompareOp::Greater, 0)];
        if let Some(v) = version {
            compares.push(Compare::version(path, CompareOp::Equal, v as i64 + 1));
        }
        let txn = Txn::new()
            .when(compares)
            .and_then([
                TxnOp::put(path, data, Some(PutOptions::new().with_ignore_lease())),
                TxnOp::get(path, keys_only()),
            ])
            .or_else([TxnOp::get(path, keys_only())]);
        let resp = self.txn(txn, path, lease).await?;
        let gets = gets(&resp);
        match (resp.succeeded(), first(gets.first())) {
            (true, Some(kv)) => {
                let mut stat = keys::stat(kv, 0);
                stat.data_length = data.len().min(i32::MAX as usize) as i32;
                Ok(stat)
            }
            (false, Some(_)) => Err(Error::BadVersion {
                path: path.to_string(),
            }),
            _ => Err(Error::NoNode {
                path: path.to_string(),
            }),
        }
    }

    async fn get_data(&self, path: &str, watch: bool) -> Result<(Vec<u8>, Stat, Option<Watch>)> {
        self.lease.machine.lost_replies.failing_read()?;
        let lease = self.lease.current().await?;
        let status = watch.then(|| self.lease.machine.subscribe());
        let (key, below, rev) = self.read(path, lease).await?;
        match key {
            Some(kv) => {
                let w = status.map(|status| {
                    self.arm(path, Kind::Data, (rev, status), kv.mod_revision(), 0, false)
                });
                Ok((kv.value().to_vec(), keys::stat(&kv, below), w))
            }
            // The root, which has no key, is never deleted.
            None if path == self.root => {
                let w = status.map(Watch::session_only);
                Ok((Vec::new(), keys::implicit_stat(below), w))
            }
            None if below > 0 => {
                let w =
                    status.map(|status| self.arm(path, Kind::Implicit, (rev, status), 0, 0, false));
                Ok((Vec::new(), keys::implicit_stat(below), w))
            }
            None => Err(Error::NoNode {
                path: path.to_string(),
            }),
        }
    }

    async fn exists(&self, path: &str, watch: bool) -> Result<(Option<Stat>, Option<Watch>)> {
        self.lease.machine.lost_replies.failing_read()?;
        let lease = self.lease.current().await?;
        let status = watch.then(|| self.lease.machine.subscribe());
        let (key, below, rev) = self.read(path, lease).await?;
        let (stat, kind, mod_revision) = match key {
            Some(kv) => (Some(keys::stat(&kv, below)), Kind::Data, kv.mod_revision()),
            // The root, which has no key, is never deleted.
            None if path == self.root => {
                return Ok((
                    Some(keys::implicit_stat(below)),
                    status.map(Watch::session_only),
                ));
            }
            None if below > 0 => (Some(keys::implicit_stat(below)), Kind::Implicit, 0),
            None => (None, Kind::Absent, 0),
        };
        Ok((
            stat,
            status.map(|status| self.arm(path, kind, (rev, status), mod_revision, 0, false)),
        ))
    }

    async fn children(&self, path: &str, watch: bool) -> Result<(Vec<Child>, Option<Watch>)> {
        self.lease.machine.lost_replies.failing_read()?;
        let lease = self.lease.current().await?;
        let status = watch.then(|| self.lease.machine.subscribe());
        let txn = Txn::new().and_then([self.count_own(path), keys_range(keys::below(path))]);
        let resp = self.txn(txn, path, lease).await?;
        let gets = gets(&resp);
        let is_key = gets.first().is_some_and(|g| g.count() > 0);
        let listed = gets.get(1).map_or(&[][..], |g| g.kvs());
        self.hub.mirrors.seed(path, revision(&resp), listed);
        let children = keys::children(path, listed);
        if !is_key && children.is_empty() && path != self.root {
            return Err(Error::NoNode {
                path: path.to_string(),
            });
        }
        let digest = keys::digest(&children);
        let w = status.map(|status| {
            let read = (revision(&resp), status);
            self.arm(path, Kind::Children, read, 0, digest, false)
        });
        Ok((children, w))
    }

    async fn children_seen(&self, path: &str, since: i64) -> Result<Vec<Child>> {
        // An empty copy cannot tell whether the directory itself is there.
        match self.hub.mirrors.children(path, since) {
            Some(children) if !children.is_empty() => Ok(children),
            _ => Ok(self.children(path, false).await?.0),
        }
    }

    async fn watch_child(&self, dir: &str, child: &Child) -> Result<Option<Watch>> {
        let node = path::join(dir, &child.name);
        let Some(czxid) = child.czxid else {
            return crate::store::read_and_watch_child(self, dir, child).await;
        };
        match self.hub.mirrors.node(&node, czxid) {
            Some((_, None)) => Ok(None),
            Some((_, Some(created))) if created != czxid => Ok(None),
            Some((as_of, Some(_))) => {
                self.lease.current().await?;
                let status = self.lease.machine.subscribe();
                let read = (as_of, status);
                Ok(Some(self.arm(&node, Kind::Data, read, czxid, 0, true)))
            }
            // Through the shared watch as well (whatever the node's
            // lease), so that its event reaches the copy first.
            None => {
                let lease = self.lease.current().await?;
                let status = self.lease.machine.subscribe();
                Ok(match self.read(&node, lease).await? {
                    (Some(kv), _, read_at) if kv.create_revision() == czxid => {
                        Some(self.arm(&node, Kind::Data, (read_at, status), czxid, 0, true))
                    }
                    _ => None,
                })
            }
        }
    }

    fn deletes_only_created(&self, path: &str, czxid: i64) -> Option<bool> {
        // A delete of our node compares its lease (or it is a protected
        // sequential node's, whose name nobody else makes).
        let lease = self.newest();
        self.owned(lease).made_with(lease, path, &czxid)
    }

    async fn multi(&self, ops: &[Op]) -> Result<Vec<OpResult>> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        multi::check_len(ops)?;
        let lease = self.lease.current().await?;
        // Parents of creates that the multi itself does not tell about are
        // read first (only multis with creates pay this round trip).
        let mut parents: HashMap<String, bool> = HashMap::new();
        for op in ops {
            if let Op::Create { path, .. } = op {
                let parent = path::parent(path).to_string();
                if parent != self.root && !parents.contains_key(&parent) {
                    let exists = self.path_exists(&parent, lease).await?;
                    parents.insert(parent, exists);
                }
            }
        }
        let first_path = ops.first().map_or("/", Op::path).to_string();
        // Checks and deletes of implicit directories are learnt on failure:
        // the common multi (on keys) stays one round trip.
        let mut implicit: HashSet<String> = HashSet::new();
        let (plan, resp) = loop {
            let outcome = self
                .multi_once(ops, lease, &parents, &implicit, &first_path)
                .await?;
            let (index, error) = match outcome {
                Ok(done) => break done,
                Err(failed) => failed,
            };
            let retry = match (&error, &ops[index]) {
                (
                    Error::NoNode { path },
                    Op::Check { path: p, .. } | Op::Delete { path: p, .. },
                ) if path == p && !implicit.contains(p) => self.is_implicit(p, lease).await?,
                _ => false,
            };
            if !retry {
                return Err(multi::failed(index, error));
            }
            implicit.insert(match &ops[index] {
                Op::Check { path, .. } | Op::Delete { path, .. } => path.clone(),
                _ => unreachable!("matched above"),
            });
        };
        let gets = gets(&resp);
        let rev = revision(&resp);
        let read_back: HashMap<&str, &KeyValue> = plan
            .read_back
            .iter()
            .zip(&gets)
            .filter_map(|(p, g)| g.kvs().first().map(|kv| (p.as_str(), kv)))
            .collect();
        for p in &plan.created_ephemeral {
            if let Some(kv) = read_back.get(p.as_str()) {
                let suffix = keys::sequence_suffix(path::node_name(p));
                let sequential = ops.iter().zip(&plan.paths).any(|(op, full)| {
                    full == p && matches!(op, Op::Create { mode, .. } if mode.is_sequential())
                });
                self.remember(
                    lease,
                    p,
                    kv.create_revision(),
                    suffix.filter(|_| sequential),
                );
            }
        }
        for p in &plan.deleted {
            self.forget(lease, p);
        }
        // A persistent node of ours has the name now: its fence ends, as
        // after a create of one (`learn_created`).
        for (op, full) in ops.iter().zip(&plan.paths) {
            let persistent = matches!(op, Op::Create { mode, .. } if !mode.is_ephemeral());
            if persistent && !plan.created_ephemeral.contains(full) {
                self.forget(lease, full);
            }
        }
        let synthetic = |ephemeral: bool| Stat {
            czxid: rev,
            mzxid: rev,
            ephemeral_owner: if ephemeral { lease } else { 0 },
            ..Stat::default()
        };
        Ok(ops
            .iter()
            .zip(&plan.paths)
            .map(|(op, full)| match op {
                Op::Check { .. } => OpResult::Checked,
                Op::Create { mode, .. } => OpResult::Created(Created {
                    path: full.clone(),
                    stat: read_back
                        .get(full.as_str())
                        .map_or_else(|| synthetic(mode.is_ephemeral()), |kv| keys::stat(kv, 0)),
                }),
                Op::SetData { .. } => OpResult::Set(
                    read_back
                        .get(full.as_str())
                        .map_or_else(|| synthetic(false), |kv| keys::stat(kv, 0)),
                ),
                Op::Delete { .. } => OpResult::Deleted,
            })
            .collect())
    }

    fn faults(&self) -> Option<&dyn Faults> {
        Some(&self.lease)
    }

    async fn close(&self) {
        self.hub.shutdown();
        self.lease.close_session().await;
    }
}
