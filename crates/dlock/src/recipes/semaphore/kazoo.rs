//! The [`Semaphore`](super::Semaphore) in kazoo's layout: kazoo's
//! `Semaphore` algorithm (the contract is in
//! [`layout`](crate::recipes::layout)), so that dlock and Python clients
//! share one semaphore.
//!
//! Acquirers take turns under a mutex at `<path>-__lock__` (kazoo's layout);
//! the turn holder lists `<path>`'s children, creates its lease node
//! `<path>/<uuid hex>` (ephemeral, not sequential) when there are fewer
//! than the maximum, and otherwise waits — the only waiter of the
//! semaphore that watches `<path>` — until a lease goes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::{Error, Found, Result};
use crate::path;
use crate::recipes::deadline::Deadline;
use crate::recipes::queue::{HeldNode, Participant};
use crate::session::Session;
use crate::store::{CreateMode, CreateOptions};

/// kazoo's lock path for a semaphore at `path`: the sibling
/// `<path>-__lock__`.
pub(crate) fn lock_path(path: &str) -> String {
    format!("{path}-__lock__")
}

/// Whether `name` is a kazoo semaphore's lease node: a UUID in 32
/// lowercase hex digits, nothing else.
pub(crate) fn is_lease_name(name: &str) -> bool {
    name.len() == 32
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A kazoo-layout semaphore's lease pool: `<path>`, whose data is the
/// maximum and whose children are the leases.
#[derive(Debug, Clone)]
pub(super) struct Pool {
    session: Session,
    path: String,
    max: u32,
    /// Whether `path` and its maximum were checked (once, as kazoo does).
    assured: Arc<AtomicBool>,
}

impl Pool {
    pub(super) fn new(session: &Session, path: &str, max: u32) -> Self {
        Pool {
            session: session.clone(),
            path: path.to_string(),
            max,
            assured: Arc::default(),
        }
    }

    /// Makes sure `path` exists, persistent, holding the maximum (kazoo's
    /// `_ensure_path`, in one step: a new node is created with its data);
    /// an existing node must hold the same maximum — or no number at all,
    /// which kazoo ignores too.
    pub(super) async fn assure(&self) -> Result<()> {
        if self.assured.load(Ordering::Relaxed) {
            return Ok(());
        }
        let persistent = CreateOptions::new(CreateMode::Persistent).with_parents();
        let max = self.max.to_string();
        let created = self
            .session
            .retrying(|| self.session.create(&self.path, max.as_bytes(), persistent))
            .await;
        match created {
            Ok(_) => {}
            Err(Error::NodeExists { .. }) => {
                let (data, _) = self.session.get_data(&self.path).await?;
                let stored = std::str::from_utf8(&data)
                    .ok()
                    .and_then(|text| text.trim().parse::<i64>().ok());
                if let Some(stored) = stored.filter(|&n| n != i64::from(self.max)) {
                    return Err(Error::InvalidArgument(format!(
                        "the kazoo semaphore at {} has max_leases {stored} stored, not {}",
                        self.path, self.max
                    )));
                }
            }
            Err(e) => return Err(e),
        }
        self.assured.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Under the semaphore's lock: creates our lease node as soon as there
    /// are fewer leases than the maximum; `None` if `deadline` passed first.
    pub(super) async fn lease_under_lock(
        &self,
        data: &[u8],
        deadline: Deadline,
    ) -> Result<Option<Arc<HeldNode>>> {
        let prefix = uuid::Uuid::new_v4().simple().to_string();
        loop {
            let (leases, watch) = match self.session.children_watch(&self.path).await {
                // Deleted since it was assured: made again when the caller
                // goes again.
                Err(gone @ Error::NoNode { .. }) => {
                    self.assured.store(false, Ordering::Relaxed);
                    return Err(gone);
                }
                listed => listed?,
            };
            if leases.len() < self.max as usize {
                let (created, _) = self
                    .session
                    .create_protected(&self.path, &prefix, "", data, CreateMode::Ephemeral, false)
                    .await?;
                return Ok(Some(HeldNode::new(
                    &self.session,
                    &self.path,
                    "lease",
                    created,
                )));
            }
            if deadline.race(watch.changed()).await.is_none() {
                return Ok(None);
            }
        }
    }

    /// Every lease, oldest first: all of them hold (in kazoo's algorithm a
    /// lease node exists only once admitted).
    pub(super) async fn participants(&self) -> Result<Vec<Participant>> {
        let listed = self.session.children(&self.path).await.found()?;
        let children = listed.unwrap_or_default();
        let mut all = Vec::with_capacity(children.len());
        for child in children {
            let node = path::join(&self.path, &child.name);
            match self.session.get_data(&node).await {
                Ok((data, stat)) => all.push(Participant {
                    node,
                    session: stat.ephemeral_owner,
                    token: stat.token(),
                    data,
                    holds: true,
                }),
                Err(Error::NoNode { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        all.sort_by_key(|p| p.token);
        Ok(all)
    }
}
