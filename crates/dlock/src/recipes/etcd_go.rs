//! etcd's Go client layout (`go.etcd.io/etcd/clientv3/concurrency`, 3.4),
//! which dlock's queues share on etcd — a compatibility contract.
//!
//! etcd's Go `Mutex` and `Election` (and so `etcdctl lock` and `etcdctl
//! elect`, and any Go service using them) put one key per contender,
//! `<prefix>/<lease id in hex>` (Go's `fmt.Sprintf("%s%x", prefix, lease)`:
//! lower-case, no padding, a minus sign before a negative id's magnitude),
//! attached to the contender's lease; a `Mutex` key holds no value, an
//! `Election` key the candidate's proposal. The key with the lowest create
//! revision holds (leads), and every other waits until all keys created
//! before its own are gone.
//!
//! dlock's wait queue on etcd orders its nodes by create revision too (see
//! `store::etcd`), so Go keys in a queue's directory are contenders of that
//! queue in the order Go gives them: a Go `Mutex` and a dlock
//! [`Mutex`](crate::Mutex) exclude each other on one prefix, and Go `Election`
//! candidates and dlock [`LeaderLatch`](crate::LeaderLatch) /
//! [`LeaderSelector`](crate::LeaderSelector) candidates take turns. Go has
//! no read-write lock: the [`ReadWriteLock`](crate::ReadWriteLock) counts a
//! Go contender as a writer, so a dlock reader waits for a Go holder, and a
//! Go `Mutex` already waits for every earlier key, readers included —
//! except the read node of a downgrade ([`WriteGuard::read`]), which takes
//! the write node's place in dlock's queue but is newer than a Go key
//! queued meanwhile: do not downgrade where Go contenders wait.
//!
//! The prefix is the key as given: `etcdctl lock /jobs/nightly` shares a
//! lock with a dlock `Mutex` at `/jobs/nightly` (dlock's keys are its
//! paths, under the endpoint's namespace if it names one), `etcdctl lock
//! jobs/nightly` does not (a key without the `/`).
//!
//! [`WriteGuard::read`]: crate::recipes::rwlock::WriteGuard::read
//!
//! A queue listing tells a child's name and creation order, not its owner,
//! so a queue recognises a Go contender by its name alone: a name of hex
//! digits only, in a store that orders by creation (a dlock or Curator node
//! always carries a lock name such as `lock-` or `__READ__`). Where the
//! owner is known ([`inspect`](crate::inspect)), the name must be that
//! owner's lease in hex.

use crate::store::{Child, SessionId};

/// The name etcd's Go client gives a contender of `lease`: Go's `%x` of an
/// `int64`.
pub(crate) fn key_name(lease: SessionId) -> String {
    if lease < 0 {
        format!("-{:x}", lease.unsigned_abs())
    } else {
        format!("{lease:x}")
    }
}

/// Whether `name` could be a Go contender's key name: some lease id in Go's
/// `%x` (at most 16 lower-case hex digits, maybe after a minus sign).
fn is_key_name(name: &str) -> bool {
    let digits = name.strip_prefix('-').unwrap_or(name);
    (1..=16).contains(&digits.len())
        && digits
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether a queue's listed child is a Go contender (see the [module
/// docs](self)): a key-like name, ordered by the store's creation order (as
/// Go orders it; without one it has no place in the queue).
pub(crate) fn is_contender(child: &Child) -> bool {
    child.created.is_some() && is_key_name(&child.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(name: &str) -> Child {
        Child {
            name: name.to_string(),
            created: Some(7),
            czxid: Some(7),
            owner: None,
        }
    }

    #[test]
    fn go_names_are_the_lease_in_lower_case_hex() {
        assert_eq!(key_name(0x694d_7f3a_12c4_0b0e), "694d7f3a12c40b0e");
        assert_eq!(key_name(0x1f), "1f");
        assert_eq!(key_name(-0x10), "-10");
        for lease in [0x694d_7f3a_12c4_0b0e, 0x1f, -0x10, i64::MIN, i64::MAX] {
            assert!(is_contender(&listed(&key_name(lease))), "{lease:#x}");
        }
    }

    #[test]
    fn dlock_and_curator_nodes_are_not_go_contenders() {
        for name in [
            "_c_8d5d0b4c-21c5-4a6e-9d6c-7f4c4e4d2a11-__READ__0000000001",
            "_c_8d5d0b4c-21c5-4a6e-9d6c-7f4c4e4d2a11-__WRIT__0000000002",
            "_c_8d5d0b4c-21c5-4a6e-9d6c-7f4c4e4d2a11-lock-0000000003",
            "lock-0000000003",
            "694D7F3A12C40B0E",
            "694d7f3a12c40b0e0",
            "",
            "-",
        ] {
            assert!(!is_contender(&listed(name)), "{name}");
        }
        // Without a creation order (ZooKeeper-style stores) nothing is Go's.
        assert!(!is_contender(&Child::named("694d7f3a12c40b0e")));
    }
}
