//! SharedCount: ports of Curator's `TestSharedCount` plus dlock's own cases,
//! run on every backend.

mod common;

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use common::tests1::{remove, started_count};
use common::{persistent, Harness};
use dlock::recipes::shared_count::{SharedCount, VersionedValue};
use dlock::store::SessionState;
use dlock::{Error, Session};
use futures::StreamExt;

const WITHIN: Duration = Duration::from_secs(20);

/// Waits (by the count's own change notifications) until it shows `value`.
async fn await_value(count: &SharedCount, value: i32) -> Result<()> {
    let mut rx = count.subscribe();
    tokio::time::timeout(WITHIN, rx.wait_for(|v| v.value == value))
        .await
        .with_context(|| {
            format!(
                "{} never showed {value} (shows {})",
                count.path(),
                count.get()
            )
        })?
        .context("count closed")?;
    Ok(())
}

/// The count node is persistent data: a finished test removes it.
/// Two clients' counts of one node, each on its own session, started in
/// order (so the first one's seed is the node's).
struct TwoClients {
    path: String,
    sessions: [Session; 2],
    counts: [SharedCount; 2],
}

impl TwoClients {
    async fn start(h: &Harness, seeds: [i32; 2]) -> Result<Self> {
        let path = h.path("/count");
        let sessions = [h.session().await, h.session().await];
        let counts = [
            SharedCount::new(&sessions[0], &path, seeds[0])?,
            SharedCount::new(&sessions[1], &path, seeds[1])?,
        ];
        for count in &counts {
            count.start().await?;
        }
        Ok(TwoClients {
            path,
            sessions,
            counts,
        })
    }

    /// Closes both counts and removes the node.
    async fn finish(self) -> Result<()> {
        for count in &self.counts {
            count.close().await;
        }
        remove(&self.sessions[0], &self.path).await
    }
}

/// Curator's bytes: a persistent node holding a 4-byte big-endian i32.
async fn the_node_is_curators(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/foo/count");
    let count = SharedCount::new(&s, &path, 258)?;
    ensure!(
        count.get() == 258 && count.versioned().version == -1,
        "the seed, unread"
    );
    count.start().await?;
    let (data, stat) = s.get_data(&path).await?;
    ensure!(data == [0, 0, 1, 2], "{data:?}");
    ensure!(stat.ephemeral_owner == 0, "persistent");
    count.set(-2).await?;
    ensure!(s.get_data(&path).await?.0 == [0xff, 0xff, 0xff, 0xfe]);
    ensure!(count.versioned() == VersionedValue::new(1, -2));
    count.close().await;
    ensure!(s.exists(&path).await?.is_some(), "close keeps the node");
    remove(&s, &path).await
}

/// Curator `testMultiClients`: five listening clients and one setter; every
/// listener observes exactly the setter's sequence.
async fn every_listener_sees_every_value(h: &Harness) -> Result<()> {
    let path = h.path("/count");
    let setter_session = h.session().await;
    let setter = SharedCount::new(&setter_session, &path, 0)?;
    setter.start().await?;
    let values: Vec<i32> = (0..20).map(|i| (i * 7919) % 101).chain([-1]).collect();
    let (ack_tx, mut ack_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut listeners = Vec::new();
    let mut counts = Vec::new();
    for id in 0..5 {
        let count = SharedCount::new(&h.session().await, &path, 0)?;
        count.start().await?;
        let mut changes = count.changes();
        let ack = ack_tx.clone();
        counts.push(count);
        listeners.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            while let Some(v) = changes.next().await {
                seen.push(v.value);
                let _ = ack.send((id, v.value));
                if v.value == -1 {
                    break;
                }
            }
            seen
        }));
    }
    for &v in &values {
        setter.set(v).await?;
        // Each listener reports this value before the next one is set.
        let mut acked = [false; 5];
        while !acked.iter().all(|a| *a) {
            let (id, seen) = tokio::time::timeout(WITHIN, ack_rx.recv())
                .await?
                .context("listeners gone")?;
            ensure!(seen == v, "listener {id} saw {seen} while {v} was expected");
            acked[id] = true;
        }
    }
    for listener in listeners {
        let seen = tokio::time::timeout(WITHIN, listener).await??;
        ensure!(seen == values, "{seen:?}");
    }
    for c in counts.iter().chain([&setter]) {
        c.close().await;
    }
    remove(&setter_session, &path).await
}

/// Curator `testSimpleVersioned`: versions 0→1→2→3 through `try_set`; a
/// wrong value, a wrong version or an outside write make it fail.
async fn versioned_sets_follow_the_version(h: &Harness) -> Result<()> {
    let (s, path, count) = started_count(h, "/count", 0).await?;
    let mut current = count.versioned();
    ensure!(current.version == 0);
    for (next, version) in [(1, 1), (5, 2), (10, 3)] {
        ensure!(count.try_set(&current, next).await?, "set {next}");
        current = count.versioned();
        ensure!(
            current.version == version && count.get() == next,
            "{current:?}"
        );
    }
    ensure!(
        !count.try_set(&VersionedValue::new(3, 20), 7).await?,
        "wrong value"
    );
    ensure!(
        !count.try_set(&VersionedValue::new(10, 10), 7).await?,
        "wrong version"
    );
    s.set_data(&path, &88i32.to_be_bytes(), None).await?;
    ensure!(!count.try_set(&current, 234).await?, "the server changed");
    ensure!(count.get() == 88, "a failed try refreshes the copy");
    ensure!(count.try_set(&count.versioned(), 89).await?);
    count.close().await;
    remove(&s, &path).await
}

/// Curator `testMultiClientVersioned`: a stale versioned value of one client
/// fails after another client's write; after the refresh it succeeds.
async fn a_stale_version_fails_across_clients(h: &Harness) -> Result<()> {
    let clients = TwoClients::start(h, [10, 20]).await?;
    let [count1, count2] = &clients.counts;
    let mut changes1 = count1.changes();
    let listener1 = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(v) = changes1.next().await {
            seen.push(v.value);
            if v.value == 40 {
                break;
            }
        }
        seen
    });
    ensure!(count1.try_set(&count1.versioned(), 10).await?);
    // The same value, a new version: count2 sees it.
    let mut rx2 = count2.subscribe();
    tokio::time::timeout(WITHIN, rx2.wait_for(|v| v.version == 1)).await??;
    ensure!(count2.versioned() == VersionedValue::new(1, 10));
    ensure!(count2.try_set(&count2.versioned(), 20).await?);
    await_value(count1, 20).await?;
    let stale1 = count1.versioned();
    ensure!(count2.try_set(&count2.versioned(), 30).await?);
    ensure!(!count1.try_set(&stale1, 40).await?, "stale");
    ensure!(count1.get() == 30, "refreshed");
    ensure!(count1.try_set(&count1.versioned(), 40).await?);
    await_value(count2, 40).await?;
    // count1's listener saw the changes in order, ending with its own
    // write. (Quick changes may reach it as one, the last: how many it saw
    // depends on when its task ran.)
    let seen = tokio::time::timeout(WITHIN, listener1).await??;
    ensure!(
        seen.windows(2).all(|w| w[0] < w[1])
            && seen.iter().all(|v| [10, 20, 30, 40].contains(v))
            && seen.last() == Some(&40),
        "{seen:?}"
    );
    clients.finish().await
}

/// Curator `testMultiClientDifferentSeed`: the first creator's seed wins.
async fn the_first_seed_wins(h: &Harness) -> Result<()> {
    let clients = TwoClients::start(h, [10, 20]).await?;
    let [count1, count2] = &clients.counts;
    ensure!(
        count1.get() == 10 && count2.get() == 10,
        "{} {}",
        count1.get(),
        count2.get()
    );
    clients.finish().await
}

/// Curator `testDisconnectReconnectWithMultipleClients`: a count whose
/// session was disconnected while another client wrote still converges to
/// the latest value after each reconnection (the re-read on `Reconnected`).
async fn a_reconnected_count_catches_up(h: &Harness) -> Result<()> {
    let clients = TwoClients::start(h, [0, 0]).await?;
    let [reader, writer] = &clients.counts;
    let s1 = &clients.sessions[0];
    let faults = s1.faults().context("faults")?;
    for i in 1..=5 {
        // By the change count, which only grows: a short suspension may be
        // over before this task looks at the state.
        let before = s1.status().changes;
        faults.suspend(Duration::from_millis(150));
        tokio::time::timeout(WITHIN, s1.watch_status().wait_for(|s| s.changes > before))
            .await
            .context("never suspended")??;
        writer.set(i).await?;
        tokio::time::timeout(
            WITHIN,
            s1.watch_status()
                .wait_for(|s| s.changes >= before + 2 && s.state == SessionState::Reconnected),
        )
        .await
        .context("never reconnected")??;
        await_value(reader, i).await?;
    }
    clients.finish().await
}

/// Data that is not a count is a typed error, never a panic; a started
/// count keeps its last good value.
async fn malformed_data_is_a_typed_error(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/count");
    s.create(&path, b"12", persistent()).await?;
    let count = SharedCount::new(&s, &path, 0)?;
    let err = count.start().await.unwrap_err();
    ensure!(matches!(err, Error::MalformedData { .. }), "{err}");
    ensure!(err.to_string().contains("4 bytes"), "{err}");
    s.set_data(&path, &5i32.to_be_bytes(), None).await?;
    count.start().await?;
    ensure!(count.get() == 5);
    s.set_data(&path, b"garbage", None).await?;
    let err = count.read().await.unwrap_err();
    ensure!(matches!(err, Error::MalformedData { .. }), "{err}");
    ensure!(count.get() == 5, "the last good value stays");
    count.set(6).await?;
    await_value(&count, 6).await?;
    count.close().await;
    remove(&s, &path).await
}

/// start/close: no use before start, none after close, no second start;
/// close ends the change streams and stops following the node.
async fn the_lifecycle_is_enforced(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/count");
    let count = SharedCount::new(&s, &path, 1)?;
    let err = count.set(2).await.unwrap_err();
    ensure!(
        matches!(err, Error::InvalidArgument(_)) && err.to_string().contains("not started"),
        "{err}"
    );
    count.start().await?;
    ensure!(
        matches!(count.start().await, Err(Error::InvalidArgument(_))),
        "second start"
    );
    let mut rx = count.subscribe();
    count.close().await;
    ensure!(rx.changed().await.is_err(), "subscribers see the end");
    ensure!(count.changes().next().await.is_none(), "streams end");
    s.set_data(&path, &9i32.to_be_bytes(), None).await?;
    ensure!(count.get() == 1, "no longer followed");
    ensure!(matches!(count.set(3).await, Err(Error::Closed)));
    ensure!(
        matches!(count.start().await, Err(Error::InvalidArgument(_))),
        "no restart"
    );
    remove(&s, &path).await
}

/// A deleted and re-created node is followed.
async fn a_recreated_node_is_followed(h: &Harness) -> Result<()> {
    let (s, path, count) = started_count(h, "/count", 3).await?;
    let other = h.session().await;
    other.delete(&path, None).await?;
    other
        .create(&path, &42i32.to_be_bytes(), persistent())
        .await?;
    await_value(&count, 42).await?;
    count.close().await;
    remove(&s, &path).await
}

per_backend!(every_backend {
    every_listener_sees_every_value,
    versioned_sets_follow_the_version,
    a_stale_version_fails_across_clients,
    the_first_seed_wins,
    a_reconnected_count_catches_up,
    malformed_data_is_a_typed_error,
    the_lifecycle_is_enforced,
    a_recreated_node_is_followed,
});

// The Curator layout and interoperability checks: ZooKeeper's naming only
// (etcd orders nodes by revision, not by Curator names).
per_backend!({
    embedded_layout => crate::common::embedded(),
    zookeeper_layout => crate::common::zookeeper(),
} {
    the_node_is_curators,
});
