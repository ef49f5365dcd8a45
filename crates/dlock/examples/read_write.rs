//! The read-write lock of the design documents: downgrade (write → read →
//! release write) is allowed; upgrade (read → write) is refused.
//!
//!     cargo run --example read_write [-- --endpoint zk://127.0.0.1:2181]

mod common;
use common::endpoint;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let session = dlock::connect(&endpoint()).await?;
    let path = format!("/examples/rw-{}", uuid::Uuid::new_v4().simple());
    let rw = dlock::ReadWriteLock::new(&session, &path)?;
    let other = dlock::ReadWriteLock::new(&session, &path)?;

    // Downgrade: write, then read, then release the write lock.
    let write = rw.write().await?;
    let read = write.read().await?;
    write.release().await?;
    println!("downgraded: holding only the read lock now");
    anyhow::ensure!(other.try_read().await?.is_some(), "another reader joins");
    anyhow::ensure!(
        other.try_write().await?.is_none(),
        "no writer while we read"
    );

    // Upgrade: refused at once, with a clear error.
    let err = rw.write().await.expect_err("upgrade must be refused");
    println!("upgrade refused: {err}");
    read.release().await?;
    rw.write().await?.release().await?;
    println!("read_write: downgrade allowed, upgrade refused");
    Ok(())
}
