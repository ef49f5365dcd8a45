//! Round trips of an uncontended acquire + release on real servers, counted
//! by a proxy between client and server that holds each reply back a
//! little (so that only real waits for an answer count; requests sent
//! together before any answer share one round trip). The number follows
//! from each backend's protocol:
//!
//! - **ZooKeeper: 2** — the create and the listing pipelined on one
//!   connection, then the delete.
//! - **Consul: 3** — the reads of the node's ancestors, sent together
//!   (a Consul transaction cannot ask "absent or not held by a session",
//!   so that no node is created below an ephemeral one is checked by
//!   reading them first); the create and the listing in one `/v1/txn`
//!   (`check-not-exists`, `lock` with the session, `get-tree`); then the
//!   delete, one `/v1/txn` fenced by the node's modify index, which the
//!   create returned.
//!
//! etcd is not pinned here: by its protocol a cycle is 2 (the create and
//! the listing in one `Txn`, then the delete), but its gRPC runs over
//! HTTP/2, and the proxy sees bytes, not frames: what the client sends
//! after an answer without waiting for one (HTTP/2 flow-control frames)
//! starts a flight too, so the proxy counts 4 per cycle.

use std::time::Duration;

use dlock::store::{CreateMode, CreateOptions};
use dlock::{Mutex, SessionOptions};
use dlock_testkit::TcpProxy;

/// Measures 5 acquire + release cycles through a proxy to `upstream`
/// (`scheme://` + the proxy's address is the endpoint) and checks that an
/// uncontended cycle takes `expected` round trips: a keep-alive may add one
/// to a cycle, never fewer.
async fn an_uncontended_cycle_takes(
    scheme: &str,
    upstream: &str,
    expected: u64,
) -> anyhow::Result<()> {
    let proxy = TcpProxy::start(upstream)?;
    // A long session: few keep-alives (one every third of it) in the way.
    let options = SessionOptions::default().with_session_timeout(Duration::from_secs(30));
    let session = dlock::connect_with(&format!("{scheme}://{}", proxy.address()), options).await?;
    let root = format!("/rt-{}", uuid::Uuid::new_v4().simple());
    // A persistent lock directory is never reaped between cycles, so every
    // cycle is the steady state (no directory to re-create).
    let options = CreateOptions::new(CreateMode::Persistent).with_parents();
    session
        .create(&format!("{root}/lock"), b"", options)
        .await?;
    let mutex = Mutex::new(&session, &format!("{root}/lock"))?;
    mutex.acquire().await?.release().await?;
    proxy.delay_replies(Duration::from_millis(20));
    let mut cycles = Vec::new();
    for _ in 0..5 {
        let before = proxy.flights();
        mutex.acquire().await?.release().await?;
        cycles.push(proxy.flights() - before);
    }
    let fewest = *cycles.iter().min().unwrap();
    assert_eq!(
        fewest, expected,
        "round trips per acquire+release: {cycles:?}"
    );
    assert!(
        cycles.iter().filter(|&&c| c == expected).count() >= 4,
        "{cycles:?}"
    );
    // The container reaper may have removed the empty directories already.
    for dir in [format!("{root}/lock"), root] {
        match session.delete(&dir, None).await {
            Ok(()) | Err(dlock::Error::NoNode { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    session.close().await;
    Ok(())
}

#[cfg(feature = "zookeeper")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_acquire_and_release_is_two_round_trips() -> anyhow::Result<()> {
    let upstream = dlock_testkit::shared_zk().connect_string();
    an_uncontended_cycle_takes("zk", &upstream, 2).await
}

#[cfg(feature = "consul")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_acquire_and_release_is_three_round_trips_on_consul() -> anyhow::Result<()> {
    let upstream = dlock_testkit::shared_consul().endpoint();
    an_uncontended_cycle_takes("consul", &upstream, 3).await
}
