//! How a [`Semaphore`] acquires: Curator's `internalAcquire1Lease` (or
//! kazoo's `_get_lease`) once per lease, all of them under one hold of the
//! internal lock.

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

    /// Acquires `qty` leases by `deadline`, one after another under one hold
    /// of the internal lock; `None` if it passed first (then the leases
    /// taken so far are given back). Curator takes the lock once per lease,
    /// so two acquirers of 2 leases out of 2 can each hold one and wait for
    /// the other for ever; holding it for all of them, the first to get it
    /// gets them all.
    pub(crate) async fn acquire_until(
        &self,
        qty: u32,
        deadline: Deadline,
    ) -> Result<Option<Vec<Lease>>> {
        self.check_qty(qty)?;
        // A lease node that vanished (Curator's `RETRY_DUE_TO_MISSING_NODE`)
        // is made again, with the others given back.
        let session = self.session();
        session
            .retrying_reaped(|| self.acquire_leases(qty, deadline))
            .await
    }

    /// One lease, as a [`Lockable`](crate::Lockable) takes it.
    pub(crate) async fn acquire_one_until(&self, deadline: Deadline) -> Result<Option<Lease>> {
        let leases = self.acquire_until(1, deadline).await?;
        Ok(leases.and_then(|mut leases| leases.pop()))
    }

    /// `qty` leases, each Curator's `internalAcquire1Lease` (create the
    /// lease node and wait until the leases fit the maximum) under the
    /// `locks` mutex, held once for all. `NoNode` if a lease node vanished:
    /// the caller goes again.
    async fn acquire_leases(&self, qty: u32, deadline: Deadline) -> Result<Option<Vec<Lease>>> {
        if let Some(pool) = &self.kazoo {
            pool.assure().await?;
        }
        let Some(lock) = self.locks.acquire_until(deadline).await? else {
            return Ok(None);
        };
        // Not `with_capacity(qty)`: a huge `qty` (up to u32::MAX is allowed
        // under a huge maximum) would abort the process on allocation.
        let mut leases = Vec::new();
        let attempt = loop {
            if leases.len() == qty as usize {
                break Ok(true);
            }
            let lease = match &self.kazoo {
                Some(pool) => self.kazoo_lease_under_lock(pool, deadline).await,
                None => self.lease_under_lock(deadline).await,
            };
            match lease {
                Ok(Some(lease)) => leases.push(lease),
                Ok(None) => break Ok(false),
                Err(e) => break Err(e),
            }
        };
        let released = to_completion(lock.release()).await;
        let failed = match (attempt, released) {
            (Ok(true), Ok(())) => return Ok(Some(leases)),
            (Err(e), _) => Err(e),
            // The session that held the mutex is gone: our leases were not
            // admitted under it, whichever session made them. Start over.
            (Ok(true), Err(Error::Lost { .. })) => Err(self.missing_node()),
            // Our leases were admitted while we held it; its node goes in
            // the background (a guaranteed delete).
            (Ok(true), Err(e)) if e.is_retryable() => {
                tracing::debug!(error = %e, "releasing a semaphore's lock after admitting our leases");
                return Ok(Some(leases));
            }
            (Ok(true), Err(e)) => Err(e),
            (Ok(false), _) => Ok(None),
        };
        return_all(leases).await;
        failed
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
                let stored = self.leases.node_data(data).to_vec();
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
    // Its retries bounded as the timed wait awaiting it bounds its own
    // (what is left of it goes on in the background).
    tokio::spawn(crate::recipes::deadline::within_this_wait(cleanup))
        .await
        .unwrap_or_else(|e| Err(Error::Backend(format!("clean-up task failed: {e}"))))
}
