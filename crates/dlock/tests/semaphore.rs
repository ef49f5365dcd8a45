//! Semaphore and SemaphoreMutex: ports of Curator's
//! `TestInterProcessSemaphore` (V2) and of the base mutex tests for
//! `TestInterProcessSemaphoreMutex`, plus dlock's own cases, on every
//! backend.

mod common;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use common::tests1::{
    clients_take_turns, curator_protected_name, joined, killed_holder_hands_over,
    lock_directories_are_reaped, recipe_on, release_tried, remove, rivals, started_count, Handover,
    Occupancy,
};
use common::{await_children, queued, sorted_names, Harness};
use dlock::recipes::semaphore::{Lease, Semaphore};
use dlock::recipes::semaphore_mutex::SemaphoreMutex;
use dlock::recipes::shared_count::SharedCount;
use dlock::Error;
use tokio::sync::{mpsc, oneshot};

const WITHIN: Duration = Duration::from_secs(20);
const SHORT: Duration = Duration::from_millis(200);

fn random(below: u32) -> u32 {
    (uuid::Uuid::new_v4().as_u128() % u128::from(below)) as u32
}

async fn release_all(leases: Vec<Lease>) -> Result<()> {
    for lease in leases {
        lease.release().await?;
    }
    Ok(())
}

/// Curator's layout: `<path>/leases/_c_<uuid>-lease-<10 digits>`, ephemeral,
/// with the node data; the internal `<path>/locks` mutex is released once the
/// lease is granted.
async fn the_layout_is_curators(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/test");
    let sem = Semaphore::new(&s, &path, 2)?.with_data(b"car-7".to_vec());
    let lease = sem.acquire_one().await?;
    let name = lease.name().to_string();
    ensure!(
        lease.node() == format!("{path}/leases/{name}"),
        "{}",
        lease.node()
    );
    curator_protected_name(lease.node(), "lease-")?;
    let (data, stat) = s.get_data(lease.node()).await?;
    ensure!(data == b"car-7" && lease.data() == b"car-7");
    ensure!(stat.ephemeral_owner == s.session_id());
    ensure!(
        lease.token().0 == stat.czxid,
        "the token is the node's czxid"
    );
    await_children(&s, &format!("{path}/locks"), 0, WITHIN).await?;
    // Without data: the session's default data, as Curator.
    let plain = Semaphore::new(&s, &path, 2)?.acquire_one().await?;
    ensure!(s.get_data(plain.node()).await?.0 == s.options().default_data);
    ensure!(plain.token() > lease.token());
    let node = lease.node().to_string();
    lease.release().await?;
    ensure!(s.exists(&node).await?.is_none(), "release deletes the node");
    plain.release().await?;
    Ok(())
}

/// `qty == 0`, `qty > max` and a maximum of 0 fail at once with a typed
/// error, before anything is created.
async fn bad_quantities_fail_fast(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/test");
    let err = Semaphore::new(&s, &path, 0).unwrap_err();
    ensure!(
        matches!(err, Error::InvalidArgument(_)) && err.to_string().contains("at least 1"),
        "{err}"
    );
    let sem = Semaphore::new(&s, &path, 2)?;
    let err = sem.acquire(0).await.unwrap_err();
    ensure!(
        matches!(err, Error::InvalidArgument(_)) && err.to_string().contains("qty cannot be 0"),
        "{err}"
    );
    let err = sem.acquire_timeout(3, WITHIN).await.unwrap_err();
    ensure!(
        matches!(err, Error::InvalidArgument(_)) && err.to_string().contains("maximum is 2"),
        "{err}"
    );
    let count = SharedCount::new(&s, &h.path("/count"), 0)?;
    count.start().await?;
    let counted = Semaphore::with_count(&s, &path, count.clone())?;
    let err = counted.try_acquire(1).await.unwrap_err();
    ensure!(
        matches!(err, Error::InvalidArgument(_)) && err.to_string().contains("maximum of 0"),
        "{err}"
    );
    ensure!(s.exists(&path).await?.is_none(), "nothing was created");
    count.close().await;
    remove(&s, &h.path("/count")).await
}

/// Curator `testThreadedLeaseIncrease`: the maximum comes from a
/// SharedCount; raising it wakes the blocked acquirer at once.
async fn raising_the_count_wakes_the_waiter(h: &Harness) -> Result<()> {
    let (s, count_path, count) = started_count(h, "/foo/count", 1).await?;
    let path = h.path("/test");
    let sem = Semaphore::with_count(&s, &path, count.clone())?;
    let first = sem.acquire_one().await?;
    let waiting = sem.clone();
    let second = queued(&s, &format!("{path}/leases"), 2, WITHIN, async move {
        waiting.acquire_one().await
    })
    .await?;
    ensure!(!second.is_finished(), "the second acquire blocks");
    ensure!(count.try_set(&count.versioned(), 2).await?);
    let second = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .context("raising the count did not wake the waiter")???;
    ensure!(sem.max_leases() == 2);
    first.release().await?;
    second.release().await?;
    count.close().await;
    remove(&s, &count_path).await
}

/// Lowering the count never revokes leases; it only holds back new ones.
async fn lowering_the_count_never_revokes(h: &Harness) -> Result<()> {
    let (s, count_path, count) = started_count(h, "/count", 2).await?;
    let sem = Semaphore::with_count(&s, &h.path("/test"), count.clone())?;
    let mut held = sem.acquire(2).await?;
    count.set(1).await?;
    for lease in &held {
        ensure!(s.exists(lease.node()).await?.is_some() && !lease.is_lost());
    }
    // Nobody acquires, so no lease is taken for a waiting one: both hold.
    let holders = sem.holders().await?;
    ensure!(holders.len() == 2, "{holders:?}");
    ensure!(sem.available_permits().await? == 0);
    ensure!(sem.try_acquire(1).await?.is_none(), "two held, maximum one");
    held.pop().unwrap().release().await?;
    ensure!(sem.try_acquire(1).await?.is_none(), "one held, maximum one");
    held.pop().unwrap().release().await?;
    sem.try_acquire(1)
        .await?
        .context("free again")?
        .pop()
        .unwrap()
        .release()
        .await?;
    count.close().await;
    remove(&s, &count_path).await
}

/// Curator `testClientClose`: the only lease's session closes; another
/// client then acquires.
async fn a_closed_client_frees_its_lease(h: &Harness) -> Result<()> {
    let (s1, s2) = (h.session().await, h.session().await);
    let path = h.path("/test");
    let lease1 = Semaphore::new(&s1, &path, 1)?.acquire_one().await?;
    let sem2 = Semaphore::new(&s2, &path, 1)?;
    let err = sem2.acquire_timeout(1, SHORT).await.unwrap_err();
    ensure!(err == Error::Timeout(SHORT), "{err}");
    s1.close().await;
    let lease2 = sem2.acquire_timeout(1, WITHIN).await?;
    ensure!(lease1.is_lost());
    let err = lease1.release().await.unwrap_err();
    ensure!(matches!(err, Error::Lost { .. } | Error::Closed), "{err}");
    release_all(lease2).await
}

/// Curator `testMaxPerSession`: clients take random quantities under a
/// random maximum (kept within a local budget, as Curator's test does, since
/// a multi-lease acquire is not atomic); the leases in use never exceed the
/// maximum and every acquire succeeds.
async fn quantities_never_exceed_the_maximum(h: &Harness) -> Result<()> {
    let max = 3 + random(5);
    let path = h.path("/test");
    let budget = Arc::new(tokio::sync::Semaphore::new(max as usize));
    let (active, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let sem = Semaphore::new(&h.session().await, &path, max)?;
        let (budget, active, peak) = (budget.clone(), active.clone(), peak.clone());
        clients.push(tokio::spawn(async move {
            for _ in 0..6 {
                let qty = 1 + random(max);
                let _budget = budget.acquire_many(qty).await?;
                let leases = sem.acquire_timeout(qty, WITHIN).await?;
                ensure!(leases.len() == qty as usize);
                let now = active.fetch_add(qty as usize, Ordering::SeqCst) + qty as usize;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(u64::from(random(5)))).await; // the work
                active.fetch_sub(qty as usize, Ordering::SeqCst);
                release_all(leases).await?;
            }
            anyhow::Ok(())
        }));
    }
    for c in clients {
        c.await??;
    }
    let peak = peak.load(Ordering::SeqCst);
    ensure!(
        peak > 0 && peak <= max as usize,
        "peak {peak}, maximum {max}"
    );
    Ok(())
}

/// Four clients each asking for every lease at once (Curator's test above
/// keeps a local budget because its multi-lease acquire can deadlock:
/// each client holding some leases and waiting for the rest): each gets
/// them all in turn, with no budget.
async fn clients_asking_for_every_lease_take_turns(h: &Harness) -> Result<()> {
    const MAX: u32 = 3;
    let path = h.path("/test");
    let active = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let sem = Semaphore::new(&h.session().await, &path, MAX)?;
        let active = active.clone();
        clients.push(tokio::spawn(async move {
            for _ in 0..5 {
                let leases = sem.acquire_timeout(MAX, WITHIN).await?;
                let now = active.fetch_add(leases.len(), Ordering::SeqCst) + leases.len();
                ensure!(now == MAX as usize, "{now} leases held, maximum {MAX}");
                active.fetch_sub(leases.len(), Ordering::SeqCst);
                release_all(leases).await?;
            }
            anyhow::Ok(())
        }));
    }
    for c in clients {
        c.await??;
    }
    Ok(())
}

/// Curator `testRelease1AtATime`: ten clients, maximum five; five hold at
/// once, and each release admits exactly one more.
async fn releases_admit_one_at_a_time(h: &Harness) -> Result<()> {
    const CLIENTS: usize = 10;
    const MAX: usize = CLIENTS / 2;
    let path = h.path("/test");
    let (active, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (held_tx, mut held_rx) = mpsc::unbounded_channel::<oneshot::Sender<()>>();
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let sem = Semaphore::new(&h.session().await, &path, MAX as u32)?;
        let (active, peak, held_tx) = (active.clone(), peak.clone(), held_tx.clone());
        clients.push(tokio::spawn(async move {
            let lease = sem.acquire_timeout(1, WITHIN).await?;
            peak.fetch_max(active.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
            let (go_tx, go_rx) = oneshot::channel();
            held_tx.send(go_tx).ok().context("main gone")?;
            go_rx.await?;
            active.fetch_sub(1, Ordering::SeqCst);
            release_all(lease).await
        }));
    }
    let mut held = VecDeque::new();
    let mut served = 0;
    while served < CLIENTS {
        while held.len() < MAX.min(CLIENTS - served) {
            held.push_back(
                tokio::time::timeout(WITHIN, held_rx.recv())
                    .await?
                    .context("clients gone")?,
            );
        }
        ensure!(peak.load(Ordering::SeqCst) <= MAX);
        let _ = held.pop_front().expect("a holder").send(());
        served += 1;
    }
    for c in clients {
        c.await??;
    }
    ensure!(
        peak.load(Ordering::SeqCst) == MAX,
        "peak {}",
        peak.load(Ordering::SeqCst)
    );
    Ok(())
}

/// Curator `testReleaseInChunks`: many tasks on one client, maximum 7
/// (Curator: 100 threads, 11), released in random chunks: never more than the
/// maximum at once, and all finish.
async fn releases_in_chunks_never_overadmit(h: &Harness) -> Result<()> {
    const TASKS: usize = 30;
    const MAX: usize = 7;
    let s = h.session().await;
    let path = h.path("/test");
    let stepper = Arc::new(tokio::sync::Semaphore::new(0));
    let active = Arc::new(Occupancy::default());
    let (released_tx, mut released_rx) = tokio::sync::watch::channel(0usize);
    let released_tx = Arc::new(released_tx);
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let sem = Semaphore::new(&s, &path, MAX as u32)?;
        let (stepper, active, released) = (stepper.clone(), active.clone(), released_tx.clone());
        tasks.push(tokio::spawn(async move {
            let lease = sem.acquire_timeout(1, WITHIN).await?;
            active.enter();
            stepper.acquire().await?.forget();
            active.leave();
            release_all(lease).await?;
            released.send_modify(|n| *n += 1);
            anyhow::Ok(())
        }));
    }
    let mut given = 0;
    while given < TASKS {
        let chunk = (1 + random(5) as usize).min(TASKS - given);
        stepper.add_permits(chunk);
        given += chunk;
        // Pace by the releases themselves, not by sleeping.
        tokio::time::timeout(WITHIN, released_rx.wait_for(|n| *n >= given)).await??;
    }
    joined(tasks).await?;
    let peak = active.peak();
    ensure!(peak > 0 && peak <= MAX, "peak {peak}");
    Ok(())
}

/// Curator `testThreads`: ten tasks share one semaphore of one lease; all get
/// it in turn, never two at once.
async fn tasks_sharing_one_semaphore_take_turns(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let sem = Semaphore::new(&s, &h.path("/test"), 1)?;
    let inside = Arc::new(Occupancy::default());
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let (sem, inside) = (sem.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            let lease = sem.acquire_timeout(1, WITHIN).await?;
            inside.alone("two holders of one lease").await?;
            release_all(lease).await
        }));
    }
    for t in tasks {
        tokio::time::timeout(WITHIN, t).await???;
    }
    Ok(())
}

/// Curator `testSimple`: one lease; the second acquire times out.
async fn a_single_lease_is_exclusive(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/test");
    let lease = Semaphore::new(&s, &path, 1)?
        .acquire_timeout(1, WITHIN)
        .await?;
    let err = Semaphore::new(&s, &path, 1)?
        .acquire_timeout(1, SHORT)
        .await
        .unwrap_err();
    ensure!(err == Error::Timeout(SHORT), "{err}");
    ensure!(
        s.children(&format!("{path}/leases")).await?.len() == 1,
        "the timed-out lease is gone"
    );
    release_all(lease).await
}

/// Curator `testSimple2`: three leases for three clients; the fourth waits
/// until one is returned.
async fn a_returned_lease_admits_the_next(h: &Harness) -> Result<()> {
    let path = h.path("/test");
    let mut leases = Vec::new();
    for _ in 0..3 {
        let sem = Semaphore::new(&h.session().await, &path, 3)?;
        leases.push(sem.acquire_one().await?);
    }
    let fourth = Semaphore::new(&h.session().await, &path, 3)?;
    ensure!(fourth.acquire_timeout(1, SHORT).await.unwrap_err() == Error::Timeout(SHORT));
    leases.pop().unwrap().release().await?;
    leases.extend(fourth.acquire_timeout(1, WITHIN).await?);
    release_all(leases).await
}

/// Curator `testGetParticipantNodes`: three leases, three participants.
async fn participants_list_the_leases(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let sem = Semaphore::new(&s, &h.path("/test"), 3)?.with_data(b"p".to_vec());
    let leases = sem.acquire(3).await?;
    let all = sem.participants().await?;
    ensure!(all.len() == 3, "{all:?}");
    ensure!(all
        .iter()
        .all(|p| p.holds && p.data == b"p" && p.session == s.session_id()));
    let mut nodes: Vec<_> = all.iter().map(|p| p.node.clone()).collect();
    let mut mine: Vec<_> = leases.iter().map(|l| l.node().to_string()).collect();
    nodes.sort();
    mine.sort();
    ensure!(nodes == mine);
    release_all(leases).await?;
    ensure!(sem.participants().await?.is_empty());
    Ok(())
}

/// Curator `testNoOrphanedNodes`: the waiting acquirer's lease node is
/// deleted behind its back; it starts over with a new one and still gets the
/// lease; afterwards nothing is left and the semaphore works.
async fn a_deleted_waiting_lease_is_retried(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/test");
    let leases_dir = format!("{path}/leases");
    let sem = Semaphore::new(&s, &path, 1)?;
    let lease = sem.acquire_timeout(1, WITHIN).await?;
    let before = sorted_names(&s, &leases_dir).await?;
    ensure!(before.len() == 1);
    let waiting = sem.clone();
    let second = queued(&s, &leases_dir, 2, WITHIN, async move {
        waiting.acquire_timeout(1, WITHIN * 2).await
    })
    .await?;
    let new_node = sorted_names(&s, &leases_dir)
        .await?
        .into_iter()
        .find(|c| !before.contains(c))
        .context("the waiter's node")?;
    let deleted = format!("{leases_dir}/{new_node}");
    let deleted_token = s
        .exists(&deleted)
        .await?
        .context("the waiter's node")?
        .token();
    s.delete(&deleted, None).await?;
    release_all(lease).await?;
    let lease = tokio::time::timeout(WITHIN, second).await???;
    // A new node, though it may have the old name (etcd reuses names).
    ensure!(lease[0].token() != deleted_token, "a new node");
    release_all(lease).await?;
    await_children(&s, &leases_dir, 0, WITHIN).await?;
    release_all(sem.acquire_timeout(1, WITHIN).await?).await
}

/// Curator `testInterruptAcquire` (CURATOR-462), as task cancellation: a
/// cancelled waiter leaves no lease node (and no lock node) behind, and the
/// next acquirer gets the lease.
async fn a_cancelled_acquire_leaves_nothing(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/test");
    let (s1, s2, s3) = (
        Semaphore::new(&s, &path, 1)?,
        Semaphore::new(&s, &path, 1)?,
        Semaphore::new(&s, &path, 1)?,
    );
    let lease = s1.acquire_timeout(1, WITHIN).await?;
    let handle = queued(&s, &format!("{path}/leases"), 2, WITHIN, async move {
        s2.acquire(1).await
    })
    .await?;
    handle.abort();
    ensure!(handle.await.unwrap_err().is_cancelled());
    await_children(&s, &format!("{path}/leases"), 1, WITHIN).await?;
    await_children(&s, &format!("{path}/locks"), 0, WITHIN).await?;
    release_all(lease).await?;
    release_all(s3.acquire_timeout(1, WITHIN).await?).await
}

/// Every failure path of a multi-lease acquire gives back what it took
/// (CURATOR-315/335/462): a timed-out or cancelled `acquire(3)` that got two
/// leases leaves only the other holder's.
async fn a_failed_multi_acquire_returns_its_leases(h: &Harness) -> Result<()> {
    let lot = rivals(h, "/test", |s, p| Semaphore::new(s, p, 3)).await?;
    let (s1, sem) = (&lot.first, &lot.theirs);
    let leases_dir = format!("{}/leases", lot.path);
    let other = lot.mine.acquire_one().await?;
    let err = sem.acquire_timeout(3, SHORT).await.unwrap_err();
    ensure!(err == Error::Timeout(SHORT), "{err}");
    ensure!(
        s1.children(&leases_dir).await?.len() == 1,
        "the two leases taken went back"
    );
    let waiting = sem.clone();
    let handle = tokio::spawn(async move { waiting.acquire(3).await });
    // Two granted, the third waiting.
    await_children(s1, &leases_dir, 4, WITHIN).await?;
    handle.abort();
    let _ = handle.await;
    await_children(s1, &leases_dir, 1, WITHIN).await?;
    other.release().await?;
    release_all(sem.acquire_timeout(3, WITHIN).await?).await
}

/// Curator `testAcquireAfterLostServer` (CURATOR-335): the acquirer at the
/// head of the line loses its session after creating its lease node; it
/// starts over in a new session, no orphan blocks anyone, and acquisitions go
/// on.
async fn acquisitions_go_on_after_a_lost_session(h: &Harness) -> Result<()> {
    let lot = rivals(h, "/test", |s, p| Semaphore::new(s, p, 1)).await?;
    let (s1, s2, path, sem2) = (&lot.first, &lot.second, &lot.path, &lot.theirs);
    let leases_dir = format!("{path}/leases");
    let held = lot.mine.acquire_one().await?;
    let waiting = sem2.clone();
    let waiter = queued(s1, &leases_dir, 2, WITHIN, async move {
        waiting.acquire_one().await
    })
    .await?;
    let old = s2.session_id();
    s2.faults().context("faults")?.suspend(h.timeout() * 2);
    tokio::time::timeout(WITHIN, s2.lost(old)).await?;
    // The waiter starts over in a new session, behind the holder.
    await_children(s1, &leases_dir, 2, WITHIN).await?;
    held.release().await?;
    let lease = tokio::time::timeout(WITHIN, waiter).await???;
    ensure!(!lease.is_lost() && s2.session_id() != old);
    lease.release().await?;
    // Ten more acquisitions, from both sessions.
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for s in [&s1, &s2] {
        let (sem, done) = (Semaphore::new(s, path, 1)?, done.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                sem.acquire_timeout(1, WITHIN)
                    .await?
                    .pop()
                    .unwrap()
                    .release()
                    .await?;
                done.fetch_add(1, Ordering::SeqCst);
            }
            anyhow::Ok(())
        }));
    }
    joined(tasks).await?;
    ensure!(done.load(Ordering::SeqCst) == 10);
    Ok(())
}

/// A lease's lost signal fires when its session expires; releasing it then
/// reports the loss; another client gets the lease.
async fn a_lost_lease_is_signalled(h: &Harness) -> Result<()> {
    let (s1, s2) = (h.session().await, h.session().await);
    let path = h.path("/test");
    let lease = Semaphore::new(&s1, &path, 1)?.acquire_one().await?;
    ensure!(!lease.is_lost() && !lease.is_suspended());
    s1.faults().context("faults")?.expire().await?;
    tokio::time::timeout(WITHIN, lease.lost()).await?;
    ensure!(lease.is_lost());
    let next = Semaphore::new(&s2, &path, 1)?
        .acquire_timeout(1, WITHIN)
        .await?;
    ensure!(next[0].token() > lease.token());
    let err = lease.guarded(&[]).await.unwrap_err();
    ensure!(matches!(err, Error::Lost { .. }), "{err}");
    let err = lease.release().await.unwrap_err();
    ensure!(matches!(err, Error::Lost { .. }), "{err}");
    release_all(next).await
}

/// A dropped lease goes back in the background.
async fn a_dropped_lease_goes_back(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/test");
    let sem = Semaphore::new(&s, &path, 1)?;
    drop(sem.acquire_one().await?);
    await_children(&s, &format!("{path}/leases"), 0, WITHIN).await?;
    release_all(sem.acquire_timeout(1, WITHIN).await?).await
}

/// A create whose reply is lost is recovered by its protection prefix: no
/// orphan lock node blocks the semaphore.
async fn a_lost_create_reply_leaves_one_lease(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/test");
    let sem = Semaphore::new(&s, &path, 2)?;
    let faults = s.faults().context("faults")?;
    faults.lose_next_create_reply(); // the first create: the internal mutex's node
    let first = sem.acquire_one().await?;
    let second = sem.acquire_one().await?;
    let kids = s.children(&format!("{path}/leases")).await?;
    ensure!(kids.len() == 2, "{kids:?}");
    ensure!(s.retries() >= 1, "the create was retried");
    await_children(&s, &format!("{path}/locks"), 0, WITHIN).await?;
    first.release().await?;
    second.release().await?;
    Ok(())
}

// ---------------------------------------------------------------------------
// SemaphoreMutex (Curator TestInterProcessSemaphoreMutex: the base mutex
// tests; the re-entrancy tests are disabled there, as it is not re-entrant).

/// Not re-entrant, and the guard may be released by another task.
async fn the_semaphore_mutex_is_not_reentrant(h: &Harness) -> Result<()> {
    let (_, path, lock) = recipe_on(h, "/locks/our-lock", SemaphoreMutex::new).await?;
    let guard = lock.acquire().await?;
    ensure!(
        guard.node().starts_with(&format!("{path}/leases/")),
        "semaphore layout"
    );
    let err = lock.acquire_timeout(SHORT).await.unwrap_err();
    ensure!(
        err == Error::Timeout(SHORT),
        "a second acquire waits for itself: {err}"
    );
    ensure!(lock.try_acquire().await?.is_none());
    tokio::spawn(async move { guard.release().await }).await??;
    let tried = lock.try_acquire().await?;
    release_tried(tried, "free after a release from another task").await
}

/// Curator `test2Clients`: exactly one of two clients holds; a release hands
/// over.
async fn the_semaphore_mutex_alternates_between_clients(h: &Harness) -> Result<()> {
    let contest = rivals(h, "/locks/our-lock", SemaphoreMutex::new).await?;
    let (m1, g2) = clients_take_turns(contest, "/leases").await?;
    ensure!(m1.try_acquire().await?.is_none(), "exactly one holder");
    ensure!(m1.participants().await?.len() == 1);
    g2.release().await?;
    Ok(())
}

/// Curator `testKilledSession`: the holder's session expires; the waiter
/// gets the lock.
async fn a_killed_semaphore_mutex_holder_hands_over(h: &Harness) -> Result<()> {
    let contest = rivals(h, "/locks/our-lock", SemaphoreMutex::new).await?;
    let Handover { lost: g1, next: g2 } =
        killed_holder_hands_over(contest, "/leases", 2, WITHIN).await?;
    let _ = g1.release().await;
    g2.release().await?;
    Ok(())
}

/// Curator `testContainerCleanup`: after many rounds with fresh instances,
/// the directories are reaped.
async fn semaphore_directories_are_reaped(h: &Harness) -> Result<()> {
    lock_directories_are_reaped(h, 5, SemaphoreMutex::new).await
}

/// The internal lock's release failing on the connection after our lease
/// was admitted under it does not cost the lease: the acquire answers with
/// it, and the lock's node goes in the background once deletes pass again.
async fn a_failed_release_of_the_internal_lock_keeps_the_admitted_lease(h: &Harness) -> Result<()> {
    let quick = dlock::RetryPolicy {
        base_sleep: Duration::from_millis(10),
        max_sleep: Duration::from_millis(20),
        max_retries: 2,
    };
    let s = h
        .session_with(dlock::SessionOptions::default().with_retry(quick))
        .await;
    let path = h.path("/sem");
    let sem = Semaphore::new(&s, &path, 1)?;
    s.faults().context("faults")?.fail_next_deletes(u32::MAX);
    let got = sem.acquire_one().await;
    s.faults().context("faults")?.fail_next_deletes(0);
    let lease = got.context("the acquire")?;
    ensure!(!lease.is_lost(), "the lease is lost");
    await_children(&s, &format!("{path}/locks"), 0, WITHIN).await?;
    ensure!(sem.participants().await?.len() == 1, "one lease");
    lease.release().await?;
    Ok(())
}

/// A timed acquire whose deletes fail (its lease node's and the internal
/// lock's, both on the way out) answers `Timeout` within the clean-up
/// grace of its deadline; the deletes go on in the background, and once
/// they pass again nothing of it is left.
async fn a_timed_out_acquire_whose_deletes_fail_ends_on_time(h: &Harness) -> Result<()> {
    let (a, b) = (h.session().await, h.session().await);
    let path = h.path("/sem");
    let held = Semaphore::new(&a, &path, 1)?.acquire_one().await?;
    let timeout = Duration::from_millis(500);
    b.faults().context("faults")?.fail_next_deletes(u32::MAX);
    let started = tokio::time::Instant::now();
    let ended = Semaphore::new(&b, &path, 1)?
        .acquire_timeout(1, timeout)
        .await
        .map(drop);
    let took = started.elapsed();
    b.faults().context("faults")?.fail_next_deletes(0);
    ensure!(ended == Err(dlock::Error::Timeout(timeout)), "{ended:?}");
    // The grace (1 s), and twice as much again for a loaded machine.
    let bound = timeout + Duration::from_secs(3);
    ensure!(took <= bound, "ended after {took:?}, past {bound:?}");
    await_children(&a, &format!("{path}/locks"), 0, WITHIN).await?;
    await_children(&a, &format!("{path}/leases"), 1, WITHIN).await?;
    held.release().await?;
    Ok(())
}

/// A semaphore in kazoo's layout whose path was deleted (an operator's
/// clean-up) makes it again on the next acquire: before, it took the path
/// for made still, and failed `NoNode` once every retry was spent.
async fn a_kazoo_layout_semaphore_makes_its_deleted_path_again(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/kazoo-sem");
    let sem = Semaphore::new(&s, &path, 2)?.with_layout(dlock::Layout::Kazoo)?;
    sem.acquire_one().await?.release().await?;
    s.delete(&path, None).await?;
    let lease = sem.acquire_timeout(1, WITHIN).await?;
    ensure!(lease.len() == 1, "{} leases", lease.len());
    for l in lease {
        l.release().await?;
    }
    // kazoo's semaphore node keeps its maximum as data: persistent.
    s.delete(&path, None).await?;
    Ok(())
}

per_backend!(every_backend {
    a_kazoo_layout_semaphore_makes_its_deleted_path_again,
    a_timed_out_acquire_whose_deletes_fail_ends_on_time,
    a_failed_release_of_the_internal_lock_keeps_the_admitted_lease,
    bad_quantities_fail_fast,
    raising_the_count_wakes_the_waiter,
    lowering_the_count_never_revokes,
    a_closed_client_frees_its_lease,
    quantities_never_exceed_the_maximum,
    clients_asking_for_every_lease_take_turns,
    releases_admit_one_at_a_time,
    releases_in_chunks_never_overadmit,
    tasks_sharing_one_semaphore_take_turns,
    a_single_lease_is_exclusive,
    a_returned_lease_admits_the_next,
    participants_list_the_leases,
    a_deleted_waiting_lease_is_retried,
    a_cancelled_acquire_leaves_nothing,
    a_failed_multi_acquire_returns_its_leases,
    acquisitions_go_on_after_a_lost_session,
    a_lost_lease_is_signalled,
    a_dropped_lease_goes_back,
    a_lost_create_reply_leaves_one_lease,
    the_semaphore_mutex_is_not_reentrant,
    the_semaphore_mutex_alternates_between_clients,
    a_killed_semaphore_mutex_holder_hands_over,
    semaphore_directories_are_reaped,
});

// The Curator layout and interoperability checks: ZooKeeper's naming only
// (etcd orders nodes by revision, not by Curator names).
per_backend!({
    embedded_layout => crate::common::embedded(),
    zookeeper_layout => crate::common::zookeeper(),
} {
    the_layout_is_curators,
});
