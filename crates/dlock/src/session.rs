//! [`Session`]: a client's handle on a coordination store, shared by every
//! recipe built on it, and [`connect`]: the one place that turns an
//! [`Endpoint`] into a session.
//!
//! The layers only point down: the endpoint parses URLs and knows no store;
//! each backend's `open` turns an endpoint into an `Arc<dyn Store>` and
//! knows no session; this module picks the backend and wraps its store.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::watch;

pub use crate::options::{RetryPolicy, SessionOptions};

use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::path;
use crate::store::create::{self, CreateRequest};
use crate::store::embedded::EmbeddedServer;
use crate::store::{
    BackendKind, Child, CreateMode, CreateOptions, Created, Faults, Op, OpResult, SessionId,
    SessionState, SessionStatus, Stat, Store, Watch,
};

/// Connects a new session to the store at `endpoint` (see [`Endpoint`]),
/// with default options.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// let session = dlock::connect("embedded").await?;
/// assert_eq!(session.backend(), dlock::store::BackendKind::Embedded);
/// # Ok(()) }
/// ```
pub async fn connect(endpoint: &str) -> Result<Session> {
    connect_with(endpoint, SessionOptions::default()).await
}

/// Connects a new session to the store at `endpoint` with `options`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// use std::time::Duration;
/// let options = dlock::SessionOptions::default().with_session_timeout(Duration::from_secs(3));
/// let session = dlock::connect_with("embedded", options).await?;
/// assert_eq!(session.session_timeout(), Duration::from_secs(3));
/// # Ok(()) }
/// ```
pub async fn connect_with(endpoint: &str, options: SessionOptions) -> Result<Session> {
    let endpoint: Endpoint = endpoint.parse()?;
    connect_endpoint(&endpoint, options).await
}

/// Connects a new session to a parsed endpoint: the backend opens its store,
/// the session wraps it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// let endpoint: dlock::Endpoint = "embedded".parse()?;
/// let session = dlock::connect_endpoint(&endpoint, Default::default()).await?;
/// assert!(session.state().is_connected());
/// # Ok(()) }
/// ```
pub async fn connect_endpoint(endpoint: &Endpoint, options: SessionOptions) -> Result<Session> {
    options.validate()?;
    let store: Arc<dyn Store> = match endpoint {
        Endpoint::Embedded => EmbeddedServer::global().open(&options),
        #[cfg(feature = "zookeeper")]
        Endpoint::ZooKeeper { .. } => crate::store::zookeeper::open(endpoint, &options).await?,
        #[cfg(feature = "etcd")]
        Endpoint::Etcd { .. } => crate::store::etcd::open(endpoint, &options).await?,
        #[cfg(feature = "consul")]
        Endpoint::Consul { .. } => crate::store::consul::open(endpoint, &options).await?,
        #[allow(unreachable_patterns)]
        other => {
            let feature = match other {
                Endpoint::Etcd { .. } => "etcd feature (cargo build --features etcd)",
                Endpoint::Consul { .. } => "consul feature",
                _ => "zookeeper feature",
            };
            return Err(Error::InvalidEndpoint {
                url: other.to_string(),
                reason: format!("dlock was built without the {feature}"),
            });
        }
    };
    Ok(Session::from_store(store, options))
}

impl EmbeddedServer {
    /// Opens a new session, as a separate process would.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// use dlock::store::embedded::EmbeddedServer;
    /// let server = EmbeddedServer::new();
    /// let a = server.connect(Default::default()).await?;
    /// let b = server.connect(Default::default()).await?;
    /// assert_ne!(a.session_id(), b.session_id());
    /// # Ok(()) }
    /// ```
    pub async fn connect(&self, options: SessionOptions) -> Result<Session> {
        options.validate()?;
        Ok(Session::from_store(self.open(&options), options))
    }

    /// Opens a new session with default options.
    pub async fn connect_default(&self) -> Result<Session> {
        self.connect(SessionOptions::default()).await
    }
}

/// A client session on a coordination store: the handle every recipe is
/// built on. Cheap to clone; clones share the session. When the last clone
/// is dropped the session is closed.
///
/// Connect one with [`connect`] (by endpoint URL) or from a
/// backend directly, e.g. [`EmbeddedServer::connect`](crate::store::embedded::EmbeddedServer::connect).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// use dlock::store::{CreateMode, CreateOptions};
/// let session = dlock::connect("embedded").await?;
/// let node = session
///     .create("/doc/session/a", b"x", CreateOptions::new(CreateMode::Ephemeral).with_parents())
///     .await?;
/// assert_eq!(node.path, "/doc/session/a");
/// session.close().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    options: SessionOptions,
    runtime: Option<tokio::runtime::Handle>,
    background: watch::Sender<usize>,
    retried: AtomicUsize,
    /// Protection prefixes whose nodes are known to be gone, for reuse.
    recycled: StdMutex<Vec<String>>,
    /// Nodes of this session being removed in the background (a dropped
    /// lease leaving): a recipe that finds one in its way waits for it to
    /// go, rather than take it for a live one. Counted: two removals may
    /// mark one node (a cancelled acquire's and a retry's), and the first
    /// to finish must not clear the other's mark.
    departing: StdMutex<HashMap<(String, i64), usize>>,
}

/// Whether the node a delete was for had gone before the delete got there:
/// someone else deleted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gone(pub bool);

/// The creation a [`Session::departing`] node has when it is not known yet.
pub(crate) const ANY_CREATION: i64 = -1;

/// A node of the session marked as on its way out, until this is dropped.
pub(crate) struct Departure {
    session: Session,
    node: (String, i64),
}

impl Drop for Departure {
    fn drop(&mut self) {
        let mut departing = self.session.inner.departing.lock();
        let departing = departing.as_mut().unwrap_or_else(|e| e.get_mut());
        if let Some(marks) = departing.get_mut(&self.node) {
            *marks -= 1;
            if *marks == 0 {
                departing.remove(&self.node);
            }
        }
    }
}

/// How many free protection prefixes a session keeps for reuse: enough for
/// the nodes a client typically holds at once.
const RECYCLED_PREFIXES: usize = 64;

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("backend", &self.backend())
            .field("status", &self.status())
            .finish()
    }
}

impl Session {
    /// Wraps a backend's store. Backends call this; users connect instead.
    pub fn from_store(store: Arc<dyn Store>, options: SessionOptions) -> Session {
        count_state_changes(&*store);
        Session {
            inner: Arc::new(Inner {
                store,
                options,
                runtime: tokio::runtime::Handle::try_current().ok(),
                background: watch::channel(0).0,
                retried: AtomicUsize::new(0),
                recycled: StdMutex::new(Vec::new()),
                departing: StdMutex::new(HashMap::new()),
            }),
        }
    }

    /// Whether `other` is a handle on this same session.
    pub(crate) fn same_session(&self, other: &Session) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The backend's store, for what the wrapper does not offer.
    pub fn store(&self) -> &dyn Store {
        &*self.inner.store
    }

    /// The session's settings.
    pub fn options(&self) -> &SessionOptions {
        &self.inner.options
    }

    /// Which kind of store this session talks to.
    pub fn backend(&self) -> BackendKind {
        self.inner.store.backend()
    }

    /// The current status snapshot.
    pub fn status(&self) -> SessionStatus {
        *self.inner.store.status().borrow()
    }

    /// The current connection state.
    pub fn state(&self) -> SessionState {
        self.status().state
    }

    /// The session currently (or last) in use.
    pub fn session_id(&self) -> SessionId {
        self.status().session_id
    }

    /// The current session as the store's own tools name it, and its id
    /// (see [`Store::native_session_id`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// let session = dlock::connect("embedded").await?;
    /// let (id, name) = session.native_session_id();
    /// assert_eq!((id, name.len()), (session.session_id(), 16));
    /// # Ok(()) }
    /// ```
    pub fn native_session_id(&self) -> (SessionId, String) {
        self.inner.store.native_session_id()
    }

    /// The session timeout the server granted.
    pub fn session_timeout(&self) -> Duration {
        self.inner.store.session_timeout()
    }

    /// The session's status, as a watch channel: it holds the latest
    /// status, so a change quickly followed by another (a suspension the
    /// connection recovered from at once) may be seen only as the second;
    /// [`SessionStatus::changes`] counts every one.
    pub fn watch_status(&self) -> watch::Receiver<SessionStatus> {
        self.inner.store.status()
    }

    /// Resolves once the session `id` is over: lost, closed or replaced by
    /// a new session. Suspensions do not count.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// let session = dlock::connect("embedded").await?;
    /// let id = session.session_id();
    /// session.faults().unwrap().expire().await?;
    /// session.lost(id).await; // returns at once: it already happened
    /// # Ok(()) }
    /// ```
    pub async fn lost(&self, id: SessionId) {
        let mut rx = self.inner.store.status();
        let _ = rx
            .wait_for(|s| {
                s.session_id != id || matches!(s.state, SessionState::Lost | SessionState::Closed)
            })
            .await;
    }

    /// Fault injection, where the backend supports it (the embedded store
    /// does).
    pub fn faults(&self) -> Option<&dyn Faults> {
        self.inner.store.faults()
    }

    /// Closes the session: its ephemeral nodes go, later operations fail
    /// with [`Error::Closed`].
    pub async fn close(&self) {
        self.inner.store.close().await;
    }

    /// How many background tasks (deletes of released nodes) are running.
    pub fn background_tasks(&self) -> usize {
        *self.inner.background.borrow()
    }

    /// Waits until no background task is running.
    pub async fn background_idle(&self) {
        let mut rx = self.inner.background.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    /// How many operations were retried after a lost connection (for tests
    /// and metrics).
    pub fn retries(&self) -> usize {
        self.inner.retried.load(Ordering::Relaxed)
    }

    /// Creates a node. A sequential path is checked with its future suffix.
    pub async fn create(&self, path: &str, data: &[u8], opts: CreateOptions) -> Result<Created> {
        check_create_path(path, opts.mode)?;
        if let Some(tag) = opts.tag.filter(|&t| t < crate::store::TAG_MIN) {
            return Err(Error::InvalidArgument(format!(
                "tag {tag:#x} of {path} is below {:#x}: smaller values are data versions",
                crate::store::TAG_MIN
            )));
        }
        let request = CreateRequest::new(path, data, opts);
        Ok(create::run(&*self.inner.store, request).await?.0)
    }

    /// [`create`](Self::create), retried as the policy says, as a task of
    /// its own that a cancelled caller cannot cut short: a create that
    /// lands after its caller went away deletes the node it made. (A
    /// caller's own clean-up, racing it, may reach the server first: etcd
    /// and Consul do not order one client's requests.) For an ephemeral
    /// node at a name no other create of ours takes.
    pub(crate) async fn create_or_undo(
        &self,
        path: &str,
        data: &[u8],
        opts: CreateOptions,
    ) -> Result<Created> {
        let (session, path, data) = (self.clone(), path.to_string(), data.to_vec());
        // Its retries bounded as the timed wait awaiting it bounds its own.
        let create = crate::recipes::deadline::within_this_wait(async move {
            let created = session
                .retrying(|| session.create(&path, &data, opts))
                .await;
            (session, path, created)
        });
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.spawn_background(async move {
            let (session, path, created) = create.await;
            let Err(created) = tx.send(created) else {
                return;
            };
            // The caller is gone: what this create may have made goes — the
            // node made, or (a reply lost) one of ours found at the name.
            let czxid = match created {
                Ok(orphan) => Some(orphan.stat.czxid),
                Err(Error::NodeExists { .. } | Error::ConnectionLoss) => {
                    let ours = session.session_id();
                    let found = session.retrying(|| session.exists(&path)).await;
                    found.ok().flatten().filter(|s| s.ephemeral_owner == ours).map(|s| s.czxid)
                }
                Err(_) => None,
            };
            if let Some(czxid) = czxid {
                match session.delete_created(&path, czxid).await {
                    Ok(_) | Err(Error::Closed) => {}
                    Err(e) => tracing::warn!(%path, error = %e, "deleting a node made for a cancelled caller failed"),
                }
            }
        });
        rx.await.unwrap_or(Err(Error::Closed))
    }

    /// Deletes a node, if its version matches (`None`: any version).
    pub async fn delete(&self, path: &str, version: Option<i32>) -> Result<()> {
        path::validate(path)?;
        check_version(path, version)?;
        self.inner.store.delete(path, version).await
    }

    /// Replaces a node's data, if its version matches (`None`: any
    /// version).
    pub async fn set_data(&self, path: &str, data: &[u8], version: Option<i32>) -> Result<Stat> {
        path::validate(path)?;
        check_version(path, version)?;
        self.inner.store.set_data(path, data, version).await
    }

    /// Reads a node's data and metadata. Reads are retried per the retry
    /// policy when the connection drops (they are idempotent); writes are
    /// not, since a lost reply leaves their outcome unknown.
    pub async fn get_data(&self, path: &str) -> Result<(Vec<u8>, Stat)> {
        let (data, stat, _) = self.read(path, |s| s.get_data(path, false)).await?;
        Ok((data, stat))
    }

    /// Reads a node's data and arms a watch for its change or deletion.
    pub async fn get_data_watch(&self, path: &str) -> Result<(Vec<u8>, Stat, Watch)> {
        let (data, stat, watch) = self.read(path, |s| s.get_data(path, true)).await?;
        Ok((data, stat, armed(watch)))
    }

    /// Reads a node's metadata, if it exists.
    pub async fn exists(&self, path: &str) -> Result<Option<Stat>> {
        Ok(self.read(path, |s| s.exists(path, false)).await?.0)
    }

    /// Reads a node's metadata and arms a watch for its creation, change or
    /// deletion.
    pub async fn exists_watch(&self, path: &str) -> Result<(Option<Stat>, Watch)> {
        let (stat, watch) = self.read(path, |s| s.exists(path, true)).await?;
        Ok((stat, armed(watch)))
    }

    /// Lists a node's children (unordered).
    pub async fn children(&self, path: &str) -> Result<Vec<Child>> {
        Ok(self.read(path, |s| s.children(path, false)).await?.0)
    }

    /// Lists a node's children and arms a watch for a change among them.
    pub async fn children_watch(&self, path: &str) -> Result<(Vec<Child>, Watch)> {
        let (children, watch) = self.read(path, |s| s.children(path, true)).await?;
        Ok((children, armed(watch)))
    }

    /// The name of the client that owns the node at `path`, if it is not
    /// dlock — on a backend whose sessions carry names (Consul, where
    /// `consul lock` and Consul's Go `api` name theirs); `None` for an
    /// unowned node, one of dlock's, or another backend
    /// ([`Store::foreign_owner`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// let session = dlock::connect("embedded").await?;
    /// let mutex = dlock::Mutex::new(&session, "/doc/owner")?;
    /// let guard = mutex.acquire().await?;
    /// assert_eq!(session.foreign_owner(guard.node()).await?, None);
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn foreign_owner(&self, path: &str) -> Result<Option<String>> {
        self.read(path, |s| s.foreign_owner(path)).await
    }

    /// The [tag](crate::store::CreateOptions::with_tag) of the node at
    /// `path`, where the store keeps tags (Consul); `None` for an untagged
    /// node or on a backend that drops tags ([`Store::tag`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// use dlock::store::{CreateMode, CreateOptions};
    /// let session = dlock::connect("embedded").await?;
    /// let tagged = CreateOptions::new(CreateMode::Ephemeral).with_tag(dlock::store::TAG_MIN);
    /// session.create("/doc-tagged", b"", tagged).await?;
    /// assert_eq!(session.tag("/doc-tagged").await?, None); // the embedded store drops tags
    /// # Ok(()) }
    /// ```
    pub async fn tag(&self, path: &str) -> Result<Option<u64>> {
        self.read(path, |s| s.tag(path)).await
    }

    /// A read of `path`, checked, and retried while the connection drops.
    async fn read<'a, T, Fut>(&'a self, path: &str, op: impl Fn(&'a dyn Store) -> Fut) -> Result<T>
    where
        Fut: std::future::Future<Output = Result<T>>,
    {
        path::validate(path)?;
        let store = &*self.inner.store;
        self.retrying(|| op(store)).await
    }

    /// Applies all operations atomically, or none.
    pub async fn multi(&self, ops: &[Op]) -> Result<Vec<OpResult>> {
        for op in ops {
            match op {
                Op::Create { path, mode, .. } => check_create_path(path, *mode)?,
                Op::Check { path, version }
                | Op::SetData { path, version, .. }
                | Op::Delete { path, version } => {
                    path::validate(path)?;
                    check_version(path, *version)?;
                }
            }
        }
        self.inner.store.multi(ops).await
    }

    /// Runs `op`, retrying it per the retry policy while it fails with a
    /// lost connection.
    pub(crate) async fn retrying<T, F, Fut>(&self, mut op: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut retry = 0;
        loop {
            match op().await {
                Err(e) if e.is_retryable() && self.retry_pause(retry).await => retry += 1,
                other => return other,
            }
        }
    }

    /// The pause before retry number `retry` (from 0) of an operation that
    /// failed on the connection, as the retry policy says; `false`, with no
    /// pause, once the policy's retries are spent, or once the timed wait
    /// (an acquire's timeout) this task runs is over: its pause ends with
    /// the wait at the latest.
    pub(crate) async fn retry_pause(&self, retry: u32) -> bool {
        let policy = self.inner.options.retry;
        let pause = crate::recipes::deadline::retry_pause_within(policy.sleep_for(retry));
        let Some(pause) = pause.filter(|_| retry < policy.max_retries) else {
            return false;
        };
        self.inner.retried.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(pause).await;
        true
    }

    /// Runs `attempt` again while it fails with `NoNode` — a container
    /// parent reaped between its creation and ours, or our ephemeral node
    /// gone with a lost session — or with `SessionExpired` — the server
    /// ended the session before the client knew (a revoked lease, a
    /// destroyed Consul session), so the next attempt runs in its
    /// successor, as Curator's retry loop goes on after `SESSIONEXPIRED` —
    /// at most the policy's `max_retries` times, then returns that error.
    ///
    /// The first retry goes at once, as Curator's `LockInternals` does: a
    /// single reap race is the common case and costs no wait. Later ones
    /// sleep the policy's backoff: a container reaped again and again means
    /// others are churning it, and an attempt that spins only adds to the
    /// churn (every retry is a create and a listing).
    pub(crate) async fn retrying_reaped<T, F, Fut>(&self, mut attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let policy = self.inner.options.retry;
        let mut retry = 0;
        loop {
            match attempt().await {
                Err(Error::NoNode { .. } | Error::SessionExpired) if retry < policy.max_retries => {
                    if retry > 0 {
                        // Bounded by a timed wait this task runs, as any
                        // retry's pause; past its end the next attempt goes
                        // at once, and answers as a wait whose deadline
                        // passed does.
                        let pause = policy.sleep_for(retry - 1);
                        let pause = crate::recipes::deadline::retry_pause_within(pause);
                        tokio::time::sleep(pause.unwrap_or_default()).await;
                    }
                    retry += 1;
                }
                other => return other,
            }
        }
    }

    /// A protection prefix (`_c_<uuid>-`) for a new protected node: a
    /// recycled one if there is one, else a new one.
    ///
    /// A node is only ever found by its prefix among this session's own
    /// nodes, so a prefix can be used again once its node is known to be
    /// gone — and should be on etcd: there a node name that is never used
    /// again leaves a tombstone that every listing of its directory scans
    /// until the next compaction, so a busy lock would slow down with
    /// every acquisition. A recycled prefix gives the next node of that
    /// directory the same key.
    pub(crate) fn protection_prefix(&self) -> String {
        let mut recycled = self
            .inner
            .recycled
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        recycled
            .pop()
            .unwrap_or_else(|| format!("_c_{}-", uuid::Uuid::new_v4()))
    }

    /// Marks the node at `path` created at `czxid` as a node of ours on its
    /// way out, until the mark is dropped (see
    /// [`is_departing`](Self::is_departing)).
    /// `czxid` [`ANY_CREATION`]: whatever node of ours is there (one whose
    /// create may still be on its way).
    pub(crate) fn departing(&self, path: &str, czxid: i64) -> Departure {
        let node = (path.to_string(), czxid);
        let mut departing = self.inner.departing.lock();
        let departing = departing.as_mut().unwrap_or_else(|e| e.get_mut());
        *departing.entry(node.clone()).or_default() += 1;
        Departure {
            session: self.clone(),
            node,
        }
    }

    /// Whether the node at `path` created at `czxid` is a node of ours on
    /// its way out in the background.
    pub(crate) fn is_departing(&self, path: &str, czxid: i64) -> bool {
        let departing = self.inner.departing.lock();
        let departing = departing.unwrap_or_else(|e| e.into_inner());
        [czxid, ANY_CREATION]
            .into_iter()
            .any(|czxid| departing.contains_key(&(path.to_string(), czxid)))
    }

    /// Returns the protection prefix of `node` (a protected node of this
    /// session that was just deleted) for reuse.
    fn recycle_prefix(&self, node: &str) {
        let Some(prefix) = path::protection_prefix(path::node_name(node)) else {
            return;
        };
        let mut recycled = self
            .inner
            .recycled
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if recycled.len() < RECYCLED_PREFIXES && !recycled.iter().any(|p| p == prefix) {
            recycled.push(prefix.to_string());
        }
    }

    /// Creates `parent/<prefix><name>` (`prefix` = `_c_<uuid>-`; parents as
    /// containers) the way
    /// Curator's protected mode does: if the reply is lost, the retry first
    /// looks for a node with our prefix and adopts it, unless it belongs to
    /// an older session (CURATOR-498), which is deleted instead. With
    /// `list`, the parent's children come back with the create, in one round
    /// trip where the backend can.
    ///
    /// Cancellation-safe: dropped unfinished, the create is finished in the
    /// background and the node it made is deleted. A request already sent
    /// may be applied after its caller gave up — on etcd even after a later
    /// request of the same client — so a clean-up that merely looked for
    /// the node could miss it.
    pub(crate) fn create_protected(
        &self,
        parent: &str,
        prefix: &str,
        name: &str,
        data: &[u8],
        mode: CreateMode,
        list: bool,
    ) -> ProtectedCreate {
        let session = self.clone();
        let full = path::join(parent, &format!("{prefix}{name}"));
        let (parent, prefix, data) = (parent.to_string(), prefix.to_string(), data.to_vec());
        // Owned, so that a dropped caller's create can finish in the
        // background.
        let create = async move {
            check_create_path(&full, mode)?;
            let opts = CreateOptions::new(mode).with_parents();
            let store = &session.inner.store;
            let mut retry = 0;
            loop {
                if retry > 0 {
                    match session.find_protected(&parent, &prefix, mode).await {
                        Ok(Some(created)) => {
                            // Ours, though its reply was lost: the store
                            // learns it as from that reply (its fence).
                            if created.path.starts_with(&full) {
                                let request = CreateRequest::new(&full, &data, opts);
                                store.learn_created(&request, &created);
                            }
                            let children = match list {
                                true => Some(
                                    session.retrying(|| store.children(&parent, false)).await?.0,
                                ),
                                false => None,
                            };
                            return Ok((created, children));
                        }
                        Ok(None) => {}
                        Err(e) if e.is_retryable() => {
                            if !session.backoff(&mut retry).await {
                                session.find_and_delete_in_background(&parent, prefix);
                                return Err(e);
                            }
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                }
                let request =
                    CreateRequest::new(&full, &data, opts).listing(list.then_some(&*parent));
                match create::run(&**store, request).await {
                    Err(e) if e.is_retryable() => {
                        if !session.backoff(&mut retry).await {
                            session.find_and_delete_in_background(&parent, prefix);
                            return Err(e);
                        }
                    }
                    other => return other,
                }
            }
        };
        ProtectedCreate {
            session: self.clone(),
            create: Some(Box::pin(create)),
        }
    }

    /// The protected create's pause before its try number `retry` + 1 (a
    /// retry first looks for the node its lost create may have made): the
    /// first two tries pause as the policy's first retry, and each one
    /// counts; `false` once [`retry_pause`](Self::retry_pause) says so.
    async fn backoff(&self, retry: &mut u32) -> bool {
        if *retry >= self.inner.options.retry.max_retries {
            return false;
        }
        let paused = self.retry_pause(retry.saturating_sub(1)).await;
        *retry += u32::from(paused);
        paused
    }

    /// Takes `created`, a node made without a sequence with `opts` and
    /// found ours after its create's reply was lost, as if from that reply:
    /// the store learns it (on etcd and Consul, its fence).
    pub(crate) fn adopt(&self, opts: CreateOptions, created: &Created) {
        if created.stat.ephemeral_owner == self.session_id() && !opts.mode.is_sequential() {
            let request = CreateRequest::new(&created.path, &[], opts);
            self.inner.store.learn_created(&request, created);
        }
    }

    async fn find_protected(
        &self,
        parent: &str,
        prefix: &str,
        mode: CreateMode,
    ) -> Result<Option<Created>> {
        let children = match self.inner.store.children(parent, false).await {
            Ok((children, _)) => children,
            Err(Error::NoNode { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(found) = children.into_iter().find(|c| c.name.starts_with(prefix)) else {
            return Ok(None);
        };
        let found = path::join(parent, &found.name);
        let Some(stat) = self.inner.store.exists(&found, false).await?.0 else {
            return Ok(None);
        };
        if mode.is_ephemeral() && stat.ephemeral_owner != self.session_id() {
            // Made by a session that is gone or going: not ours to adopt.
            // Gone before our create goes again, which may make the same
            // name (etcd's suffixes, a name without one): deleted later, in
            // the background, it could be our new node that goes.
            self.delete_created(&found, stat.czxid).await?;
            return Ok(None);
        }
        Ok(Some(Created { path: found, stat }))
    }

    /// Deletes a node, retrying lost connections; if that does not succeed,
    /// keeps trying in the background until the node is gone (Curator's
    /// guaranteed delete). A node that is already gone counts as deleted.
    pub(crate) async fn delete_guaranteed(&self, path: &str) -> Result<()> {
        self.delete_guaranteed_or_gone(path).await.map(drop)
    }

    /// [`delete_guaranteed`](Self::delete_guaranteed), telling whether the
    /// node was [`Gone`] before: a holder's release that finds its node
    /// gone was taken away (revoked by force) and must say so.
    pub(crate) async fn delete_guaranteed_or_gone(&self, path: &str) -> Result<Gone> {
        let mut tries = 0;
        let deleted = self
            .retrying(|| {
                tries += 1;
                self.inner.store.delete(path, None)
            })
            .await;
        match deleted {
            Ok(()) => Ok(Gone(false)),
            // After a retry, the node may be gone by our own delete whose
            // reply was lost.
            Err(Error::NoNode { .. }) => Ok(Gone(tries == 1)),
            Err(e) if e.is_retryable() => {
                self.delete_in_background(path.to_string());
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// [`delete_guaranteed_or_gone`](Self::delete_guaranteed_or_gone) for a
    /// protected node this session created (and deletes only here): once it
    /// is gone, its protection prefix is reused.
    pub(crate) async fn delete_protected(&self, path: &str) -> Result<Gone> {
        let gone = self.delete_guaranteed_or_gone(path).await?;
        self.recycle_prefix(path);
        Ok(gone)
    }

    /// [`delete_protected`](Self::delete_protected) only if the node at
    /// `path` is still the one created at `czxid` (on etcd a name comes
    /// back on a newer node): for a deleter that is not the holder's own
    /// release, which may come after the node was deleted and made again.
    /// [`Gone`] if someone else removed it first.
    pub(crate) async fn delete_protected_created(&self, path: &str, czxid: i64) -> Result<Gone> {
        let gone = self.delete_created(path, czxid).await?;
        if gone == Gone(false) {
            self.recycle_prefix(path);
        }
        Ok(gone)
    }

    /// Deletes the node at `path` only if it is the one created at `czxid`;
    /// [`Gone`] if someone else removed it first (then the node there, if
    /// any, is another). One round trip where the store fences its
    /// session's deletes, two elsewhere. Guaranteed, as
    /// [`delete_guaranteed`](Self::delete_guaranteed) is: if the
    /// connection fails through every retry, the delete goes on in the
    /// background (a hold that ran out would otherwise keep its node, and
    /// its waiters, until the session ends).
    pub(crate) async fn delete_created(&self, path: &str, czxid: i64) -> Result<Gone> {
        match self.inner.store.deletes_only_created(path, czxid) {
            Some(true) => self.delete_guaranteed_or_gone(path).await,
            Some(false) => Ok(Gone(true)),
            None => self.delete_created_by_reading(path, czxid, None).await,
        }
    }

    /// [`delete_created`](Self::delete_created) for a caller that needs it
    /// only done, not answered: a failure on the connection is `Ok`, the
    /// delete going on in the background.
    pub(crate) async fn delete_created_eventually(&self, path: &str, czxid: i64) -> Result<()> {
        match self.delete_created(path, czxid).await {
            Err(e) if !e.is_retryable() => Err(e),
            _ => Ok(()),
        }
    }

    /// [`delete_created`](Self::delete_created) of a node just read, at
    /// `version`, on a store that does not fence deletes by creation: the
    /// first delete goes on that version, without reading it again.
    pub(crate) async fn delete_created_read(
        &self,
        path: &str,
        czxid: i64,
        version: i32,
    ) -> Result<Gone> {
        self.delete_created_by_reading(path, czxid, Some(version))
            .await
    }

    /// [`delete_created`](Self::delete_created) on a store that does not
    /// fence deletes by creation: reads the node's (unless `read` tells
    /// its version already), then deletes on its version; guaranteed.
    async fn delete_created_by_reading(
        &self,
        path: &str,
        czxid: i64,
        read: Option<i32>,
    ) -> Result<Gone> {
        let deleted = self.delete_created_once(path, czxid, read).await;
        if deleted.as_ref().is_err_and(Error::is_retryable) {
            let path = path.to_string();
            self.retry_in_background(move |session| {
                let path = path.clone();
                async move {
                    let deleted = session.delete_created_once(&path, czxid, None).await;
                    deleted.map(drop)
                }
            });
        }
        deleted
    }

    /// One [`delete_created_by_reading`](Self::delete_created_by_reading),
    /// through the retry policy. A delete that goes unanswered is not sent
    /// again as it was: the whole attempt is, reading the node again first.
    /// Its version alone does not name it — a node made at the name since
    /// (the next member of a group, the next holder of a shared name)
    /// starts at the same version 0, and a resent delete would take it.
    async fn delete_created_once(
        &self,
        path: &str,
        czxid: i64,
        mut read: Option<i32>,
    ) -> Result<Gone> {
        let unanswered = AtomicBool::new(false);
        let attempt = || {
            let mut version = read.take();
            let unanswered = &unanswered;
            async move {
                loop {
                    let now = match version.take() {
                        Some(version) => version,
                        None => match self.inner.store.exists(path, false).await? {
                            (Some(stat), _) if stat.czxid == czxid => stat.version,
                            // Gone, or another node: our unanswered delete
                            // may have landed; if none was sent, someone
                            // else's did.
                            _ => return Ok(Gone(!unanswered.load(Ordering::Relaxed))),
                        },
                    };
                    match self.inner.store.delete(path, Some(now)).await {
                        Ok(()) | Err(Error::NoNode { .. }) => return Ok(Gone(false)),
                        // Its data changed meanwhile (a revocation request).
                        Err(Error::BadVersion { .. }) => {}
                        Err(e) => {
                            unanswered.fetch_or(e.is_retryable(), Ordering::Relaxed);
                            return Err(e);
                        }
                    }
                }
            }
        };
        self.retrying(attempt).await
    }

    /// Deletes a node in the background, retrying until it is gone or the
    /// session is closed.
    pub(crate) fn delete_in_background(&self, path: String) {
        self.retry_in_background(move |session| {
            let path = path.clone();
            async move {
                match session.inner.store.delete(&path, None).await {
                    Err(Error::NoNode { .. }) | Err(Error::Closed) => Ok(()),
                    Err(e) if !e.is_retryable() => {
                        tracing::warn!(%path, error = %e, "background delete failed");
                        Ok(())
                    }
                    deleted => deleted,
                }
            }
        });
    }

    /// Finds the node a protected create may have made and deletes it, in
    /// the background (Curator's `FindAndDeleteProtectedNodeInBackground`).
    pub(crate) fn find_and_delete_in_background(&self, parent: &str, prefix: String) {
        let parent = parent.to_string();
        self.retry_in_background(move |session| {
            let (parent, prefix) = (parent.clone(), prefix.clone());
            async move {
                let (children, _) = session.inner.store.children(&parent, false).await?;
                for c in children.iter().filter(|c| c.name.starts_with(&prefix)) {
                    let _ = session
                        .delete_guaranteed(&path::join(&parent, &c.name))
                        .await;
                }
                Ok(())
            }
        });
    }

    /// Runs `attempt` in the background until it ends other than with a
    /// retryable error, pausing between tries as the retry policy says
    /// (the session's retries were spent in the foreground already).
    pub(crate) fn retry_in_background<F, Fut>(&self, mut attempt: F)
    where
        F: FnMut(Session) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<()>> + Send,
    {
        let session = self.clone();
        self.spawn_background(async move {
            let mut retry = 0;
            while attempt(session.clone())
                .await
                .is_err_and(|e| e.is_retryable())
            {
                session.background_pause(retry).await;
                retry += 1;
            }
        });
    }

    /// The pause of a background loop before its try number `retry` + 1
    /// after a retryable failure: as the retry policy says, and at least
    /// [`BACKGROUND_PAUSE`], whatever the policy (one that never sleeps —
    /// a counter's single optimistic try — would make a loop that outlives
    /// every retry spin).
    pub(crate) async fn background_pause(&self, retry: u32) {
        let pause = self.inner.options.retry.sleep_for(retry.min(8));
        tokio::time::sleep(pause.max(BACKGROUND_PAUSE)).await;
    }

    /// Runs a future in the background, counted by
    /// [`background_tasks`](Self::background_tasks), on the runtime of the
    /// caller; from `Drop` outside any runtime too, on the one the session
    /// was created on.
    pub(crate) fn spawn_background(
        &self,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let Some(runtime) = tokio::runtime::Handle::try_current()
            .ok()
            .or_else(|| self.inner.runtime.clone())
        else {
            tracing::warn!("no tokio runtime: background task dropped");
            return;
        };
        self.inner.background.send_modify(|n| *n += 1);
        let counted = Counted(self.inner.background.clone());
        runtime.spawn(async move {
            let _counted = counted;
            task.await;
        });
    }
}

/// One background task counted: uncounted when it ends — also when it
/// panics, or is dropped unfinished with its runtime (else
/// [`background_idle`](Session::background_idle) would wait for it for
/// ever).
struct Counted(watch::Sender<usize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

/// Counts the session's state changes in the `dlock_session_state_changes_total`
/// metric, until the store goes away.
fn count_state_changes(store: &dyn Store) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let mut status = store.status();
    let backend = store.backend().to_string();
    runtime.spawn(async move {
        while status.changed().await.is_ok() {
            let state = format!("{:?}", status.borrow_and_update().state).to_lowercase();
            tracing::debug!(%backend, %state, "session state");
            metrics::counter!("dlock_session_state_changes_total", "backend" => backend.clone(), "state" => state)
                .increment(1);
        }
    });
}

/// The watch a read was asked to arm (the contract says it always is).
fn armed(watch: Option<Watch>) -> Watch {
    watch.expect("the store armed the requested watch")
}

/// The shortest pause of a background retry loop
/// ([`Session::background_pause`]).
const BACKGROUND_PAUSE: Duration = Duration::from_millis(10);

/// Version -1 is refused: ZooKeeper takes it for "any version", the other
/// stores for none, and a compare-and-set must not mean one thing on one
/// store and another on the next (`None` is "any"). Other negative
/// versions are a node's own: ZooKeeper's (and the embedded store's)
/// versions wrap past 2^31 writes (ZOOKEEPER-4743), and a compare-and-set
/// on them goes on working (CURATOR-688).
fn check_version(path: &str, version: Option<i32>) -> Result<()> {
    match version {
        Some(-1) => Err(Error::InvalidArgument(format!(
            "version -1 of {path}: ZooKeeper reads -1 as any version, so no \
             compare-and-set can name it (a node's version reaches -1 once in 2^32 \
             writes; None matches any version)"
        ))),
        _ => Ok(()),
    }
}

fn check_create_path(path: &str, mode: CreateMode) -> Result<()> {
    if mode.is_sequential() {
        // The store appends the sequence, so `/x/lock-` is legal.
        path::validate(&format!("{path}0000000000"))
    } else {
        path::validate(path)
    }
}

/// What a protected create gives: the node, and the parent's children if
/// asked for.
pub(crate) type ProtectedCreated = Result<(Created, Option<Vec<Child>>)>;

/// A protected create in flight (see [`Session::create_protected`]): if
/// dropped before it finishes, it is finished in the background and the
/// node it made is deleted.
pub(crate) struct ProtectedCreate {
    session: Session,
    create: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ProtectedCreated> + Send>>>,
}

impl std::future::Future for ProtectedCreate {
    type Output = ProtectedCreated;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<ProtectedCreated> {
        let create = self.create.as_mut().expect("polled after it finished");
        let created = std::task::ready!(create.as_mut().poll(cx));
        self.create = None;
        std::task::Poll::Ready(created)
    }
}

impl Drop for ProtectedCreate {
    fn drop(&mut self) {
        if let Some(create) = self.create.take() {
            let session = self.session.clone();
            self.session.spawn_background(async move {
                if let Ok((created, _)) = create.await {
                    let _ = session.delete_guaranteed(&created.path).await;
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two removals mark one node (a cancelled acquire's and its retry's):
    /// the first to finish leaves the other's mark.
    #[tokio::test]
    async fn a_node_marked_twice_departs_until_both_marks_go() {
        let session = crate::connect("embedded").await.unwrap();
        let first = session.departing("/a", ANY_CREATION);
        let second = session.departing("/a", ANY_CREATION);
        drop(first);
        assert!(session.is_departing("/a", 7));
        drop(second);
        assert!(!session.is_departing("/a", 7));
        session.close().await;
    }
}
