//! The embedded store: ZooKeeper's data model and session semantics inside
//! the process, for demos, tests and single-process use.
//!
//! One [`EmbeddedServer`] plays the ensemble; every session connected to it
//! behaves like a separate process (its own ephemeral nodes, watches and
//! session state). It follows ZooKeeper 3.8 where recipes can tell:
//! sequence suffix = the parent's count of child creations formatted `%010d`,
//! ephemeral nodes removed when their session closes or expires, containers
//! reaped once emptied, versions, one-shot watches, one global transaction
//! id. Its sessions can be made to fail on purpose ([`Faults`]).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
//! use dlock::store::embedded::EmbeddedServer;
//! let server = EmbeddedServer::new();
//! let a = server.connect_default().await?;
//! let b = server.connect_default().await?;
//! assert_ne!(a.session_id(), b.session_id());
//! # Ok(()) }
//! ```

mod tree;

use std::sync::{Arc, Mutex as StdMutex, OnceLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::oneshot;

use self::tree::{Fired, Tree};
use super::create::CreateRequest;
use super::status::{GrantedTimeout, Renewal, SessionMachine, StatusMachine};
use super::{
    BackendKind, Child, Created, Faults, Op, OpResult, SessionId, Stat, Store, Watch, WatchEvent,
};
use crate::error::{Error, Result};
use crate::options::SessionOptions;

/// Settings of an embedded server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbeddedOptions {
    /// How often emptied containers are looked for and deleted (ZooKeeper's
    /// `znode.container.checkIntervalMs`, whose default is 60 s).
    pub container_check_interval: Duration,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            container_check_interval: Duration::from_millis(100),
        }
    }
}

/// An in-process coordination store with ZooKeeper semantics. Cheap to
/// clone; clones share the same tree.
#[derive(Clone)]
pub struct EmbeddedServer {
    server: Arc<Server>,
}

impl std::fmt::Debug for EmbeddedServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedServer").finish_non_exhaustive()
    }
}

impl Default for EmbeddedServer {
    fn default() -> Self {
        Self::new()
    }
}

impl EmbeddedServer {
    /// A new, empty store with default options.
    pub fn new() -> Self {
        Self::with_options(EmbeddedOptions::default())
    }

    /// A new, empty store.
    pub fn with_options(options: EmbeddedOptions) -> Self {
        let server = Arc::new(Server {
            tree: StdMutex::new(Tree::new()),
            options,
        });
        start_reaper(Arc::downgrade(&server), options.container_check_interval);
        EmbeddedServer { server }
    }

    /// The process-wide store that the endpoint `embedded` connects to.
    pub fn global() -> &'static EmbeddedServer {
        static GLOBAL: OnceLock<EmbeddedServer> = OnceLock::new();
        GLOBAL.get_or_init(EmbeddedServer::new)
    }

    /// Opens a new client of this store (its own session), for
    /// [`Session`](crate::Session) to wrap: see `EmbeddedServer::connect`.
    pub fn open(&self, options: &SessionOptions) -> Arc<dyn Store> {
        Arc::new(EmbeddedStore::open(
            self.server.clone(),
            options.session_timeout,
        ))
    }

    /// A bare store (no [`Session`](crate::Session) around it), for the
    /// crate's own tests of store wrappers.
    #[cfg(test)]
    pub(crate) fn open_store(&self) -> impl Store {
        EmbeddedStore::open(self.server.clone(), Duration::from_secs(10))
    }

    /// How many nodes the store holds, the root included (for tests).
    pub fn node_count(&self) -> usize {
        self.server.lock().node_count()
    }

    /// Counts of armed watches and delivered notifications (for tests: a
    /// waiter should cost one watch, and a release should wake one waiter).
    pub fn watch_stats(&self) -> WatchStats {
        self.server.lock().watch_stats()
    }

    /// How many sessions are open.
    pub fn session_count(&self) -> usize {
        self.server.lock().session_count()
    }
}

/// Watch counters of an [`EmbeddedServer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchStats {
    /// Armed watches on nodes (`get_data`, `exists`).
    pub node_watches: usize,
    /// Armed watches on children (`children`).
    pub child_watches: usize,
    /// Node-watch notifications delivered so far.
    pub node_notifications: u64,
    /// Child-watch notifications delivered so far.
    pub child_notifications: u64,
}

struct Server {
    tree: StdMutex<Tree>,
    #[allow(dead_code)]
    options: EmbeddedOptions,
}

impl Server {
    fn lock(&self) -> std::sync::MutexGuard<'_, Tree> {
        // A panic while holding the lock leaves the tree consistent (every
        // mutation is validated before it is applied), so poisoning is moot.
        self.tree.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the tree, then delivers the watch events it produced
    /// outside the lock.
    fn apply<T>(&self, f: impl FnOnce(&mut Tree, &mut Vec<Fired>) -> T) -> T {
        let mut fired = Vec::new();
        let result = {
            let mut tree = self.lock();
            f(&mut tree, &mut fired)
        };
        for (tx, event) in fired {
            let _ = tx.send(event);
        }
        result
    }
}

/// Container reaping runs on its own thread, so it works whichever runtime
/// (or none) the sessions use, and ends with the server.
fn start_reaper(server: Weak<Server>, interval: Duration) {
    let spawned = std::thread::Builder::new()
        .name("dlock-embedded-reaper".into())
        .spawn(move || loop {
            std::thread::sleep(interval);
            let Some(server) = server.upgrade() else {
                return;
            };
            server.apply(|tree, fired| tree.reap_containers(fired));
        });
    if let Err(e) = spawned {
        tracing::warn!("embedded store: no container reaper thread: {e}");
    }
}

/// A client of an [`EmbeddedServer`]: one session at a time, renewed after
/// it is lost.
pub(crate) struct EmbeddedStore {
    server: Arc<Server>,
    /// The session's state.
    machine: Arc<StatusMachine<SessionSlot>>,
}

/// What the status machine keeps per session: its id (the session itself
/// lives in the tree) and its timeout (the one the store was opened with).
struct SessionSlot {
    id: SessionId,
    timeout: Duration,
}

impl GrantedTimeout for SessionSlot {
    fn granted_timeout(&self) -> Duration {
        self.timeout
    }
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore")
            .field("status", &self.machine)
            .finish_non_exhaustive()
    }
}

impl EmbeddedStore {
    fn open(server: Arc<Server>, timeout: Duration) -> Self {
        let session_id = server.lock().open_session();
        let slot = SessionSlot {
            id: session_id,
            timeout,
        };
        EmbeddedStore {
            server,
            machine: Arc::new(StatusMachine::new(session_id, slot)),
        }
    }

    /// The session to run an operation in: waits out a suspension, and opens
    /// a new session after a loss.
    async fn session(&self) -> Result<SessionId> {
        self.machine.ready_session(|lost| self.renew(lost)).await
    }

    async fn renew(&self, lost: SessionId) -> Result<()> {
        let timeout = self.session_timeout();
        let open = || async {
            let id = self.server.lock().open_session();
            Ok((id, SessionSlot { id, timeout }))
        };
        if let Renewal::Abandoned(session) = self.machine.renew(lost, open).await? {
            // Closed while the new session was opened.
            self.server.apply(|t, f| t.end_session(session.id, f));
        }
        Ok(())
    }

    /// Runs `op` on the tree in the current session; marks the session lost
    /// if the server no longer knows it.
    async fn run<T>(
        &self,
        op: impl FnOnce(&mut Tree, SessionId, &mut Vec<Fired>) -> Result<T>,
    ) -> Result<T> {
        self.run_watched(false, op).await.map(|(done, _)| done)
    }

    /// [`run`](Self::run), for a read that arms a watch if `watch`: with
    /// the session's status channel, subscribed before the read, so that a
    /// change while it runs (a suspension from another thread) fires it.
    async fn run_watched<T>(
        &self,
        watch: bool,
        op: impl FnOnce(&mut Tree, SessionId, &mut Vec<Fired>) -> Result<T>,
    ) -> Result<(
        T,
        Option<tokio::sync::watch::Receiver<crate::store::SessionStatus>>,
    )> {
        // Every operation spends the task's cooperative budget, as network
        // I/O would: a loop of operations that never waits must still let
        // other tasks run (on a current-thread runtime it would starve them).
        tokio::task::consume_budget().await;
        let session = self.session().await?;
        let status = watch.then(|| self.machine.subscribe());
        let result = self.server.apply(|tree, fired| {
            tree.check_session(session)?;
            op(tree, session, fired)
        });
        if matches!(result, Err(Error::SessionExpired)) {
            self.machine.lose(session);
        }
        result.map(|done| (done, status))
    }

    /// The watch of a read that [`run_watched`](Self::run_watched).
    fn watch(
        rx: Option<oneshot::Receiver<WatchEvent>>,
        status: Option<tokio::sync::watch::Receiver<crate::store::SessionStatus>>,
    ) -> Option<Watch> {
        Some(Watch::since_read(rx?, status?))
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        let session = self.machine.snapshot().session_id;
        self.server.apply(|t, f| t.end_session(session, f));
    }
}

#[async_trait]
impl Store for EmbeddedStore {
    fn backend(&self) -> BackendKind {
        BackendKind::Embedded
    }

    fn machine(&self) -> &dyn SessionMachine {
        &*self.machine
    }

    async fn create_in(&self, request: CreateRequest<'_>) -> Result<(Created, Option<Vec<Child>>)> {
        self.run(|t, s, f| {
            let created = t.create_with(s, request.path, request.data, request.opts, f)?;
            let listed = request.list.map(|list| t.list(list)).transpose()?;
            Ok((created, listed))
        })
        .await
    }

    async fn delete(&self, path: &str, version: Option<i32>) -> Result<()> {
        self.machine.lost_replies.failing_delete()?;
        self.run(|t, _, f| t.delete(path, version, f, None)).await?;
        self.machine.lost_delete_reply()
    }

    async fn set_data(&self, path: &str, data: &[u8], version: Option<i32>) -> Result<Stat> {
        self.machine.lost_replies.failing_set()?;
        self.run(|t, _, f| t.set_data(path, data, version, f, None))
            .await
    }

    async fn get_data(&self, path: &str, watch: bool) -> Result<(Vec<u8>, Stat, Option<Watch>)> {
        self.machine.lost_replies.failing_read()?;
        let ((data, stat, rx), status) = self
            .run_watched(watch, |t, s, _| t.get_data(path, watch.then_some(s)))
            .await?;
        Ok((data, stat, Self::watch(rx, status)))
    }

    async fn exists(&self, path: &str, watch: bool) -> Result<(Option<Stat>, Option<Watch>)> {
        self.machine.lost_replies.failing_read()?;
        let ((stat, rx), status) = self
            .run_watched(watch, |t, s, _| Ok(t.exists(path, watch.then_some(s))))
            .await?;
        Ok((stat, Self::watch(rx, status)))
    }

    async fn children(&self, path: &str, watch: bool) -> Result<(Vec<Child>, Option<Watch>)> {
        self.machine.lost_replies.failing_read()?;
        let ((children, rx), status) = self
            .run_watched(watch, |t, s, _| t.children(path, watch.then_some(s)))
            .await?;
        Ok((children, Self::watch(rx, status)))
    }

    async fn multi(&self, ops: &[Op]) -> Result<Vec<OpResult>> {
        self.run(|t, s, f| t.multi(s, ops, f)).await
    }

    fn faults(&self) -> Option<&dyn Faults> {
        Some(self)
    }

    async fn close(&self) {
        // Closed first: a watcher woken by the session's deletions must find
        // the store closed, not a lost session to renew (and lead again in).
        self.machine.shut(|_| ());
        let session = self.machine.snapshot().session_id;
        self.server.apply(|t, f| t.end_session(session, f));
    }
}

#[async_trait]
impl Faults for EmbeddedStore {
    fn suspend(&self, duration: Duration) {
        let Some(suspension) = self.machine.begin_suspension() else {
            return;
        };
        let timeout = self.session_timeout();
        let expires = duration >= timeout;
        let server = Arc::downgrade(&self.server);
        let machine = Arc::downgrade(&self.machine);
        let wait = if expires { timeout } else { duration };
        let end = move || {
            let Some(machine) = machine.upgrade() else {
                return;
            };
            if !expires {
                if machine.end_suspension(suspension) {
                    machine.connected(suspension.session);
                }
            } else if machine.in_force(suspension) {
                if let Some(server) = server.upgrade() {
                    server.apply(|t, f| t.end_session(suspension.session, f));
                }
                machine.lose(suspension.session);
            }
        };
        // On the caller's runtime (whose clock tests may pause), or, called
        // from outside one (the blocking API), on a thread of its own.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(async move {
                tokio::time::sleep(wait).await;
                end();
            })),
            Err(_) => drop(std::thread::spawn(move || {
                std::thread::sleep(wait);
                end();
            })),
        }
    }

    async fn expire(&self) -> Result<()> {
        // Closed: `Closed`, as the other stores answer.
        self.machine
            .expire_with(|session| async move {
                self.server.apply(|t, f| t.end_session(session, f));
                self.machine.lose(session);
                Ok(())
            })
            .await
    }

    /// The next operation finds the session gone (and loses it).
    async fn end_on_server(&self) -> Result<()> {
        self.machine
            .expire_with(|session| async move {
                self.server.apply(|t, f| t.end_session(session, f));
                Ok(())
            })
            .await
    }

    fn lose_next_create_reply(&self) {
        self.machine.lost_replies.create.arm();
    }

    fn lose_next_delete_reply(&self) {
        self.machine.lost_replies.delete.arm();
    }

    fn fail_next_reads(&self, n: u32) {
        self.machine.lost_replies.fail_reads(n);
    }

    fn fail_next_sets(&self, n: u32) {
        self.machine.lost_replies.fail_sets(n);
    }

    fn fail_next_deletes(&self, n: u32) {
        self.machine.lost_replies.fail_deletes(n);
    }

    fn fail_next_creates(&self, n: u32) {
        self.machine.lost_replies.fail_creates(n);
    }
}
