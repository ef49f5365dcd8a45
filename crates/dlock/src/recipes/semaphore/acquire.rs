//! How a [`Semaphore`] acquires: Curator's `internalAcquire1Lease` (or
//! kazoo's `_get_lease`) once per lease, under the internal lock.

use tokio::sync::Notify;

use super::kazoo;
use super::lease::{return_all, Lease};
use super::max::{forward_changes, LeaseCount};
use super::Semaphore;
use crate::error::{Error, Result};
use crate::recipes::deadline::Deadline;
use crate::recipes::queue::Stop;
use crate::store::CreateMode;

impl Semaphore {
    pub(super) fn check_qty(&self, qty: u32) -> Result<()> {
        if qty == 0 {
            return Err(Error::InvalidArgument(format!(
                "qty cannot be 0: acquire at least 1 lease of the semaphore at {}",
                self.path
            )));
        }
        let max = self.max.current();
        if max <= 0 {
            return Err(Error::InvalidArgument(format!(
                "the semaphore at {} has a maximum of {max} leases: nothing can be acquired",
                self.path
            )));
        }
        if i64::from(qty) > max {
            return Err(Error::InvalidArgument(format!(
                "cannot acquire {qty} leases of the semaphore at {}: its maximum is {max}",
                self.path
            )));
        }
        Ok(())
    }

    /// Acquires `qty` leases by `deadline`, one after another; `None` if it
    /// passed first (then the leases taken so far are given back).
    pub(crate) async fn acquire_until(
        &self,
        qty: u32,
        deadline: Deadline,
    ) -> Result<Option<Vec<Lease>>> {
        self.check_qty(qty)?;
        // Not `with_capacity(qty)`: a huge `qty` (up to u32::MAX is allowed
        // under a huge maximum) would abort the process on allocation.
        let mut leases = Vec::new();
        while leases.len() < qty as usize {
            // A lease node that vanished (Curator's
            // `RETRY_DUE_TO_MISSING_NODE`) is made again.
            let session = self.session();
            match session
                .retrying_reaped(|| self.acquire_lease(deadline))
                .await
            {
                Ok(Some(lease)) => leases.push(lease),
                Ok(None) => {
                    return_all(leases).await;
                    return Ok(None);
                }
                Err(e) => {
                    return_all(leases).await;
                    return Err(e);
                }
            }
        }
        Ok(Some(leases))
    }

    /// One lease, Curator's `internalAcquire1Lease`: under the `locks` mutex,
    /// create the lease node and wait until the leases fit the maximum.
    /// `NoNode` if our lease node vanished: the caller makes a new one.
    async fn acquire_lease(&self, deadline: Deadline) -> Result<Option<Lease>> {
        if let Some(pool) = &self.kazoo {
            pool.assure().await?;
        }
        let Some(lock) = self.locks.acquire_until(deadline).await? else {
            return Ok(None);
        };
        let attempt = match &self.kazoo {
            Some(pool) => self.kazoo_lease_under_lock(pool, deadline).await,
            None => self.lease_under_lock(deadline).await,
        };
        match (attempt, to_completion(lock.release()).await) {
            (Ok(lease), Ok(())) => Ok(lease),
            (Ok(lease), Err(e)) => {
                return_all(lease).await;
                // The session that held the mutex is gone: our lease was not
                // admitted under it, whichever session made it. Start over.
                Err(match e {
                    Error::Lost { .. } => self.missing_node(),
                    e => e,
                })
            }
            (Err(e), _) => Err(e),
        }
    }

    /// kazoo's `_get_lease` loop, under kazoo's lock.
    async fn kazoo_lease_under_lock(
        &self,
        pool: &kazoo::Pool,
        deadline: Deadline,
    ) -> Result<Option<Lease>> {
        let session = &self.leases.session;
        let data = self
            .data
            .as_deref()
            .unwrap_or(&session.options().default_data);
        let node = pool.lease_under_lock(data, deadline).await?;
        // The hold limit works on kazoo's leases too (kazoo's acquirers
        // watch the lease directory); revocation requests are not listened
        // to in kazoo's layout: kazoo reads every lease node's data.
        let max_hold = self.leases.max_hold;
        Ok(node.map(|node| Lease::new(node.limited(max_hold), data.to_vec())))
    }

    async fn lease_under_lock(&self, deadline: Deadline) -> Result<Option<Lease>> {
        let session = &self.leases.session;
        // Subscribe before looking, so that no change of the maximum is missed.
        let changes = self.max.subscribe();
        let data = self
            .data
            .as_deref()
            .unwrap_or(&session.options().default_data);
        // `NoNode`: the container reaper removed the empty `leases`
        // directory between its creation and ours.
        let (pending, created, children) = self
            .leases
            .enter(data, CreateMode::EphemeralSequential)
            .await?;
        let wake = Notify::new();
        let predicate = LeaseCount(&self.max);
        let waited = tokio::select! {
            waited = self.leases.wait(&created, children, &predicate, deadline, Some(&wake)) => waited,
            never = forward_changes(changes, &wake) => match never {},
        };
        match waited {
            Ok(()) => {
                pending.disarm();
                let node = self.leases.hold(&self.path, "lease", created);
                // A revocable lease node carries no data (see `revocable`).
                let stored = if self.leases.revocation.is_some() {
                    Vec::new()
                } else {
                    data.to_vec()
                };
                Ok(Some(Lease::new(node, stored)))
            }
            Err(Stop::TimedOut) => {
                to_completion(pending.delete()).await?;
                Ok(None)
            }
            Err(Stop::Failed(Error::NoNode { .. })) => {
                to_completion(pending.delete()).await?;
                Err(self.missing_node())
            }
            Err(Stop::Failed(e)) => {
                // Keep the primary error; the node goes in the background.
                drop(pending);
                Err(e)
            }
        }
    }

    /// Our lease node is gone (Curator: "Sequential path not found").
    fn missing_node(&self) -> Error {
        Error::NoNode {
            path: format!(
                "{}: sequential path not found - possible session loss",
                self.leases.dir
            ),
        }
    }
}

/// Runs a clean-up (a release or a delete) to completion even if the caller
/// is cancelled meanwhile: a half-done release must not orphan a node that
/// blocks every other acquirer.
async fn to_completion(
    cleanup: impl std::future::Future<Output = Result<()>> + Send + 'static,
) -> Result<()> {
    tokio::spawn(cleanup)
        .await
        .unwrap_or_else(|e| Err(Error::Backend(format!("clean-up task failed: {e}"))))
}
