//! What a directory's shared watch delivered: its latest deletions, for
//! node watches that join it late, and a copy of the keys below the
//! directory, so that a woken waiter needs no round trip.
//!
//! A handoff costs the new holder a listing (is anyone still ahead of me?)
//! and, before that, a read to arm its watch on the node ahead. Both answers
//! are already on the client: the listing its node queued with (at
//! revision `L`, no older than the watch's start) has every node created
//! up to `L`, and the directory's shared watch delivers every deletion
//! below it after that, in order, with no gap. So the copy (that listing,
//! less the deletions after `L`) has exactly the nodes created up to `L`
//! that still existed at the last deletion applied (`as_of`); nodes
//! created after `L` are not in it (the watch does not deliver creations:
//! they would cost every waiting client a message per handoff), so it
//! answers only for nodes created up to `L`. The dispatcher records a
//! response's deletions before it fires the watches they wake, so a woken
//! waiter's view already holds the deletion that woke it.
//!
//! Why that is enough for a wait queue: a waiter only waits for nodes
//! created before its own (a node created after ours can never be ahead of
//! ours — except one that takes another's place, the read-write lock's
//! downgrade, whose writers list instead), and asks with `since` = its
//! node's creation, which its own listing covers. The copy never shows a node as gone that exists
//! (deletions reach it only once committed), so "nobody ahead of me" stays
//! true; and "my node is there" at `as_of` is what etcd's own recipe checks
//! with its extra read after a wait (the etcd 3.4.3 Jepsen finding): a
//! lease that expired before `as_of` would have shown as our key's
//! deletion.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use etcd_client::KeyValue;

use super::keys;
use crate::store::Child;

/// One delivered deletion: (revision, key).
pub(super) type Deletion = (i64, Vec<u8>);

/// How many delivered deletions a shared watch keeps.
const RECENT: usize = 1024;

/// What every directory with a shared watch has seen, by directory:
/// written by the watch dispatcher, read by the store.
#[derive(Debug, Clone, Default)]
pub(super) struct Mirrors(Arc<Mutex<HashMap<String, Seen>>>);

#[derive(Debug, Default)]
struct Seen {
    /// The latest deletions delivered, oldest first.
    recent: VecDeque<Deletion>,
    /// Every deletion after this revision has been delivered and is still in
    /// `recent`, or is still to come. `None` until the watch started.
    complete_after: Option<i64>,
    /// The copy of the keys below the directory, once a listing started it.
    copy: Option<Copy>,
}

#[derive(Debug)]
struct Copy {
    /// Key → its create revision.
    keys: BTreeMap<Vec<u8>, i64>,
    /// The revision of the listing it started from: changes up to it are
    /// in it already, and it has every node created up to it. (One
    /// revision can change several keys, so this, not `as_of`, is the
    /// bound.)
    listed_at: i64,
    /// The revision of the last deletion applied: the copy has every
    /// deletion up to it.
    as_of: i64,
}

impl Copy {
    fn apply(&mut self, (revision, key): &Deletion) {
        if *revision <= self.listed_at {
            return;
        }
        self.keys.remove(key);
        self.as_of = self.as_of.max(*revision);
    }
}

impl Seen {
    /// The recent deletions after `revision` (in revision order).
    fn after(&self, revision: i64) -> impl Iterator<Item = &Deletion> {
        let first = self.recent.partition_point(|(r, _)| *r <= revision);
        self.recent.range(first..)
    }

    /// The copy, if it has every node created up to `since`.
    fn copy_since(&self, since: i64) -> Option<&Copy> {
        self.copy.as_ref().filter(|c| c.listed_at >= since)
    }
}

/// What a node watch joining a shared watch missed since its arming read.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Missed {
    /// The shared watch has not started: its start is checked then.
    Unknown,
    /// Changes after the read are no longer all kept: read again.
    Gap,
    /// The node was deleted after the read.
    Deleted,
    /// Nothing.
    Nothing,
}

impl Mirrors {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Seen>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts afresh for `dir`: its shared watch opened, or opened again
    /// with a gap behind it.
    pub fn reset(&self, dir: &str) {
        self.lock().insert(dir.to_string(), Seen::default());
    }

    /// Forgets `dir` (its shared watch closed).
    pub fn remove(&self, dir: &str) {
        self.lock().remove(dir);
    }

    /// The shared watch on `dir` delivers every deletion after `revision`.
    pub fn started(&self, dir: &str, revision: i64) {
        if let Some(seen) = self.lock().get_mut(dir) {
            seen.complete_after = Some(revision);
        }
    }

    /// Records deletions the shared watch on `dir` delivered, in order.
    pub fn deliver(&self, dir: &str, deletions: impl IntoIterator<Item = Deletion>) {
        let mut mirrors = self.lock();
        let Some(seen) = mirrors.get_mut(dir) else {
            return;
        };
        for deletion in deletions {
            if let Some(copy) = &mut seen.copy {
                copy.apply(&deletion);
            }
            if seen.recent.len() == RECENT {
                if let Some((dropped, _)) = seen.recent.pop_front() {
                    seen.complete_after = seen.complete_after.map(|c| c.max(dropped));
                }
            }
            seen.recent.push_back(deletion);
        }
    }

    /// What a watch on `path`, armed by a read at `covered`, missed.
    pub fn missed(&self, path: &str, covered: i64) -> Missed {
        let mirrors = self.lock();
        let Some(seen) = mirrors.get(crate::path::parent(path)) else {
            return Missed::Unknown;
        };
        match seen.complete_after {
            None => Missed::Unknown,
            Some(complete) if covered < complete => Missed::Gap,
            Some(_) => seen
                .after(covered)
                .find(|(_, key)| key == path.as_bytes())
                .map_or(Missed::Nothing, |_| Missed::Deleted),
        }
    }

    /// Offers a listing of every key below `dir` read at `revision`: it
    /// becomes the copy if it is newer and every change after it was or
    /// will be delivered. So the copy is never older than this client's
    /// last listing, and a waiter arming its watch right after queueing
    /// finds its predecessor in it.
    pub fn seed(&self, dir: &str, revision: i64, kvs: &[KeyValue]) {
        let listed = kvs
            .iter()
            .map(|kv| (kv.key().to_vec(), kv.create_revision()));
        self.seed_with(dir, revision, listed);
    }

    fn seed_with(
        &self,
        dir: &str,
        revision: i64,
        listed: impl IntoIterator<Item = (Vec<u8>, i64)>,
    ) {
        let mut mirrors = self.lock();
        let Some(seen) = mirrors.get_mut(dir) else {
            return;
        };
        let older = seen.copy.as_ref().is_some_and(|c| revision <= c.listed_at);
        if older || seen.complete_after.is_none_or(|c| revision < c) {
            return;
        }
        let mut copy = Copy {
            keys: listed.into_iter().collect(),
            listed_at: revision,
            as_of: revision,
        };
        for deletion in seen.after(revision) {
            copy.apply(deletion);
        }
        seen.copy = Some(copy);
    }

    /// `dir`'s children created up to `since` (and maybe later ones), as of
    /// a revision no older than `since`, if the copy has them.
    pub fn children(&self, dir: &str, since: i64) -> Option<Vec<Child>> {
        let mirrors = self.lock();
        let copy = mirrors.get(dir)?.copy_since(since)?;
        Some(keys::children_of(
            dir,
            copy.keys
                .iter()
                .map(|(key, &created)| (key.as_slice(), created)),
        ))
    }

    /// Node `path`, created up to `since`, in its directory's copy, if that
    /// has every node created up to `since`: the revision up to which the
    /// copy has every deletion, and the node's create revision (`None`:
    /// gone).
    pub fn node(&self, path: &str, since: i64) -> Option<(i64, Option<i64>)> {
        let mirrors = self.lock();
        let copy = mirrors.get(crate::path::parent(path))?.copy_since(since)?;
        Some((copy.as_of, copy.keys.get(path.as_bytes()).copied()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delete(revision: i64, key: &str) -> Deletion {
        (revision, key.as_bytes().to_vec())
    }

    fn names(children: Option<Vec<Child>>) -> Option<Vec<String>> {
        children.map(|c| c.into_iter().map(|c| c.name).collect())
    }

    fn listed(keys: &[(&str, i64)]) -> Vec<(Vec<u8>, i64)> {
        keys.iter()
            .map(|(k, r)| (k.as_bytes().to_vec(), *r))
            .collect()
    }

    /// Mirrors of `/d`, whose shared watch started after `revision`.
    fn started_after(revision: i64) -> Mirrors {
        let mirrors = Mirrors::default();
        mirrors.reset("/d");
        mirrors.started("/d", revision);
        mirrors
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
        mirrors.deliver("/d", [delete(13, "/d/c"), delete(14, "/d/a")]);
        // A listing at 13 no longer has c: only the delete after it applies.
        mirrors.seed_with("/d", 13, listed(&[("/d/a", 5), ("/d/b", 13)]));
        assert_eq!(names(mirrors.children("/d", 13)), Some(vec!["b".into()]));
        assert_eq!(mirrors.node("/d/a", 0), Some((14, None)));
        assert_eq!(mirrors.node("/d/b", 13), Some((14, Some(13))));
    }

    #[test]
    fn every_change_of_one_revision_applies() {
        let mirrors = started_after(1);
        mirrors.seed_with("/d", 3, listed(&[("/d/a", 2), ("/d/b", 3)]));
        // One lease revocation deletes both keys at revision 4.
        mirrors.deliver("/d", [delete(4, "/d/a"), delete(4, "/d/b")]);
        assert_eq!(names(mirrors.children("/d", 3)), Some(vec![]));
    }

    #[test]
    fn a_copy_answers_for_nodes_created_up_to_its_listing_only() {
        let mirrors = started_after(1);
        mirrors.seed_with("/d", 5, listed(&[("/d/a", 3)]));
        // b, created at 7, is not in the copy: unknown, not gone.
        assert_eq!(mirrors.node("/d/b", 7), None);
        assert_eq!(names(mirrors.children("/d", 7)), None);
        assert_eq!(names(mirrors.children("/d", 5)), Some(vec!["a".into()]));
        mirrors.deliver("/d", [delete(10, "/d/a")]);
        assert_eq!(mirrors.node("/d/a", 3), Some((10, None)));
        // A listing at 8 has what the copy lacks, though the copy has a
        // later deletion; that deletion applies on top of it.
        mirrors.seed_with("/d", 8, listed(&[("/d/a", 3), ("/d/b", 7)]));
        assert_eq!(mirrors.node("/d/b", 7), Some((10, Some(7))));
        assert_eq!(names(mirrors.children("/d", 8)), Some(vec!["b".into()]));
    }

    #[test]
    fn a_copy_older_than_asked_answers_nothing() {
        let mirrors = started_after(1);
        mirrors.seed_with("/d", 3, listed(&[("/d/a", 2)]));
        assert!(mirrors.children("/d", 3).is_some());
        assert!(mirrors.children("/d", 4).is_none());
        assert!(mirrors.node("/d/a", 4).is_none());
        assert!(mirrors.children("/other", 0).is_none());
    }

    #[test]
    fn a_watch_that_dropped_changes_refuses_listings_from_before_them() {
        let mirrors = started_after(1);
        let count = RECENT as i64 + 10;
        mirrors.deliver("/d", (2..2 + count).map(|r| delete(r, &format!("/d/n{r}"))));
        mirrors.seed_with("/d", 5, listed(&[]));
        assert!(
            mirrors.children("/d", 0).is_none(),
            "changes after 5 were dropped"
        );
        let last = 1 + count;
        let before_last = [(format!("/d/n{last}"), 1), ("/d/x".into(), 1)];
        let before_last: Vec<_> = before_last.iter().map(|(k, r)| (k.as_str(), *r)).collect();
        mirrors.seed_with("/d", last - 1, listed(&before_last));
        assert_eq!(
            names(mirrors.children("/d", last - 1)),
            Some(vec!["x".into()])
        );
    }

    #[test]
    fn a_newer_listing_replaces_the_copy_and_later_changes_apply_on_top() {
        let mirrors = started_after(1);
        mirrors.seed_with("/d", 2, listed(&[("/d/a", 2)]));
        // The copy lacks b and c; a listing at 4 has them.
        mirrors.seed_with("/d", 4, listed(&[("/d/a", 2), ("/d/b", 3), ("/d/c", 4)]));
        assert_eq!(mirrors.node("/d/c", 4), Some((4, Some(4))));
        // An older listing changes nothing; late changes up to 4 are in it.
        mirrors.seed_with("/d", 3, listed(&[("/d/a", 2)]));
        mirrors.deliver("/d", [delete(3, "/d/z"), delete(5, "/d/a")]);
        assert_eq!(
            names(mirrors.children("/d", 4)),
            Some(vec!["b".into(), "c".into()])
        );
        assert_eq!(mirrors.node("/d/a", 2), Some((5, None)));
    }

    #[test]
    fn a_joining_watch_learns_what_it_missed_or_that_it_cannot_know() {
        let mirrors = Mirrors::default();
        mirrors.reset("/d");
        assert_eq!(mirrors.missed("/d/a", 5), Missed::Unknown);
        mirrors.started("/d", 6);
        assert_eq!(mirrors.missed("/d/a", 5), Missed::Gap);
        mirrors.deliver("/d", [delete(7, "/d/b"), delete(9, "/d/a")]);
        assert_eq!(mirrors.missed("/d/a", 6), Missed::Deleted);
        assert_eq!(mirrors.missed("/d/a", 8), Missed::Deleted);
        assert_eq!(mirrors.missed("/d/a", 9), Missed::Nothing);
        assert_eq!(mirrors.missed("/e/a", 9), Missed::Unknown);
    }

    #[test]
    fn a_reset_forgets_everything() {
        let mirrors = started_after(1);
        mirrors.seed_with("/d", 2, listed(&[("/d/a", 2)]));
        mirrors.reset("/d");
        assert!(mirrors.children("/d", 0).is_none());
        mirrors.remove("/d");
        mirrors.deliver("/d", [delete(3, "/d/a")]);
        assert!(mirrors.children("/d", 0).is_none());
    }
}
