//! LeaderSelector as in the design documents: candidates take turns; each
//! runs its task while leader and gives leadership up when the task returns
//! (auto-requeue puts it back in line).
//!
//!     cargo run --example leader_selector [-- --endpoint zk://127.0.0.1:2181]

mod common;
use common::endpoint;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Counts leaders in; out again when dropped.
struct Leading(Arc<AtomicUsize>);

impl Leading {
    fn enter(leading: &Arc<AtomicUsize>, violations: &AtomicUsize) -> Self {
        if leading.fetch_add(1, Ordering::SeqCst) != 0 {
            violations.fetch_add(1, Ordering::SeqCst);
        }
        Leading(leading.clone())
    }
}

impl Drop for Leading {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let endpoint = endpoint();
    let path = format!("/examples/selector-{}", uuid::Uuid::new_v4().simple());
    let (leading, terms, violations) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let (done_tx, mut done) = tokio::sync::mpsc::unbounded_channel();
    let mut selectors = Vec::new();
    for i in 0..3 {
        let session = dlock::connect(&endpoint).await?;
        let (leading, terms, violations, done_tx) = (
            leading.clone(),
            terms.clone(),
            violations.clone(),
            done_tx.clone(),
        );
        let selector = dlock::LeaderSelector::new(&session, &path, move |term| {
            let (leading, terms, violations, done_tx) = (
                leading.clone(),
                terms.clone(),
                violations.clone(),
                done_tx.clone(),
            );
            async move {
                // Counted out on drop too: closing a selector cancels its
                // running task by dropping it.
                let _leading = Leading::enter(&leading, &violations);
                println!("candidate-{i} leads (epoch {})", term.epoch());
                tokio::time::sleep(Duration::from_millis(20)).await;
                if terms.fetch_add(1, Ordering::SeqCst) + 1 == 9 {
                    let _ = done_tx.send(());
                }
            }
        })?
        .with_id(format!("candidate-{i}"))
        .with_auto_requeue();
        selector.start()?;
        selectors.push(selector);
    }
    done.recv().await;
    for s in &selectors {
        s.close().await?;
    }
    let violations = violations.load(Ordering::SeqCst);
    println!(
        "leader_selector: {} terms taken in turn, {violations} overlaps",
        terms.load(Ordering::SeqCst)
    );
    anyhow::ensure!(violations == 0, "two leaders at once");
    Ok(())
}
