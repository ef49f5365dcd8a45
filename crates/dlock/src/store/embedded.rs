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

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex as StdMutex, OnceLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{oneshot, watch};

use super::status::{Renewal, StatusMachine};
use super::{
    BackendKind, Child, CreateMode, CreateOptions, Created, Faults, Op, OpResult, SessionId,
    SessionStatus, Stat, Store, Watch, WatchEvent,
};
use crate::error::{Error, Result};
use crate::options::SessionOptions;
use crate::path;

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
        self.server.lock().nodes.len()
    }

    /// Counts of armed watches and delivered notifications (for tests: a
    /// waiter should cost one watch, and a release should wake one waiter).
    pub fn watch_stats(&self) -> WatchStats {
        let tree = self.server.lock();
        let count = |m: &HashMap<String, Vec<Watcher>>| m.values().map(Vec::len).sum::<usize>();
        WatchStats {
            node_watches: count(&tree.node_watches),
            child_watches: count(&tree.child_watches),
            node_notifications: tree.node_notifications,
            child_notifications: tree.child_notifications,
        }
    }

    /// How many sessions are open.
    pub fn session_count(&self) -> usize {
        self.server.lock().sessions.len()
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

type Fired = (oneshot::Sender<WatchEvent>, WatchEvent);

struct Watcher {
    session: SessionId,
    tx: oneshot::Sender<WatchEvent>,
}

#[derive(Clone)]
struct Node {
    data: Vec<u8>,
    stat: Stat,
    mode: CreateMode,
    children: BTreeSet<String>,
    /// Child creations so far: the next sequence suffix. ZooKeeper 3.8
    /// numbers sequential children by creations only, although its
    /// `cversion` also counts deletions (measured on a real server).
    creations: i32,
}

/// What a multi-operation must put back if a later operation fails.
enum Undo {
    Created {
        path: String,
        parent_stat: Stat,
    },
    Deleted {
        path: String,
        node: Node,
        parent_stat: Stat,
    },
    DataSet {
        path: String,
        data: Vec<u8>,
        stat: Stat,
    },
}

struct Tree {
    nodes: HashMap<String, Node>,
    zxid: i64,
    next_session: i64,
    sessions: HashMap<SessionId, HashSet<String>>,
    /// Watches armed by `get_data`/`exists`: fire on create, delete, set.
    node_watches: HashMap<String, Vec<Watcher>>,
    /// Watches armed by `children`: fire on child create/delete or delete.
    child_watches: HashMap<String, Vec<Watcher>>,
    /// Containers that became empty: checked by the reaper.
    reap_candidates: HashSet<String>,
    node_notifications: u64,
    child_notifications: u64,
}

impl Tree {
    fn new() -> Self {
        let mut nodes = HashMap::new();
        nodes.insert(
            "/".to_string(),
            Node {
                data: Vec::new(),
                stat: Stat::default(),
                mode: CreateMode::Persistent,
                children: BTreeSet::new(),
                creations: 0,
            },
        );
        Tree {
            nodes,
            zxid: 0,
            // Shaped like ZooKeeper's ids (server id in the top byte).
            next_session: 0x0100_0000_0000_0001,
            sessions: HashMap::new(),
            node_watches: HashMap::new(),
            child_watches: HashMap::new(),
            reap_candidates: HashSet::new(),
            node_notifications: 0,
            child_notifications: 0,
        }
    }

    fn open_session(&mut self) -> SessionId {
        let id = self.next_session;
        self.next_session += 1;
        self.sessions.insert(id, HashSet::new());
        id
    }

    fn check_session(&self, session: SessionId) -> Result<()> {
        if self.sessions.contains_key(&session) {
            Ok(())
        } else {
            Err(Error::SessionExpired)
        }
    }

    /// Ends a session: deletes its ephemeral nodes (one transaction, as
    /// ZooKeeper's closeSession) and drops its watches.
    fn end_session(&mut self, session: SessionId, fired: &mut Vec<Fired>) {
        let Some(ephemerals) = self.sessions.remove(&session) else {
            return;
        };
        if !ephemerals.is_empty() {
            self.zxid += 1;
            let mut paths: Vec<_> = ephemerals.into_iter().collect();
            paths.sort();
            for path in paths {
                let _ = self.delete(&path, None, fired, None);
            }
        }
        for watches in [&mut self.node_watches, &mut self.child_watches] {
            for list in watches.values_mut() {
                list.retain(|w| w.session != session);
            }
            watches.retain(|_, list| !list.is_empty());
        }
    }

    fn fire(
        map: &mut HashMap<String, Vec<Watcher>>,
        path: &str,
        event: WatchEvent,
        fired: &mut Vec<Fired>,
        count: &mut u64,
    ) {
        if let Some(list) = map.remove(path) {
            for w in list {
                *count += 1;
                fired.push((w.tx, event));
            }
        }
    }

    fn create(
        &mut self,
        session: SessionId,
        path: &str,
        data: &[u8],
        mode: CreateMode,
        fired: &mut Vec<Fired>,
        undo: Option<&mut Vec<Undo>>,
    ) -> Result<Created> {
        let parent_path = path::parent(path);
        let parent = self.nodes.get(parent_path).ok_or_else(|| Error::NoNode {
            path: parent_path.to_string(),
        })?;
        if parent.mode.is_ephemeral() {
            return Err(Error::NoChildrenForEphemerals {
                path: parent_path.to_string(),
            });
        }
        let full = if mode.is_sequential() {
            format!("{path}{:010}", parent.creations)
        } else {
            path.to_string()
        };
        if self.nodes.contains_key(&full) {
            return Err(Error::NodeExists { path: full });
        }
        self.zxid += 1;
        let zxid = self.zxid;
        let parent = self.nodes.get_mut(parent_path).expect("checked above");
        if let Some(undo) = undo {
            undo.push(Undo::Created {
                path: full.clone(),
                parent_stat: parent.stat,
            });
        }
        parent.children.insert(path::node_name(&full).to_string());
        parent.creations += 1;
        parent.stat.cversion += 1;
        parent.stat.num_children += 1;
        let stat = Stat {
            czxid: zxid,
            mzxid: zxid,
            version: 0,
            cversion: 0,
            ephemeral_owner: if mode.is_ephemeral() { session } else { 0 },
            num_children: 0,
            data_length: data.len() as i32,
        };
        self.nodes.insert(
            full.clone(),
            Node {
                data: data.to_vec(),
                stat,
                mode,
                children: BTreeSet::new(),
                creations: 0,
            },
        );
        if mode.is_ephemeral() {
            if let Some(owned) = self.sessions.get_mut(&session) {
                owned.insert(full.clone());
            }
        }
        let (nn, cn) = (&mut self.node_notifications, &mut self.child_notifications);
        Self::fire(
            &mut self.node_watches,
            &full,
            WatchEvent::NodeCreated,
            fired,
            nn,
        );
        Self::fire(
            &mut self.child_watches,
            parent_path,
            WatchEvent::ChildrenChanged,
            fired,
            cn,
        );
        Ok(Created { path: full, stat })
    }

    /// Creates the missing ancestors of `path` as empty containers, each in
    /// its own transaction, as Curator's `mkdirs` does.
    fn create_parents(
        &mut self,
        session: SessionId,
        path: &str,
        fired: &mut Vec<Fired>,
    ) -> Result<()> {
        for ancestor in path::ancestors(path) {
            if !self.nodes.contains_key(ancestor) {
                self.create(session, ancestor, &[], CreateMode::Container, fired, None)?;
            }
        }
        Ok(())
    }

    fn delete(
        &mut self,
        path: &str,
        version: Option<i32>,
        fired: &mut Vec<Fired>,
        undo: Option<&mut Vec<Undo>>,
    ) -> Result<()> {
        if path == "/" {
            return Err(Error::InvalidArgument("the root cannot be deleted".into()));
        }
        let node = self.nodes.get(path).ok_or_else(|| Error::NoNode {
            path: path.to_string(),
        })?;
        if version.is_some_and(|v| v != node.stat.version) {
            return Err(Error::BadVersion {
                path: path.to_string(),
            });
        }
        if !node.children.is_empty() {
            return Err(Error::NotEmpty {
                path: path.to_string(),
            });
        }
        let node = self.nodes.remove(path).expect("checked above");
        if node.stat.ephemeral_owner != 0 {
            if let Some(owned) = self.sessions.get_mut(&node.stat.ephemeral_owner) {
                owned.remove(path);
            }
        }
        self.reap_candidates.remove(path);
        let parent_path = path::parent(path);
        let parent = self
            .nodes
            .get_mut(parent_path)
            .expect("a node's parent exists");
        if let Some(undo) = undo {
            undo.push(Undo::Deleted {
                path: path.to_string(),
                node,
                parent_stat: parent.stat,
            });
        }
        parent.children.remove(path::node_name(path));
        parent.stat.cversion += 1;
        parent.stat.num_children -= 1;
        if parent.mode == CreateMode::Container && parent.children.is_empty() {
            self.reap_candidates.insert(parent_path.to_string());
        }
        let (nn, cn) = (&mut self.node_notifications, &mut self.child_notifications);
        Self::fire(
            &mut self.node_watches,
            path,
            WatchEvent::NodeDeleted,
            fired,
            nn,
        );
        Self::fire(
            &mut self.child_watches,
            path,
            WatchEvent::NodeDeleted,
            fired,
            cn,
        );
        Self::fire(
            &mut self.child_watches,
            parent_path,
            WatchEvent::ChildrenChanged,
            fired,
            cn,
        );
        Ok(())
    }

    fn set_data(
        &mut self,
        path: &str,
        data: &[u8],
        version: Option<i32>,
        fired: &mut Vec<Fired>,
        undo: Option<&mut Vec<Undo>>,
    ) -> Result<Stat> {
        let node = self.nodes.get_mut(path).ok_or_else(|| Error::NoNode {
            path: path.to_string(),
        })?;
        if version.is_some_and(|v| v != node.stat.version) {
            return Err(Error::BadVersion {
                path: path.to_string(),
            });
        }
        self.zxid += 1;
        if let Some(undo) = undo {
            undo.push(Undo::DataSet {
                path: path.to_string(),
                data: std::mem::replace(&mut node.data, data.to_vec()),
                stat: node.stat,
            });
        } else {
            node.data = data.to_vec();
        }
        node.stat.version = node.stat.version.wrapping_add(1);
        node.stat.mzxid = self.zxid;
        node.stat.data_length = data.len() as i32;
        let stat = node.stat;
        Self::fire(
            &mut self.node_watches,
            path,
            WatchEvent::DataChanged,
            fired,
            &mut self.node_notifications,
        );
        Ok(stat)
    }

    fn rollback(&mut self, undo: Vec<Undo>, zxid: i64) {
        for step in undo.into_iter().rev() {
            match step {
                Undo::Created { path, parent_stat } => {
                    if let Some(node) = self.nodes.remove(&path) {
                        if let Some(owned) = self.sessions.get_mut(&node.stat.ephemeral_owner) {
                            owned.remove(&path);
                        }
                    }
                    let parent = self
                        .nodes
                        .get_mut(path::parent(&path))
                        .expect("parent exists");
                    parent.children.remove(path::node_name(&path));
                    parent.stat = parent_stat;
                    parent.creations -= 1;
                }
                Undo::Deleted {
                    path,
                    node,
                    parent_stat,
                } => {
                    if let Some(owned) = self.sessions.get_mut(&node.stat.ephemeral_owner) {
                        owned.insert(path.clone());
                    }
                    let parent = self
                        .nodes
                        .get_mut(path::parent(&path))
                        .expect("parent exists");
                    parent.children.insert(path::node_name(&path).to_string());
                    parent.stat = parent_stat;
                    self.nodes.insert(path, node);
                }
                Undo::DataSet { path, data, stat } => {
                    let node = self.nodes.get_mut(&path).expect("node exists");
                    node.data = data;
                    node.stat = stat;
                }
            }
        }
        self.zxid = zxid;
    }

    fn multi(
        &mut self,
        session: SessionId,
        ops: &[Op],
        fired: &mut Vec<Fired>,
    ) -> Result<Vec<OpResult>> {
        let start_zxid = self.zxid;
        let mut undo = Vec::new();
        // Watches fire only if the whole transaction commits.
        let mut pending = Vec::new();
        let mut results = Vec::with_capacity(ops.len());
        for (index, op) in ops.iter().enumerate() {
            let result = match op {
                Op::Check { path, version } => match self.nodes.get(path.as_str()) {
                    None => Err(Error::NoNode { path: path.clone() }),
                    Some(n) if version.is_some_and(|v| v != n.stat.version) => {
                        Err(Error::BadVersion { path: path.clone() })
                    }
                    Some(_) => Ok(OpResult::Checked),
                },
                Op::Create { path, data, mode } => self
                    .create(session, path, data, *mode, &mut pending, Some(&mut undo))
                    .map(OpResult::Created),
                Op::SetData {
                    path,
                    data,
                    version,
                } => self
                    .set_data(path, data, *version, &mut pending, Some(&mut undo))
                    .map(OpResult::Set),
                Op::Delete { path, version } => self
                    .delete(path, *version, &mut pending, Some(&mut undo))
                    .map(|()| OpResult::Deleted),
            };
            match result {
                Ok(r) => results.push(r),
                Err(e) => {
                    self.rollback(undo, start_zxid);
                    // The watches that would have fired are re-armed.
                    for (tx, _) in pending {
                        drop(tx);
                    }
                    return Err(Error::MultiFailed {
                        index,
                        source: Box::new(e),
                    });
                }
            }
        }
        // ZooKeeper gives a multi a single transaction id.
        if self.zxid > start_zxid + 1 {
            let zxid = start_zxid + 1;
            for r in &mut results {
                match r {
                    OpResult::Created(c) => {
                        c.stat.czxid = zxid;
                        c.stat.mzxid = zxid;
                        if let Some(n) = self.nodes.get_mut(&c.path) {
                            n.stat.czxid = zxid;
                            n.stat.mzxid = zxid;
                        }
                    }
                    OpResult::Set(_) => {}
                    _ => {}
                }
            }
            self.zxid = zxid;
        }
        fired.extend(pending);
        Ok(results)
    }

    fn reap_containers(&mut self, fired: &mut Vec<Fired>) {
        if self.reap_candidates.is_empty() {
            return;
        }
        let mut candidates: Vec<String> = self.reap_candidates.drain().collect();
        // Deepest first, so a chain of emptied containers goes in one pass.
        candidates.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for path in candidates {
            let reapable = self.nodes.get(&path).is_some_and(|n| {
                n.mode == CreateMode::Container && n.children.is_empty() && n.stat.cversion > 0
            });
            if reapable {
                self.zxid += 1;
                let _ = self.delete(&path, None, fired, None);
            }
        }
    }

    fn arm(
        map: &mut HashMap<String, Vec<Watcher>>,
        path: &str,
        session: SessionId,
    ) -> oneshot::Receiver<WatchEvent> {
        let (tx, rx) = oneshot::channel();
        map.entry(path.to_string())
            .or_default()
            .push(Watcher { session, tx });
        rx
    }
}

/// A client of an [`EmbeddedServer`]: one session at a time, renewed after
/// it is lost.
pub(crate) struct EmbeddedStore {
    server: Arc<Server>,
    timeout: Duration,
    /// The session's state; the slot holds the session's id (the session
    /// itself lives in the tree).
    machine: Arc<StatusMachine<SessionId>>,
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
        EmbeddedStore {
            server,
            timeout,
            machine: Arc::new(StatusMachine::new(session_id, session_id)),
        }
    }

    /// The session to run an operation in: waits out a suspension, and opens
    /// a new session after a loss.
    async fn session(&self) -> Result<SessionId> {
        self.machine
            .ready(|_, session| Some(session), |lost| self.renew(lost))
            .await
    }

    async fn renew(&self, lost: SessionId) -> Result<()> {
        let open = || async {
            let session = self.server.lock().open_session();
            Ok((session, session))
        };
        if let Renewal::Abandoned(session) = self.machine.renew(lost, open).await? {
            // Closed while the new session was opened.
            self.server.apply(|t, f| t.end_session(session, f));
        }
        Ok(())
    }

    /// Runs `op` on the tree in the current session; marks the session lost
    /// if the server no longer knows it.
    async fn run<T>(
        &self,
        op: impl FnOnce(&mut Tree, SessionId, &mut Vec<Fired>) -> Result<T>,
    ) -> Result<T> {
        // Every operation spends the task's cooperative budget, as network
        // I/O would: a loop of operations that never waits must still let
        // other tasks run (on a current-thread runtime it would starve them).
        tokio::task::consume_budget().await;
        let session = self.session().await?;
        let result = self.server.apply(|tree, fired| {
            tree.check_session(session)?;
            op(tree, session, fired)
        });
        if matches!(result, Err(Error::SessionExpired)) {
            self.machine.lose(session);
        }
        result
    }

    fn watch(&self, rx: oneshot::Receiver<WatchEvent>) -> Watch {
        Watch::new(rx, self.machine.subscribe())
    }

    fn create_in(
        tree: &mut Tree,
        session: SessionId,
        path: &str,
        data: &[u8],
        opts: CreateOptions,
        fired: &mut Vec<Fired>,
    ) -> Result<Created> {
        match tree.create(session, path, data, opts.mode, fired, None) {
            Err(Error::NoNode { .. }) if opts.create_parents => {
                tree.create_parents(session, path, fired)?;
                tree.create(session, path, data, opts.mode, fired, None)
            }
            other => other,
        }
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        let session = self.machine.snapshot().session_id;
        self.server.apply(|t, f| t.end_session(session, f));
    }
}

fn list(tree: &Tree, path: &str) -> Result<Vec<Child>> {
    let node = tree.nodes.get(path).ok_or_else(|| Error::NoNode {
        path: path.to_string(),
    })?;
    Ok(node.children.iter().map(Child::named).collect())
}

#[async_trait]
impl Store for EmbeddedStore {
    fn backend(&self) -> BackendKind {
        BackendKind::Embedded
    }

    fn status(&self) -> watch::Receiver<SessionStatus> {
        self.machine.subscribe()
    }

    fn session_timeout(&self) -> Duration {
        self.timeout
    }

    async fn create(&self, path: &str, data: &[u8], opts: CreateOptions) -> Result<Created> {
        let created = self
            .run(|t, s, f| Self::create_in(t, s, path, data, opts, f))
            .await?;
        self.machine.lost_create_reply()?;
        Ok(created)
    }

    async fn create_and_list(
        &self,
        path: &str,
        data: &[u8],
        opts: CreateOptions,
        list_path: &str,
    ) -> Result<(Created, Vec<Child>)> {
        let result = self
            .run(|t, s, f| {
                let created = Self::create_in(t, s, path, data, opts, f)?;
                Ok((created, list(t, list_path)?))
            })
            .await?;
        self.machine.lost_create_reply()?;
        Ok(result)
    }

    async fn delete(&self, path: &str, version: Option<i32>) -> Result<()> {
        self.run(|t, _, f| t.delete(path, version, f, None)).await?;
        self.machine.lost_delete_reply()
    }

    async fn set_data(&self, path: &str, data: &[u8], version: Option<i32>) -> Result<Stat> {
        self.run(|t, _, f| t.set_data(path, data, version, f, None))
            .await
    }

    async fn get_data(&self, path: &str, watch: bool) -> Result<(Vec<u8>, Stat, Option<Watch>)> {
        let (data, stat, rx) = self
            .run(|t, s, _| {
                let node = t.nodes.get(path).ok_or_else(|| Error::NoNode {
                    path: path.to_string(),
                })?;
                let (data, stat) = (node.data.clone(), node.stat);
                let rx = watch.then(|| Tree::arm(&mut t.node_watches, path, s));
                Ok((data, stat, rx))
            })
            .await?;
        Ok((data, stat, rx.map(|rx| self.watch(rx))))
    }

    async fn exists(&self, path: &str, watch: bool) -> Result<(Option<Stat>, Option<Watch>)> {
        let (stat, rx) = self
            .run(|t, s, _| {
                let stat = t.nodes.get(path).map(|n| n.stat);
                let rx = watch.then(|| Tree::arm(&mut t.node_watches, path, s));
                Ok((stat, rx))
            })
            .await?;
        Ok((stat, rx.map(|rx| self.watch(rx))))
    }

    async fn children(&self, path: &str, watch: bool) -> Result<(Vec<Child>, Option<Watch>)> {
        let (children, rx) = self
            .run(|t, s, _| {
                let children = list(t, path)?;
                let rx = watch.then(|| Tree::arm(&mut t.child_watches, path, s));
                Ok((children, rx))
            })
            .await?;
        Ok((children, rx.map(|rx| self.watch(rx))))
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
        let expires = duration >= self.timeout;
        let server = Arc::downgrade(&self.server);
        let machine = Arc::downgrade(&self.machine);
        let wait = if expires { self.timeout } else { duration };
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
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
        });
    }

    async fn expire(&self) -> Result<()> {
        let session = self.machine.snapshot().session_id;
        self.server.apply(|t, f| t.end_session(session, f));
        self.machine.lose(session);
        Ok(())
    }

    fn lose_next_create_reply(&self) {
        self.machine.lost_replies.create.arm();
    }

    fn lose_next_delete_reply(&self) {
        self.machine.lost_replies.delete.arm();
    }
}
