//! Store paths: ZooKeeper's rules, checked before anything reaches a store.

use crate::error::{Error, Result};

/// Checks `path` against ZooKeeper's path rules (`PathUtils.validatePath`):
/// absolute, no trailing slash (except the root), no empty, `.` or `..`
/// segments, and none of the characters ZooKeeper forbids — U+0000–U+001F,
/// U+007F–U+009F, U+E000–U+F8FF (with the surrogates, U+D800–U+F8FF in
/// UTF-16) and U+FFF0–U+FFFF, bounds included as the ZooKeeper client
/// (`zookeeper-client`) checks them, and every character beyond U+FFFF,
/// which is a surrogate pair in ZooKeeper's UTF-16 and which the ZooKeeper
/// server refuses. So a path accepted here is one every backend can hold.
///
/// ```
/// use dlock::path::validate;
/// assert!(validate("/locks/a").is_ok());
/// assert!(validate("locks").is_err());
/// assert!(validate("/a//b").is_err());
/// assert!(validate("/a/").is_err());
/// ```
pub fn validate(path: &str) -> Result<()> {
    let fail = |reason: &str| {
        Err(Error::InvalidPath {
            path: path.to_string(),
            reason: reason.to_string(),
        })
    };
    if path.is_empty() {
        return fail("path must not be empty");
    }
    if !path.starts_with('/') {
        return fail("path must start with /");
    }
    if path == "/" {
        return Ok(());
    }
    if path.ends_with('/') {
        return fail("path must not end with /");
    }
    for segment in path[1..].split('/') {
        match segment {
            "" => return fail("empty node name (double slash)"),
            "." | ".." => return fail("relative segments . and .. are not allowed"),
            _ => {}
        }
    }
    for (i, c) in path.chars().enumerate() {
        let u = c as u32;
        // ZooKeeper's server codes these bounds as exclusive, but the Rust
        // client refuses them inclusively, and the server refuses the
        // surrogate pairs of characters beyond U+FFFF: refuse all of them,
        // so that no backend accepts a path ZooKeeper would not.
        let forbidden = u <= 0x1f
            || (0x7f..=0x9f).contains(&u)
            || (0xd800..=0xf8ff).contains(&u)
            || (0xfff0..=0xffff).contains(&u)
            || u > 0xffff;
        if forbidden {
            return fail(&format!("invalid character U+{u:04X} at index {i}"));
        }
    }
    Ok(())
}

/// Checks the path of a recipe (`what`, as in "a semaphore"): a valid
/// path other than the root, where the recipe's nodes would mix with every
/// other node of the store. What each recipe's `new` checks first, for a
/// caller that wants to refuse a bad path before connecting.
///
/// ```
/// use dlock::path::validate_recipe;
/// assert!(validate_recipe("/locks/nightly", "a lock").is_ok());
/// assert!(validate_recipe("/", "a lock").is_err());
/// assert!(validate_recipe("relative", "a lock").is_err());
/// ```
pub fn validate_recipe(path: &str, what: &str) -> Result<()> {
    validate(path)?;
    if path == "/" {
        return Err(Error::InvalidPath {
            path: path.into(),
            reason: format!("{what} cannot live at the root"),
        });
    }
    Ok(())
}

/// Joins a parent path and a child name with exactly one slash.
///
/// ```
/// assert_eq!(dlock::path::join("/a", "b"), "/a/b");
/// assert_eq!(dlock::path::join("/", "b"), "/b");
/// ```
pub fn join(parent: &str, child: &str) -> String {
    if parent.ends_with('/') {
        format!("{parent}{child}")
    } else {
        format!("{parent}/{child}")
    }
}

/// The last segment of a path.
///
/// ```
/// assert_eq!(dlock::path::node_name("/a/b"), "b");
/// ```
pub fn node_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The parent of a path (`/` for top-level nodes and the root).
///
/// ```
/// assert_eq!(dlock::path::parent("/a/b"), "/a");
/// assert_eq!(dlock::path::parent("/a"), "/");
/// ```
pub fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

/// The protection prefix (`_c_<uuid>-`, Curator's protected mode) a node
/// name starts with, if it has one. Its creator drew the UUID at random,
/// so no other client makes a node of that name.
///
/// ```
/// let name = "_c_2f1e6b6a-8a8e-4c39-9d5f-1a4b0e7c3d21-lock-0000000007";
/// assert_eq!(
///     dlock::path::protection_prefix(name),
///     Some("_c_2f1e6b6a-8a8e-4c39-9d5f-1a4b0e7c3d21-")
/// );
/// assert_eq!(dlock::path::protection_prefix("lock-0000000007"), None);
/// ```
pub fn protection_prefix(name: &str) -> Option<&str> {
    const LEN: usize = 3 + 36 + 1;
    let prefix = name.get(..LEN)?;
    let uuid = prefix.strip_prefix("_c_")?.strip_suffix('-')?;
    uuid::Uuid::try_parse(uuid).is_ok().then_some(prefix)
}

/// The ancestors of a path, outermost first, without the root and the path.
pub(crate) fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    path.char_indices()
        .skip(1)
        .filter(|&(_, c)| c == '/')
        .map(move |(i, _)| &path[..i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zookeeper_rules() {
        for ok in ["/", "/a", "/a/b.c", "/a/..b", "/ä", "/a b"] {
            assert!(validate(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a",
            "/a/",
            "//",
            "/a/./b",
            "/a/../b",
            "/.",
            "/a\u{0}b",
            "/a\u{1}",
            "/\u{80}x",
            "/\u{e000}",
            "/\u{1f}",
            "/\u{7f}",
            "/\u{9f}",
            "/\u{f8ff}",
            "/\u{fff0}",
            "/\u{ffff}",
            "/\u{1f600}",
        ] {
            let err = validate(bad).unwrap_err();
            assert!(
                matches!(err, Error::InvalidPath { .. }),
                "{bad:?} gave {err}"
            );
        }
        // Just outside the forbidden ranges.
        for ok in [
            "/\u{20}",
            "/\u{7e}",
            "/\u{a0}",
            "/\u{d7ff}",
            "/\u{f900}",
            "/\u{ffef}",
        ] {
            assert!(validate(ok).is_ok(), "{ok:?}");
        }
    }

    #[test]
    fn ancestors_outermost_first() {
        let v: Vec<_> = ancestors("/a/b/c").collect();
        assert_eq!(v, ["/a", "/a/b"]);
        assert_eq!(ancestors("/a").count(), 0);
    }
}
