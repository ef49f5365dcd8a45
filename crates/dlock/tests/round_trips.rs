//! Round trips on a real ZooKeeper, counted by a proxy between client and
//! server that holds each reply back a little (so that only real waits for
//! an answer count): an uncontended acquire + release is two sequential
//! round trips (create ‖ list pipelined, then delete).

use std::time::Duration;

use dlock::store::{CreateMode, CreateOptions};
use dlock::{Mutex, SessionOptions};
use dlock_testkit::{shared_zk, TcpProxy};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_acquire_and_release_is_two_round_trips() -> anyhow::Result<()> {
    let proxy = TcpProxy::start(&shared_zk().connect_string())?;
    let options = SessionOptions::default().with_session_timeout(Duration::from_secs(30));
    let session = dlock::connect_with(&format!("zk://{}", proxy.address()), options).await?;
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
    // A keep-alive ping may add a flight to a cycle; never fewer than two.
    let fewest = *cycles.iter().min().unwrap();
    assert_eq!(fewest, 2, "round trips per acquire+release: {cycles:?}");
    assert!(
        cycles.iter().filter(|&&c| c == 2).count() >= 4,
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
