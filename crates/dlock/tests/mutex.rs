//! Mutex: dlock's own cases and the ports of Curator's
//! `TestInterProcessMutexBase`, run on every backend.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use common::tests1::{
    clients_take_turns, curator_protected_name, got_within, joined, killed_holder_hands_over,
    no_children, one_watch_per_waiter, refuses_bad_paths, rivals, Handover, Occupancy, Queued,
};
use common::{await_children, persistent, queued, Harness};
use dlock::store::{sequence_key, Op, SessionState};
use dlock::{Error, Mutex};
use tokio::sync::Mutex as AsyncMutex;

const WITHIN: Duration = Duration::from_secs(20);

/// Curator's layout: `<path>/_c_<uuid>-lock-<10 digits>`, ephemeral, the
/// session's default data.
async fn node_layout_is_curators(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let guard = Mutex::new(&s, &h.path("/locks/a"))?.acquire().await?;
    let name = curator_protected_name(guard.node(), "lock-")?;
    ensure!(guard.node() == h.path(&format!("/locks/a/{name}")));
    let (data, stat) = s.get_data(guard.node()).await?;
    ensure!(stat.ephemeral_owner == s.session_id());
    ensure!(data == s.options().default_data);
    ensure!(
        guard.token().0 == stat.czxid,
        "the token is the node's czxid"
    );
    let node = guard.node().to_string();
    guard.release().await?;
    ensure!(s.exists(&node).await?.is_none());
    Ok(())
}

/// Waiters are served in the order they queued, each watching only its
/// predecessor.
async fn waiters_are_served_in_fifo_order(h: &Harness) -> Result<()> {
    let path = h.path("/fifo");
    let holder = h.session().await;
    let first = Mutex::new(&holder, &path)?.acquire().await?;
    let order = Arc::new(AsyncMutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5 {
        let s = h.session().await;
        let mutex = Mutex::new(&s, &path)?;
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let g = mutex.acquire().await?;
            order.lock().await.push(i);
            g.release().await?;
            anyhow::Ok(())
        }));
        // Queue strictly one after another.
        await_children(&holder, &path, i + 2, WITHIN).await?;
    }
    first.release().await?;
    joined(tasks).await?;
    ensure!(*order.lock().await == [0, 1, 2, 3, 4]);
    Ok(())
}

/// Curator `testReentrant`: nested acquires through the guard; the lock is
/// held until the outermost release.
async fn reentrant_holds_until_the_last_release(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let other = h.session().await;
    let path = h.path("/locks/our-lock");
    let mutex = Mutex::new(&s, &path)?;
    let rival = Mutex::new(&other, &path)?;
    let outer = mutex.acquire().await?;
    let middle = outer.reenter()?;
    let inner = middle.reenter()?;
    ensure!(outer.holds() == 3 && inner.node() == outer.node() && inner.token() == outer.token());
    inner.release().await?;
    middle.release().await?;
    ensure!(
        rival.try_acquire().await?.is_none(),
        "still held after inner releases"
    );
    ensure!(s.exists(outer.node()).await?.is_some());
    let node = outer.node().to_string();
    outer.release().await?;
    ensure!(
        s.exists(&node).await?.is_none(),
        "the last release deletes the node"
    );
    rival
        .try_acquire()
        .await?
        .expect("free now")
        .release()
        .await?;
    Ok(())
}

/// Curator `testReentrant2Threads`: while task A holds (re-entered three
/// levels), task B cannot acquire; after A unwinds, nothing is held.
async fn reentrant_holder_excludes_another_task(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let mutex = Mutex::new(&s, &h.path("/locks/our-lock"))?;
    // Curator's test names its three levels foo, bar and snafu.
    let outer = mutex.acquire().await?;
    let middle = outer.reenter()?;
    let inner = middle.reenter()?;
    let contender = mutex.clone();
    let b = tokio::spawn(async move {
        contender
            .acquire_timeout(Duration::from_millis(300))
            .await
            .map(|_| ())
    });
    let err = b.await?.unwrap_err();
    ensure!(matches!(err, Error::Timeout(_)), "{err}");
    for g in [inner, middle, outer] {
        g.release().await?;
    }
    await_children(&s, &h.path("/locks/our-lock"), 0, WITHIN).await?;
    Ok(())
}

/// Curator `testReentrantSingleLock`: ten tasks share one `Mutex` and still
/// exclude each other.
async fn tasks_sharing_one_mutex_exclude_each_other(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let mutex = Mutex::new(&s, &h.path("/locks/our-lock"))?;
    let inside = Arc::new(Occupancy::default());
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let (mutex, inside) = (mutex.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            let g = mutex.acquire().await?;
            inside.alone("two holders at once").await?;
            g.release().await?;
            anyhow::Ok(())
        }));
    }
    joined(tasks).await
}

/// Curator `test2Clients`: two sessions, exactly one holds; when it releases
/// the other gets the lock.
async fn two_clients_take_turns(h: &Harness) -> Result<()> {
    let contest = rivals(h, "/locks/our-lock", Mutex::new).await?;
    let (m1, g2) = clients_take_turns(contest, "").await?;
    ensure!(m1.try_acquire().await?.is_none(), "exactly one holder");
    g2.release().await?;
    Ok(())
}

/// Curator `testKilledSession`: the holder's session expires; the waiter
/// acquires, and the old holder's lost signal fires.
async fn a_killed_holder_hands_over_and_learns_it(h: &Harness) -> Result<()> {
    let contest = rivals(h, "/locks/our-lock", Mutex::new).await?;
    let handover = h.timeout() + Duration::from_secs(1);
    let Handover { lost: g1, next: g2 } =
        killed_holder_hands_over(contest, "", 2, handover).await?;
    let err = g1.guarded(&[]).await.unwrap_err();
    ensure!(
        matches!(err, Error::Lost { .. }),
        "guarded write after loss: {err}"
    );
    let err = g1.release().await.unwrap_err();
    ensure!(
        matches!(err, Error::Lost { .. }),
        "release reports the loss: {err}"
    );
    g2.release().await?;
    Ok(())
}

/// A holder suspended past its session timeout loses the lock to the next
/// waiter within the timeout plus a second.
async fn a_silent_holder_loses_the_lock_after_its_timeout(h: &Harness) -> Result<()> {
    let Queued {
        first: s1,
        held: g1,
        waiter,
        ..
    } = rivals(h, "/locks/silent", Mutex::new)
        .await?
        .hold_and_queue("", 2)
        .await?;
    let started = tokio::time::Instant::now();
    s1.faults().expect("faults").suspend(h.timeout() * 3);
    tokio::time::timeout(Duration::from_secs(1), async {
        s1.watch_status()
            .wait_for(|s| s.state == SessionState::Suspended)
            .await
            .map(|_| ())
    })
    .await??;
    ensure!(g1.acquisition().is_suspended() && !g1.acquisition().is_lost());
    let g2 = got_within(waiter, h.timeout() + Duration::from_secs(1)).await?;
    // Not before the session could expire: its last heartbeat was at most
    // a third of the timeout before the suspension (plus its lateness).
    ensure!(
        started.elapsed() >= h.timeout() / 3,
        "not before the session could expire"
    );
    g1.acquisition().lost().await;
    let _ = g1.release().await;
    g2.release().await?;
    Ok(())
}

/// Curator `testContainerCleanup`: after many lock/unlock rounds with fresh
/// instances, the lock directories are reaped.
async fn lock_directories_are_reaped(h: &Harness) -> Result<()> {
    common::tests1::lock_directories_are_reaped(h, 10, Mutex::new).await
}

/// A timed-out or cancelled acquire leaves no node behind.
async fn timeouts_and_cancellation_leave_nothing(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/locks/t");
    let m = Mutex::new(&s, &path)?;
    let held = m.acquire().await?;
    let err = m
        .acquire_timeout(Duration::from_millis(50))
        .await
        .unwrap_err();
    ensure!(err == Error::Timeout(Duration::from_millis(50)), "{err}");
    ensure!(
        s.children(&path).await?.len() == 1,
        "the timed-out node was removed"
    );
    let m2 = m.clone();
    let waiting = queued(&s, &path, 2, WITHIN, async move { m2.acquire().await }).await?;
    waiting.abort();
    let _ = waiting.await;
    await_children(&s, &path, 1, WITHIN).await?;
    ensure!(m.try_acquire().await?.is_none());
    held.release().await?;
    Ok(())
}

/// While the connection is down, a timed acquire still ends with
/// `Timeout` and a non-blocking one with `ConnectionLoss`, each within the
/// clean-up grace — not once the connection is back (or the session lost):
/// both return while the session is still suspended. Nothing is left once
/// it is back.
async fn timed_acquires_end_while_the_connection_is_down(h: &Harness) -> Result<()> {
    let options = dlock::SessionOptions::default().with_session_timeout(Duration::from_secs(30));
    let s = h.session_with(options).await;
    let path = h.path("/locks/down");
    let m = Mutex::new(&s, &path)?;
    s.faults().expect("faults").suspend(Duration::from_secs(8));
    ensure!(s.state() == SessionState::Suspended);
    let timeout = Duration::from_millis(100);
    let err = m.acquire_timeout(timeout).await.unwrap_err();
    ensure!(err == Error::Timeout(timeout), "{err}");
    let now = m.try_acquire().await.map(|g| g.is_some());
    ensure!(matches!(now, Err(Error::ConnectionLoss)), "{now:?}");
    ensure!(
        s.state() == SessionState::Suspended,
        "both answered only once the connection was back"
    );
    common::await_state(&s, SessionState::Reconnected, WITHIN).await?;
    m.acquire().await?.release().await?;
    await_children(&s, &path, 0, WITHIN).await
}

/// A timed-out waiter whose node's delete keeps failing still answers
/// `Timeout` (what the caller asked about), within the clean-up grace;
/// its node goes in the background once deletes pass again.
async fn a_timed_out_waiter_whose_delete_fails_still_times_out(h: &Harness) -> Result<()> {
    let (a, b) = (h.session().await, h.session().await);
    let path = h.path("/locks/undeleted");
    let held = Mutex::new(&a, &path)?.acquire().await?;
    let timeout = Duration::from_millis(300);
    b.faults().context("faults")?.fail_next_deletes(u32::MAX);
    let started = tokio::time::Instant::now();
    let ended = Mutex::new(&b, &path)?
        .acquire_timeout(timeout)
        .await
        .map(drop);
    let took = started.elapsed();
    ensure!(ended == Err(Error::Timeout(timeout)), "{ended:?}");
    // The grace (1 s), and as much again for a loaded machine.
    let bound = timeout + Duration::from_secs(3);
    ensure!(took <= bound, "ended after {took:?}, past {bound:?}");
    ensure!(
        a.children(&path).await?.len() == 2,
        "the waiter's node went although deletes failed"
    );
    b.faults().context("faults")?.fail_next_deletes(0);
    await_children(&a, &path, 1, WITHIN).await?;
    held.release().await?;
    Ok(())
}

/// A hold lost with its session while deletes fail (the outage that lost
/// it, likely) reports the loss on release, not the delete's
/// `ConnectionLoss`: the caller must learn its work was unprotected.
async fn a_lost_hold_reports_the_loss_whatever_its_delete_says(h: &Harness) -> Result<()> {
    let (s, observer) = (h.impatient_session().await, h.session().await);
    let path = h.path("/locks/lost-undeleted");
    let guard = Mutex::new(&s, &path)?.acquire().await?;
    let faults = s.faults().context("faults")?;
    faults.fail_next_deletes(u32::MAX);
    faults.expire().await?;
    tokio::time::timeout(WITHIN, guard.lost())
        .await
        .context("the lost signal")?;
    let released = guard.release().await;
    faults.fail_next_deletes(0);
    ensure!(matches!(released, Err(Error::Lost { .. })), "{released:?}");
    await_children(&observer, &path, 0, WITHIN).await
}

/// Every release of a re-entered hold whose lock was lost reports the
/// loss, not only the last one: each hold's work was unprotected.
async fn every_release_of_a_lost_reentrant_hold_reports_the_loss(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let outer = Mutex::new(&s, &h.path("/locks/reentered"))?
        .acquire()
        .await?;
    let inner = outer.reenter()?;
    dlock::revoke_forced(&s, outer.node()).await?;
    tokio::time::timeout(WITHIN, outer.lost())
        .await
        .context("the lost signal")?;
    for (which, hold) in [("inner", inner), ("outer", outer)] {
        let released = hold.release().await;
        ensure!(
            matches!(released, Err(Error::Lost { .. })),
            "{which}: {released:?}"
        );
    }
    Ok(())
}

/// A timed acquire whose requests keep failing on a live connection (a
/// cluster without a leader answers 5xx, an overloaded one times requests
/// out, while the session's renewals still get through) ends within the
/// clean-up grace of its deadline with `Timeout`, as when the connection is
/// down: they are not retried past it (with the default policy they would
/// go on for about 11 s each). Its node goes in the background once reads
/// pass again.
async fn a_timed_acquire_stops_retrying_failing_requests_at_its_deadline(
    h: &Harness,
) -> Result<()> {
    let (a, b) = (h.session().await, h.session().await);
    let path = h.path("/locks/failing");
    let held = Mutex::new(&a, &path)?.acquire().await?;
    // Room for the release to reach the waiter before its deadline.
    let timeout = Duration::from_secs(2);
    let m = Mutex::new(&b, &path)?;
    let started = tokio::time::Instant::now();
    let waiting = queued(&a, &path, 2, WITHIN, async move {
        m.acquire_timeout(timeout).await.map(drop)
    })
    .await?;
    b.faults().context("faults")?.fail_next_reads(u32::MAX);
    held.release().await?;
    let ended = tokio::time::timeout(WITHIN, waiting).await??;
    let took = started.elapsed();
    b.faults().context("faults")?.fail_next_reads(0);
    ensure!(ended == Err(Error::Timeout(timeout)), "{ended:?}");
    // The grace (1 s), and twice as much again for a loaded machine.
    let bound = timeout + Duration::from_secs(3);
    ensure!(took <= bound, "ended after {took:?}, past {bound:?}");
    ensure!(b.state().is_connected(), "{:?}", b.state());
    await_children(&a, &path, 0, WITHIN).await
}

/// A late twin of our node — made by an earlier try of our own create,
/// whose reply was lost, landing after the retry made ours (etcd and
/// Consul do not order one client's requests) — is deleted by the wait,
/// not waited behind for good. Made here by hand: a node of our session
/// with the protection prefix that our next node takes again (a released
/// node's prefix is reused).
async fn a_late_twin_of_our_node_is_deleted_not_waited_for(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/locks/twin");
    let m = Mutex::new(&s, &path)?;
    let first = m.acquire().await?;
    let name = dlock::path::node_name(first.node());
    let prefix = dlock::path::protection_prefix(name)
        .context("a protected name")?
        .to_string();
    first.release().await?;
    // Sorted before the node the next acquire makes.
    let twin = s
        .create(&format!("{path}/{prefix}lock-"), b"", common::sequential())
        .await?;
    let guard = m.acquire_timeout(WITHIN).await?;
    ensure!(
        guard.node().starts_with(&format!("{path}/{prefix}")),
        "the prefix was not reused: {}",
        guard.node()
    );
    ensure!(
        s.exists(&twin.path).await?.is_none(),
        "the twin is still there"
    );
    guard.release().await?;
    await_children(&s, &path, 0, WITHIN).await
}

/// A create whose reply is lost is recovered by its protection prefix: one
/// node, adopted, no orphan.
async fn a_lost_create_reply_leaves_one_node(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/locks/reply");
    s.faults().expect("faults").lose_next_create_reply();
    let g = Mutex::new(&s, &path)?.acquire().await?;
    let kids = s.children(&path).await?;
    ensure!(
        kids.len() == 1 && g.node().ends_with(&kids[0].name),
        "{kids:?}"
    );
    ensure!(s.retries() >= 1, "the create was retried");
    g.release().await?;
    ensure!(no_children(&s, &path).await);
    Ok(())
}

/// Each release wakes exactly one waiter: a waiter costs one watch, and
/// handing over the lock notifies one watch.
async fn a_release_wakes_exactly_one_waiter(h: &Harness) -> Result<()> {
    let common::Backend::Embedded(server) = &h.backend else {
        anyhow::bail!("embedded only")
    };
    let path = h.path("/herd");
    let holder = h.session().await;
    let g = Mutex::new(&holder, &path)?.acquire().await?;
    let acquired = Arc::new(AtomicUsize::new(0));
    let (release_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let mut tasks = Vec::new();
    let waiters = 50;
    for _ in 0..waiters {
        let m = Mutex::new(&h.session().await, &path)?;
        let (acquired, mut go) = (acquired.clone(), release_tx.subscribe());
        tasks.push(tokio::spawn(async move {
            let g = m.acquire().await?;
            acquired.fetch_add(1, Ordering::SeqCst);
            let _ = go.recv().await;
            g.release().await?;
            anyhow::Ok(())
        }));
    }
    await_children(&holder, &path, waiters + 1, WITHIN).await?;
    // Every waiter arms exactly one watch (on its predecessor), no more.
    let stats = one_watch_per_waiter(server, waiters, WITHIN).await?;
    let before = stats.node_notifications;
    g.release().await?;
    tokio::time::timeout(WITHIN, async {
        while acquired.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await?;
    let woken = server.watch_stats().node_notifications - before;
    ensure!(woken == 1, "one release woke {woken} waiters");
    drop(release_tx);
    joined(tasks).await?;
    Ok(())
}

/// A dropped watch is no watch: the store counts none, and a change
/// notifies only the watches still awaited (before, the embedded store
/// kept every watch dropped unfired — a timed-out wait's — on a node that
/// never changed, and counted and notified them).
async fn dropped_watches_are_not_kept(h: &Harness) -> Result<()> {
    let common::Backend::Embedded(server) = &h.backend else {
        anyhow::bail!("embedded only")
    };
    let s = h.session().await;
    let node = h.path("/dropped-watches");
    s.create(&node, b"", persistent()).await?;
    let before = server.watch_stats();
    for _ in 0..100 {
        let (_, _, dropped) = s.get_data_watch(&node).await?;
        drop(dropped);
    }
    let (_, _, kept) = s.get_data_watch(&node).await?;
    let armed = server.watch_stats().node_watches - before.node_watches;
    ensure!(armed == 1, "{armed} watches on the node, one awaited");
    s.set_data(&node, b"x", None).await?;
    kept.changed().await;
    let told = server.watch_stats().node_notifications - before.node_notifications;
    ensure!(told == 1, "one change notified {told} watches");
    s.delete(&node, None).await?;
    Ok(())
}

/// Guarded writes land only while the lock is held.
async fn guarded_writes_need_the_lock(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let data = h.path("/guarded/value");
    s.create(&data, b"0", persistent()).await?;
    let g = Mutex::new(&s, &h.path("/guarded/lock"))?.acquire().await?;
    let set = |v: &str| Op::SetData {
        path: data.clone(),
        data: v.into(),
        version: None,
    };
    g.guarded(&[set("1")]).await?;
    ensure!(s.get_data(&data).await?.0 == b"1");
    // Someone deletes our node (an operator, or the store after expiry).
    s.delete(g.node(), None).await?;
    let err = g.guarded(&[set("2")]).await.unwrap_err();
    ensure!(matches!(err, Error::Lost { .. }), "{err}");
    ensure!(
        s.get_data(&data).await?.0 == b"1",
        "the fenced write did not land"
    );
    let _ = g.release().await;
    s.delete(&data, None).await?;
    Ok(())
}

/// A release whose future is dropped midway (its delete waiting for the
/// connection) still releases: the node goes in the background.
async fn a_cancelled_release_still_releases(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/locks/cancelled-release");
    let g = Mutex::new(&s, &path)?.acquire().await?;
    // A third of the timeout: well past the 10 ms even on a busy machine,
    // and well short of a loss.
    s.faults().expect("faults").suspend(h.timeout() / 3);
    let release = tokio::time::timeout(Duration::from_millis(10), g.release()).await;
    ensure!(
        release.is_err(),
        "the release could not finish while suspended"
    );
    await_children(&s, &path, 0, WITHIN).await?;
    Ok(())
}

/// Bad paths are refused with a typed error before anything is created.
async fn invalid_paths_are_refused(h: &Harness) -> Result<()> {
    refuses_bad_paths(h, Mutex::new).await
}

/// Sorting is Curator's string compare of the suffix after the lock name.
#[test]
fn sort_key_is_the_suffix_after_the_last_lock_name() {
    assert_eq!(
        sequence_key("_c_x-lock-0000000007", &["lock-"]),
        "0000000007"
    );
    assert_eq!(
        sequence_key("_c_lock--lock-0000000007", &["lock-"]),
        "0000000007"
    );
    assert_eq!(sequence_key("foreign", &["lock-"]), "foreign");
}

// Every case on every backend, and again below an etcd namespace (paths in
// and out of the wait queue, watches and guarded writes all pass through
// it).
per_backend!({
    embedded => crate::common::embedded(),
    zookeeper => crate::common::zookeeper(),
    #[cfg(feature = "etcd")]
    etcd => crate::common::etcd(),
    #[cfg(feature = "etcd")]
    etcd_namespaced => crate::common::etcd_namespaced(),
    #[cfg(feature = "consul")]
    consul => crate::common::consul(),
} {
    node_layout_is_curators,
    waiters_are_served_in_fifo_order,
    reentrant_holds_until_the_last_release,
    reentrant_holder_excludes_another_task,
    tasks_sharing_one_mutex_exclude_each_other,
    two_clients_take_turns,
    a_killed_holder_hands_over_and_learns_it,
    a_silent_holder_loses_the_lock_after_its_timeout,
    lock_directories_are_reaped,
    timeouts_and_cancellation_leave_nothing,
    timed_acquires_end_while_the_connection_is_down,
    a_timed_acquire_stops_retrying_failing_requests_at_its_deadline,
    every_release_of_a_lost_reentrant_hold_reports_the_loss,
    a_lost_hold_reports_the_loss_whatever_its_delete_says,
    a_timed_out_waiter_whose_delete_fails_still_times_out,
    a_late_twin_of_our_node_is_deleted_not_waited_for,
    a_lost_create_reply_leaves_one_node,
    guarded_writes_need_the_lock,
    a_cancelled_release_still_releases,
    invalid_paths_are_refused,
});

// Embedded only: the case counts the store's watches. (One watch per waiter
// and one wake-up per release hold everywhere: each waiter watches only its
// predecessor.)
per_backend!(embedded_watches => crate::common::embedded();
    a_release_wakes_exactly_one_waiter,
    dropped_watches_are_not_kept,
);
