//! The semaphore programs of the design documents: take 5 leases, then 1
//! more; a timed request for 5 times out; return one, then 5 succeed again
//! (Curator's InterProcessSemaphoreV2 demo, 10 leases) — and 15 competitors
//! on a limit of 3 (the Consul-style semaphore test).
//!
//!     cargo run --example semaphore [-- --endpoint zk://127.0.0.1:2181]

mod common;
use common::endpoint;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let endpoint = endpoint();
    let root = format!("/examples/semaphore-{}", uuid::Uuid::new_v4().simple());
    let session = dlock::connect(&endpoint).await?;

    // Curator's demo: 10 leases.
    let sem = dlock::Semaphore::new(&session, &format!("{root}/v2"), 10)?;
    let mut five = sem.acquire(5).await?;
    let one = sem.acquire_one().await?;
    println!("holding 6 of 10 leases");
    let err = sem
        .acquire_timeout(5, Duration::from_millis(300))
        .await
        .expect_err("only 4 left");
    println!("a request for 5 more: {err}");
    five.pop().expect("five leases").release().await?;
    let five_again = sem.acquire_timeout(5, Duration::from_secs(5)).await?;
    println!(
        "returned one, then 5 more succeeded: {} leases held",
        five.len() + 1 + five_again.len()
    );
    for lease in five.into_iter().chain(five_again).chain([one]) {
        lease.release().await?;
    }

    // The Consul-style test: 15 competitors, a limit of 3.
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut competitors = Vec::new();
    for _ in 0..15 {
        let session = dlock::connect(&endpoint).await?;
        let sem = dlock::KvSemaphore::new(&session, &format!("{root}/kv"), 3)?;
        let (inside, most) = (inside.clone(), most.clone());
        competitors.push(tokio::spawn(async move {
            let lease = sem.acquire().await?;
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            lease.release().await?;
            anyhow::Ok(())
        }));
    }
    for c in competitors {
        c.await??;
    }
    let most = most.load(Ordering::SeqCst);
    println!("semaphore: 15 competitors, at most {most} inside at once (limit 3)");
    anyhow::ensure!(most <= 3, "{most} inside at once");
    Ok(())
}
