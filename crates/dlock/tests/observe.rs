//! Introspection without taking part: an election's leader changes as a
//! stream (etcd's `Election.Observe`), and a semaphore's free permits and
//! holders (CURATOR-230) — run on every backend.

mod common;

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use common::tests2::next_within;
use common::{await_children, persistent, Harness};
use dlock::recipes::leader_selector::LeaderSelector;
use dlock::recipes::observe::observe;
use dlock::store::{CreateMode, Op};
use dlock::{KvSemaphore, Layout, LeaderLatch, LeaderParticipant, Semaphore};
use futures::stream::BoxStream;
use futures::StreamExt;

const WITHIN: Duration = Duration::from_secs(30);

async fn next<T>(events: &mut BoxStream<'static, T>) -> Result<T> {
    next_within(events, WITHIN).await
}

fn id(leader: &Option<LeaderParticipant>) -> Option<&str> {
    leader.as_ref().map(|l| l.id.as_str())
}

/// Three latches in three sessions lead in turn; an observer in a fourth
/// session sees each leader in order, then nobody — and never shows up as
/// a candidate itself.
async fn leader_changes_are_observed_in_order(h: &Harness) -> Result<()> {
    let path = h.path("/e/latch");
    let watcher = h.session().await;
    let observer = observe(&watcher, &path).await?;
    let mut leaders = observer.leader_changes();
    ensure!(id(&next(&mut leaders).await?).is_none(), "nobody at first");

    let mut latches = Vec::new();
    for (n, name) in ["a", "b", "c"].into_iter().enumerate() {
        let latch = LeaderLatch::new(&h.session().await, &path)?.with_id(name);
        latch.start()?;
        await_children(&watcher, &path, n + 1, WITHIN).await?;
        latches.push(latch);
    }
    let first = next(&mut leaders).await?;
    ensure!(id(&first) == Some("a"), "{first:?}");
    let term = latches[0].await_leadership().await?;
    ensure!(first.as_ref().map(|l| l.epoch) == Some(term.epoch()));

    // The observer's copy catches up with the store by its watches.
    let mut changes = observer.changes();
    let seen = loop {
        let seen = next(&mut changes).await?;
        if seen.participants.len() >= 3 {
            break seen;
        }
    };
    let ids: Vec<&str> = seen.participants.iter().map(|p| p.id.as_str()).collect();
    ensure!(
        ids == ["a", "b", "c"],
        "{ids:?}: only the three candidates, in order"
    );
    ensure!(seen.leader().map(|l| l.is_leader) == Some(true));

    for expected in [Some("b"), Some("c"), None] {
        latches.remove(0).close().await?;
        let leader = next(&mut leaders).await?;
        ensure!(id(&leader) == expected, "{leader:?}, expected {expected:?}");
    }
    observer.close().await;
    ensure!(
        tokio::time::timeout(WITHIN, leaders.next())
            .await?
            .is_none(),
        "the stream ends with the observer"
    );
    Ok(())
}

/// Two candidates that appear together (one transaction, so one listing
/// shows both) are announced in their queue order: the first leader named
/// is the one the full view puts first, never the other one for a moment
/// (here the later node's name sorts first, and listings come by name).
async fn candidates_that_appear_together_are_seen_in_order(h: &Harness) -> Result<()> {
    let path = h.path("/e/together");
    let (watcher, candidates) = (h.session().await, h.session().await);
    candidates.create(&path, b"", persistent()).await?;
    let observer = observe(&watcher, &path).await?;
    let mut leaders = observer.leader_changes();
    ensure!(id(&next(&mut leaders).await?).is_none(), "nobody at first");
    let nodes = [
        format!("{path}/_c_ffffffff-ffff-4fff-bfff-ffffffffffff-latch-0000000000"),
        format!("{path}/_c_00000000-0000-4000-8000-000000000000-latch-0000000001"),
    ];
    let create = |node: &String, id: &str| Op::Create {
        path: node.clone(),
        data: id.as_bytes().to_vec(),
        mode: CreateMode::Ephemeral,
    };
    let both = [create(&nodes[0], "a"), create(&nodes[1], "b")];
    candidates.multi(&both).await?;
    let leader = next(&mut leaders).await?.context("a leader")?;
    // The copy catches up with both.
    let mut changes = observer.changes();
    let seen = loop {
        let seen = next(&mut changes).await?;
        if seen.participants.len() >= 2 {
            break seen;
        }
    };
    let first = &seen.participants[0];
    ensure!(
        leader.id == first.id && leader.node == first.node,
        "{leader:?} was named leader, but the queue puts {first:?} first"
    );
    candidates.delete(&first.node, None).await?;
    let next_leader = next(&mut leaders).await?;
    ensure!(
        id(&next_leader) == Some(seen.participants[1].id.as_str()),
        "{next_leader:?}: then the other"
    );
    candidates.delete(&seen.participants[1].node, None).await?;
    ensure!(id(&next(&mut leaders).await?).is_none(), "then nobody");
    observer.close().await;
    candidates.delete(&path, None).await?;
    Ok(())
}

/// A LeaderSelector's election (a mutex's nodes) is observed alike: the
/// leader's id while it leads, nobody once it has given up.
async fn a_selectors_leader_is_observed(h: &Harness) -> Result<()> {
    let path = h.path("/e/selector");
    let observer = observe(&h.session().await, &path).await?;
    let mut leaders = observer.leader_changes();
    ensure!(id(&next(&mut leaders).await?).is_none());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let selector = LeaderSelector::new(&h.session().await, &path, move |_term| {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    })?
    .with_id("worker-1");
    selector.start()?;
    let leader = next(&mut leaders).await?;
    ensure!(id(&leader) == Some("worker-1"), "{leader:?}");
    stop.send_replace(true);
    let leader = next(&mut leaders).await?;
    ensure!(leader.is_none(), "{leader:?}");
    selector.close().await?;
    observer.close().await;
    Ok(())
}

/// kazoo's election nodes (`<uuid>__lock__<seq>`: a selector with
/// [`Layout::Kazoo`]) are observed in queue order, whatever their random
/// prefixes: the first candidate leads, the others follow in turn.
async fn kazoo_candidates_are_observed_in_order(h: &Harness) -> Result<()> {
    let path = h.path("/e/kazoo");
    let watcher = h.session().await;
    let observer = observe(&watcher, &path).await?;
    let mut selectors = Vec::new();
    for n in 1..=5 {
        let selector = LeaderSelector::new(&h.session().await, &path, |_term| {
            std::future::pending::<()>()
        })?
        .with_layout(Layout::Kazoo)?
        .with_id(format!("w{n}"));
        selector.start()?;
        await_children(&watcher, &path, n, WITHIN).await?;
        selectors.push(selector);
    }
    let mut changes = observer.changes();
    let seen = loop {
        let seen = next(&mut changes).await?;
        if seen.participants.len() == 5 {
            break seen;
        }
    };
    let ids: Vec<&str> = seen.participants.iter().map(|p| p.id.as_str()).collect();
    ensure!(ids == ["w1", "w2", "w3", "w4", "w5"], "{ids:?}");
    for selector in selectors {
        selector.close().await?;
    }
    observer.close().await;
    await_children(&watcher, &path, 0, WITHIN).await
}

/// The data of `sem`'s holders, in queue order.
async fn holders_data(sem: &Semaphore) -> Result<Vec<Vec<u8>>> {
    Ok(sem.holders().await?.into_iter().map(|p| p.data).collect())
}

/// A semaphore tells its free permits and its holders without acquiring;
/// an acquirer waiting for a lease is no holder.
async fn semaphore_permits_and_holders(h: &Harness) -> Result<()> {
    let path = h.path("/s/sem");
    let looker = Semaphore::new(&h.session().await, &path, 2)?;
    ensure!(looker.available_permits().await? == 2);
    ensure!(looker.holders().await?.is_empty());
    let a = Semaphore::new(&h.session().await, &path, 2)?.with_data(b"a".to_vec());
    let b = Semaphore::new(&h.session().await, &path, 2)?.with_data(b"b".to_vec());
    let la = a.acquire_one().await?;
    ensure!(looker.available_permits().await? == 1);
    let lb = b.acquire_one().await?;
    let c = Semaphore::new(&h.session().await, &path, 2)?.with_data(b"c".to_vec());
    let waiting = tokio::spawn(async move { c.acquire_one().await });
    // The waiter's lease node is there, but it does not hold.
    await_children(looker.session(), &format!("{path}/leases"), 3, WITHIN).await?;
    ensure!(looker.available_permits().await? == 0);
    let holders = holders_data(&looker).await?;
    ensure!(holders == [b"a".to_vec(), b"b".to_vec()], "{holders:?}");
    ensure!(
        looker
            .session()
            .children(&format!("{path}/leases"))
            .await?
            .len()
            == 3
    );

    la.release().await?;
    let lc = tokio::time::timeout(WITHIN, waiting).await???;
    let holders = holders_data(&looker).await?;
    ensure!(holders == [b"b".to_vec(), b"c".to_vec()], "{holders:?}");
    lb.release().await?;
    lc.release().await?;
    ensure!(looker.available_permits().await? == 2);
    Ok(())
}

/// A KV semaphore tells its free slots (by the limit its record states)
/// and its live holders without taking a slot.
async fn kv_semaphore_permits_and_holders(h: &Harness) -> Result<()> {
    let path = h.path("/s/kv");
    let looker = KvSemaphore::new(&h.session().await, &path, 2)?;
    ensure!(looker.available_permits().await? == 2);
    let a = KvSemaphore::new(&h.session().await, &path, 2)?;
    let lease = a.acquire().await?;
    ensure!(looker.available_permits().await? == 1);
    ensure!(looker.holders().await? == [lease.holder()]);
    let seen = dlock::inspect(looker.session(), &path).await?;
    ensure!(
        seen.limit == Some(2),
        "inspect reads the record's limit: {seen:?}"
    );
    // A looker stating another limit still reads the holders' one.
    let other = KvSemaphore::new(&h.session().await, &path, 5)?;
    ensure!(other.available_permits().await? == 1);
    lease.release().await?;
    ensure!(looker.available_permits().await? == 2);
    ensure!(looker.holders().await?.is_empty());
    Ok(())
}

/// On etcd, a candidate of etcd's own `etcdctl elect` and a dlock latch
/// queue on one path by create revision; the observer sees the Go leader
/// (its proposal), then the latch once the Go candidate resigned.
async fn go_and_dlock_candidates_are_observed_in_turn(h: &Harness) -> Result<()> {
    let path = h.path("/e/go");
    let watcher = h.session().await;
    let observer = observe(&watcher, &path).await?;
    let mut leaders = observer.leader_changes();
    ensure!(id(&next(&mut leaders).await?).is_none());
    let mut etcdctl = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!(
            "--endpoints={}",
            dlock_testkit::shared_etcd().url()
        ))
        .args(["elect", &path, "go-1"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .context("run etcdctl")?;
    let leader = next(&mut leaders).await?;
    ensure!(id(&leader) == Some("go-1"), "{leader:?}");
    let latch = LeaderLatch::new(&h.session().await, &path)?.with_id("d1");
    latch.start()?;
    await_children(&watcher, &path, 2, WITHIN).await?;
    // Campaigning set up etcdctl's signal handling: SIGINT makes it resign.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(etcdctl.id() as libc::pid_t, libc::SIGINT) };
    // The observer's copy may see Go's key go before it has read d1's
    // node: "no leader" in between is a true observation, not a skip.
    let mut leader = next(&mut leaders).await?;
    while leader.is_none() {
        leader = next(&mut leaders).await?;
    }
    ensure!(id(&leader) == Some("d1"), "{leader:?}");
    tokio::task::spawn_blocking(move || etcdctl.wait()).await??;
    latch.await_leadership_timeout(WITHIN).await?;
    latch.close().await?;
    ensure!(next(&mut leaders).await?.is_none());
    observer.close().await;
    Ok(())
}

#[cfg(feature = "etcd")]
per_backend!(etcd_go => crate::common::etcd();
    go_and_dlock_candidates_are_observed_in_turn,
);

per_backend!(every_backend {
    leader_changes_are_observed_in_order,
    candidates_that_appear_together_are_seen_in_order,
    a_selectors_leader_is_observed,
    kazoo_candidates_are_observed_in_order,
    semaphore_permits_and_holders,
    kv_semaphore_permits_and_holders,
});
