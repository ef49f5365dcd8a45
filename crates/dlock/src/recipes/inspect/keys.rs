//! The recipes of the Consul design, which hold by keys rather than by a
//! queue: a KV semaphore's entries and `.lock` record, and the `.lock` key
//! of Consul's `api.Lock` (a [`ConsulLock`](crate::ConsulLock)'s).

use super::{Contender, Foreign, Role};
use crate::error::{Error, Found, Result};
use crate::path;
use crate::recipes::kv_semaphore;
use crate::recipes::layout::CONSUL_LOCK_FLAGS;
use crate::session::Session;
use crate::store::Stat;

/// What a `.lock` child is.
pub(super) enum DotLock {
    /// A KV semaphore's record, in dlock's or Consul's layout.
    Record(crate::Layout),
    /// The key of Consul's `api.Lock` layout, with its holder if a session
    /// owns it.
    LockKey(Option<Contender>),
}

/// What the `.lock` child of `path` is; `None`: someone else's file of
/// that name, no recipe's.
pub(super) async fn dot_lock_at(session: &Session, path: &str) -> Result<Option<DotLock>> {
    let node = path::join(path, kv_semaphore::RECORD);
    let Some((data, stat)) = session.get_data(&node).await.found()? else {
        return Ok(Some(DotLock::Record(crate::Layout::Curator)));
    };
    if stat.ephemeral_owner != 0 {
        let foreign = consul_client(session, &node).await?;
        let holder = key_contender(Role::Holder, node, data, &stat, foreign);
        return Ok(Some(DotLock::LockKey(Some(holder))));
    }
    let record_in = |layout| kv_semaphore::Record::decode(layout, &node, &data).is_ok();
    if record_in(crate::Layout::Consul) {
        return Ok(Some(DotLock::Record(crate::Layout::Consul)));
    }
    // `api.Lock`'s key, released and not yet destroyed: a free lock.
    if session.tag(&node).await.found()?.flatten() == Some(CONSUL_LOCK_FLAGS) {
        return Ok(Some(DotLock::LockKey(None)));
    }
    Ok(record_in(crate::Layout::Curator).then_some(DotLock::Record(crate::Layout::Curator)))
}

/// [`Foreign::Consul`] if a key of Consul's layouts at `node` is held by
/// one of Consul's own clients rather than by dlock.
async fn consul_client(session: &Session, node: &str) -> Result<Option<Foreign>> {
    // Released since it was read: no owner.
    let owner = session.foreign_owner(node).await.found()?;
    Ok(owner.flatten().map(|_| Foreign::Consul))
}

/// The limit a KV semaphore's record states, if there is a record that
/// lists holders (one without states none: the next contender's holds).
pub(super) async fn kv_limit(
    session: &Session,
    path: &str,
    layout: crate::Layout,
) -> Result<Option<u32>> {
    let node = path::join(path, kv_semaphore::RECORD);
    let read = session.get_data(&node).await.found()?;
    let record = read.and_then(|(data, _)| kv_semaphore::Record::decode(layout, &node, &data).ok());
    Ok(record.filter(|r| !r.holders.is_empty()).map(|r| r.limit))
}

/// A KV semaphore's entries: holders in the order the record admitted them,
/// then waiters in the order they came.
pub(super) async fn kv_semaphore_at(
    session: &Session,
    path: &str,
    layout: crate::Layout,
) -> Result<Vec<Contender>> {
    let sem = crate::KvSemaphore::new(session, path, 1)?.with_layout(layout);
    let holders = sem.holders().await?;
    let mut all = Vec::new();
    for child in session.children(path).await.or_else(|e| match e {
        Error::NoNode { .. } => Ok(Vec::new()),
        e => Err(e),
    })? {
        if child.name == kv_semaphore::RECORD {
            continue;
        }
        let node = path::join(path, &child.name);
        let (data, stat) = match session.get_data(&node).await {
            // An entry no session holds proves no contender lives (on
            // Consul, one a session with behavior `release` left): the
            // semaphore passes it by, and so do we.
            Ok((_, stat)) if stat.ephemeral_owner == 0 => continue,
            Ok(found) => found,
            // Gone since the listing.
            Err(Error::NoNode { .. }) => continue,
            Err(e) => return Err(e),
        };
        let admitted = holders.iter().position(|h| *h == child.name);
        let foreign = match layout {
            crate::Layout::Consul => consul_client(session, &node).await?,
            _ => None,
        };
        let role = if admitted.is_some() {
            Role::Holder
        } else {
            Role::Waiter
        };
        all.push((admitted, key_contender(role, node, data, &stat, foreign)));
    }
    // Holders (Some) by admission, then waiters (None) by arrival.
    all.sort_by_key(|(admitted, c)| (admitted.is_none(), *admitted, c.token));
    Ok(all.into_iter().map(|(_, c)| c).collect())
}

/// A contender read from its node (a KV semaphore entry, the key of
/// Consul's `api.Lock`), written by the `foreign` client if any; no
/// read-write half.
fn key_contender(
    role: Role,
    node: String,
    data: Vec<u8>,
    stat: &Stat,
    foreign: Option<Foreign>,
) -> Contender {
    Contender {
        role,
        token: stat.token(),
        session: stat.ephemeral_owner,
        node,
        data,
        access: None,
        foreign,
    }
}
