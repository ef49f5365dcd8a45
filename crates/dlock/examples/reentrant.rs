//! The FakeLimitedResource test of the design documents: clients acquire,
//! use a resource that fails if used concurrently, re-acquire (re-entrant),
//! and release twice.
//!
//!     cargo run --example reentrant [-- --endpoint zk://127.0.0.1:2181]

mod common;
use common::endpoint;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A resource that may be used by one client at a time, and says so if not.
#[derive(Default)]
struct FakeLimitedResource {
    in_use: AtomicBool,
}

impl FakeLimitedResource {
    async fn use_it(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            !self.in_use.swap(true, Ordering::SeqCst),
            "used concurrently!"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
        self.in_use.store(false, Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let endpoint = endpoint();
    let path = format!("/examples/reentrant-{}", uuid::Uuid::new_v4().simple());
    let resource = Arc::new(FakeLimitedResource::default());
    let mut clients = Vec::new();
    for i in 0..5 {
        let session = dlock::connect(&endpoint).await?;
        let (mutex, resource) = (dlock::Mutex::new(&session, &path)?, resource.clone());
        clients.push(tokio::spawn(async move {
            for _ in 0..10 {
                let outer = mutex.acquire().await?;
                resource.use_it().await?;
                let inner = outer.reenter()?; // re-entrant: no round trip, no wait
                resource.use_it().await?;
                inner.release().await?;
                outer.release().await?;
            }
            println!("client {i} done");
            anyhow::Ok(())
        }));
    }
    for c in clients {
        c.await??;
    }
    println!("reentrant: 5 clients × 10 rounds, the resource was never used concurrently");
    Ok(())
}
