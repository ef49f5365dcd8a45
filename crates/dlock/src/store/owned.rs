//! What a session of a key-value store (etcd, Consul) remembers of the
//! nodes it created and holds: a name can be used again by a newer node,
//! so a delete is fenced by what the create returned, and a sequential
//! node is found again by its directory and sequence suffix.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex as StdMutex, MutexGuard};

use super::{CreateRequest, Created, SessionId};
use crate::path;

pub use super::{sequence_suffix, SEQUENCE_DIGITS};

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

/// How many session renewals a name of a node that went with its session
/// stays fenced ([`Owned::gone`]): a guarded write or a delete started in
/// that session is long settled by then.
const GONE_FOR_RENEWALS: u32 = 8;

/// One session's nodes; `F` fences a delete of one (etcd: its create
/// revision; Consul: its create index).
pub(crate) struct Owned<F> {
    session: SessionId,
    /// How many times the session changed.
    renewals: u32,
    /// Path → fence.
    pub nodes: HashMap<String, F>,
    /// (directory, sequence suffix) → path, for sequential nodes.
    pub sequenced: HashMap<(String, String), String>,
    /// Our nodes of earlier sessions, by path (never a path in `nodes`).
    /// Their names stay fenced: a check or delete of "our node" there (one issued in that session and
    /// sent in a later one, after waiting out the renewal) acts on a node
    /// held by that session — the server may keep a session the client
    /// gave up on — or by the operation's own, and fails rather than land
    /// on another session's node that took the name meanwhile.
    gone: HashMap<String, Gone>,
}

/// A node of ours that went with an earlier session.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gone {
    /// The session it was made in.
    pub session: SessionId,
    /// The renewal that ended that session.
    renewal: u32,
}

impl<F> Owned<F> {
    fn of(session: SessionId) -> Self {
        Owned {
            session,
            renewals: 0,
            nodes: HashMap::new(),
            sequenced: HashMap::new(),
            gone: HashMap::new(),
        }
    }

    /// The table of the next session, `session`: our nodes so far went
    /// with the one that ended, and their names stay fenced (see `gone`).
    fn renewed(&mut self, session: SessionId) {
        let renewals = self.renewals + 1;
        let mut gone = std::mem::take(&mut self.gone);
        gone.retain(|_, g| renewals - g.renewal < GONE_FOR_RENEWALS);
        let ended = Gone {
            session: self.session,
            renewal: renewals,
        };
        gone.extend(self.nodes.drain().map(|(path, _)| (path, ended)));
        *self = Owned {
            session,
            renewals,
            gone,
            ..Owned::of(session)
        };
    }

    /// Whether `path` is fenced: a node of ours, or the name of one that
    /// went with an earlier session.
    fn fenced(&self, path: &str) -> bool {
        self.nodes.contains_key(path) || self.gone.contains_key(path)
    }

    /// Our node at `path` that went with an earlier session.
    pub fn gone(&self, path: &str) -> Option<Gone> {
        self.gone.get(path).copied()
    }

    /// The session that must hold the key at `path` for a check or delete
    /// of "our node" there by `session`: the earlier session of our node
    /// that went with it, else `session` if the node is ours; `None` if we
    /// have no node there.
    pub fn holder(&self, session: SessionId, path: &str) -> Option<SessionId> {
        match self.gone(path) {
            Some(gone) => Some(gone.session),
            None => self.nodes.contains_key(path).then_some(session),
        }
    }

    /// Forgets the gone node at `path`, made in `made_in`, deleted by an
    /// operation of `session`.
    #[cfg_attr(not(feature = "consul"), allow(dead_code))]
    pub fn forget_gone(&mut self, session: SessionId, path: &str, made_in: SessionId) {
        let ours = self.gone.get(path).is_some_and(|g| g.session == made_in);
        if self.is_of(session) && ours {
            self.gone.remove(path);
        }
    }

    /// Whether the node of ours at `path` is the one created with `fence`
    /// (see [`Store::deletes_only_created`](super::Store::deletes_only_created));
    /// `false` if ours there is a later one. `None` if the table has no
    /// node of `session` there — or only an earlier one than `fence`: then
    /// the node at `fence` was made by a create whose reply was lost, and
    /// the table cannot tell whether it is ours.
    pub fn made_with(&self, session: SessionId, path: &str, fence: &F) -> Option<bool>
    where
        F: PartialOrd,
    {
        if !self.is_of(session) {
            return None;
        }
        match fence.partial_cmp(self.nodes.get(path)?)? {
            std::cmp::Ordering::Equal => Some(true),
            std::cmp::Ordering::Less => Some(false),
            std::cmp::Ordering::Greater => None,
        }
    }

    /// Whether this is the table of `session`; else `session` is not the
    /// store's newest, and what it created or deleted does not change this
    /// one (but a node it created is fenced as gone with it).
    pub fn is_of(&self, session: SessionId) -> bool {
        self.session == session
    }

    /// Notes `path`, created by `session` with `fence` (and `suffix`, if
    /// sequential). From an earlier session than the table's (its create
    /// answered late), the node is fenced as gone with it, unless the name
    /// is fenced already (by a node the table knows of, newer than a reply
    /// that comes this late).
    pub fn remember(&mut self, session: SessionId, path: &str, fence: F, suffix: Option<&str>) {
        if !self.is_of(session) {
            if !self.fenced(path) {
                let renewal = self.renewals;
                self.gone
                    .insert(path.to_string(), Gone { session, renewal });
            }
            return;
        }
        self.gone.remove(path);
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

    /// Forgets `path`, deleted (or made a persistent node of ours) by an
    /// operation of `session`.
    pub fn forget(&mut self, session: SessionId, path: &str) {
        if self.is_of(session) {
            self.forget_any(path);
        }
    }

    fn forget_any(&mut self, path: &str) {
        self.gone.remove(path);
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
    /// `newest` tells the store's newest session (its status's).
    pub fn learn(
        &self,
        request: &CreateRequest<'_>,
        created: &Created,
        fence: F,
        newest: impl FnOnce() -> SessionId,
    ) {
        let owner = created.stat.ephemeral_owner;
        if owner != 0 {
            let sequential = request.opts.mode.is_sequential();
            let suffix = sequential.then(|| &created.path[request.path.len()..]);
            self.of(owner, newest)
                .remember(owner, &created.path, fence, suffix);
        } else {
            // A persistent node of ours has the name now: a fence left by
            // an ephemeral one that went must not refuse it.
            let mut owned = self.0.lock().unwrap_or_else(|e| e.into_inner());
            owned.forget_any(&created.path);
        }
    }

    /// The nodes of `session`, if it is the store's newest session (its
    /// status's, which `newest` tells, asked only when the table is another
    /// session's — not on the hot path): none yet, if the table was an earlier
    /// session's (whose nodes' names stay fenced, see [`Owned::fenced`]).
    /// For any other session, the current table, not to be changed
    /// ([`Owned::is_of`]): the table only moves forward, never back to a
    /// session that ended (an operation that started in it may finish
    /// late), whether or not it had been the table's.
    pub fn of(
        &self,
        session: SessionId,
        newest: impl FnOnce() -> SessionId,
    ) -> MutexGuard<'_, Owned<F>> {
        // Every critical section leaves the table consistent.
        let mut owned = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if owned.session != session && session == newest() {
            owned.renewed(session);
        }
        owned
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{CreateMode, CreateOptions, Stat};

    /// Learns our node `path` made in session `owner`, while the store's
    /// newest session is `newest`.
    fn learn(table: &OwnedNodes<i64>, path: &str, owner: SessionId, newest: SessionId, fence: i64) {
        let request = CreateRequest::new(path, b"", CreateOptions::new(CreateMode::Ephemeral));
        let stat = Stat {
            ephemeral_owner: owner,
            ..Stat::default()
        };
        let created = Created {
            path: path.to_string(),
            stat,
        };
        table.learn(&request, &created, fence, || newest);
    }

    #[test]
    fn a_node_of_an_ended_session_stays_fenced_until_ours_again() {
        let table = OwnedNodes::default();
        learn(&table, "/a", 1, 1, 10);
        assert_eq!(table.of(1, || 1).nodes.get("/a"), Some(&10));
        // Session 1 ended; 2 is current: "/a" has no fence value, but is fenced.
        let renewed = table.of(2, || 2);
        let gone = renewed.gone("/a").expect("fenced by the node that went");
        assert_eq!(gone.session, 1);
        drop(renewed);
        learn(&table, "/a", 2, 2, 20);
        let owned = table.of(2, || 2);
        assert_eq!(owned.nodes.get("/a"), Some(&20));
        assert!(owned.gone("/a").is_none());
    }

    #[test]
    fn made_with_tells_ours_a_later_one_and_what_it_cannot_know() {
        let table = OwnedNodes::default();
        learn(&table, "/a", 1, 1, 20);
        let owned = table.of(1, || 1);
        assert_eq!(owned.made_with(1, "/a", &20), Some(true));
        // An earlier node at the name: ours there is a later one.
        assert_eq!(owned.made_with(1, "/a", &10), Some(false));
        // A later one than the table knows: made by a create whose reply
        // was lost (or by someone else); the table cannot tell.
        assert_eq!(owned.made_with(1, "/a", &30), None);
        assert_eq!(owned.made_with(1, "/b", &20), None);
        assert_eq!(owned.made_with(2, "/a", &20), None);
    }

    #[test]
    fn an_ended_session_never_moves_the_table() {
        let table = OwnedNodes::default();
        learn(&table, "/a", 1, 1, 10);
        learn(&table, "/b", 2, 2, 20);
        // A create sent in session 1 answers after session 2 began.
        learn(&table, "/c", 1, 2, 30);
        // And one from session 3, which ended before the table ever saw it
        // (4 is the newest now).
        learn(&table, "/d", 3, 4, 40);
        let owned = table.of(3, || 4);
        assert!(owned.is_of(2), "the table stays session 2's");
        assert_eq!(owned.nodes.get("/b"), Some(&20));
        assert!(owned.gone("/a").is_some());
        // The late ones are fenced as gone with their sessions.
        assert_eq!(owned.gone("/c").map(|g| g.session), Some(1));
        assert_eq!(owned.gone("/d").map(|g| g.session), Some(3));
    }

    #[test]
    fn a_gone_name_is_fenced_for_a_few_renewals_only() {
        let table: OwnedNodes<i64> = OwnedNodes::default();
        learn(&table, "/a", 1, 1, 10);
        for session in 2..2 + SessionId::from(GONE_FOR_RENEWALS) {
            assert!(
                table.of(session, || session).fenced("/a"),
                "session {session}"
            );
        }
        assert!(!table.of(100, || 100).fenced("/a"));
    }
}
