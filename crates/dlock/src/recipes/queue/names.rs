//! How queue nodes are named: what the queue writes for each [`Layout`],
//! and which siblings' names it reads a sequence suffix from. The facts
//! about kazoo's names are the contract in [`layout`](crate::recipes::layout).

use crate::error::{Error, Result};
use crate::recipes::layout::Layout;

/// Curator's node name for mutex participants (also the leader selector's
/// and the semaphore's internal lock).
pub(crate) const CURATOR_LOCK: &str = "lock-";
/// kazoo's node name for `Lock`, `WriteLock` and `Election` contenders.
pub(crate) const KAZOO_LOCK: &str = "__lock__";
/// kazoo's node name for `ReadLock` contenders.
pub(crate) const KAZOO_READ_LOCK: &str = "__rlock__";

/// The names a mutex-shaped queue orders by the sequence that follows
/// them: Curator's, and kazoo's two (a kazoo reader excludes a mutex
/// holder as kazoo's own `WriteLock` would have it). ZooKeeper numbers one
/// parent's sequential children from one counter, so the suffixes of all
/// three compare as the creation order.
pub(crate) const MUTEX_SORT_NAMES: &[&str] = &[CURATOR_LOCK, KAZOO_LOCK, KAZOO_READ_LOCK];

/// How a queue names the nodes it creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NodeNames {
    /// Curator's name (`lock-`, `lease-`, `latch-`, ...).
    pub curator: &'static str,
    /// The names ordered by their sequence suffix.
    pub sort: &'static [&'static str],
    /// kazoo's name for the same recipe, if kazoo has it.
    pub kazoo: Option<&'static str>,
}

impl NodeNames {
    /// A mutex-shaped queue's names.
    pub const MUTEX: NodeNames = NodeNames {
        curator: CURATOR_LOCK,
        sort: MUTEX_SORT_NAMES,
        kazoo: Some(KAZOO_LOCK),
    };

    /// The protection prefix and the name of a new node in `layout`
    /// (`_c_<uuid>-` + `lock-`, or kazoo's `<uuid hex>` + `__lock__`).
    /// `curator_prefix` is asked for only when it is used.
    pub fn for_new_node(
        &self,
        layout: Layout,
        curator_prefix: impl FnOnce() -> String,
    ) -> (String, &'static str) {
        match (layout, self.kazoo) {
            (Layout::Kazoo, Some(kazoo)) => (kazoo_prefix(), kazoo),
            _ => (curator_prefix(), self.curator),
        }
    }

    /// Whether the queue can write `layout`'s nodes; an error naming
    /// `recipe` and `dir` if not.
    pub fn check_layout(&self, layout: Layout, recipe: &str, dir: &str) -> Result<()> {
        match (layout, self.kazoo) {
            (Layout::Curator, _) | (Layout::Kazoo, Some(_)) => Ok(()),
            (other, _) => Err(Error::InvalidArgument(format!(
                "the {recipe} at {dir} has no {other} layout (the {other} layout is for {})",
                match other {
                    Layout::Consul => "ConsulLock and KvSemaphore",
                    _ => "Mutex, LeaderSelector and Semaphore",
                }
            ))),
        }
    }
}

/// A protection prefix as kazoo makes them: a random UUID as 32 lowercase
/// hex digits. Not recycled (the session's pool holds Curator prefixes).
fn kazoo_prefix() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// The part of a node's `name` that its creation chose at random — the
/// protection prefix, Curator's `_c_<uuid>-` or kazoo's 32 hex digits —
/// which every try of that one create shares, and nothing else.
pub(crate) fn creation_prefix(name: &str) -> Option<&str> {
    crate::path::protection_prefix(name).or_else(|| is_kazoo_node(name).then(|| &name[..32]))
}

/// Whether `name` ends in `marker` and a sequence suffix, as a sequential
/// node of that name does (`lock-0000000007`, with a protection prefix or
/// not; ZooKeeper's counter prints `-` first once it overflows). Unlike a
/// name that merely contains `marker` (a directory `clock-sync/`), it is
/// no recipe's parent directory.
///
/// ```ignore
/// assert!(is_sequenced("_c_0b1e-lock-0000000007", "lock-"));
/// assert!(!is_sequenced("clock-sync", "lock-"));
/// ```
pub(crate) fn is_sequenced(name: &str, marker: &str) -> bool {
    name.rsplit_once(marker)
        .is_some_and(|(_, seq)| is_sequence(seq))
}

/// Whether `seq` is a sequence suffix as ZooKeeper prints it (`%010d`):
/// ten digits, or once the counter overflowed a minus sign and nine or ten.
fn is_sequence(seq: &str) -> bool {
    let (digits, lengths) = match seq.strip_prefix('-') {
        Some(digits) => (digits, 9..=10),
        None => (seq, 10..=10),
    };
    lengths.contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `name` is a kazoo lock contender's node,
/// `<32 hex digits>__lock__<seq>` or `<32 hex digits>__rlock__<seq>`
/// (`<seq>`: a sequence suffix, see `is_sequence`) — as kazoo writes it,
/// or dlock in [`Layout::Kazoo`].
///
/// ```ignore
/// assert!(is_kazoo_node("0f1e2d3c4b5a69788796a5b4c3d2e1f0__lock__0000000007"));
/// ```
pub(crate) fn is_kazoo_node(name: &str) -> bool {
    let Some((hex, rest)) = name.split_at_checked(32) else {
        return false;
    };
    let Some(seq) = rest
        .strip_prefix(KAZOO_LOCK)
        .or_else(|| rest.strip_prefix(KAZOO_READ_LOCK))
    else {
        return false;
    };
    hex.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && is_sequence(seq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{sort_sequenced, Child};

    #[test]
    fn only_names_ending_in_a_sequence_are_sequenced() {
        assert!(is_sequenced("lock-0000000007", CURATOR_LOCK));
        assert!(is_sequenced(
            "_c_0b1e8a52-6d3f-lock-0000000007",
            CURATOR_LOCK
        ));
        assert!(is_sequenced("lock--000000001", CURATOR_LOCK));
        for name in [
            "clock-sync",
            "lock-",
            "lock-12",
            "lock-00000000070",
            "lock-000000007x",
        ] {
            assert!(!is_sequenced(name, CURATOR_LOCK), "{name}");
        }
    }

    #[test]
    fn kazoo_and_curator_nodes_order_by_their_common_sequence() {
        let mut kids = vec![
            Child::named("_c_0b1e8a52-6d3f-4a4e-9a57-0a9c8f3e2d11-lock-0000000004"),
            Child::named("ffffffffffffffffffffffffffffffff__lock__0000000003"),
            Child::named("00000000000000000000000000000000__rlock__0000000005"),
            Child::named("_c_ffffffff-6d3f-4a4e-9a57-0a9c8f3e2d11-lock-0000000001"),
        ];
        sort_sequenced(&mut kids, MUTEX_SORT_NAMES);
        let seqs: Vec<_> = kids.iter().map(|c| &c.name[c.name.len() - 1..]).collect();
        assert_eq!(seqs, ["1", "3", "4", "5"]);
    }

    #[test]
    fn kazoo_names_are_recognised_exactly() {
        let hex = "0f1e2d3c4b5a69788796a5b4c3d2e1f0";
        assert!(is_kazoo_node(&format!("{hex}__lock__0000000007")));
        assert!(is_kazoo_node(&format!("{hex}__rlock__-2147483648")));
        assert!(!is_kazoo_node(&format!("{hex}__lock__000000007")));
        assert!(!is_kazoo_node(&format!("{hex}-lock-0000000007")));
        assert!(!is_kazoo_node(&format!("{}__lock__0000000007", &hex[1..])));
        assert!(!is_kazoo_node(&format!("{}X__lock__0000000007", &hex[1..])));
        assert!(!is_kazoo_node(
            "_c_0b1e8a52-6d3f-4a4e-9a57-0a9c8f3e2d11-lock-0000000004"
        ));
        assert!(!is_kazoo_node("é"));
    }

    #[test]
    fn new_nodes_follow_the_layout() {
        let (prefix, name) = NodeNames::MUTEX.for_new_node(Layout::Kazoo, || unreachable!());
        assert!(is_kazoo_node(&format!("{prefix}{name}0000000001")));
        let (prefix, name) = NodeNames::MUTEX.for_new_node(Layout::Curator, || "_c_x-".into());
        assert_eq!((prefix.as_str(), name), ("_c_x-", "lock-"));
        let latch = NodeNames {
            curator: "latch-",
            sort: &["latch-"],
            kazoo: None,
        };
        assert!(latch.check_layout(Layout::Kazoo, "latch", "/l").is_err());
        assert!(NodeNames::MUTEX
            .check_layout(Layout::Consul, "mutex", "/m")
            .is_err());
        assert!(NodeNames::MUTEX
            .check_layout(Layout::Kazoo, "mutex", "/m")
            .is_ok());
    }
}
