//! [`inspect`]: who holds and who waits at a path, whatever recipe lives
//! there — the library side of `dlock inspect`.
//!
//! The recipe is recognised from the nodes under the path, by the layout
//! each recipe module defines for itself (the mutex's `lock-` nodes, the
//! semaphore's `locks` and `leases` directories, the KV semaphore's `.lock`
//! record, ...); participants are listed in the order that recipe serves
//! them, holders first. Peers that write the same layouts are recognised
//! as what they are: Curator on ZooKeeper writes exactly our nodes, so its
//! holders show like ours.
//!
//! Three foreign layouts are recognised too. etcd's Go client
//! (`concurrency.Mutex` and `concurrency.Election`, and `etcdctl lock` /
//! `etcdctl elect`, which use them) puts one key per contender,
//! `<prefix>/<lease id in hex>`, attached to that lease; the key with the
//! lowest create revision holds. On etcd our own wait queue orders by create
//! revision as well, so such keys are contenders of a dlock mutex on the
//! same path and are listed in its queue, marked [`Foreign::EtcdGo`]. A path
//! holding only such keys shows as a [`RecipeKind::Mutex`] — or as a
//! [`RecipeKind::LeaderElection`] if a key carries a value (a Go `Mutex`
//! writes none; an `Election` candidate writes its proposal). Next to a
//! read-write lock's nodes they are writers ([`Access::Write`]), as the
//! read-write lock treats them (the layout: `recipes/etcd_go.rs`).
//!
//! kazoo's (Python) lock nodes, `<uuid hex>__lock__<seq>` and
//! `<uuid hex>__rlock__<seq>` (its `Lock`, `Election`, `ReadLock`,
//! `WriteLock`), are ordered among a mutex's own by their sequence (see
//! [`layout`](super::layout)); a path with such nodes shows as a
//! [`RecipeKind::Mutex`], each marked [`Foreign::Kazoo`] — dlock's own
//! nodes in [`Layout::Kazoo`](crate::Layout::Kazoo) too, being the same.
//! A path whose children are all kazoo semaphore leases (`<uuid hex>`)
//! shows as a [`RecipeKind::Semaphore`]: those leases hold, and the
//! acquirers queued at `<path>-__lock__` wait.
//!
//! On Consul, the keys of Consul's own lock and semaphore layouts
//! (`<prefix>/.lock` held by a session; `<prefix>/<session>` contenders)
//! are the same whether dlock ([`Layout::Consul`](crate::Layout::Consul))
//! or `consul lock` wrote them; the owning session's name tells them apart
//! (dlock's are named "dlock"), and holders of Consul's own clients are
//! marked [`Foreign::Consul`] — one read of the session per such key.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
//! use dlock::{inspect, RecipeKind, Role};
//! let session = dlock::connect("embedded").await?;
//! let mutex = dlock::Mutex::new(&session, "/doc/inspect")?;
//! let guard = mutex.acquire().await?;
//! let seen = inspect(&session, "/doc/inspect").await?;
//! assert_eq!(seen.recipe, RecipeKind::Mutex);
//! assert_eq!(seen.participants[0].role, Role::Holder);
//! assert_eq!(seen.participants[0].token, guard.token());
//! guard.release().await?;
//! assert_eq!(inspect(&session, "/doc/inspect").await?.recipe, RecipeKind::None);
//! # Ok(()) }
//! ```

mod keys;
mod report;

use keys::{dot_lock_at, kv_limit, kv_semaphore_at, DotLock};
pub use report::{Access, Contender, Foreign, Inspection, RecipeKind, Role};

use super::queue::{is_kazoo_node, is_sequenced, FirstN, Participant, KAZOO_READ_LOCK};
use super::{etcd_go, kv_semaphore, leader_latch, mutex, rwlock, semaphore, shared_count};
use crate::error::{Found, Result};
use crate::path;
use crate::session::Session;
use crate::store::SessionId;

/// Who holds and who waits at `path`, and for which recipe. A path with
/// nothing under it (or no node at all) is [`RecipeKind::None`] with no
/// participants. See the [module docs](self) for what is recognised.
///
/// A semaphore's clients each state its size, so none is stored: every
/// lease node counts as a holder except one still being waited for, which
/// belongs to the acquirer at the head of the semaphore's internal lock
/// queue; the rest of that queue waits behind it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// let session = dlock::connect("embedded").await?;
/// let sem = dlock::Semaphore::new(&session, "/doc/inspect-sem", 2)?;
/// let lease = sem.acquire_one().await?;
/// let seen = dlock::inspect(&session, "/doc/inspect-sem").await?;
/// assert_eq!(seen.recipe, dlock::RecipeKind::Semaphore);
/// assert_eq!(seen.participants.len(), 1);
/// # lease.release().await?; Ok(()) }
/// ```
pub async fn inspect(session: &Session, path: &str) -> Result<Inspection> {
    path::validate(path)?;
    let nothing = |recipe| Inspection {
        path: path.to_string(),
        recipe,
        participants: Vec::new(),
        count: None,
        limit: None,
    };
    if path == "/" {
        // No recipe can live at the root (they refuse it), and its children
        // are other recipes' directories.
        return Ok(nothing(RecipeKind::None));
    }
    let children = session.children(path).await.found()?.unwrap_or_default();
    let names: Vec<&str> = children.iter().map(|c| c.name.as_str()).collect();
    let found = |recipe, participants| Inspection {
        participants,
        ..nothing(recipe)
    };
    let any = |is: fn(&str) -> bool| names.iter().any(|n| is(n));
    let dot_lock = match kv_semaphore::is_layout(&names) {
        true => dot_lock_at(session, path).await?,
        false => None,
    };
    let inspection = if let Some(dot_lock) = dot_lock {
        match dot_lock {
            DotLock::Record(layout) => Inspection {
                limit: kv_limit(session, path, layout).await?,
                ..found(
                    RecipeKind::KvSemaphore,
                    kv_semaphore_at(session, path, layout).await?,
                )
            },
            // Consul's `api.Lock` key (a ConsulLock): a mutex's one holder,
            // or none.
            DotLock::LockKey(holder) => found(RecipeKind::Mutex, Vec::from_iter(holder)),
        }
    } else if let Some(all) = match semaphore::is_layout(&names) {
        true => semaphore_at(session, path).await?,
        false => None,
    } {
        found(RecipeKind::Semaphore, all)
    } else if names.iter().any(|n| rwlock::is_writer(n).is_some()) {
        let rw = crate::ReadWriteLock::new(session, path)?;
        let mut all = contenders(rw.participants().await?);
        // A Go mutex contender is a writer to the read-write lock.
        for go in all
            .iter_mut()
            .filter(|c| c.foreign == Some(Foreign::EtcdGo))
        {
            go.access = Some(Access::Write);
        }
        found(RecipeKind::ReadWriteLock, all)
    } else if any(leader_latch::is_node) {
        let queue = leader_latch::candidates(session, path)?;
        found(
            RecipeKind::LeaderLatch,
            contenders(queue.participants(&FirstN(1)).await?),
        )
    } else if any(mutex::is_node) {
        let mut all = mutex_at(session, path).await?;
        match all.iter().any(|c| is_kazoo_reader(&c.node)) {
            true => {
                kazoo_read_write(&mut all);
                found(RecipeKind::ReadWriteLock, all)
            }
            false => found(RecipeKind::Mutex, all),
        }
    } else if !names.is_empty() && names.iter().all(|n| semaphore::is_kazoo_lease(n)) {
        found(
            RecipeKind::Semaphore,
            kazoo_semaphore_at(session, path).await?,
        )
    } else if !children.is_empty() {
        unrecognised(session, path, nothing(RecipeKind::None)).await?
    } else {
        let read = session.get_data(path).await.found()?;
        let count = read.and_then(|(data, stat)| shared_count::value_of(&data, &stat));
        Inspection {
            count,
            ..nothing(count.map_or(RecipeKind::None, |_| RecipeKind::SharedCount))
        }
    };
    Ok(inspection)
}

/// Children no dlock recipe wrote: etcd Go contenders (listed in the
/// queue order our mutex would give them, which is theirs), or a KV
/// semaphore whose first contender has not written the record yet.
async fn unrecognised(session: &Session, path: &str, none: Inspection) -> Result<Inspection> {
    let listed = crate::Mutex::new(session, path)?.participants().await?;
    if listed
        .iter()
        .any(|p| kv_semaphore::is_entry(path::node_name(&p.node), &p.data, p.session))
    {
        return Ok(Inspection {
            recipe: RecipeKind::KvSemaphore,
            participants: kv_semaphore_at(session, path, crate::Layout::Curator).await?,
            ..none
        });
    }
    let all = contenders(listed);
    let go: Vec<&Contender> = all
        .iter()
        .filter(|c| c.foreign == Some(Foreign::EtcdGo))
        .collect();
    if go.is_empty() {
        return Ok(none);
    }
    let recipe = if go.iter().any(|c| !c.data.is_empty()) {
        RecipeKind::LeaderElection
    } else {
        RecipeKind::Mutex
    };
    Ok(Inspection {
        recipe,
        participants: all,
        ..none
    })
}

/// A queue's participants, as its recipe lists them, with what a listing
/// alone cannot say: the read-write half, and who wrote the node.
fn contenders(listed: Vec<Participant>) -> Vec<Contender> {
    listed.into_iter().map(contender).collect()
}

fn contender(p: Participant) -> Contender {
    let name = path::node_name(&p.node);
    Contender {
        role: if p.holds { Role::Holder } else { Role::Waiter },
        token: p.token,
        session: p.session,
        access: rwlock::is_writer(name).map(|w| if w { Access::Write } else { Access::Read }),
        foreign: foreign(name, &p.data, p.session),
        data: p.data,
        node: p.node,
    }
}

/// Which foreign client's layout a queue node `name` is in, if any.
fn foreign(name: &str, data: &[u8], owner: SessionId) -> Option<Foreign> {
    if is_etcd_go_key(name, data, owner) {
        Some(Foreign::EtcdGo)
    } else if is_kazoo_node(name) {
        Some(Foreign::Kazoo)
    } else {
        None
    }
}

/// etcd's Go `concurrency` package names a contender's key after its lease,
/// `fmt.Sprintf("%s%x", prefix, lease)`, and attaches it to that lease. A
/// KV semaphore entry can have the same name (16 hex digits), but holds a
/// UUID, which a Go key does not.
fn is_etcd_go_key(name: &str, data: &[u8], owner: SessionId) -> bool {
    if owner == 0 || kv_semaphore::is_entry(name, data, owner) {
        return false;
    }
    name == etcd_go::key_name(owner)
}

/// Whether `node` is a kazoo reader's (`ReadLock`: `<uuid>__rlock__<seq>`).
fn is_kazoo_reader(node: &str) -> bool {
    let name = path::node_name(node);
    is_kazoo_node(name) && name.contains(KAZOO_READ_LOCK)
}

/// Roles as kazoo's read-write lock gives them: a reader holds unless a
/// writer (`Lock`, `WriteLock`) is ahead of it; a writer holds only first.
fn kazoo_read_write(queue: &mut [Contender]) {
    let mut writer_ahead = false;
    for (i, c) in queue.iter_mut().enumerate() {
        let reader = is_kazoo_reader(&c.node);
        let holds = if reader { !writer_ahead } else { i == 0 };
        c.role = if holds { Role::Holder } else { Role::Waiter };
        c.access = Some(if reader { Access::Read } else { Access::Write });
        writer_ahead |= !reader;
    }
}

async fn mutex_at(session: &Session, path: &str) -> Result<Vec<Contender>> {
    Ok(contenders(
        crate::Mutex::new(session, path)?.participants().await?,
    ))
}

/// A semaphore's leases, then its acquirers: the head of the internal lock
/// queue creates a lease node and waits (holding that lock) until the lease
/// count allows it; so a lease node of the head's session created after its
/// lock node is that acquirer's, still waiting — its newest one, when it
/// asked for several (those before it were admitted). `None` if its
/// `leases` and `locks` hold nothing, or anything but those nodes: then
/// they are ordinary directories (`/app/locks/nightly` makes `/app` no
/// semaphore).
async fn semaphore_at(session: &Session, path: &str) -> Result<Option<Vec<Contender>>> {
    // The size only decides `holds`, which is worked out below instead.
    let leases = crate::Semaphore::new(session, path, u32::MAX)?
        .participants()
        .await?;
    let lock = path::join(path, semaphore::LOCK_PARENT);
    let acquirers = crate::Mutex::new(session, &lock)?.participants().await?;
    let named = |list: &[Participant], is: &dyn Fn(&str) -> bool| {
        list.iter().all(|p| is(path::node_name(&p.node)))
    };
    let is_lease = |name: &str| is_sequenced(name, semaphore::LEASE_NAME);
    // Empty, they are no sign either (a `leases/` made for anything).
    let none = leases.is_empty() && acquirers.is_empty();
    if none || !named(&leases, &is_lease) || !named(&acquirers, &mutex::is_node) {
        return Ok(None);
    }
    let head = acquirers.iter().find(|p| p.holds);
    let pending = head.and_then(|head| {
        leases
            .iter()
            .rposition(|l| l.session == head.session && l.token > head.token)
    });
    let mut all: Vec<Contender> = Vec::with_capacity(leases.len() + acquirers.len());
    let mut waiting = None;
    for (i, lease) in leases.into_iter().enumerate() {
        let mut c = contender(lease);
        if Some(i) == pending {
            c.role = Role::Waiter;
            waiting = Some(c);
        } else {
            c.role = Role::Holder;
            all.push(c);
        }
    }
    let head_node = head.map(|h| h.node.clone());
    all.extend(waiting);
    for acquirer in acquirers {
        // The head and its pending lease are one acquirer: list it once.
        if pending.is_some() && Some(&acquirer.node) == head_node.as_ref() {
            continue;
        }
        let mut c = contender(acquirer);
        c.role = Role::Waiter;
        all.push(c);
    }
    Ok(Some(all))
}

/// A kazoo semaphore's leases (all hold: kazoo creates a lease node only
/// once admitted), then its acquirers, queued on kazoo's lock at
/// `<path>-__lock__`, all waiting.
async fn kazoo_semaphore_at(session: &Session, path: &str) -> Result<Vec<Contender>> {
    let leases = crate::Semaphore::new(session, path, 1)?
        .with_layout(crate::Layout::Kazoo)?
        .participants()
        .await?;
    let lock = semaphore::kazoo_lock_path(path);
    let acquirers = crate::Mutex::new(session, &lock)?.participants().await?;
    let mut all = Vec::with_capacity(leases.len() + acquirers.len());
    for lease in leases {
        let mut c = contender(lease);
        c.role = Role::Holder;
        c.foreign = Some(Foreign::Kazoo);
        all.push(c);
    }
    for acquirer in acquirers {
        let mut c = contender(acquirer);
        c.role = Role::Waiter;
        all.push(c);
    }
    Ok(all)
}
