//! Revocation as Curator does it: a holder made revocable is asked, by
//! anyone, to release; it cooperates.
//!
//!     cargo run --example revocation [-- --endpoint zk://127.0.0.1:2181]

mod common;
use common::endpoint;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let endpoint = endpoint();
    let path = format!("/examples/revocation-{}", uuid::Uuid::new_v4().simple());
    let holder = dlock::connect(&endpoint).await?;
    let (asked_tx, mut asked) = tokio::sync::mpsc::unbounded_channel();
    let mutex = dlock::Mutex::new(&holder, &path)?.revocable(move |node| {
        let _ = asked_tx.send(node.to_string());
    });
    let guard = mutex.acquire().await?;

    // Somebody else sees the holder and asks it to let go.
    let admin = dlock::connect(&endpoint).await?;
    let queue = dlock::Mutex::new(&admin, &path)?.participants().await?;
    dlock::revoke(&admin, &queue[0].node).await?;

    let node = asked.recv().await.expect("the holder is asked");
    println!("asked to release {node}: releasing");
    guard.release().await?;
    let next = dlock::Mutex::new(&admin, &path)?.acquire().await?;
    println!("revocation: the lock passed on (token {})", next.token());
    next.release().await?;
    Ok(())
}
