//! What a directory's shared watch has seen, kept as a copy of the keys
//! below the directory, so that a woken waiter needs no round trip.
//!
//! A handoff costs the new holder a listing (is anyone still ahead of me?)
//! and, before that, a read to arm its watch on the node ahead. Both answers
//! are already on the client: the directory's shared watch delivers every
//! change below it, in order, with no gap. Started from one listing (at
//! revision `L`, no older than the watch's start), and with every event
//! after `L` applied, the copy is the directory exactly as of the last
//! revision applied (`as_of`). The dispatcher applies a response's events
//! before it fires the watches they wake, so a woken waiter's view already
//! holds the change that woke it.
//!
//! Why a view that may trail the server by the watch's delay is enough for a
//! wait queue: it never shows a node as gone that exists (deletions reach
//! it only once committed), and a node created after ours can never be
//! ahead of ours. So "nobody ahead of me" seen at `as_of` stays true; and
//! "my node is there" at `as_of` is what etcd's own recipe checks with its
//! extra read after a wait (the etcd 3.4.3 Jepsen finding): a lease that
//! expired before `as_of` would have shown as our key's deletion.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use etcd_client::KeyValue;

use super::keys;
use crate::store::Child;

/// A key's create and mod revisions.
type Revisions = (i64, i64);

/// One delivered change: (revision, key, the key's revisions if it was put).
pub(super) type Change = (i64, Vec<u8>, Option<Revisions>);

/// How many changes an unseeded copy keeps for the listing that will seed
/// it; past that, a listing must be newer than the oldest one dropped.
const BACKLOG: usize = 1024;

/// The copies of every directory that has a shared watch, by directory:
/// written by the watch dispatcher, read by the store.
#[derive(Debug, Clone, Default)]
pub(super) struct Mirrors(Arc<Mutex<HashMap<String, Mirror>>>);

#[derive(Debug, Default)]
struct Mirror {
    /// Every key below the directory, once seeded.
    keys: Option<BTreeMap<Vec<u8>, Revisions>>,
    /// The revision of the listing that seeded the copy: changes up to it
    /// are in it already.
    seeded_at: i64,
    /// The revision the copy is exact at.
    as_of: i64,
    /// Changes at or before this revision may be missing from `backlog`
    /// (the watch's start, then the newest change dropped): a listing
    /// older than it cannot seed the copy. `None` until the watch started.
    floor: Option<i64>,
    /// Changes delivered while unseeded, oldest first.
    backlog: VecDeque<Change>,
}

impl Mirror {
    fn apply(&mut self, (revision, key, put): Change) {
        let Some(keys) = &mut self.keys else {
            if self.backlog.len() == BACKLOG {
                if let Some((dropped, _, _)) = self.backlog.pop_front() {
                    self.floor = self.floor.map(|f| f.max(dropped));
                }
            }
            self.backlog.push_back((revision, key, put));
            return;
        };
        // Already in the listing that seeded the copy. (One revision can
        // change several keys, so only the listing's revision is a bound.)
        if revision <= self.seeded_at {
            return;
        }
        match put {
            Some(revisions) => keys.insert(key, revisions),
            None => keys.remove(&key),
        };
        self.as_of = self.as_of.max(revision);
    }
}

impl Mirrors {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Mirror>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts an empty, unseeded copy of `dir` (its shared watch opened),
    /// or empties it (the watch is opened again, with a gap behind it).
    pub fn reset(&self, dir: &str) {
        self.lock().insert(dir.to_string(), Mirror::default());
    }

    /// Drops the copy of `dir` (its shared watch closed).
    pub fn remove(&self, dir: &str) {
        self.lock().remove(dir);
    }

    /// The shared watch on `dir` delivers every change after `revision`.
    pub fn started(&self, dir: &str, revision: i64) {
        if let Some(m) = self.lock().get_mut(dir) {
            m.floor = Some(revision);
        }
    }

    /// Applies changes the shared watch on `dir` delivered, in order.
    pub fn apply(&self, dir: &str, changes: impl IntoIterator<Item = Change>) {
        if let Some(m) = self.lock().get_mut(dir) {
            for change in changes {
                m.apply(change);
            }
        }
    }

    /// Offers a listing of every key below `dir` read at `revision`: it
    /// becomes the copy if it is newer and the watch delivers (or
    /// delivered and kept) every change after it. So the copy is never
    /// older than this client's last listing, and a waiter arming its
    /// watch right after queueing finds its predecessor in it.
    pub fn seed(&self, dir: &str, revision: i64, kvs: &[KeyValue]) {
        let listed = kvs
            .iter()
            .map(|kv| (kv.key().to_vec(), (kv.create_revision(), kv.mod_revision())));
        self.seed_with(dir, revision, listed);
    }

    fn seed_with(
        &self,
        dir: &str,
        revision: i64,
        listed: impl IntoIterator<Item = (Vec<u8>, Revisions)>,
    ) {
        let mut mirrors = self.lock();
        let Some(m) = mirrors.get_mut(dir) else {
            return;
        };
        let older = m.keys.is_some() && revision <= m.as_of;
        if older || m.floor.is_none_or(|floor| revision < floor) {
            return;
        }
        m.keys = Some(listed.into_iter().collect());
        m.seeded_at = revision;
        m.as_of = revision;
        for change in std::mem::take(&mut m.backlog) {
            m.apply(change);
        }
    }

    /// `dir`'s children as of a revision no older than `since`, if the copy
    /// has them.
    pub fn children(&self, dir: &str, since: i64) -> Option<Vec<Child>> {
        let mirrors = self.lock();
        let m = mirrors.get(dir)?;
        let keys = m.keys.as_ref().filter(|_| m.as_of >= since)?;
        Some(keys::children_of(
            dir,
            keys.iter()
                .map(|(key, &(created, _))| (key.as_slice(), created)),
        ))
    }

    /// Node `path` in its directory's copy, if that is no older than
    /// `since`: the copy's revision, and the node's create and mod
    /// revisions (`None`: not there).
    pub fn node(&self, path: &str, since: i64) -> Option<(i64, Option<Revisions>)> {
        let mirrors = self.lock();
        let m = mirrors.get(crate::path::parent(path))?;
        let keys = m.keys.as_ref().filter(|_| m.as_of >= since)?;
        Some((m.as_of, keys.get(path.as_bytes()).copied()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(revision: i64, key: &str) -> Change {
        (
            revision,
            key.as_bytes().to_vec(),
            Some((revision, revision)),
        )
    }

    fn delete(revision: i64, key: &str) -> Change {
        (revision, key.as_bytes().to_vec(), None)
    }

    fn names(children: Option<Vec<Child>>) -> Option<Vec<String>> {
        children.map(|c| c.into_iter().map(|c| c.name).collect())
    }

    fn listed(keys: &[(&str, i64)]) -> Vec<(Vec<u8>, Revisions)> {
        keys.iter()
            .map(|(k, r)| (k.as_bytes().to_vec(), (*r, *r)))
            .collect()
    }

    #[test]
    fn a_copy_answers_only_once_seeded_by_a_listing_no_older_than_its_watch() {
        let mirrors = Mirrors::default();
        mirrors.reset("/d");
        // Before the watch started, no listing can tell what it missed.
        mirrors.seed_with("/d", 10, listed(&[("/d/a", 5)]));
        assert_eq!(names(mirrors.children("/d", 0)), None);
        mirrors.started("/d", 12);
        mirrors.seed_with("/d", 11, listed(&[("/d/a", 5)]));
        assert_eq!(
            names(mirrors.children("/d", 0)),
            None,
            "older than the watch"
        );
        mirrors.apply("/d", [put(13, "/d/b"), delete(14, "/d/a")]);
        // A listing at 13 already has b: only the delete after it applies.
        mirrors.seed_with("/d", 13, listed(&[("/d/a", 5), ("/d/b", 13)]));
        assert_eq!(names(mirrors.children("/d", 14)), Some(vec!["b".into()]));
        assert_eq!(mirrors.node("/d/a", 0), Some((14, None)));
        assert_eq!(mirrors.node("/d/b", 0), Some((14, Some((13, 13)))));
    }

    #[test]
    fn every_change_of_one_revision_applies() {
        let mirrors = Mirrors::default();
        mirrors.reset("/d");
        mirrors.started("/d", 1);
        mirrors.seed_with("/d", 3, listed(&[("/d/a", 2), ("/d/b", 3)]));
        // One lease revocation deletes both keys at revision 4.
        mirrors.apply("/d", [delete(4, "/d/a"), delete(4, "/d/b")]);
        assert_eq!(names(mirrors.children("/d", 4)), Some(vec![]));
    }

    #[test]
    fn a_copy_older_than_asked_answers_nothing() {
        let mirrors = Mirrors::default();
        mirrors.reset("/d");
        mirrors.started("/d", 1);
        mirrors.seed_with("/d", 3, listed(&[("/d/a", 2)]));
        assert!(mirrors.children("/d", 3).is_some());
        assert!(mirrors.children("/d", 4).is_none());
        assert!(mirrors.node("/d/a", 4).is_none());
        assert!(mirrors.children("/other", 0).is_none());
    }

    #[test]
    fn a_backlog_that_overflowed_refuses_listings_from_before_what_it_dropped() {
        let mirrors = Mirrors::default();
        mirrors.reset("/d");
        mirrors.started("/d", 1);
        let count = BACKLOG as i64 + 10;
        mirrors.apply("/d", (2..2 + count).map(|r| put(r, &format!("/d/n{r}"))));
        mirrors.seed_with("/d", 5, listed(&[]));
        assert!(
            mirrors.children("/d", 0).is_none(),
            "changes after 5 were dropped"
        );
        let last = 1 + count;
        mirrors.seed_with("/d", last - 1, listed(&[("/d/x", 1)]));
        assert_eq!(
            names(mirrors.children("/d", last)),
            Some(vec![format!("n{last}"), "x".into()])
        );
    }

    #[test]
    fn a_newer_listing_replaces_the_copy_and_later_changes_apply_on_top() {
        let mirrors = Mirrors::default();
        mirrors.reset("/d");
        mirrors.started("/d", 1);
        mirrors.seed_with("/d", 2, listed(&[("/d/a", 2)]));
        // The watch has not delivered b and c yet; a listing at 4 has them.
        mirrors.seed_with("/d", 4, listed(&[("/d/a", 2), ("/d/b", 3), ("/d/c", 4)]));
        assert_eq!(mirrors.node("/d/c", 4), Some((4, Some((4, 4)))));
        // An older listing changes nothing; late changes up to 4 are in it.
        mirrors.seed_with("/d", 3, listed(&[("/d/a", 2)]));
        mirrors.apply("/d", [put(3, "/d/b"), put(4, "/d/c"), delete(5, "/d/a")]);
        assert_eq!(
            names(mirrors.children("/d", 5)),
            Some(vec!["b".into(), "c".into()])
        );
    }

    #[test]
    fn a_reset_forgets_everything() {
        let mirrors = Mirrors::default();
        mirrors.reset("/d");
        mirrors.started("/d", 1);
        mirrors.seed_with("/d", 2, listed(&[("/d/a", 2)]));
        mirrors.reset("/d");
        assert!(mirrors.children("/d", 0).is_none());
        mirrors.remove("/d");
        mirrors.apply("/d", [put(3, "/d/b")]);
        assert!(mirrors.children("/d", 0).is_none());
    }
}
