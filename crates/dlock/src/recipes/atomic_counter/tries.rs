//! How an [`AtomicCounter`] updates: Curator's
//! `trySet`, optimistic tries then the promoted lock's.

use std::time::Instant;

use super::value::{decode, encode, AtomicStats, AtomicValue};
use super::AtomicCounter;
use crate::error::{Error, Found, Result};
use crate::recipes::mutex::Mutex;
use crate::session::RetryPolicy;
use crate::store::{CreateMode, CreateOptions, Stat};

impl AtomicCounter {
    /// The node: persistent, its ancestors containers.
    pub(super) fn node_options() -> CreateOptions {
        CreateOptions::new(CreateMode::Persistent).with_parents()
    }

    /// The node's data and stat, `None` if it is missing.
    pub(super) async fn read_raw(&self) -> Result<Option<(Vec<u8>, Stat)>> {
        let (session, path) = (&self.session, &self.path);
        session.retrying(|| session.get_data(path)).await.found()
    }

    /// The value and stat, `None` if the node is missing.
    pub(super) async fn read(&self) -> Result<Option<(i64, Stat)>> {
        match self.read_raw().await? {
            Some((data, stat)) => Ok(Some((decode(&self.path, &data)?, stat))),
            None => Ok(None),
        }
    }

    /// Curator's `trySet(MakeValue)`: optimistic tries, then the promoted
    /// lock's.
    pub(super) async fn update(&self, make: impl Fn(i64) -> Result<i64>) -> Result<AtomicValue> {
        let mut result = AtomicValue::unset();
        let started = Instant::now();
        let optimistic = self.tries(&mut result, &make, &self.retry, |s| &mut s.optimistic_tries);
        optimistic.await?;
        result.stats.optimistic_time = started.elapsed();
        if let (false, Some(promoted)) = (result.succeeded, &self.promoted) {
            let started = Instant::now();
            let mutex = Mutex::new(&self.session, &promoted.lock_path)?;
            let guard = match promoted.timeout {
                Some(t) => match mutex.acquire_timeout(t).await {
                    Ok(guard) => Some(guard),
                    Err(Error::Timeout(_)) => None,
                    Err(e) => return Err(e),
                },
                None => Some(mutex.acquire().await?),
            };
            if let Some(guard) = guard {
                let retry = &promoted.retry;
                let tried = self.tries(&mut result, &make, retry, |s| &mut s.promoted_lock_tries);
                let tried = tried.await;
                let released = guard.release().await;
                tried?;
                match released {
                    // The compare-and-set is atomic by itself: the lock
                    // only keeps contenders apart, so neither its loss nor
                    // a release left to the background (a lost connection)
                    // undoes an update that landed (a caller told otherwise
                    // would apply it twice).
                    Err(e) if result.succeeded => {
                        tracing::debug!(error = %e, "the promoted lock's release after an update that landed");
                    }
                    released => released?,
                }
            }
            result.stats.promoted_time = started.elapsed();
        }
        Ok(result)
    }

    /// Compare-and-set tries per `policy` until one wins or the policy
    /// gives up (a lost race is no error), each counted in `count`.
    async fn tries(
        &self,
        result: &mut AtomicValue,
        make: &impl Fn(i64) -> Result<i64>,
        policy: &RetryPolicy,
        count: fn(&mut AtomicStats) -> &mut u32,
    ) -> Result<()> {
        let mut retry = 0;
        loop {
            *count(&mut result.stats) += 1;
            if self.try_once(result, make).await? || retry >= policy.max_retries {
                return Ok(());
            }
            tokio::time::sleep(policy.sleep_for(retry)).await;
            retry += 1;
        }
    }

    /// `value`, or [`Error::InvalidArgument`] if `doing` it overflowed.
    pub(super) fn no_overflow(
        &self,
        value: Option<i64>,
        doing: impl FnOnce() -> String,
    ) -> Result<i64> {
        value.ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{} at {} overflows a 64-bit counter",
                doing(),
                self.path
            ))
        })
    }

    /// One compare-and-set: read, compute, write with the version read (or
    /// create). Whether it won; a lost race is `false`.
    async fn try_once(
        &self,
        result: &mut AtomicValue,
        make: &impl Fn(i64) -> Result<i64>,
    ) -> Result<bool> {
        let (session, path) = (&self.session, &self.path);
        let read = self.read().await?;
        result.pre_value = read.map_or(0, |(v, _)| v);
        result.post_value = result.pre_value;
        let value = make(result.pre_value)?;
        let data = encode(value);
        let written = match read {
            Some((_, stat)) => session
                .set_data(path, &data, Some(stat.version))
                .await
                .map(drop),
            None => session
                .create(path, &data, Self::node_options())
                .await
                .map(drop),
        };
        match written {
            Ok(()) => {
                result.succeeded = true;
                result.post_value = value;
                Ok(true)
            }
            Err(Error::BadVersion { .. } | Error::NodeExists { .. } | Error::NoNode { .. }) => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}
