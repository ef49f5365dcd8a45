//! The counter a scenario checks itself with: a SharedCount (4-byte
//! big-endian int, Curator's layout) that every participant, in any process
//! — Curator's probes too — changes by compare-and-set on entering and on
//! leaving, so that more of them inside at once than allowed shows.

use anyhow::Result;
use dlock::recipes::shared_count::SharedCount;
use dlock::Session;

/// One participant's handle on the probe counter.
#[derive(Clone)]
pub struct Probe {
    counter: SharedCount,
}

impl Probe {
    /// The probe at `path` for `session`, created with 0 if it is absent
    /// (it is never reset).
    pub async fn open(session: &Session, path: &str) -> Result<Probe> {
        let counter = SharedCount::new(session, path, 0)?;
        counter.start().await?;
        Ok(Probe { counter })
    }

    /// Adds `delta` by compare-and-set; the new value.
    pub async fn add(&self, delta: i32) -> Result<i32> {
        loop {
            let seen = self.counter.versioned();
            let next = seen.value.wrapping_add(delta);
            // A failed try refreshes the local copy for the next round.
            if self.counter.try_set(&seen, next).await? {
                return Ok(next);
            }
        }
    }

    /// Stops watching the counter.
    pub async fn close(&self) {
        self.counter.close().await;
    }
}
