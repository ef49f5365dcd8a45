//! Scale: a thousand waiters on one lock wake one at a time; one session
//! holds ten thousand locks. On the embedded store, which counts watches.

mod common;

use std::time::Duration;

use anyhow::{ensure, Result};
use common::tests1::one_watch_per_waiter;
use dlock::store::embedded::{EmbeddedOptions, EmbeddedServer};
use dlock::{Mutex, SessionOptions};

fn server() -> EmbeddedServer {
    EmbeddedServer::with_options(EmbeddedOptions {
        container_check_interval: Duration::from_millis(50),
    })
}

/// 1,000 waiters queue on one lock: each costs one watch, and each of the
/// 1,000 handoffs wakes exactly one of them (no herd).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_waiters_are_woken_one_at_a_time() -> Result<()> {
    let server = server();
    let path = "/scale/one-lock";
    let waiters = 1000;
    let holder = server.connect_default().await?;
    let first = Mutex::new(&holder, path)?.acquire().await?;
    let (tx, mut acquired) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..waiters {
        let session = server.connect(SessionOptions::default()).await?;
        let (mutex, tx) = (Mutex::new(&session, path)?, tx.clone());
        tasks.push(tokio::spawn(async move {
            let guard = mutex.acquire().await?;
            tx.send(i).unwrap();
            guard.release().await?;
            drop(session);
            anyhow::Ok(())
        }));
    }
    let before = one_watch_per_waiter(&server, waiters, Duration::from_secs(60)).await?;
    first.release().await?;
    for _ in 0..waiters {
        tokio::time::timeout(Duration::from_secs(60), acquired.recv()).await?;
    }
    for t in tasks {
        t.await??;
    }
    let woken = server.watch_stats().node_notifications - before.node_notifications;
    ensure!(
        woken == waiters as u64,
        "{woken} wake-ups for {waiters} handoffs"
    );
    Ok(())
}

/// One session holds 10,000 locks at once, and releases them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_holds_ten_thousand_locks() -> Result<()> {
    let server = server();
    let session = server.connect_default().await?;
    let mut guards = Vec::with_capacity(10_000);
    for i in 0..10_000 {
        guards.push(
            Mutex::new(&session, &format!("/scale/many/{i}"))?
                .acquire()
                .await?,
        );
    }
    let other = server.connect_default().await?;
    ensure!(Mutex::new(&other, "/scale/many/9999")?
        .try_acquire()
        .await?
        .is_none());
    let tokens: std::collections::BTreeSet<_> = guards.iter().map(|g| g.token()).collect();
    ensure!(tokens.len() == 10_000, "distinct fencing tokens");
    for g in guards {
        g.release().await?;
    }
    ensure!(Mutex::new(&other, "/scale/many/9999")?
        .try_acquire()
        .await?
        .is_some());
    Ok(())
}
