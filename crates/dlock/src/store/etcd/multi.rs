//! `multi` as one etcd transaction.
//!
//! ZooKeeper applies a multi's operations in order, each seeing the ones
//! before; an etcd transaction checks all its compares against the state
//! before it and may touch each key only once. So the operations are
//! simulated here: the first operation on a path becomes compares against
//! the store (its preconditions), later operations on the same path are
//! checked against the simulated state, and only each path's final state is
//! written (a create then a delete of one path writes nothing). If a
//! compare fails, the else branch has read what tells which operation
//! failed first, so a failed multi is still one round trip.
//!
//! Collapsing has one visible cost: a path written several times in one
//! multi ends with etcd version + 1 (ZooKeeper's version counts each set).

use std::collections::HashMap;

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, PutOptions, TxnOp};

use super::keys;
use crate::error::{Error, Result};
use crate::path;
use crate::store::{CreateMode, Op};

/// One precondition, on the store as it is before the transaction.
#[derive(Debug, Clone)]
pub(super) enum Cond {
    /// The key exists.
    Exists(String),
    /// The key does not exist.
    Absent(String),
    /// The key's etcd version is this.
    Version(String, i64),
    /// The key's create revision is this (our node, not a newer one of the
    /// same name).
    Fence(String, i64),
    /// The key is held by this lease (our node, where we know no create
    /// revision of it).
    Held(String, i64),
    /// The key is not ephemeral (or absent).
    NotEphemeral(String),
    /// Nothing is below the path, apart from these keys (deleted earlier in
    /// the same multi).
    NoDescendants(String, Vec<String>),
    /// Something is below the path (an implicit directory exists).
    HasDescendants(String),
}

impl Cond {
    fn compares(&self) -> Vec<Compare> {
        match self {
            Cond::Exists(p) => vec![Compare::version(p.as_str(), CompareOp::Greater, 0)],
            Cond::Absent(p) => vec![Compare::create_revision(p.as_str(), CompareOp::Equal, 0)],
            Cond::Version(p, v) => vec![Compare::version(p.as_str(), CompareOp::Equal, *v)],
            Cond::Fence(p, r) => vec![Compare::create_revision(p.as_str(), CompareOp::Equal, *r)],
            Cond::NotEphemeral(p) => vec![Compare::lease(p.as_str(), CompareOp::Equal, 0)],
            Cond::Held(p, lease) => vec![Compare::lease(p.as_str(), CompareOp::Equal, *lease)],
            Cond::HasDescendants(p) => {
                // A range compare holds for every key in the range, and
                // compares an empty range as one absent key (revision 0).
                let (start, end) = keys::descendants(p);
                vec![Compare::create_revision(start, CompareOp::Greater, 0).with_range(end)]
            }
            Cond::NoDescendants(p, except) => {
                // The descendants' range, with holes at the excepted keys
                // and their markers.
                let (mut start, end) = keys::descendants(p);
                let mut holes: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
                for key in except {
                    let mut after = key.as_bytes().to_vec();
                    after.push(0);
                    holes.push((key.as_bytes().to_vec(), after));
                    holes.push(keys::markers(key));
                }
                holes.sort();
                let mut compares = Vec::new();
                for (hole_start, hole_end) in holes {
                    if hole_start > start {
                        compares.push(
                            Compare::create_revision(start.clone(), CompareOp::Equal, 0)
                                .with_range(hole_start),
                        );
                    }
                    start = start.max(hole_end);
                }
                if start < end {
                    compares
                        .push(Compare::create_revision(start, CompareOp::Equal, 0).with_range(end));
                }
                compares
            }
        }
    }

    /// The read (in the else branch) that tells whether it held.
    fn read(&self) -> TxnOp {
        match self {
            Cond::NoDescendants(p, _) | Cond::HasDescendants(p) => {
                let (start, end) = keys::descendants(p);
                TxnOp::get(
                    start,
                    Some(GetOptions::new().with_range(end).with_keys_only()),
                )
            }
            Cond::Exists(p)
            | Cond::Absent(p)
            | Cond::Version(p, _)
            | Cond::Fence(p, _)
            | Cond::Held(p, _)
            | Cond::NotEphemeral(p) => {
                TxnOp::get(p.as_str(), Some(GetOptions::new().with_keys_only()))
            }
        }
    }

    /// Judges the condition on what [`read`](Self::read) returned: the
    /// error of the failing operation, if it failed.
    fn judge(&self, kvs: &[KeyValue]) -> Option<Error> {
        let key = kvs.first();
        match self {
            Cond::Exists(p) => key.is_none().then(|| Error::NoNode { path: p.clone() }),
            Cond::Absent(p) => key.is_some().then(|| Error::NodeExists { path: p.clone() }),
            Cond::Version(p, v) => match key {
                None => Some(Error::NoNode { path: p.clone() }),
                Some(kv) => (kv.version() != *v).then(|| Error::BadVersion { path: p.clone() }),
            },
            Cond::Fence(p, r) => match key {
                Some(kv) if kv.create_revision() == *r => None,
                _ => Some(Error::NoNode { path: p.clone() }),
            },
            Cond::Held(p, lease) => match key {
                Some(kv) if kv.lease() == *lease => None,
                _ => Some(Error::NoNode { path: p.clone() }),
            },
            Cond::NotEphemeral(p) => match key {
                Some(kv) if kv.lease() != 0 => {
                    Some(Error::NoChildrenForEphemerals { path: p.clone() })
                }
                _ => None,
            },
            Cond::HasDescendants(p) => (!kvs.iter().any(|kv| keys::is_descendant(p, kv.key())))
                .then(|| Error::NoNode { path: p.clone() }),
            Cond::NoDescendants(p, except) => kvs
                .iter()
                .any(|kv| {
                    keys::is_descendant(p, kv.key())
                        && !except.iter().any(|e| e.as_bytes() == kv.key())
                })
                .then(|| Error::NotEmpty { path: p.clone() }),
        }
    }
}

/// What the simulation knows of one path.
#[derive(Debug, Clone)]
struct Sim {
    exists: bool,
    /// The ZooKeeper version, when known.
    version: Option<i32>,
    /// Sets applied to the key as it was in the store (for version
    /// compares against the store).
    store_sets: i32,
    /// The key existed in the store before the multi.
    stored: bool,
    /// Created in this multi (and not deleted since), with this mode.
    created: Option<CreateMode>,
    /// Data to write, if written.
    data: Option<Vec<u8>>,
    /// Must be written (put or deleted) at the end.
    dirty: bool,
}

/// A multi turned into one transaction.
#[derive(Debug)]
pub(super) struct Plan {
    /// Preconditions, with the index of the operation each belongs to.
    pub conds: Vec<(usize, Cond)>,
    /// Writes, then read-backs of the keys put.
    pub then: Vec<TxnOp>,
    /// Keys read back after the writes (in `then`, in order, after the
    /// writes).
    pub read_back: Vec<String>,
    /// The full path of each operation (sequential creates get their
    /// suffix).
    pub paths: Vec<String>,
    /// Ephemeral nodes that exist after the transaction.
    pub created_ephemeral: Vec<String>,
    /// Nodes deleted by the transaction.
    pub deleted: Vec<String>,
}

/// A multi that fails before any compare can: operation `index` cannot
/// succeed whatever the store holds; `conds` are the preconditions of the
/// operations before it (which may fail first).
#[derive(Debug)]
pub(super) struct StaticFailure {
    pub index: usize,
    pub error: Error,
    pub conds: Vec<(usize, Cond)>,
}

/// What our node at a path must be, for a fenced check or delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fence {
    /// The node we created in this lease, with this create revision.
    Created(i64),
    /// Our node of this earlier lease: any node it holds (the server may
    /// keep a lease the client gave up on).
    Gone(i64),
    /// Any node the operation's lease holds: that lease is not the newest.
    Held,
}

impl Fence {
    /// The condition that our node at `path` is still there.
    fn cond(self, path: &str, lease: i64) -> Cond {
        match self {
            Fence::Created(revision) => Cond::Fence(path.to_string(), revision),
            Fence::Gone(earlier) => Cond::Held(path.to_string(), earlier),
            Fence::Held => Cond::Held(path.to_string(), lease),
        }
    }
}

/// What the planner needs from the store.
pub(super) struct Context<'a> {
    /// The lease ephemeral nodes are created with.
    pub lease: i64,
    /// What our node must be, at paths where we have (or had) one (fenced
    /// checks and deletes).
    pub fence: &'a dyn Fn(&str) -> Option<Fence>,
    /// Whether a path exists in the store now (asked only for parents of
    /// creates that the multi does not tell).
    pub parent_exists: &'a dyn Fn(&str) -> bool,
    /// A fresh sequence suffix.
    pub suffix: &'a dyn Fn() -> String,
    /// Paths known to be implicit directories (no key, keys below): a
    /// check passes while something is below them, a delete removes nothing
    /// and needs them empty by then.
    pub implicit: &'a dyn Fn(&str) -> bool,
    /// The root: `/` or the namespace (only ancestors below it are checked).
    pub root: &'a str,
}

/// Plans `ops`.
pub(super) fn plan(ops: &[Op], cx: &Context<'_>) -> std::result::Result<Plan, StaticFailure> {
    let mut sims: HashMap<String, Sim> = HashMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut conds: Vec<(usize, Cond)> = Vec::new();
    let mut paths = Vec::with_capacity(ops.len());
    // Keys deleted from the store by earlier operations, per path.
    let mut store_deleted: Vec<String> = Vec::new();

    let fail = |index: usize, error: Error, conds: &Vec<(usize, Cond)>| StaticFailure {
        index,
        error,
        conds: conds.clone(),
    };

    for (index, op) in ops.iter().enumerate() {
        let full = match op {
            Op::Create { path, mode, .. } if mode.is_sequential() => {
                format!("{path}{}", (cx.suffix)())
            }
            Op::Check { path, .. }
            | Op::Create { path, .. }
            | Op::SetData { path, .. }
            | Op::Delete { path, .. } => path.clone(),
        };
        paths.push(full.clone());
        if !sims.contains_key(&full) {
            order.push(full.clone());
        }
        let known = sims.get(&full).cloned();
        let needs_existing = !matches!(op, Op::Create { .. });

        // Existence.
        let mut sim = match known {
            Some(sim) => {
                if needs_existing && !sim.exists {
                    return Err(fail(index, Error::NoNode { path: full }, &conds));
                }
                if !needs_existing && sim.exists {
                    return Err(fail(index, Error::NodeExists { path: full }, &conds));
                }
                sim
            }
            None if needs_existing
                && matches!(op, Op::Check { .. } | Op::Delete { .. })
                && (cx.implicit)(&full) =>
            {
                conds.push((
                    index,
                    match op {
                        Op::Delete { .. } => Cond::Absent(full.clone()),
                        _ => Cond::HasDescendants(full.clone()),
                    },
                ));
                Sim {
                    exists: true,
                    version: Some(0),
                    store_sets: 0,
                    stored: false,
                    created: None,
                    data: None,
                    dirty: false,
                }
            }
            None => {
                conds.push((
                    index,
                    if needs_existing {
                        Cond::Exists(full.clone())
                    } else {
                        Cond::Absent(full.clone())
                    },
                ));
                Sim {
                    exists: needs_existing,
                    version: None,
                    store_sets: 0,
                    stored: needs_existing,
                    created: None,
                    data: None,
                    dirty: false,
                }
            }
        };

        // Versions.
        let wanted = match op {
            Op::Check { version, .. }
            | Op::SetData { version, .. }
            | Op::Delete { version, .. } => *version,
            Op::Create { .. } => None,
        };
        if let Some(v) = wanted {
            match sim.version {
                Some(known) if known != v => {
                    return Err(fail(index, Error::BadVersion { path: full }, &conds));
                }
                Some(_) => {}
                None => {
                    let in_store = v - sim.store_sets;
                    if in_store < 0 {
                        return Err(fail(index, Error::BadVersion { path: full }, &conds));
                    }
                    conds.push((index, Cond::Version(full.clone(), in_store as i64 + 1)));
                    sim.version = Some(v);
                }
            }
        }

        match op {
            Op::Check { version: None, .. } => {
                // Our own node: it must be the one we created, not a newer
                // one of the same name.
                if sim.stored && sim.created.is_none() {
                    if let Some(fence) = (cx.fence)(&full) {
                        conds.push((index, fence.cond(&full, cx.lease)));
                    }
                }
            }
            Op::Check { .. } => {}
            Op::Create { data, mode, .. } => {
                let parent = path::parent(&full);
                if parent != "/" {
                    let parent_known = sims.get(parent).map(|s| s.exists);
                    let below_known = sims
                        .iter()
                        .any(|(p, s)| s.exists && p.starts_with(&format!("{parent}/")));
                    let exists = parent_known.unwrap_or(false) || below_known || {
                        parent_known.is_none() && (cx.parent_exists)(parent)
                    };
                    if !exists {
                        return Err(fail(
                            index,
                            Error::NoNode {
                                path: parent.to_string(),
                            },
                            &conds,
                        ));
                    }
                }
                for ancestor in keys::ancestors_below(cx.root, &full) {
                    match sims.get(ancestor) {
                        Some(s) if s.exists && s.created.is_some_and(CreateMode::is_ephemeral) => {
                            return Err(fail(
                                index,
                                Error::NoChildrenForEphemerals {
                                    path: ancestor.to_string(),
                                },
                                &conds,
                            ));
                        }
                        Some(s) if s.exists && s.created.is_some() => {}
                        // Once per ancestor: creates in one directory share
                        // it, and etcd takes at most 128 compares.
                        _ if conds
                            .iter()
                            .any(|(_, c)| matches!(c, Cond::NotEphemeral(a) if a == ancestor)) => {}
                        _ => conds.push((index, Cond::NotEphemeral(ancestor.to_string()))),
                    }
                }
                sim.exists = true;
                sim.version = Some(0);
                sim.created = Some(*mode);
                sim.data = Some(data.clone());
                sim.dirty = true;
            }
            Op::SetData { data, .. } => {
                sim.version = sim.version.map(|v| v + 1);
                if sim.created.is_none() {
                    sim.store_sets += 1;
                }
                sim.data = Some(data.clone());
                sim.dirty = true;
            }
            Op::Delete { version, .. } => {
                let below = format!("{full}/");
                if sims.iter().any(|(p, s)| s.exists && p.starts_with(&below)) {
                    return Err(fail(index, Error::NotEmpty { path: full }, &conds));
                }
                let except: Vec<String> = store_deleted
                    .iter()
                    .filter(|p| p.starts_with(&below))
                    .cloned()
                    .collect();
                conds.push((index, Cond::NoDescendants(full.clone(), except)));
                if sim.stored && sim.created.is_none() {
                    // Our own node, unless a version names the one read.
                    if let Some(fence) = version.is_none().then(|| (cx.fence)(&full)).flatten() {
                        conds.push((index, fence.cond(&full, cx.lease)));
                    }
                    store_deleted.push(full.clone());
                }
                sim.exists = false;
                sim.version = None;
                sim.created = None;
                sim.data = None;
                sim.dirty = true;
            }
        }
        sims.insert(full, sim);
    }

    let mut then = Vec::new();
    let mut read_back = Vec::new();
    let mut created_ephemeral = Vec::new();
    let mut deleted = Vec::new();
    for p in &order {
        let sim = &sims[p];
        if !sim.dirty {
            continue;
        }
        if sim.exists {
            let options = match sim.created {
                Some(mode) if mode.is_ephemeral() => {
                    created_ephemeral.push(p.clone());
                    Some(PutOptions::new().with_lease(cx.lease))
                }
                Some(_) => None,
                None => Some(PutOptions::new().with_ignore_lease()),
            };
            then.push(TxnOp::put(
                p.as_str(),
                sim.data.clone().unwrap_or_default(),
                options,
            ));
            read_back.push(p.clone());
        } else if sim.stored {
            then.push(TxnOp::delete(p.as_str(), None));
            let (start, end) = keys::markers(p);
            then.push(TxnOp::delete(
                start,
                Some(etcd_client::DeleteOptions::new().with_range(end)),
            ));
            deleted.push(p.clone());
        }
    }
    for p in &read_back {
        then.push(TxnOp::get(p.as_str(), None));
    }
    Ok(Plan {
        conds,
        then,
        read_back,
        paths,
        created_ephemeral,
        deleted,
    })
}

/// The compares of `conds`, in order.
pub(super) fn compares(conds: &[(usize, Cond)]) -> Vec<Compare> {
    conds.iter().flat_map(|(_, c)| c.compares()).collect()
}

/// The else-branch reads of `conds`, one per condition, in order.
pub(super) fn reads(conds: &[(usize, Cond)]) -> Vec<TxnOp> {
    conds.iter().map(|(_, c)| c.read()).collect()
}

/// The first failing condition, judged on the else branch's reads (one
/// key-value list per condition): the failing operation's index and error.
pub(super) fn first_failure(
    conds: &[(usize, Cond)],
    reads: &[Vec<KeyValue>],
) -> Option<(usize, Error)> {
    conds
        .iter()
        .zip(reads)
        .find_map(|((index, cond), kvs)| cond.judge(kvs).map(|e| (*index, e)))
}

/// The contract's error for a failed multi.
pub(super) fn failed(index: usize, error: Error) -> Error {
    Error::MultiFailed {
        index,
        source: Box::new(error),
    }
}

/// Refuses multis too large for one etcd transaction (128 operations by
/// default: each operation may need a compare, a write and a read-back).
pub(super) fn check_len(ops: &[Op]) -> Result<()> {
    if ops.len() > MAX_OPS {
        return Err(Error::InvalidArgument(format!(
            "a multi on etcd takes at most {MAX_OPS} operations (etcd's transactions hold 128 each way), got {}",
            ops.len()
        )));
    }
    Ok(())
}

/// The most operations one multi may have on etcd.
pub(super) const MAX_OPS: usize = 42;
