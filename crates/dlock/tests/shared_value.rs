//! SharedValue: Curator's `TestSharedValue`-style cases, and a SharedCount
//! and a SharedValue sharing one node, run on every backend.

mod common;

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use common::Harness;
use dlock::recipes::children_cache::ChildrenCache;
use dlock::recipes::shared_count::encode;
use dlock::recipes::shared_value::VersionedValue;
use dlock::{Error, GroupMember, Session, SharedCount, SharedValue};
use futures::{FutureExt, StreamExt};

const WITHIN: Duration = Duration::from_secs(20);

async fn remove(session: &Session, path: &str) -> Result<()> {
    match session.delete(path, None).await {
        Ok(()) | Err(Error::NoNode { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Bytes as given, the first seed wins, versions count the writes, and a
/// stale compare-and-set of one session fails after another's write.
async fn versioned_bytes_across_sessions(h: &Harness) -> Result<()> {
    let path = h.path("/value");
    let (s1, s2) = (h.session().await, h.session().await);
    let v1 = SharedValue::new(&s1, &path, b"first".to_vec())?;
    let v2 = SharedValue::new(&s2, &path, b"second".to_vec())?;
    v1.start().await?;
    v2.start().await?;
    ensure!(v2.versioned() == VersionedValue::new(0, b"first".to_vec()));
    ensure!(
        s1.get_data(&path).await?.0 == b"first",
        "the bytes as given"
    );

    let mut changes2 = v2.changes();
    let stale = v1.versioned();
    ensure!(v1.try_set(&stale, b"\x00\xffbinary".to_vec()).await?);
    let seen = tokio::time::timeout(WITHIN, changes2.next())
        .await?
        .context("stream ended")?;
    ensure!(
        seen == VersionedValue::new(1, b"\x00\xffbinary".to_vec()),
        "{seen:?}"
    );
    ensure!(!v1.try_set(&stale, b"late".to_vec()).await?, "stale");
    ensure!(
        v2.try_set(&v2.versioned(), Vec::new()).await?,
        "empty is a value"
    );
    let mut rx1 = v1.subscribe();
    tokio::time::timeout(WITHIN, rx1.wait_for(|v| v.version == 2)).await??;
    ensure!(v1.get().is_empty(), "{:?}", v1.get());
    ensure!(
        v1.try_set(&v1.versioned(), b"x".to_vec()).await?,
        "caught up"
    );
    ensure!(v2.read().await? == VersionedValue::new(3, b"x".to_vec()));
    let err = v1
        .try_set(&VersionedValue::new(-1, Vec::new()), b"y".to_vec())
        .await
        .unwrap_err();
    ensure!(matches!(err, Error::InvalidArgument(_)), "{err}");
    // Another negative version is one ZooKeeper's wrap to (CURATOR-688): a
    // stale one here, not refused.
    let wrapped = VersionedValue::new(-2, b"x".to_vec());
    ensure!(
        !v1.try_set(&wrapped, b"y".to_vec()).await?,
        "a stale version"
    );
    v1.close().await;
    v2.close().await;
    // What it had not yet delivered, then the end.
    tokio::time::timeout(WITHIN, changes2.count())
        .await
        .context("the stream ends on close")?;
    remove(&s1, &path).await
}

/// A SharedCount is a typed view of the same node: a SharedValue sees the
/// count's 4 bytes, and the count sees 4 bytes the value writes; bytes
/// that are no count leave the count at its last good value.
async fn a_count_is_a_typed_value(h: &Harness) -> Result<()> {
    let path = h.path("/count");
    let (s1, s2) = (h.session().await, h.session().await);
    let count = SharedCount::new(&s1, &path, 7)?;
    count.start().await?;
    let value = SharedValue::new(&s2, &path, Vec::new())?;
    value.start().await?;
    ensure!(value.get() == encode(7), "{:?}", value.get());
    let mut rx = value.subscribe();
    count.set(-2).await?;
    tokio::time::timeout(WITHIN, rx.wait_for(|v| v.value == encode(-2))).await??;

    let mut counts = count.subscribe();
    ensure!(
        value
            .try_set(&value.versioned(), encode(300).to_vec())
            .await?
    );
    tokio::time::timeout(WITHIN, counts.wait_for(|v| v.value == 300)).await??;
    ensure!(count.versioned() == VersionedValue::new(2, 300));

    value.set(b"not a count".to_vec()).await?;
    let err = count.read().await.unwrap_err();
    ensure!(matches!(err, Error::MalformedData { .. }), "{err}");
    ensure!(count.get() == 300, "the last good value stays");
    count.close().await;
    value.close().await;
    remove(&s1, &path).await
}

/// Bad paths are typed errors; a value is not used before start.
async fn bad_input_is_refused(h: &Harness) -> Result<()> {
    let s = h.session().await;
    for bad in ["/", "relative", "/x/"] {
        let err = SharedValue::new(&s, bad, Vec::new()).unwrap_err();
        ensure!(matches!(err, Error::InvalidPath { .. }), "{bad}: {err}");
    }
    let value = SharedValue::new(&s, &h.path("/unstarted"), Vec::new())?;
    let err = value.set(b"x".to_vec()).await.unwrap_err();
    ensure!(err.to_string().contains("not started"), "{err}");
    Ok(())
}

/// A start's future dropped midway (here while the connection is down, so
/// its first read waits) takes its begin back: starting again works, for
/// each recipe that starts by reading the store — a value, a children
/// cache, a group member (whose cache and node the first start may have
/// made already).
async fn a_start_cancelled_midway_can_be_tried_again(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let value = SharedValue::new(&s, &h.path("/value"), b"seed".to_vec())?;
    let cache = ChildrenCache::new(&s, &h.path("/cache"))?;
    let member = GroupMember::new(&s, &h.path("/group"), "a")?;
    let faults = s.faults().context("faults")?;
    faults.suspend(Duration::from_millis(300));
    ensure!(
        value.start().now_or_never().is_none(),
        "a start while suspended waits"
    );
    ensure!(
        cache.start().now_or_never().is_none(),
        "a start while suspended waits"
    );
    ensure!(
        member.start().now_or_never().is_none(),
        "a start while suspended waits"
    );
    value.start().await.context("the value's second start")?;
    cache.start().await.context("the cache's second start")?;
    member.start().await.context("the member's second start")?;
    ensure!(value.get() == b"seed");
    value.close().await;
    cache.close().await;
    member.close().await?;
    remove(&s, &h.path("/value")).await
}

per_backend!(every_backend {
    a_start_cancelled_midway_can_be_tried_again,
    versioned_bytes_across_sessions,
    a_count_is_a_typed_value,
    bad_input_is_refused,
});
