//! The lock family: read-write lock, multi-lock, revocation, participants —
//! ports of Curator's TestInterProcessReadWriteLock, TestInterProcessMutex
//! (testRevoking), TestInterProcessMultiMutex, plus dlock's own cases.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use async_trait::async_trait;
use common::tests1::{finished, joined, rivals, Occupancy};
use common::{await_children, queued, Harness};
use dlock::{
    ConsulLock, Error, Hold, KvSemaphore, Lockable, MultiLock, Mutex, ReadWriteLock, Semaphore,
    Session,
};

const WITHIN: Duration = Duration::from_secs(20);
const SHORT: Duration = Duration::from_millis(300);

/// Curator `testGetParticipantNodes` (read-write): 20 readers hold, 8 writers
/// queue; the listing shows them in order, readers holding.
async fn rw_participants_show_holders_and_waiters(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/rw");
    let mut readers = Vec::new();
    for _ in 0..20 {
        readers.push(ReadWriteLock::new(&s, &path)?.read().await?);
    }
    let mut writers = Vec::new();
    for i in 0..8 {
        let rw = ReadWriteLock::new(&s, &path)?;
        writers.push(tokio::spawn(async move { rw.write().await }));
        await_children(&s, &path, 21 + i, WITHIN).await?;
    }
    let all = ReadWriteLock::new(&s, &path)?.participants().await?;
    ensure!(all.len() == 28);
    let (reads, writes): (Vec<_>, Vec<_>) = all.iter().partition(|p| p.node.contains("__READ__"));
    ensure!(reads.len() == 20 && writes.len() == 8);
    ensure!(reads.iter().all(|p| p.holds) && writes.iter().all(|p| !p.holds));
    ensure!(
        all[..20].iter().all(|p| p.node.contains("__READ__")),
        "queue order"
    );
    for r in readers {
        r.release().await?;
    }
    for w in writers {
        w.await??.release().await?;
    }
    Ok(())
}

/// Curator `testThatUpgradingIsDisallowed`: a reader cannot take the write
/// lock — dlock says so at once instead of waiting out a timeout, whatever
/// the timeout (zero included, and for a try).
async fn upgrading_is_refused(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let rw = ReadWriteLock::new(&s, &h.path("/rw"))?;
    let r = rw.read().await?;
    for err in [
        rw.write_timeout(SHORT).await.unwrap_err(),
        rw.write_timeout(Duration::ZERO).await.unwrap_err(),
        rw.try_write().await.unwrap_err(),
    ] {
        ensure!(
            matches!(&err, Error::InvalidArgument(m) if m.contains("upgrade")),
            "{err}"
        );
    }
    r.release().await?;
    rw.write().await?.release().await?;
    Ok(())
}

/// A task holding the write lock is refused the read lock and a second
/// write lock through the same value (or a clone), each of which would
/// queue behind its own write node forever, with a message naming the way
/// that works (a downgrade, a re-entry); another task waits. A hold given
/// back (or lost) refuses nothing.
async fn a_task_holding_the_write_lock_is_refused_what_would_wait_for_itself(
    h: &Harness,
) -> Result<()> {
    let s = h.session().await;
    let rw = ReadWriteLock::new(&s, &h.path("/rw"))?;
    let w = rw.write().await?;
    let refused = [
        rw.read().await.map(drop).unwrap_err(),
        rw.clone().try_read().await.map(drop).unwrap_err(),
        rw.write().await.map(drop).unwrap_err(),
        rw.write_half()
            .lock_for(Some(SHORT))
            .await
            .map(drop)
            .unwrap_err(),
    ];
    let ways = ["WriteGuard::read", "WriteGuard::read", "reenter", "reenter"];
    for (err, way) in refused.iter().zip(ways) {
        ensure!(
            matches!(err, Error::InvalidArgument(m) if m.contains(way)),
            "{err}"
        );
    }
    let again = w.reenter()?;
    let read = w.read().await?;
    let other = rw.clone();
    let elsewhere = tokio::spawn(async move { other.try_write().await.map(|g| g.is_some()) });
    ensure!(!elsewhere.await??, "another task waits for the lock");
    w.release().await?;
    again.release().await?;
    read.release().await?;
    rw.write().await?.release().await?;
    Ok(())
}

/// A task holding the read lock is refused a second one through the same
/// value (or a clone): free now, it would queue behind a writer that came
/// in between, which waits for the first read, so for ever. The message
/// names the re-entry; another task reads alongside.
async fn a_task_holding_the_read_lock_is_refused_a_second_one(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let rw = ReadWriteLock::new(&s, &h.path("/rw"))?;
    let r = rw.read().await?;
    let refused = [
        rw.read().await.map(drop).unwrap_err(),
        rw.clone().try_read().await.map(drop).unwrap_err(),
        rw.read_half()
            .lock_for(Some(SHORT))
            .await
            .map(drop)
            .unwrap_err(),
    ];
    for err in refused {
        ensure!(
            matches!(&err, Error::InvalidArgument(m) if m.contains("ReadGuard::reenter")),
            "{err}"
        );
    }
    let again = r.reenter()?;
    let other = rw.clone();
    let elsewhere = tokio::spawn(async move { other.read().await?.release().await });
    elsewhere.await??;
    again.release().await?;
    r.release().await?;
    rw.read().await?.release().await?;
    Ok(())
}

/// A write guard handed over to another task still counts for the task
/// that took it (refused there through the same value); that task waits
/// for the lock through a value of its own, and gets it once the other
/// task releases.
async fn a_handed_over_write_guard_is_waited_for_through_a_value_of_ones_own(
    h: &Harness,
) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/rw");
    let rw = ReadWriteLock::new(&s, &path)?;
    let w = rw.write().await?;
    let (go, release) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(async move {
        let _ = release.await;
        w.release().await
    });
    let err = rw.try_read().await.map(drop).unwrap_err();
    ensure!(matches!(err, Error::InvalidArgument(_)), "{err}");
    // In this very task, through a value of its own: not refused, it
    // waits for the worker's release.
    let own = ReadWriteLock::new(&s, &path)?;
    let _ = go.send(());
    let read = tokio::time::timeout(WITHIN, own.read()).await??;
    worker.await??;
    read.release().await?;
    Ok(())
}

/// Curator `testThatDowngradingRespectsThreads`: while one task holds the
/// write lock, another cannot read.
async fn downgrading_is_only_for_the_writer(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let rw = ReadWriteLock::new(&s, &h.path("/rw"))?;
    let w = rw.write().await?;
    let other = rw.clone();
    let err = tokio::spawn(async move { other.read_timeout(SHORT).await.map(|_| ()) })
        .await?
        .unwrap_err();
    ensure!(matches!(err, Error::Timeout(_)), "{err}");
    w.release().await?;
    Ok(())
}

/// Curator `testDowngrading`: write, read, release write, release read.
async fn a_writer_downgrades_to_reader(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/rw");
    let rw = ReadWriteLock::new(&s, &path)?;
    let w = rw.write().await?;
    let r = tokio::time::timeout(SHORT, w.read()).await??;
    w.release().await?;
    // Readers may join now; writers may not.
    let other = ReadWriteLock::new(&s, &path)?;
    other.read().await?.release().await?;
    ensure!(other.try_write().await?.is_none());
    r.release().await?;
    other.write().await?.release().await?;
    Ok(())
}

/// Curator `testContendingDowngrading` (CURATOR-621): a writer queued behind
/// a downgrading writer stays out until the downgraded read is released.
/// Twice: the second time writer 2's client has just waited there, so a
/// backend that keeps what its watches delivered (etcd) may answer from it.
/// The read hold keeps the write hold's fencing token, so writer 2, which
/// holds after it, has a larger one (its node is older than the read
/// node: before, the read hold's token was the larger).
async fn a_queued_writer_cannot_slip_into_a_downgrade(h: &Harness) -> Result<()> {
    let (s1, s2) = (h.session().await, h.session().await);
    let path = h.path("/rw");
    let lock1 = ReadWriteLock::new(&s1, &path)?;
    for round in 0..2 {
        let w1 = lock1.write().await?;
        let lock2 = ReadWriteLock::new(&s2, &path)?;
        let mut writer2 = tokio::spawn(async move { anyhow::Ok(lock2.write().await?) });
        await_children(&s1, &path, 2, WITHIN).await?;
        let r1 = w1.read().await?;
        ensure!(
            r1.token() == w1.token(),
            "round {round}: the read hold's token"
        );
        w1.release().await?;
        // Writer 2 is woken by the write node's deletion and must see our
        // read node ahead of it: it keeps waiting, watching the read node.
        await_children(&s1, &path, 2, WITHIN).await?;
        let fresh = ReadWriteLock::new(&s1, &path)?.participants().await?;
        ensure!(
            fresh[0].node == r1.node() && fresh[0].holds && !fresh[1].holds,
            "round {round}: {fresh:#?}"
        );
        // Given the time to act on its wake-up, it still waits.
        ensure!(
            tokio::time::timeout(SHORT, &mut writer2).await.is_err(),
            "round {round}: writer 2 slipped in"
        );
        let read_token = r1.token();
        r1.release().await?;
        let w2 = finished(writer2, WITHIN).await?;
        ensure!(
            w2.token() > read_token,
            "round {round}: writer 2's token {} after {read_token}",
            w2.token()
        );
        w2.release().await?;
    }
    Ok(())
}

/// A write lock revoked by force, unnoticed by its holder (nothing asked
/// whether it was lost), whose queued writer holds now: a downgrade fails
/// as lost and leaves no read node, which would otherwise take the gone
/// write node's place ahead of the writer that holds.
async fn a_downgrade_of_a_write_lock_revoked_by_force_is_lost(h: &Harness) -> Result<()> {
    let (s1, s2, operator) = (h.session().await, h.session().await, h.session().await);
    let path = h.path("/rw");
    let w1 = ReadWriteLock::new(&s1, &path)?.write().await?;
    let lock2 = ReadWriteLock::new(&s2, &path)?;
    let writer2 = tokio::spawn(async move { anyhow::Ok(lock2.write().await?) });
    await_children(&operator, &path, 2, WITHIN).await?;
    dlock::revoke_forced(&operator, w1.node()).await?;
    let w2 = finished(writer2, WITHIN).await?;
    let read = w1.read().await;
    ensure!(
        matches!(read, Err(Error::Lost { .. })),
        "a downgrade of a write lock revoked by force, with writer 2 holding: {:?}",
        read.map(|r| r.node().to_string())
    );
    await_children(&operator, &path, 1, WITHIN).await?;
    let left = operator.children(&path).await?;
    ensure!(
        left.len() == 1 && w2.node() == format!("{path}/{}", left[0].name),
        "{left:?}"
    );
    w2.release().await?;
    let _ = w1.release().await;
    Ok(())
}

/// A guarded write through a hold that was given back is refused — even
/// once the same session queues for the same lock again while another
/// holds it (on etcd under the same key name, which the write's check
/// alone would accept).
async fn a_released_hold_guards_no_more_writes(h: &Harness) -> Result<()> {
    let (s, other) = (h.session().await, h.session().await);
    let (path, resource) = (h.path("/lock"), h.path("/resource"));
    s.create(&resource, b"v0", common::persistent()).await?;
    let mutex = Mutex::new(&s, &path)?;
    let guard = mutex.acquire().await?;
    let kept: dlock::Acquisition = (*guard).clone();
    let acquire = |m: Mutex| async move { m.acquire().await };
    let theirs = acquire(Mutex::new(&other, &path)?);
    let theirs = queued(&other, &path, 2, WITHIN, theirs).await?;
    guard.release().await?;
    let theirs = finished(theirs, WITHIN).await?;
    let ours_again = queued(&s, &path, 2, WITHIN, acquire(mutex)).await?;
    common::late_guarded_write_is_refused(&kept, &s, &resource, "a released hold").await?;
    theirs.release().await?;
    finished(ours_again, WITHIN).await?.release().await?;
    s.delete(&resource, None).await?;
    Ok(())
}

/// A downgrade whose session ends while it makes the read node fails as
/// lost, and leaves no read node: one made in the next session would not
/// take the write node's place (etcd and Consul keep a place only within a
/// session), so a writer queued behind could get in while it reads.
async fn a_downgrade_that_outlives_its_session_is_lost(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/rw");
    let w = ReadWriteLock::new(&s, &path)?.write().await?;
    let first = s.session_id();
    s.faults().context("faults")?.suspend(h.timeout() * 2);
    // Issued while the connection is down, sent once it is back: in the
    // next session.
    let read = w.read().await;
    ensure!(s.session_id() != first, "the session was renewed");
    ensure!(
        read.is_err(),
        "a downgrade of a write lock lost meanwhile: {:?}",
        read.map(|r| r.node().to_string())
    );
    let _ = w.release().await;
    let left = s.children(&path).await.unwrap_or_default();
    ensure!(left.is_empty(), "left behind: {left:?}");
    Ok(())
}

/// Curator `testBasic`: 8 clients, mostly readers, one writer in ten; a
/// writer is alone, readers overlap.
async fn writers_are_alone_and_readers_share(h: &Harness) -> Result<()> {
    let path = h.path("/rw");
    let readers = Arc::new(Occupancy::default());
    let writers = Arc::new(Occupancy::default());
    let writes = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for client in 0..8 {
        let rw = ReadWriteLock::new(&h.session().await, &path)?;
        let (readers, writers, writes) = (readers.clone(), writers.clone(), writes.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..25 {
                if (client * 25 + i) % 10 == 0 {
                    let g = rw.write().await?;
                    ensure!(writers.enter() == 1, "two writers");
                    ensure!(readers.now() == 0, "a writer with readers");
                    tokio::task::yield_now().await;
                    writers.leave();
                    writes.fetch_add(1, Ordering::SeqCst);
                    g.release().await?;
                } else {
                    let g = rw.read().await?;
                    readers.enter();
                    ensure!(writers.now() == 0, "a reader with a writer");
                    tokio::time::sleep(Duration::from_millis(2)).await; // hold a while, so readers overlap
                    readers.leave();
                    g.release().await?;
                }
            }
            anyhow::Ok(())
        }));
    }
    joined(tasks).await?;
    ensure!(writes.load(Ordering::SeqCst) == 20);
    ensure!(readers.peak() > 1, "readers never overlapped");
    Ok(())
}

/// Curator `testSetNodeData`: the lock's data is stored in its nodes.
async fn rw_nodes_carry_the_lock_data(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let mut data = vec![1u8, 2, 3, 4];
    let rw = ReadWriteLock::new(&s, &h.path("/lock"))?.with_data(data.clone());
    data[0] = 9; // the lock keeps its own copy
    let w = rw.write().await?;
    ensure!(s.get_data(w.node()).await?.0 == [1, 2, 3, 4]);
    let r = w.read().await?;
    ensure!(
        s.get_data(r.node()).await?.0 == [1, 2, 3, 4],
        "the downgrade's"
    );
    r.release().await?;
    w.release().await?;
    // Revocable, its nodes hold nothing (as Curator's): a request is
    // written over them. The downgrade's too.
    let rw = ReadWriteLock::new(&s, &h.path("/revocable"))?
        .with_data(vec![1u8])
        .revocable(|_| {});
    let w = rw.write().await?;
    let r = w.read().await?;
    for node in [w.node(), r.node()] {
        let (data, _) = s.get_data(node).await?;
        ensure!(data.is_empty(), "{node} holds {data:?}");
    }
    r.release().await?;
    w.release().await?;
    Ok(())
}

/// Curator `testLockPath`: a writer's session dies; a reader gets in; the
/// old write node is gone; the old holder's release reports the loss.
async fn a_dead_writer_lets_readers_in(h: &Harness) -> Result<()> {
    let lock = rivals(h, "/rw", ReadWriteLock::new).await?;
    let w = lock.mine.write().await?;
    lock.first.faults().expect("faults").expire().await?;
    let r = lock.theirs.read_timeout(WITHIN).await?;
    ensure!(lock.second.exists(w.node()).await?.is_none());
    ensure!(matches!(w.release().await.unwrap_err(), Error::Lost { .. }));
    r.release().await?;
    Ok(())
}

/// Curator `testRevoking`: a revocable holder is asked (by node path, from
/// another session) to release, does so, and the next participant gets in.
async fn a_revocable_holder_is_asked_to_release(h: &Harness) -> Result<()> {
    let (s1, s2) = (h.session().await, h.session().await);
    let path = h.path("/locks/our-lock");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let m1 = Mutex::new(&s1, &path)?.revocable(move |node| {
        let _ = tx.send(node.to_string());
    });
    let g = m1.acquire().await?;
    ensure!(
        s1.get_data(g.node()).await?.0.is_empty(),
        "revocable nodes carry no data"
    );
    let m2 = Mutex::new(&s2, &path)?;
    let nodes = m2.participants().await?;
    ensure!(nodes.len() == 1 && nodes[0].node == g.node());
    dlock::revoke(&s2, &nodes[0].node).await?;
    let asked = tokio::time::timeout(WITHIN, rx.recv()).await?;
    ensure!(asked.as_deref() == Some(g.node()));
    g.release().await?;
    m2.acquire_timeout(Duration::from_secs(5))
        .await?
        .release()
        .await?;
    // Revoking a node that is gone is fine.
    dlock::revoke(&s2, &nodes[0].node).await?;
    Ok(())
}

/// A waiting (not yet holding) revocable participant is told too.
async fn a_revocable_waiter_is_told_too(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/locks/w");
    let holder = Mutex::new(&s, &path)?.acquire().await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let waiter = Mutex::new(&s, &path)?.revocable(move |node| {
        let _ = tx.send(node.to_string());
    });
    let waiting = queued(&s, &path, 2, WITHIN, async move { waiter.acquire().await }).await?;
    let queue = Mutex::new(&s, &path)?.participants().await?;
    dlock::revoke(&s, &queue[1].node).await?;
    ensure!(
        tokio::time::timeout(WITHIN, rx.recv()).await?.as_deref() == Some(queue[1].node.as_str())
    );
    waiting.abort();
    let _ = waiting.await;
    holder.release().await?;
    Ok(())
}

/// Mutex participants: holder first, then waiters, with session, token and
/// data.
async fn mutex_participants_in_queue_order(h: &Harness) -> Result<()> {
    let (s1, s2) = (h.session().await, h.session().await);
    let path = h.path("/locks/p");
    let g = Mutex::new(&s1, &path)?
        .with_data(b"one".to_vec())
        .acquire()
        .await?;
    let m2 = Mutex::new(&s2, &path)?.with_data(b"two".to_vec());
    let waiting = queued(&s1, &path, 2, WITHIN, async move { m2.acquire().await }).await?;
    let all = Mutex::new(&s1, &path)?.participants().await?;
    ensure!(all.len() == 2);
    ensure!(
        all[0].holds
            && all[0].data == b"one"
            && all[0].session == s1.session_id()
            && all[0].token == g.token()
    );
    ensure!(
        !all[1].holds
            && all[1].data == b"two"
            && all[1].session == s2.session_id()
            && all[1].token > g.token()
    );
    g.release().await?;
    waiting.await??.release().await?;
    Ok(())
}

fn two_locks(h: &Harness, s: &dlock::Session) -> Result<MultiLock> {
    Ok(MultiLock::new(vec![
        Box::new(Mutex::new(s, &h.path("/locks/our-lock-1"))?),
        Box::new(ReadWriteLock::new(s, &h.path("/locks/our-lock-2"))?.write_half()),
    ]))
}

/// Curator's base test `test2Clients`, for a MultiLock: one holder at a time.
async fn multi_locks_exclude_each_other(h: &Harness) -> Result<()> {
    let (s1, s2) = (h.session().await, h.session().await);
    let (m1, m2) = (two_locks(h, &s1)?, two_locks(h, &s2)?);
    let g1 = m1.acquire().await?;
    let err = m2.acquire_timeout(SHORT).await.unwrap_err();
    ensure!(matches!(err, Error::Timeout(_)), "{err}");
    // The timed-out attempt released what it had taken.
    ensure!(s1.children(&h.path("/locks/our-lock-1")).await?.len() == 1);
    let waiting = tokio::spawn(async move { m2.acquire().await });
    g1.release().await?;
    let g2 = tokio::time::timeout(WITHIN, waiting).await???;
    ensure!(g2.tokens().len() == 2);
    g2.release().await?;
    Ok(())
}

/// Curator's base test `testKilledSession`, for a MultiLock: the holder's
/// session expires; the waiting multi-lock gets both locks.
async fn a_killed_multi_lock_holder_hands_over(h: &Harness) -> Result<()> {
    let (s1, s2) = (h.session().await, h.session().await);
    let g1 = two_locks(h, &s1)?.acquire().await?;
    let m2 = two_locks(h, &s2)?;
    let waiting = queued(&s2, &h.path("/locks/our-lock-1"), 2, WITHIN, async move {
        m2.acquire().await
    })
    .await?;
    s1.faults().expect("faults").expire().await?;
    let g2 = tokio::time::timeout(WITHIN, waiting).await???;
    let err = g1.release().await.unwrap_err();
    ensure!(
        matches!(err, Error::Lost { .. } | Error::Several(_)),
        "{err}"
    );
    g2.release().await?;
    Ok(())
}

/// Curator's base test `testContainerCleanup`, for a MultiLock: after many
/// rounds with fresh instances, the lock directories are reaped.
async fn multi_lock_directories_are_reaped(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let mut tasks = Vec::new();
    for _ in 0..5 {
        let multi = two_locks(h, &s)?;
        tasks.push(tokio::spawn(async move {
            for _ in 0..3 {
                multi.acquire().await?.release().await?;
            }
            anyhow::Ok(())
        }));
    }
    joined(tasks).await?;
    common::await_gone(&s, &h.path("/locks"), WITHIN).await?;
    Ok(())
}

/// A lock whose acquire or release fails on purpose.
#[derive(Debug)]
struct Faulty {
    inner: Mutex,
    fail_acquire: bool,
}

#[derive(Debug)]
struct FaultyHold(dlock::LockGuard);

#[async_trait]
impl Hold for FaultyHold {
    fn acquisition(&self) -> &dlock::Acquisition {
        &self.0
    }
    async fn release(self: Box<Self>) -> dlock::Result<()> {
        // The release fails, and the lock stays held (its guard is leaked
        // into the test's keeping below).
        std::mem::forget(self.0);
        Err(Error::Backend("release failed on purpose".into()))
    }
}

impl Faulty {
    /// A multi-lock of `good`, then of `inner` made faulty: failing to
    /// acquire if `fail_acquire`, else to release.
    fn after(good: &Mutex, inner: &Mutex, fail_acquire: bool) -> MultiLock {
        MultiLock::new(vec![
            Box::new(good.clone()),
            Box::new(Faulty {
                inner: inner.clone(),
                fail_acquire,
            }),
        ])
    }
}

#[async_trait]
impl Lockable for Faulty {
    async fn lock_for(&self, timeout: Option<Duration>) -> dlock::Result<Option<Box<dyn Hold>>> {
        if self.fail_acquire {
            return Err(Error::Backend("acquire failed on purpose".into()));
        }
        let g = match timeout {
            Some(t) => self.inner.acquire_timeout(t).await?,
            None => self.inner.acquire().await?,
        };
        Ok(Some(Box::new(FaultyHold(g))))
    }
}

/// Curator `testSomeReleasesFail`: one release fails; the others are still
/// released and the failure is reported.
async fn a_failing_release_does_not_stop_the_others(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let good = Mutex::new(&s, &h.path("/locks/good"))?;
    let bad = Mutex::new(&s, &h.path("/locks/bad"))?;
    let multi = Faulty::after(&good, &bad, false);
    let g = multi.acquire().await?;
    let err = g.release().await.unwrap_err();
    ensure!(
        matches!(&err, Error::Backend(m) if m.contains("on purpose")),
        "{err}"
    );
    ensure!(
        good.try_acquire().await?.is_some(),
        "the good lock was released"
    );
    ensure!(
        bad.try_acquire().await?.is_none(),
        "the bad lock is still held"
    );
    // Clean up the deliberately leaked hold.
    for p in bad.participants().await? {
        s.delete(&p.node, None).await?;
    }
    Ok(())
}

/// Curator `testSomeLocksFailToLock`: a later lock fails to lock; the earlier
/// one, held meanwhile, is released again; the error is the failure's.
async fn a_failing_acquire_rolls_back(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let good = Mutex::new(&s, &h.path("/locks/good"))?;
    let multi = Faulty::after(&good, &good, true);
    let err = multi.acquire().await.unwrap_err();
    ensure!(
        matches!(&err, Error::Backend(m) if m.contains("acquire failed")),
        "{err}"
    );
    ensure!(good.try_acquire().await?.is_some(), "rolled back");
    Ok(())
}

/// A waiter whose session the server ended unannounced (an operator's
/// `etcdctl lease revoke` or `consul session destroy`, or Consul when the
/// node's health check fails) goes on in the session's successor and gets
/// the lock once it is free, as Curator's retry loop goes on after
/// `SESSIONEXPIRED` — it does not fail with `SessionExpired` because a
/// request found out before the session did. For the queued recipes the
/// waiter is in the queue when its session ends; a `ConsulLock` waiter
/// has no node to show it waits, so it may find out at its first write.
async fn a_waiter_whose_session_the_server_ended_goes_on_in_the_next(h: &Harness) -> Result<()> {
    let (a, b) = (h.session().await, h.session().await);
    let path = h.path("/ended");
    let kinds: [(&str, usize); 4] = [("mutex", 2), ("kv", 3), ("semaphore", 0), ("consul", 0)];
    for (kind, queued_nodes) in kinds {
        let dir = format!("{path}/{kind}");
        let hold = |s: &Session| -> dlock::Result<Box<dyn Lockable>> {
            Ok(match kind {
                "mutex" => Box::new(Mutex::new(s, &dir)?),
                "kv" => Box::new(KvSemaphore::new(s, &dir, 1)?),
                "semaphore" => Box::new(Semaphore::new(s, &dir, 1)?),
                _ => Box::new(ConsulLock::new(s, &dir)?),
            })
        };
        let held = hold(&a)?.lock_for(None).await?.context("held")?;
        let (waiter, before) = (hold(&b)?, b.session_id());
        let acquire = async move { waiter.lock_for(None).await };
        let waiting = match queued_nodes {
            0 => tokio::spawn(acquire),
            n => queued(&a, &dir, n, WITHIN, acquire).await?,
        };
        b.faults().context("faults")?.end_on_server().await?;
        let first = held.token();
        held.release().await?;
        let got = tokio::time::timeout(WITHIN, waiting)
            .await
            .with_context(|| format!("{kind}: the waiter never got the lock"))??;
        let got = got.with_context(|| format!("{kind}: the waiter's acquire"))?;
        let got = got.with_context(|| format!("{kind}: an untimed acquire timed out"))?;
        ensure!(
            b.session_id() != before && got.acquisition().session_id() == b.session_id(),
            "{kind}: held in session {:#x}, the ended one was {before:#x}, now {:#x}",
            got.acquisition().session_id(),
            b.session_id()
        );
        ensure!(
            got.token() > first,
            "{kind}: token {:?} after {first:?}",
            got.token()
        );
        got.release().await?;
    }
    Ok(())
}

// Every case on every backend.
per_backend!(every_backend {
    rw_participants_show_holders_and_waiters,
    upgrading_is_refused,
    downgrading_is_only_for_the_writer,
    a_task_holding_the_write_lock_is_refused_what_would_wait_for_itself,
    a_task_holding_the_read_lock_is_refused_a_second_one,
    a_handed_over_write_guard_is_waited_for_through_a_value_of_ones_own,
    a_writer_downgrades_to_reader,
    a_queued_writer_cannot_slip_into_a_downgrade,
    a_downgrade_that_outlives_its_session_is_lost,
    a_downgrade_of_a_write_lock_revoked_by_force_is_lost,
    a_released_hold_guards_no_more_writes,
    writers_are_alone_and_readers_share,
    rw_nodes_carry_the_lock_data,
    a_dead_writer_lets_readers_in,
    a_revocable_holder_is_asked_to_release,
    a_revocable_waiter_is_told_too,
    mutex_participants_in_queue_order,
    multi_locks_exclude_each_other,
    a_killed_multi_lock_holder_hands_over,
    multi_lock_directories_are_reaped,
    a_failing_release_does_not_stop_the_others,
    a_failing_acquire_rolls_back,
    a_waiter_whose_session_the_server_ended_goes_on_in_the_next,
});
