//! Barrier and DoubleBarrier: Curator's node layout and behaviour (ports of
//! `TestDistributedBarrier` / `TestDistributedDoubleBarrier` plus dlock's
//! cancellation cases), run on every backend.

mod common;

use std::future::Future;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use common::{await_children, await_gone, Harness};
use dlock::{Barrier, DoubleBarrier, Error, Session};
use tokio::task::JoinHandle;

const WITHIN: Duration = Duration::from_secs(20);
const SHORT: Duration = Duration::from_millis(200);

/// `tasks` all still wait (else they got `early`); once `release` is done,
/// each ends well within [`WITHIN`]. Returns what `release` and then each
/// task got.
async fn held_until<T>(
    tasks: Vec<JoinHandle<dlock::Result<T>>>,
    early: &str,
    release: impl Future<Output = dlock::Result<T>>,
) -> Result<Vec<T>> {
    ensure!(tasks.iter().all(|t| !t.is_finished()), "{early}");
    let mut got = vec![release.await?];
    for task in tasks {
        got.push(tokio::time::timeout(WITHIN, task).await???);
    }
    Ok(got)
}

/// A new session's `Barrier` at the test's `/b/barrier`, with that path.
async fn a_barrier(h: &Harness) -> Result<(Session, String, Barrier)> {
    let s = h.session().await;
    let path = h.path("/b/barrier");
    let barrier = Barrier::new(&s, &path)?;
    Ok((s, path, barrier))
}

/// `DistributedBarrier`: one persistent node at the path, with the default
/// data; setting twice and removing twice are no-ops.
async fn barrier_node_is_curators(h: &Harness) -> Result<()> {
    let (s, path, barrier) = a_barrier(h).await?;
    barrier.remove_barrier().await?;
    barrier.set_barrier().await?;
    barrier.set_barrier().await?;
    let (data, stat) = s.get_data(&path).await?;
    ensure!(stat.ephemeral_owner == 0, "persistent");
    ensure!(data == s.options().default_data, "{data:?}");
    barrier.remove_barrier().await?;
    barrier.remove_barrier().await?;
    ensure!(s.exists(&path).await?.is_none());
    Ok(())
}

/// Waiters in other sessions block while the barrier is set and all go on
/// once it is removed; an unset barrier does not block.
async fn waiters_go_when_the_barrier_is_removed(h: &Harness) -> Result<()> {
    let (_s, path, barrier) = a_barrier(h).await?;
    barrier.wait_on_barrier().await?;
    barrier.set_barrier().await?;
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let other = Barrier::new(&h.session().await, &path)?;
        let err = other.wait_on_barrier_timeout(SHORT).await.unwrap_err();
        ensure!(err == Error::Timeout(SHORT), "{err}");
        waiters.push(tokio::spawn(async move { other.wait_on_barrier().await }));
    }
    held_until(waiters, "passed a set barrier", barrier.remove_barrier()).await?;
    Ok(())
}

/// `DistributedDoubleBarrier`: ephemeral members named by a UUID, with the
/// default data; the member that completes the count creates a persistent
/// `ready`; the last to leave deletes it.
async fn double_barrier_nodes_are_curators(h: &Harness) -> Result<()> {
    let (s1, s2) = (h.session().await, h.session().await);
    let dir = h.path("/d/double");
    let first = tokio::spawn({
        let b = DoubleBarrier::new(&s1, &dir, 2)?;
        async move { b.enter().await }
    });
    await_children(&s2, &dir, 1, WITHIN).await?;
    let name = s2.children(&dir).await?.remove(0).name;
    ensure!(
        uuid::Uuid::parse_str(&name).is_ok() && name.len() == 36,
        "{name}"
    );
    let (data, stat) = s2.get_data(&format!("{dir}/{name}")).await?;
    ensure!(stat.ephemeral_owner == s1.session_id(), "ephemeral, s1's");
    ensure!(data == s1.options().default_data, "{data:?}");
    ensure!(s2.exists(&format!("{dir}/ready")).await?.is_none());

    let second = DoubleBarrier::new(&s2, &dir, 2)?.enter().await?;
    let first = tokio::time::timeout(WITHIN, first).await???;
    ensure!(first.path() == format!("{dir}/{name}"));
    let (data, stat) = s2.get_data(&format!("{dir}/ready")).await?;
    ensure!(stat.ephemeral_owner == 0 && data == s2.options().default_data);

    let leaving = tokio::spawn(first.leave());
    await_gone(&s2, &format!("{dir}/{name}"), WITHIN).await?;
    ensure!(!leaving.is_finished(), "left before the other member");
    second.leave().await?;
    tokio::time::timeout(WITHIN, leaving).await???;
    ensure!(s2.exists(&format!("{dir}/ready")).await?.is_none());
    Ok(())
}

/// Three members in three sessions: none is in before the third enters,
/// none is out before the last leaves.
async fn members_enter_together_and_leave_together(h: &Harness) -> Result<()> {
    let dir = h.path("/d/together");
    let watcher = h.session().await;
    let mut entering = Vec::new();
    for _ in 0..2 {
        let b = DoubleBarrier::new(&h.session().await, &dir, 3)?;
        entering.push(tokio::spawn(async move { b.enter().await }));
    }
    await_children(&watcher, &dir, 2, WITHIN).await?;
    let third = DoubleBarrier::new(&h.session().await, &dir, 3)?;
    let mut members = held_until(entering, "in before 3", third.enter()).await?;
    let last = members.pop().context("three members")?;
    let mut leaving = Vec::new();
    for m in members {
        leaving.push(tokio::spawn(m.leave()));
    }
    // Two members gone, `ready` and the last member remain.
    await_children(&watcher, &dir, 2, WITHIN).await?;
    held_until(leaving, "out before the last", last.leave()).await?;
    Ok(())
}

/// More members than the count all get in (a threshold, not a limit).
async fn an_oversubscribed_barrier_lets_everyone_in(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let b = DoubleBarrier::new(&s, &h.path("/d/over"), 2)?;
    let (x, y, z) = tokio::try_join!(b.enter(), b.enter(), b.enter())?;
    tokio::try_join!(x.leave(), y.leave(), z.leave())?;
    Ok(())
}

/// A timed-out enter, a dropped enter and a dropped member leave no node;
/// a timed-out leave is out anyway.
async fn timeouts_and_cancellation_leave_nothing(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let dir = h.path("/d/cancel");
    let b = DoubleBarrier::new(&s, &dir, 2)?;
    let err = b.enter_timeout(SHORT).await.unwrap_err();
    ensure!(err == Error::Timeout(SHORT), "{err}");
    await_children(&s, &dir, 0, WITHIN).await?;

    let entering = tokio::spawn({
        let b = b.clone();
        async move { b.enter().await }
    });
    await_children(&s, &dir, 1, WITHIN).await?;
    entering.abort();
    ensure!(entering.await.unwrap_err().is_cancelled());
    await_children(&s, &dir, 0, WITHIN).await?;

    let (x, y) = tokio::try_join!(b.enter(), b.enter())?;
    let y_node = y.path().to_string();
    let err = x.leave_timeout(SHORT).await.unwrap_err();
    ensure!(err == Error::Timeout(SHORT), "{err}");
    drop(y); // abandons: its node goes in the background
    await_gone(&s, &y_node, WITHIN).await?;
    // Nobody is left to delete `ready`: a new member passes and cleans up.
    let z = b.enter_timeout(WITHIN).await?;
    z.leave().await?;
    ensure!(s.children(&dir).await.map_or(true, |c| c.is_empty()));
    Ok(())
}

/// Bad arguments are refused before any round trip.
async fn bad_arguments_are_refused(h: &Harness) -> Result<()> {
    let s = h.session().await;
    ensure!(matches!(
        Barrier::new(&s, "/"),
        Err(Error::InvalidPath { .. })
    ));
    ensure!(matches!(
        Barrier::new(&s, "no-slash"),
        Err(Error::InvalidPath { .. })
    ));
    ensure!(matches!(
        DoubleBarrier::new(&s, &h.path("/d"), 0),
        Err(Error::InvalidArgument(_))
    ));
    Ok(())
}

per_backend!(every_backend {
    barrier_node_is_curators,
    waiters_go_when_the_barrier_is_removed,
    double_barrier_nodes_are_curators,
    members_enter_together_and_leave_together,
    an_oversubscribed_barrier_lets_everyone_in,
    timeouts_and_cancellation_leave_nothing,
    bad_arguments_are_refused,
});
