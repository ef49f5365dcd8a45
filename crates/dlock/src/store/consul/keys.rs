//! How store paths map onto Consul keys, and Consul's KV entries back
//! onto nodes (the layout is described in `store::consul`'s module docs).

use base64::Engine as _;
use serde::Deserialize;

use crate::store::{Child, SessionId, Stat};

/// What a position marker's key looks like below its node:
/// `<node>/\x01pos/<create index>`. Paths cannot hold control characters,
/// so no node can collide with one.
pub const MARKER: &str = "/\u{1}pos/";

pub use crate::store::owned::sequence_suffix;

/// A KV entry, as Consul's API returns it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Entry {
    pub key: String,
    #[serde(default)]
    pub create_index: u64,
    #[serde(default)]
    pub modify_index: u64,
    #[serde(default)]
    pub flags: u64,
    #[serde(default)]
    pub session: Option<String>,
    #[serde(default)]
    pub value: Option<String>,
}

impl Entry {
    /// The value, decoded (Consul sends it in base64).
    pub fn data(&self) -> Vec<u8> {
        self.value
            .as_deref()
            .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok())
            .unwrap_or_default()
    }

    /// Whether `Flags` hold a tag (see `store::TAG_MIN`) rather than the
    /// data version.
    pub fn is_tagged(&self) -> bool {
        self.flags >= crate::store::TAG_MIN
    }

    /// The data version: `Flags`, or for a tagged key its `ModifyIndex`
    /// modulo 2^31. Every write moves `ModifyIndex`, so it is exact for
    /// compare-and-set; and the index only grows, store-wide, so a key made
    /// again in the place of a deleted one never repeats a version read
    /// from it (no ABA) until 2^31 writes later — where a count since the
    /// key's creation would start again at 0, and saturate on a long-lived
    /// key.
    pub fn version(&self) -> i32 {
        match self.is_tagged() {
            true => (self.modify_index % (1 << 31)) as i32,
            false => self.flags.min(i32::MAX as u64) as i32,
        }
    }

    /// The `Flags` a set writes: the next version, or the tag unchanged.
    pub fn next_flags(&self) -> u64 {
        match self.is_tagged() {
            true => self.flags,
            false => self.flags + 1,
        }
    }

    /// The owning session, as a session id (0: none).
    pub fn owner(&self) -> SessionId {
        self.session.as_deref().map_or(0, session_id)
    }
}

/// A Consul session's UUID as a [`SessionId`]: its first 63 bits (never
/// 0). Unique enough to tell sessions apart; the UUID stays the identity.
pub fn session_id(uuid: &str) -> SessionId {
    let hex: String = uuid
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(16)
        .collect();
    let n = u64::from_str_radix(&hex, 16).unwrap_or(0) & (i64::MAX as u64);
    n.max(1) as i64
}

/// Maps paths to keys below a prefix.
#[derive(Debug, Clone)]
pub struct Layout {
    /// `""`, or the prefix's key with a trailing `/` (`app/`).
    prefix: String,
}

impl Layout {
    /// The layout below `prefix` (a store path such as `/app`, or none).
    pub fn new(prefix: Option<&str>) -> Layout {
        Layout {
            prefix: match prefix {
                None | Some("/") => String::new(),
                Some(p) => format!("{}/", p.trim_start_matches('/')),
            },
        }
    }

    /// The key of `path` (not the root, which has none).
    pub fn key(&self, path: &str) -> String {
        format!("{}{}", self.prefix, path.trim_start_matches('/'))
    }

    /// The prefix of `path`'s descendants' keys.
    pub fn below(&self, path: &str) -> String {
        if path == "/" {
            self.prefix.clone()
        } else {
            format!("{}/", self.key(path))
        }
    }
}

/// The key of `node`'s position marker: it sorts as if created at `index`.
pub fn marker(node_key: &str, index: u64) -> String {
    format!("{node_key}{MARKER}{index}")
}

/// The prefix of all markers of `node_key`.
pub fn markers(node_key: &str) -> String {
    format!("{node_key}/\u{1}")
}

/// The direct children of the node whose descendants' keys start with
/// `below`, from entries of a recursive read of it: child keys, and
/// implicit child directories made by deeper keys. `created` is a child's
/// create index (a marker's, if it has one; an implicit directory's
/// smallest below it); `czxid` its own key's create index.
pub fn children<'e>(below: &str, entries: impl IntoIterator<Item = &'e Entry>) -> Vec<Child> {
    let keys = entries
        .into_iter()
        .map(|e| (e.key.as_bytes(), e.create_index as i64, Some(e.owner())));
    crate::store::children_from_keys(below.as_bytes(), MARKER.as_bytes(), 1, keys)
}

/// Whether `key` is a real descendant (not a marker) of the node whose
/// descendants start with `below`.
pub fn is_descendant(below: &str, key: &str) -> bool {
    key.strip_prefix(below).is_some_and(|rest| {
        !rest.is_empty() && !rest.starts_with('\u{1}') && !rest.contains(MARKER)
    })
}

pub(crate) use crate::store::listing_digest as digest;

/// An entry's metadata in ZooKeeper's terms.
pub fn stat(e: &Entry, descendants: usize) -> Stat {
    Stat {
        czxid: e.create_index as i64,
        mzxid: e.modify_index as i64,
        version: e.version(),
        cversion: 0,
        ephemeral_owner: e.owner(),
        num_children: descendants.min(i32::MAX as usize) as i32,
        data_length: e.data().len().min(i32::MAX as usize) as i32,
    }
}

/// The metadata of an implicit directory: no key, no indexes, no data.
pub fn implicit_stat(descendants: usize) -> Stat {
    Stat {
        num_children: descendants.min(i32::MAX as usize) as i32,
        ..Stat::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, index: u64) -> Entry {
        Entry {
            key: key.into(),
            create_index: index,
            modify_index: index,
            flags: 0,
            session: None,
            value: None,
        }
    }

    #[test]
    fn layout() {
        let root = Layout::new(None);
        assert_eq!(root.key("/a/b"), "a/b");
        assert_eq!(root.below("/"), "");
        assert_eq!(root.below("/a"), "a/");
        let app = Layout::new(Some("/app"));
        assert_eq!(app.key("/a/b"), "app/a/b");
        assert_eq!(app.below("/"), "app/");
    }

    #[test]
    fn children_merge_keys_markers_and_implicit_directories() {
        let entries = [
            entry("d/a", 5),
            entry("d/b/c", 7),
            entry("d/b/e", 6),
            entry("d/r", 9),
            entry(&marker("d/r", 3), 9),
            entry("d/\u{1}x", 1),
        ];
        let kids = children("d/", &entries);
        let got: Vec<_> = kids
            .iter()
            .map(|c| (c.name.as_str(), c.created, c.czxid))
            .collect();
        assert_eq!(
            got,
            [
                ("a", Some(5), Some(5)),
                ("b", Some(6), None),
                ("r", Some(3), Some(9))
            ]
        );
        assert!(is_descendant("d/", "d/b/c"));
        assert!(!is_descendant("d/", &marker("d/r", 3)));
        assert!(!is_descendant("d/", "d/"));
    }

    #[test]
    fn a_tagged_keys_version_never_repeats_when_it_is_made_again() {
        let tagged = |create, modify| Entry {
            create_index: create,
            modify_index: modify,
            flags: crate::store::TAG_MIN,
            ..entry("d/.lock", 0)
        };
        let old = tagged(10, 10);
        let written = tagged(10, 17);
        assert_ne!(old.version(), written.version(), "a write moves it");
        let made_again = tagged(20, 20);
        assert!(
            made_again.version() > written.version(),
            "a new key: a later index"
        );
        let long_lived = tagged(1, (1 << 31) + 5);
        assert_eq!(long_lived.version(), 5, "wraps, never saturates");
    }

    #[test]
    fn session_ids_come_from_the_uuid() {
        assert_eq!(
            session_id("9a2aef2d-ec29-bf90-d2ae-ab04937b1019"),
            0x1a2aef2dec29bf90
        );
        assert_eq!(session_id(""), 1);
    }
}
