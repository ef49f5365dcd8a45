//! The ticket-selling test of the design documents: 30 sellers, 100
//! tickets, exactly 100 sold — the count read and written under a Mutex.
//!
//!     cargo run --example tickets [-- --endpoint zk://127.0.0.1:2181]

mod common;
use common::endpoint;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use dlock::store::{CreateMode, CreateOptions};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let endpoint = endpoint();
    let root = format!("/examples/tickets-{}", uuid::Uuid::new_v4().simple());
    let admin = dlock::connect(&endpoint).await?;
    let left_path = format!("{root}/left");
    admin
        .create(
            &left_path,
            b"100",
            CreateOptions::new(CreateMode::Persistent).with_parents(),
        )
        .await?;
    let sold = Arc::new(AtomicU32::new(0));
    let mut sellers = Vec::new();
    for _ in 0..30 {
        let session = dlock::connect(&endpoint).await?;
        let (lock, left_path, sold) = (
            dlock::Mutex::new(&session, &format!("{root}/lock"))?,
            left_path.clone(),
            sold.clone(),
        );
        sellers.push(tokio::spawn(async move {
            loop {
                let guard = lock.acquire().await?;
                let left: u32 =
                    String::from_utf8(session.get_data(&left_path).await?.0)?.parse()?;
                if left == 0 {
                    guard.release().await?;
                    return anyhow::Ok(());
                }
                session
                    .set_data(&left_path, (left - 1).to_string().as_bytes(), None)
                    .await?;
                sold.fetch_add(1, Ordering::SeqCst);
                guard.release().await?;
            }
        }));
    }
    for s in sellers {
        s.await??;
    }
    let sold = sold.load(Ordering::SeqCst);
    println!("tickets: 30 sellers sold {sold} of 100");
    anyhow::ensure!(sold == 100, "sold {sold} tickets of 100");
    admin.delete(&left_path, None).await?;
    Ok(())
}
