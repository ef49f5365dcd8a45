//! The embedded store's data: ZooKeeper's tree of nodes, the sessions that
//! own its ephemeral nodes, and its one-shot watches. Nothing here waits or
//! knows a clock: each change is a plain function of the tree that hands
//! back the watch events it fired, for the server to deliver outside its
//! lock (a woken watcher may call straight back into the store).

use std::collections::{BTreeSet, HashMap, HashSet};

use tokio::sync::oneshot;

use super::WatchStats;
use crate::error::{Error, Result};
use crate::path;
use crate::store::{
    Child, CreateMode, CreateOptions, Created, Op, OpResult, SessionId, Stat, WatchEvent,
};

/// A watch that fired, and with what.
pub(super) type Fired = (oneshot::Sender<WatchEvent>, WatchEvent);

struct Watcher {
    session: SessionId,
    tx: oneshot::Sender<WatchEvent>,
}

#[derive(Clone)]
pub(super) struct Node {
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
pub(super) enum Undo {
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

pub(super) struct Tree {
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
    /// While a multi-operation runs: the watches it would fire (children's
    /// or not, path, event), fired only once it commits.
    deferred: Option<Vec<(bool, String, WatchEvent)>>,
}

impl Tree {
    pub(super) fn new() -> Self {
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
            deferred: None,
        }
    }

    pub(super) fn open_session(&mut self) -> SessionId {
        let id = self.next_session;
        self.next_session += 1;
        self.sessions.insert(id, HashSet::new());
        id
    }

    pub(super) fn check_session(&self, session: SessionId) -> Result<()> {
        if self.sessions.contains_key(&session) {
            Ok(())
        } else {
            Err(Error::SessionExpired)
        }
    }

    /// Ends a session: deletes its ephemeral nodes (one transaction, as
    /// ZooKeeper's closeSession) and drops its watches.
    pub(super) fn end_session(&mut self, session: SessionId, fired: &mut Vec<Fired>) {
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

    /// Fires the watches on node `path` (armed by `get_data`/`exists`).
    fn fire_node(&mut self, path: &str, event: WatchEvent, fired: &mut Vec<Fired>) {
        if let Some(deferred) = self.deferred.as_mut() {
            return deferred.push((false, path.to_string(), event));
        }
        self.node_notifications += fire(&mut self.node_watches, path, event, fired);
    }

    /// Fires the watches on the children of `path` (armed by `children`).
    fn fire_children(&mut self, path: &str, event: WatchEvent, fired: &mut Vec<Fired>) {
        if let Some(deferred) = self.deferred.as_mut() {
            return deferred.push((true, path.to_string(), event));
        }
        self.child_notifications += fire(&mut self.child_watches, path, event, fired);
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
        self.fire_node(&full, WatchEvent::NodeCreated, fired);
        self.fire_children(parent_path, WatchEvent::ChildrenChanged, fired);
        Ok(Created { path: full, stat })
    }

    /// Creates a node as the store's `create` does: with `opts.create_parents`,
    /// missing ancestors first (as containers), only once the parent is
    /// found missing.
    pub(super) fn create_with(
        &mut self,
        session: SessionId,
        path: &str,
        data: &[u8],
        opts: CreateOptions,
        fired: &mut Vec<Fired>,
    ) -> Result<Created> {
        match self.create(session, path, data, opts.mode, fired, None) {
            Err(Error::NoNode { .. }) if opts.create_parents => {
                self.create_parents(session, path, fired)?;
                self.create(session, path, data, opts.mode, fired, None)
            }
            other => other,
        }
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

    pub(super) fn delete(
        &mut self,
        path: &str,
        version: Option<i32>,
        fired: &mut Vec<Fired>,
        undo: Option<&mut Vec<Undo>>,
    ) -> Result<()> {
        if path == "/" {
            return Err(Error::InvalidArgument("the root cannot be deleted".into()));
        }
        if !self.versioned(path, version)?.children.is_empty() {
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
        self.fire_node(path, WatchEvent::NodeDeleted, fired);
        self.fire_children(path, WatchEvent::NodeDeleted, fired);
        self.fire_children(parent_path, WatchEvent::ChildrenChanged, fired);
        Ok(())
    }

    /// The node at `path`, if it is at `version` (any, without one).
    fn versioned(&self, path: &str, version: Option<i32>) -> Result<&Node> {
        let node = self.nodes.get(path).ok_or_else(|| Error::NoNode {
            path: path.to_string(),
        })?;
        if version.is_some_and(|v| v != node.stat.version) {
            return Err(Error::BadVersion {
                path: path.to_string(),
            });
        }
        Ok(node)
    }

    pub(super) fn set_data(
        &mut self,
        path: &str,
        data: &[u8],
        version: Option<i32>,
        fired: &mut Vec<Fired>,
        undo: Option<&mut Vec<Undo>>,
    ) -> Result<Stat> {
        self.versioned(path, version)?;
        let node = self.nodes.get_mut(path).expect("checked above");
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
        self.fire_node(path, WatchEvent::DataChanged, fired);
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
                    // An emptied container waiting to be reaped waits again.
                    if node.mode == CreateMode::Container && node.children.is_empty() {
                        self.reap_candidates.insert(path.clone());
                    }
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

    pub(super) fn multi(
        &mut self,
        session: SessionId,
        ops: &[Op],
        fired: &mut Vec<Fired>,
    ) -> Result<Vec<OpResult>> {
        let start_zxid = self.zxid;
        let mut undo = Vec::new();
        // Watches fire only if the whole transaction commits: a failed one
        // leaves them armed, as if it never ran.
        self.deferred = Some(Vec::new());
        let mut results = Vec::with_capacity(ops.len());
        for (index, op) in ops.iter().enumerate() {
            let result = match op {
                Op::Check { path, version } => {
                    self.versioned(path, *version).map(|_| OpResult::Checked)
                }
                Op::Create { path, data, mode } => self
                    .create(session, path, data, *mode, fired, Some(&mut undo))
                    .map(OpResult::Created),
                Op::SetData {
                    path,
                    data,
                    version,
                } => self
                    .set_data(path, data, *version, fired, Some(&mut undo))
                    .map(OpResult::Set),
                Op::Delete { path, version } => self
                    .delete(path, *version, fired, Some(&mut undo))
                    .map(|()| OpResult::Deleted),
            };
            match result {
                Ok(r) => results.push(r),
                Err(e) => {
                    self.deferred = None;
                    self.rollback(undo, start_zxid);
                    return Err(Error::MultiFailed {
                        index,
                        source: Box::new(e),
                    });
                }
            }
        }
        // ZooKeeper gives a multi a single transaction id: every node it
        // made or wrote, and every result, carries it (a write's id left
        // ahead of the counter would be handed out again).
        if self.zxid > start_zxid + 1 {
            let zxid = start_zxid + 1;
            let stamp = |stat: &mut Stat| {
                if stat.czxid > start_zxid {
                    stat.czxid = zxid;
                }
                if stat.mzxid > start_zxid {
                    stat.mzxid = zxid;
                }
            };
            for (op, r) in ops.iter().zip(&mut results) {
                let path = match (op, r) {
                    (_, OpResult::Created(c)) => {
                        stamp(&mut c.stat);
                        c.path.clone()
                    }
                    (Op::SetData { path, .. }, OpResult::Set(stat)) => {
                        stamp(stat);
                        path.clone()
                    }
                    _ => continue,
                };
                if let Some(n) = self.nodes.get_mut(&path) {
                    stamp(&mut n.stat);
                }
            }
            self.zxid = zxid;
        }
        for (children, path, event) in self.deferred.take().unwrap_or_default() {
            match children {
                false => self.fire_node(&path, event, fired),
                true => self.fire_children(&path, event, fired),
            }
        }
        Ok(results)
    }

    pub(super) fn reap_containers(&mut self, fired: &mut Vec<Fired>) {
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

    /// A node's data and stat; with `watch`, a watch for that session on
    /// its next change.
    pub(super) fn get_data(
        &mut self,
        path: &str,
        watch: Option<SessionId>,
    ) -> Result<(Vec<u8>, Stat, Option<oneshot::Receiver<WatchEvent>>)> {
        let node = self.nodes.get(path).ok_or_else(|| Error::NoNode {
            path: path.to_string(),
        })?;
        let (data, stat) = (node.data.clone(), node.stat);
        let rx = watch.map(|s| arm(&mut self.node_watches, path, s));
        Ok((data, stat, rx))
    }

    /// A node's stat if it exists; with `watch`, a watch for that session
    /// on its creation, deletion or change.
    pub(super) fn exists(
        &mut self,
        path: &str,
        watch: Option<SessionId>,
    ) -> (Option<Stat>, Option<oneshot::Receiver<WatchEvent>>) {
        let stat = self.nodes.get(path).map(|n| n.stat);
        (stat, watch.map(|s| arm(&mut self.node_watches, path, s)))
    }

    /// A node's children; with `watch`, a watch for that session on the
    /// next change of them.
    pub(super) fn children(
        &mut self,
        path: &str,
        watch: Option<SessionId>,
    ) -> Result<(Vec<Child>, Option<oneshot::Receiver<WatchEvent>>)> {
        let children = self.list(path)?;
        Ok((
            children,
            watch.map(|s| arm(&mut self.child_watches, path, s)),
        ))
    }

    pub(super) fn list(&self, path: &str) -> Result<Vec<Child>> {
        let node = self.nodes.get(path).ok_or_else(|| Error::NoNode {
            path: path.to_string(),
        })?;
        Ok(node.children.iter().map(Child::named).collect())
    }

    pub(super) fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub(super) fn session_count(&self) -> usize {
        self.sessions.len()
    }

    pub(super) fn watch_stats(&self) -> WatchStats {
        // A dropped watch is gone, whether or not it was pruned yet.
        let live = |list: &Vec<Watcher>| list.iter().filter(|w| !w.tx.is_closed()).count();
        let count = |m: &HashMap<String, Vec<Watcher>>| m.values().map(live).sum::<usize>();
        WatchStats {
            node_watches: count(&self.node_watches),
            child_watches: count(&self.child_watches),
            node_notifications: self.node_notifications,
            child_notifications: self.child_notifications,
        }
    }
}

/// Fires (takes) the watches armed on `path`; returns how many.
fn fire(
    map: &mut HashMap<String, Vec<Watcher>>,
    path: &str,
    event: WatchEvent,
    fired: &mut Vec<Fired>,
) -> u64 {
    let list = map.remove(path).unwrap_or_default();
    let live: Vec<Watcher> = list.into_iter().filter(|w| !w.tx.is_closed()).collect();
    let count = live.len() as u64;
    fired.extend(live.into_iter().map(|w| (w.tx, event)));
    count
}

fn arm(
    map: &mut HashMap<String, Vec<Watcher>>,
    path: &str,
    session: SessionId,
) -> oneshot::Receiver<WatchEvent> {
    let (tx, rx) = oneshot::channel();
    let list = map.entry(path.to_string()).or_default();
    // Watches dropped unfired (a wait that timed out) go as the next one
    // comes, or a node that never changes would gather them for ever.
    list.retain(|w| !w.tx.is_closed());
    list.push(Watcher { session, tx });
    rx
}
