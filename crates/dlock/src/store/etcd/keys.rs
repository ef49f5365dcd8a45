//! How store paths map onto etcd keys, and back.
//!
//! A path is the key with the same bytes. Its children are the keys below
//! `path/` with no further slash; deeper keys make *implicit* directories
//! (a path with descendants but no key of its own). Keys whose name below a
//! node starts with a NUL byte are the backend's own markers (paths can
//! never contain NUL), never shown as nodes.

use etcd_client::KeyValue;

use crate::store::{Child, Stat};

/// What a position marker's key looks like below its node:
/// `<node>/\0pos/<revision>`.
const MARKER: &[u8] = b"/\0pos/";

/// The prefix of `path`'s children: `path/` (the root's is `/`).
pub fn child_prefix(path: &str) -> Vec<u8> {
    if path == "/" {
        b"/".to_vec()
    } else {
        format!("{path}/").into_bytes()
    }
}

/// The smallest key greater than every key starting with `prefix`.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff: to the end of the keyspace.
    vec![0]
}

/// The range `[start, end)` holding `path`'s real descendants (markers
/// excluded: they sort before every child name, whose first byte is at
/// least 0x1f by the path rules).
pub fn descendants(path: &str) -> (Vec<u8>, Vec<u8>) {
    let prefix = child_prefix(path);
    let end = prefix_end(&prefix);
    let mut start = prefix;
    start.push(1);
    (start, end)
}

/// The range `[start, end)` holding everything below `path` (descendants
/// and markers): what a listing reads.
pub fn below(path: &str) -> (Vec<u8>, Vec<u8>) {
    let prefix = child_prefix(path);
    let end = prefix_end(&prefix);
    (prefix, end)
}

/// The range `[start, end)` of `node`'s position markers.
pub fn markers(node: &str) -> (Vec<u8>, Vec<u8>) {
    let mut start = node.as_bytes().to_vec();
    start.extend_from_slice(b"/\0");
    let mut end = node.as_bytes().to_vec();
    end.extend_from_slice(b"/\x01");
    (start, end)
}

/// The key of `node`'s position marker: the node sorts as if created at
/// `revision`.
pub fn marker(node: &str, revision: i64) -> Vec<u8> {
    let mut key = node.as_bytes().to_vec();
    key.extend_from_slice(MARKER);
    key.extend_from_slice(revision.to_string().as_bytes());
    key
}

/// The range `[start, end)` covering `path` itself and everything below
/// it (plus siblings whose name extends `path`'s with a byte below `/`,
/// which watchers filter out).
pub fn subtree(path: &str) -> (Vec<u8>, Vec<u8>) {
    let end = prefix_end(&child_prefix(path));
    (path.as_bytes().to_vec(), end)
}

/// The key holding `path`'s own data. A keyless path (a namespace's root)
/// gets a key that never exists — keys below it start with its path and a
/// `/`, and paths never end with one — so that reading it needs no
/// permission outside the namespace.
pub fn own_key(path: &str, keyless: bool) -> String {
    if keyless {
        format!("{path}/")
    } else {
        path.to_string()
    }
}

/// The ancestors of `path` strictly below `root` (`/` or a namespace),
/// outermost first: the nodes a create checks are not ephemeral. Keys at or
/// above a namespace are not ours, and a role limited to it may not read
/// them.
pub fn ancestors_below<'p>(root: &str, path: &'p str) -> Vec<&'p str> {
    crate::path::ancestors(path)
        .filter(|a| {
            root == "/"
                || a.strip_prefix(root)
                    .is_some_and(|rest| rest.starts_with('/'))
        })
        .collect()
}

/// Where a watched key lies relative to the watched `path`.
#[derive(Debug, PartialEq, Eq)]
pub enum Relation {
    /// The key is `path` itself.
    Itself,
    /// A direct child key of `path`.
    Child,
    /// A deeper descendant of `path` (or a marker).
    Deeper,
    /// Not below `path` at all.
    Outside,
}

/// Classifies `key` relative to `path`.
pub fn relation(path: &str, key: &[u8]) -> Relation {
    if key == path.as_bytes() {
        return Relation::Itself;
    }
    let prefix = child_prefix(path);
    match key.strip_prefix(prefix.as_slice()) {
        None => Relation::Outside,
        Some(rest) if rest.first() == Some(&0) || rest.contains(&b'/') => Relation::Deeper,
        Some(_) => Relation::Child,
    }
}

/// Whether `key` is a real descendant of `path` (not a marker).
pub fn is_descendant(path: &str, key: &[u8]) -> bool {
    let prefix = child_prefix(path);
    match key.strip_prefix(prefix.as_slice()) {
        None => false,
        Some(rest) => !rest.is_empty() && rest[0] != 0 && !contains(rest, MARKER),
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Turns the keys below `path` (a [`below`] range read, keys only) into
/// its direct children: child keys, and implicit child directories made by
/// deeper keys. Each child's `created` is its key's create revision (a
/// position marker's revision if it has one), or for an implicit
/// directory the smallest create revision below it.
pub fn children(path: &str, kvs: &[KeyValue]) -> Vec<Child> {
    children_of(path, kvs.iter().map(|kv| (kv.key(), kv.create_revision())))
}

/// [`children`] from (key, create revision) pairs.
pub fn children_of<'k>(path: &str, keys: impl IntoIterator<Item = (&'k [u8], i64)>) -> Vec<Child> {
    // A key goes with its lease: no owner to tell.
    let keys = keys.into_iter().map(|(key, created)| (key, created, None));
    crate::store::children_from_keys(&child_prefix(path), MARKER, 0, keys)
}

pub(crate) use crate::store::listing_digest as digest;

/// A key's metadata in ZooKeeper's terms: czxid = create revision (the
/// fencing token), mzxid = mod revision, version = etcd version − 1,
/// ephemeral owner = the lease. `descendants` counts the keys below it
/// (reported as `num_children`).
pub fn stat(kv: &KeyValue, descendants: i64) -> Stat {
    Stat {
        czxid: kv.create_revision(),
        mzxid: kv.mod_revision(),
        version: (kv.version() - 1).clamp(0, i32::MAX as i64) as i32,
        cversion: 0,
        ephemeral_owner: kv.lease(),
        num_children: descendants.clamp(0, i32::MAX as i64) as i32,
        data_length: kv.value().len().min(i32::MAX as usize) as i32,
    }
}

/// The metadata of an implicit directory: no key, so no revisions, no data.
pub fn implicit_stat(descendants: i64) -> Stat {
    Stat {
        num_children: descendants.clamp(0, i32::MAX as i64) as i32,
        ..Stat::default()
    }
}

pub use crate::store::owned::{sequence_suffix, SEQUENCE_DIGITS};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(child_prefix("/"), b"/");
        assert_eq!(child_prefix("/a"), b"/a/");
        assert_eq!(prefix_end(b"/a/"), b"/a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(descendants("/a"), (b"/a/\x01".to_vec(), b"/a0".to_vec()));
        assert_eq!(
            markers("/a/n"),
            (b"/a/n/\0".to_vec(), b"/a/n/\x01".to_vec())
        );
        assert_eq!(marker("/a/n", 42), b"/a/n/\0pos/42");
        assert_eq!(subtree("/a"), (b"/a".to_vec(), b"/a0".to_vec()));
    }

    #[test]
    fn ancestors_below_a_namespace() {
        assert_eq!(ancestors_below("/", "/a/b/c"), ["/a", "/a/b"]);
        assert_eq!(ancestors_below("/ns", "/ns/a/b"), ["/ns/a"]);
        assert!(ancestors_below("/ns", "/ns/a").is_empty());
    }

    #[test]
    fn relations() {
        assert_eq!(relation("/a", b"/a"), Relation::Itself);
        assert_eq!(relation("/a", b"/a/b"), Relation::Child);
        assert_eq!(relation("/a", b"/a/b/c"), Relation::Deeper);
        assert_eq!(relation("/a", b"/a/b/\0pos/3"), Relation::Deeper);
        assert_eq!(relation("/a", b"/a-1"), Relation::Outside);
        assert_eq!(relation("/", b"/x"), Relation::Child);
        assert!(is_descendant("/a", b"/a/b/c"));
        assert!(!is_descendant("/a", b"/a/b/\0pos/3"));
        assert!(!is_descendant("/a", b"/a-b"));
    }

    #[test]
    fn suffixes() {
        assert_eq!(
            sequence_suffix("_c_x-__READ__0000000042"),
            Some("0000000042")
        );
        assert_eq!(sequence_suffix("n-000000000042"), Some("0000000042"));
        assert_eq!(sequence_suffix("n-42"), None);
    }
}
