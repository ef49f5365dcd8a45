//! LeaderLatch as in the design documents: several candidates, exactly one
//! leader; when it closes, the next one leads, with a larger epoch.
//!
//!     cargo run --example leader_latch [-- --endpoint zk://127.0.0.1:2181]

mod common;
use common::endpoint;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let endpoint = endpoint();
    let path = format!("/examples/latch-{}", uuid::Uuid::new_v4().simple());
    let mut latches = Vec::new();
    for i in 0..5 {
        let session = dlock::connect(&endpoint).await?;
        let latch = dlock::LeaderLatch::new(&session, &path)?.with_id(format!("candidate-{i}"));
        latch.start()?;
        latches.push(latch);
    }
    let mut last_epoch = None;
    for round in 0..5 {
        // Whoever queued first among those left leads (start() joins the
        // race in the background, so that need not be candidate 0).
        let waits = latches.iter().map(|l| Box::pin(l.await_leadership()));
        let (term, index, _) = futures::future::select_all(waits).await;
        let term = term?;
        let leaders = latches.iter().filter(|l| l.has_leadership()).count();
        let leader = latches[index].leader().await?.expect("a leader");
        println!(
            "round {round}: {} leads with epoch {} ({leaders} leader)",
            leader.id,
            term.epoch()
        );
        anyhow::ensure!(leaders == 1, "{leaders} leaders at once");
        anyhow::ensure!(
            leader.id == latches[index].id(),
            "the latch that leads is the one the store names"
        );
        anyhow::ensure!(last_epoch < Some(term.epoch()), "epochs grow");
        last_epoch = Some(term.epoch());
        latches.remove(index).close().await?;
    }
    println!("leader_latch: 5 terms, one leader each, growing epochs");
    Ok(())
}
