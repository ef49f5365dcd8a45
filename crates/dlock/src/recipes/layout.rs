//! [`Layout`]: whose node layout a recipe writes, for recipes that can
//! share their nodes with another implementation.
//!
//! # Consul's layouts (a compatibility contract)
//!
//! With [`Layout::Consul`], dlock writes what Consul's own `api.Lock` and
//! `api.Semaphore` (so `consul lock [-n N]`) write, so that both kinds of
//! clients on one prefix exclude each other:
//! - **Lock** ([`ConsulLock`](super::consul_lock::ConsulLock)): one key
//!   `<prefix>/.lock`, acquired by the holder's session, tagged
//!   [`CONSUL_LOCK_FLAGS`].
//! - **Semaphore** ([`KvSemaphore`](super::kv_semaphore::KvSemaphore)):
//!   contender keys `<prefix>/<session UUID>` acquired by their session, and
//!   the record `<prefix>/.lock` = `{"Limit":N,"Holders":{"<UUID>":true}}`,
//!   all tagged [`CONSUL_SEMAPHORE_FLAGS`], the record updated by
//!   compare-and-set; the last holder to leave writes it with no holders
//!   (`"Holders":{}`, as `api.Semaphore`'s release leaves it) and never
//!   deletes it. A holder is alive while its contender key is owned by
//!   a session (Consul's sessions may leave the key behind without a
//!   session, so a listed name is not enough: each key's owner is read); on
//!   Consul, dlock and `consul lock -n N` on one prefix then never hold more
//!   than N slots together. A contender that loses a compare-and-set race
//!   looks again at once, as `api.Semaphore`'s does (it is `api.Lock` that
//!   sleeps 5 s after a failed acquire, hashicorp/consul#2767), and waits
//!   on watches of the record and the keys (blocking queries on Consul),
//!   never by polling.
//!
//! Consul's tools refuse keys without their flag values
//! (`ErrLockConflict`, `ErrSemaphoreConflict`), so these nodes are created
//! with [tags](crate::store::CreateOptions::with_tag); the store keeps the
//! data version elsewhere for them (see `store::consul`).
//!
//! On the other backends the same layout is written (tags dropped), so a
//! recipe behaves alike everywhere; only on Consul does it meet Consul's
//! tools.
//!
//! # kazoo's layouts (a compatibility contract)
//!
//! kazoo 2.8 (`kazoo/recipe/lock.py`, `election.py`; Debian's
//! `python3-kazoo` 2.8.0) lays its ZooKeeper recipes out as follows.
//!
//! - **`Lock(client, path, identifier, extra_lock_patterns=())`**: each
//!   contender creates one ephemeral-sequential node
//!   `<path>/<uuid4 hex>__lock__<seq>` (32 lowercase hex digits, then
//!   `__lock__`, then ZooKeeper's 10-digit sequence), holding the
//!   identifier as UTF-8 (empty without one). `<path>` is made with
//!   `ensure_path`: a *persistent* node, which kazoo then takes for granted
//!   for as long as the `Lock` object lives. The contenders are the
//!   children matching `(?:__lock__|<extra patterns>)(-?\d{10})$`; they are
//!   ordered by that sequence suffix (as a string) and the first holds;
//!   a waiter watches its predecessor among the contenders. Children that
//!   match no pattern are not contenders at all — so a kazoo `Lock` sees a
//!   Curator-layout node `_c_<uuid>-lock-<seq>` only with
//!   `extra_lock_patterns=["-lock-"]`.
//! - **`ReadLock`** names its nodes `<uuid4 hex>__rlock__<seq>` and is
//!   meant to be excluded by the `__lock__` nodes ahead of it only;
//!   **`WriteLock`** names its nodes like a `Lock` and is excluded by
//!   `__lock__` and `__rlock__` nodes. But kazoo 2.8's `ReadLock` does not
//!   find its own node among the contenders, so it waits on the *last*
//!   `__lock__` node, even one queued after it (fixed in kazoo 2.9.0,
//!   python-zk/kazoo#649): a writer it sees — kazoo's own `WriteLock`, or a
//!   dlock contender in [`Layout::Kazoo`] (or with a pattern the reader was
//!   given) — queued behind a waiting 2.8 reader deadlocks with it. Use
//!   kazoo 2.9 or later where its readers share a path with writers.
//! - **`Election(client, path, identifier)`** is a `Lock(client, path,
//!   identifier)` (no extra patterns possible): the holder leads; its
//!   `contenders()` are the identifiers in queue order.
//! - **`Semaphore(client, path, identifier, max_leases)`** is another
//!   algorithm: `<path>` (persistent) holds `max_leases` as a decimal string
//!   (written by whoever created `<path>`, compared by every other client,
//!   which refuses a different number; non-numeric data is ignored); the
//!   holders are the children of `<path>` itself, each an *ephemeral,
//!   non-sequential* node `<path>/<uuid4 hex>` holding the identifier; and
//!   acquirers take turns under a kazoo `Lock` at the sibling path
//!   `<path>-__lock__`. The turn holder lists `<path>`'s children (with a
//!   watch), creates its lease node if there are fewer than `max_leases`,
//!   else waits for the children to change; then it releases the lock.
//!
//! ZooKeeper numbers the sequential children of one parent from one
//! counter, whoever creates them, so kazoo's `<hex>__lock__<seq>` and
//! Curator's `_c_<uuid>-lock-<seq>` on one path order by their suffixes
//! alike. dlock builds on that:
//!
//! - **Always** (every layout), the wait queue of a mutex-shaped recipe —
//!   [`Mutex`](crate::Mutex), [`LeaderSelector`](crate::LeaderSelector), a
//!   [`Semaphore`](crate::Semaphore)'s internal lock — orders kazoo's
//!   `__lock__` and `__rlock__` nodes by their sequence suffix, like its
//!   own; so a kazoo holder or reader keeps dlock out, and a dlock waiter
//!   queues behind it. A kazoo `Lock` sees dlock's Curator-layout nodes only
//!   with `extra_lock_patterns=["-lock-"]`, and a kazoo `Election` (which
//!   cannot be given patterns) not at all. The default layout makes a
//!   missing lock directory a container, as Curator does, which ZooKeeper
//!   removes once empty: a kazoo `Lock` or `Election` object that made (or
//!   found) the path once then fails its next acquire with `NoNodeError`
//!   (kazoo checks the path once per object). Where kazoo clients live
//!   long on a path, create it first as a persistent node (kazoo's
//!   `ensure_path`, or [`Layout::Kazoo`], which keeps a directory that
//!   exists as it is — a container made earlier stays one).
//! - **[`Layout::Kazoo`]** makes dlock *write* kazoo's names,
//!   `<uuid hex>__lock__<seq>` with the data it would store anyway, and
//!   create the lock's directory as a persistent node (as kazoo's
//!   `ensure_path` does; a container that ZooKeeper removes once empty
//!   would break a kazoo `Lock` that checked the path before): then plain
//!   kazoo `Lock`s and `Election`s see dlock's contenders too. Java Curator
//!   does not order kazoo's names, so a path shared with Curator should
//!   keep the default layout.
//! - **[`Semaphore`](crate::Semaphore) with [`Layout::Kazoo`]** runs
//!   kazoo's semaphore algorithm on kazoo's layout above (a dlock
//!   `Semaphore` in the default layout writes Curator's `locks`/`leases`
//!   directories, which kazoo does not read).
//!
//! Not covered: kazoo's `ReadLock`/`WriteLock` against dlock's
//! [`ReadWriteLock`](crate::ReadWriteLock) (whose layout stays Curator's),
//! and sequence numbers past 2³¹, which ZooKeeper prints with a minus
//! sign (kazoo and dlock would order those differently).

use std::fmt;
use std::str::FromStr;

/// The `Flags` of the key of Consul's `api.Lock` (`consul lock <prefix>`).
pub const CONSUL_LOCK_FLAGS: u64 = 0x2ddc_cbc0_58a5_0c18;

/// The `Flags` of every key of Consul's `api.Semaphore` (`consul lock -n N`).
pub const CONSUL_SEMAPHORE_FLAGS: u64 = 0xe0f6_9a2b_aa41_4de0;

/// Whose node layout a recipe uses.
///
/// ```
/// use dlock::Layout;
/// assert_eq!("consul".parse::<Layout>().unwrap(), Layout::Consul);
/// assert_eq!(Layout::default(), Layout::Curator);
/// assert_eq!(Layout::Consul.to_string(), "consul");
/// assert_eq!("kazoo".parse::<Layout>().unwrap(), Layout::Kazoo);
/// assert!("zookeeper".parse::<Layout>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Layout {
    /// dlock's own layouts: Curator's for the Curator recipes, and for the
    /// [`KvSemaphore`](super::kv_semaphore::KvSemaphore), which Curator
    /// lacks, dlock's record `{"limit":N,"holders":[...]}`.
    #[default]
    Curator,
    /// Consul's `api.Lock` and `api.Semaphore` layouts (see the [module
    /// docs](self)).
    Consul,
    /// kazoo's (Python) `Lock`, `Election` and `Semaphore` layouts (see
    /// the [module docs](self)): for the [`Mutex`](crate::Mutex), the
    /// [`LeaderSelector`](crate::LeaderSelector) and the
    /// [`Semaphore`](crate::Semaphore).
    Kazoo,
}

/// A layout name that is none of `curator`, `consul`, `kazoo`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown layout {0:?}: expected \"curator\", \"consul\" or \"kazoo\"")]
pub struct UnknownLayout(pub String);

impl FromStr for Layout {
    type Err = UnknownLayout;

    fn from_str(s: &str) -> Result<Self, UnknownLayout> {
        match s {
            "curator" => Ok(Layout::Curator),
            "consul" => Ok(Layout::Consul),
            "kazoo" => Ok(Layout::Kazoo),
            other => Err(UnknownLayout(other.to_string())),
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layout::Curator => "curator",
            Layout::Consul => "consul",
            Layout::Kazoo => "kazoo",
        })
    }
}
