//! What a session of a key-value store (etcd, Consul) remembers of the
//! nodes it created and holds: a name can be used again by a newer node,
//! so a delete is fenced by what the create returned, and a sequential
//! node is found again by its directory and sequence suffix.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex as StdMutex, MutexGuard};

use super::{CreateRequest, Created, SessionId};
use crate::path;

/// How many digits a sequence suffix has (as ZooKeeper's `%010d`).
pub const SEQUENCE_DIGITS: usize = 10;

/// The trailing [`SEQUENCE_DIGITS`] digits of a node name, if it ends with
/// at least that many (the shape of these backends' sequence suffixes).
pub fn sequence_suffix(name: &str) -> Option<&str> {
    let digits = name.bytes().rev().take_while(u8::is_ascii_digit).count();
    (digits >= SEQUENCE_DIGITS).then(|| &name[name.len() - SEQUENCE_DIGITS..])
}

/// How many distinct sequence suffixes there are ([`SEQUENCE_DIGITS`]
/// digits).
pub const SEQUENCE_SPACE: u64 = 10_000_000_000;

/// A client's counter of sequence suffixes: starting at a random point in
/// the lower half of the space, so that clients rarely draw the same
/// suffix in one directory (a collision costs a create another try).
pub(crate) struct Sequence(AtomicU64);

impl Sequence {
    pub fn new() -> Self {
        Sequence(AtomicU64::new(
            (uuid::Uuid::new_v4().as_u128() % (u128::from(SEQUENCE_SPACE) / 2)) as u64,
        ))
    }

    /// The next suffix, zero-padded to [`SEQUENCE_DIGITS`] digits.
    pub fn next_suffix(&self) -> String {
        let n = self.0.fetch_add(1, Ordering::Relaxed) % SEQUENCE_SPACE;
        format!("{n:0width$}", width = SEQUENCE_DIGITS)
    }
}

/// One session's nodes; `F` fences a delete of one (etcd: its create
/// revision; Consul: its create and modify indexes).
pub(crate) struct Owned<F> {
    session: SessionId,
    /// Path → fence.
    pub nodes: HashMap<String, F>,
    /// (directory, sequence suffix) → path, for sequential nodes.
    pub sequenced: HashMap<(String, String), String>,
}

impl<F> Owned<F> {
    fn of(session: SessionId) -> Self {
        Owned {
            session,
            nodes: HashMap::new(),
            sequenced: HashMap::new(),
        }
    }

    /// Notes `path`, created with `fence` (and `suffix`, if sequential).
    pub fn remember(&mut self, path: &str, fence: F, suffix: Option<&str>) {
        self.nodes.insert(path.to_string(), fence);
        if let Some(suffix) = suffix {
            self.sequenced.insert(
                (path::parent(path).to_string(), suffix.to_string()),
                path.to_string(),
            );
        }
    }

    /// The sequential node of ours whose place a non-sequential create of
    /// `full` takes (the same directory and sequence suffix, another
    /// name), with what its create returned.
    pub fn sibling_of(&self, full: &str) -> Option<(String, &F)> {
        let suffix = sequence_suffix(path::node_name(full))?;
        let key = (path::parent(full).to_string(), suffix.to_string());
        let sibling = self.sequenced.get(&key).filter(|s| *s != full)?;
        Some((sibling.clone(), self.nodes.get(sibling)?))
    }

    /// Forgets `path`, deleted.
    pub fn forget(&mut self, path: &str) {
        if self.nodes.remove(path).is_some() {
            if let Some(suffix) = sequence_suffix(path::node_name(path)) {
                let key = (path::parent(path).to_string(), suffix.to_string());
                if self.sequenced.get(&key).is_some_and(|p| p == path) {
                    self.sequenced.remove(&key);
                }
            }
        }
    }
}

/// The nodes of the store's current session.
pub(crate) struct OwnedNodes<F>(StdMutex<Owned<F>>);

impl<F> Default for OwnedNodes<F> {
    fn default() -> Self {
        OwnedNodes(StdMutex::new(Owned::of(0)))
    }
}

impl<F> OwnedNodes<F> {
    /// Takes note of the node `created` by `request` with its `fence`, if
    /// it is ephemeral (see `Store::learn_created`); a persistent one ends
    /// any fence of its name.
    pub fn learn(&self, request: &CreateRequest<'_>, created: &Created, fence: F) {
        let owner = created.stat.ephemeral_owner;
        if owner != 0 {
            let sequential = request.opts.mode.is_sequential();
            let suffix = sequential.then(|| &created.path[request.path.len()..]);
            self.of(owner).remember(&created.path, fence, suffix);
        } else {
            // A persistent node of ours has the name now: a fence left by
            // an ephemeral one that went must not refuse it.
            let mut owned = self.0.lock().unwrap_or_else(|e| e.into_inner());
            owned.forget(&created.path);
        }
    }

    /// The nodes of `session` (none, if the table was another session's).
    pub fn of(&self, session: SessionId) -> MutexGuard<'_, Owned<F>> {
        // Every critical section leaves the table consistent.
        let mut owned = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if owned.session != session {
            *owned = Owned::of(session);
        }
        owned
    }
}
