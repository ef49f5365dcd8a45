//! Regression scenarios from peers' bug reports
//! (`shared/research/peers-and-correctness.md` §2.4.4 and §4): one named
//! test per scenario that no other suite already covers, run on every
//! backend. The scenarios that other suites cover are listed in SAFETY.md
//! with the test that covers each.
//!
//! Each test names its source in its doc comment (CURATOR-n is Apache
//! Curator's JIRA, etcd#n and kazoo#n are GitHub issues).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use anyhow::{bail, ensure, Context, Result};
use common::tests1::{finished, gets_in_at, release_tried, rivals};
use common::{await_children, await_gone, Harness};
use dlock::recipes::semaphore::Semaphore;
use dlock::store::{sequence_key, SessionId};
use dlock::{
    Error, FencingToken, LeaderLatch, Mutex, ReadWriteLock, RetryPolicy, Session, SessionOptions,
    SessionState,
};

const WITHIN: Duration = Duration::from_secs(20);

/// One node of a recipe's directory, as the store shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    path: String,
    owner: SessionId,
    token: FencingToken,
}

/// The nodes under `dir`, oldest first (creation order is queue order on
/// every backend), with their owning sessions.
async fn nodes(s: &Session, dir: &str) -> Result<Vec<Node>> {
    let children = match s.children(dir).await {
        Ok(children) => children,
        Err(Error::NoNode { .. }) => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    let mut found = Vec::new();
    for child in children {
        let path = format!("{dir}/{}", child.name);
        if let Some(stat) = s.exists(&path).await? {
            found.push(Node {
                path,
                owner: stat.ephemeral_owner,
                token: stat.token(),
            });
        }
    }
    found.sort_by_key(|n| n.token);
    Ok(found)
}

/// Waits (by watching `dir`'s children, not by polling) until `cond` holds
/// for its nodes.
async fn await_nodes(
    s: &Session,
    dir: &str,
    what: &str,
    cond: impl Fn(&[Node]) -> bool,
) -> Result<Vec<Node>> {
    let last = std::sync::Mutex::new(Vec::new());
    let waited = tokio::time::timeout(WITHIN, async {
        loop {
            // Armed before looking, so no change is missed.
            let watch = match s.children_watch(dir).await {
                Ok((_, watch)) => watch,
                Err(Error::NoNode { .. }) => s.exists_watch(dir).await?.1,
                Err(e) => return Err(e.into()),
            };
            let now = nodes(s, dir).await?;
            if cond(&now) {
                return Ok(now);
            }
            *last.lock().unwrap() = now;
            watch.changed().await;
        }
    })
    .await;
    waited.with_context(|| format!("{dir}: never {what}; last seen {:?}", last.lock().unwrap()))?
}

/// Waits until a waiter whose session was just expired while it queued in
/// `dir` behind one holder has either queued again, in its new session
/// (the usual outcome: its wait wakes on the expiry, finds its node gone
/// and starts over), or failed with the session's loss (when one of its
/// operations was in flight at the expiry, as Curator's acquire fails);
/// in the latter case it is started again with `restart`. It must never
/// claim the lock. Returns the waiter and the queue: the holder, then the
/// waiter's new node.
async fn requeued_after_expiry<G: Send + 'static>(
    holder: &Session,
    dir: &str,
    old_session: SessionId,
    mut waiting: JoinHandle<dlock::Result<G>>,
    restart: impl FnOnce() -> JoinHandle<dlock::Result<G>>,
) -> Result<(JoinHandle<dlock::Result<G>>, Vec<Node>)> {
    let requeued = |n: &[Node]| n.len() == 2 && n[1].owner != old_session && n[1].owner != 0;
    let queue = tokio::select! {
        finished = &mut waiting => match finished? {
            Ok(_) => bail!("the expired waiter claimed the lock while it was held"),
            Err(e) if e.is_session_lost() => {
                waiting = restart();
                await_nodes(holder, dir, "the waiter queued again", requeued).await?
            }
            Err(e) => bail!("the expired waiter failed oddly: {e}"),
        },
        queue = await_nodes(holder, dir, "the waiter queued again", requeued) => queue?,
    };
    ensure!(
        !waiting.is_finished(),
        "the expired waiter claimed the lock while it was held"
    );
    Ok((waiting, queue))
}

/// A session whose retries of lost connections wait `sleep` (exactly: the
/// base and the cap are equal).
async fn session_retrying_after(h: &Harness, sleep: Duration) -> Session {
    h.session_with(
        SessionOptions::default()
            .with_session_timeout(h.timeout())
            .with_retry(RetryPolicy {
                base_sleep: sleep,
                max_sleep: sleep,
                max_retries: 10,
            }),
    )
    .await
}

/// etcd#19597, and the etcd 3.4.3 Jepsen bug it follows (etcd#11456, fixed
/// by etcd#11408): a waiter whose session expires while it is queued must
/// never believe it holds. Its wait wakes on the expiry at once and it
/// queues again with a node of its new session behind the holder (or, if
/// an operation of it was in flight, its acquire fails with the session's
/// loss), and it acquires only once the holder releases. The holder is
/// unaffected throughout: it keeps its node, its lock and its fenced
/// writes.
async fn a_session_expiring_while_queued_never_acquires(h: &Harness) -> Result<()> {
    let (holder, waiter) = (h.session().await, h.session().await);
    let path = h.path("/locks/queued");
    let held = Mutex::new(&holder, &path)?.acquire().await?;
    let m = Mutex::new(&waiter, &path)?;
    let again = m.clone();
    let waiting = tokio::spawn(async move { m.acquire().await });
    let queued = await_nodes(&holder, &path, "two in the queue", |n| n.len() == 2).await?;
    let old_session = waiter.session_id();
    ensure!(queued[1].owner == old_session, "{queued:?}");
    waiter.faults().context("faults")?.expire().await?;
    let (waiting, requeued) = requeued_after_expiry(&holder, &path, old_session, waiting, || {
        tokio::spawn(async move { again.acquire().await })
    })
    .await?;
    ensure!(
        requeued[0].path == held.node() && requeued[1].owner == waiter.session_id(),
        "the holder first, then the waiter's new node: {requeued:?}"
    );
    ensure!(!held.is_lost() && holder.exists(held.node()).await?.is_some());
    held.guarded(&[])
        .await
        .context("the holder's fenced write")?;
    let held_token = held.token();
    held.release().await?;
    let got = tokio::time::timeout(WITHIN, waiting).await???;
    ensure!(
        got.node() == requeued[1].path && got.node() != queued[1].path,
        "acquired with its new node"
    );
    ensure!(!got.is_lost() && got.token() > held_token);
    got.release().await?;
    Ok(())
}

/// CURATOR-307 (IndexOutOfBounds in the read-write lock on connection
/// loss): a reader queued behind a writer loses its session; its node is
/// gone, and it must neither fail oddly nor get in — it queues again in its
/// new session (or fails with the session's loss and is started again) and
/// reads once the writer is done.
async fn a_queued_reader_losing_its_session_starts_over(h: &Harness) -> Result<()> {
    let lock = rivals(h, "/rw", ReadWriteLock::new).await?;
    let (writer, reader, path) = (&lock.first, &lock.second, &lock.path);
    let w = lock.mine.write().await?;
    let (rw, again) = (lock.theirs.clone(), lock.theirs.clone());
    let reading = tokio::spawn(async move { rw.read().await });
    await_nodes(writer, path, "a reader queued", |n| n.len() == 2).await?;
    let old_session = reader.session_id();
    reader.faults().context("faults")?.expire().await?;
    let (reading, requeued) = requeued_after_expiry(writer, path, old_session, reading, || {
        tokio::spawn(async move { again.read().await })
    })
    .await?;
    ensure!(!w.is_lost() && requeued[0].path == w.node());
    w.release().await?;
    gets_in_at(reading, &requeued[1].path).await
}

/// etcd#22082 (a stale `Unlock` retry deleted a newer incarnation of the
/// lock key) and CURATOR-678 (a release during a connection loss broke the
/// lock's local state): holder A's release is applied but its reply is
/// lost, so the guaranteed delete retries — after a second, while B
/// acquires and A queues again in the same session. The retry removes
/// neither B's node nor A's new one: B holds, its fenced writes land, and A
/// acquires after B as if nothing happened.
async fn a_lost_delete_reply_does_not_delete_a_newer_holder(h: &Harness) -> Result<()> {
    let a = session_retrying_after(h, Duration::from_secs(1)).await;
    let b = h.session().await;
    let path = h.path("/locks/delete-reply");
    let ma = Mutex::new(&a, &path)?;
    let first = ma.acquire().await?;
    let first_node = first.node().to_string();
    let mb = Mutex::new(&b, &path)?;
    let b_waiting = tokio::spawn(async move { mb.acquire().await });
    await_nodes(&a, &path, "B queued", |n| n.len() == 2).await?;
    let retries = a.retries();
    a.faults().context("faults")?.lose_next_delete_reply();
    let releasing = tokio::spawn(async move { first.release().await });
    // B is woken by the applied delete, not by A's (lost) reply.
    let gb = tokio::time::timeout(WITHIN, b_waiting).await???;
    // A's next incarnation, in the same session, before the retry comes.
    let ma2 = ma.clone();
    let a_waiting = tokio::spawn(async move { ma2.acquire().await });
    let queue = await_nodes(&b, &path, "A queued again", |n| {
        n.len() == 2 && n[1].owner == a.session_id()
    })
    .await?;
    ensure!(
        !releasing.is_finished(),
        "the retry was done before A queued again: the case was not exercised"
    );
    tokio::time::timeout(WITHIN, releasing)
        .await??
        .context("A's release succeeds once its retry finds the node gone")?;
    ensure!(
        a.retries() > retries,
        "the lost reply made the delete retry"
    );
    let after = nodes(&b, &path).await?;
    ensure!(
        after == queue && after[0].path == gb.node() && after[1].path != first_node,
        "the retry removed nothing but A's old node: {queue:?} -> {after:?}"
    );
    ensure!(!gb.is_lost());
    gb.guarded(&[]).await.context("B's fenced write")?;
    ensure!(!a_waiting.is_finished(), "A got in while B held");
    gb.release().await?;
    gets_in_at(a_waiting, &after[1].path).await
}

/// CURATOR-604 (an acquire succeeded on "the about-to-be-deleted lock node
/// of the previous session") and CURATOR-620/696 (the same for
/// LeaderLatch): after its session is replaced, a participant must not
/// count a node of its old session as its own, even while the server still
/// shows it.
///
/// 1. A process restarts while its old session still lives on the server
///    (the crash is not noticed yet): the new session, with the very same
///    node data, queues behind the old node and gets the lock only once the
///    old session is reaped.
/// 2. A queued waiter is cut off past its session timeout while the holder
///    releases, so its old node is first in line when the waiter looks
///    again from its new session. On etcd the old lease's keys go only when
///    the server's lessor notices (up to half a second after the client
///    declared the lease lost), so the old node is often still listed
///    then: the waiter must not take the lock with it. On the embedded
///    store and ZooKeeper the node is gone by the time `Lost` is reported.
async fn a_new_session_ignores_its_old_sessions_node(h: &Harness) -> Result<()> {
    let path = h.path("/locks/old-session");
    let same_data = || {
        SessionOptions::default()
            .with_session_timeout(h.timeout())
            .with_default_data(b"worker-1".to_vec())
    };
    // 1. A restart.
    let (old, new) = (
        h.session_with(same_data()).await,
        h.session_with(same_data()).await,
    );
    let before = Mutex::new(&old, &path)?.acquire().await?;
    let m = Mutex::new(&new, &path)?;
    ensure!(
        m.try_acquire().await?.is_none(),
        "the new session took the old one's hold for its own"
    );
    let waiting = tokio::spawn(async move { m.acquire().await });
    let queue = await_nodes(&new, &path, "the new session queued", |n| n.len() == 2).await?;
    ensure!(queue[0].owner == old.session_id() && queue[1].owner == new.session_id());
    ensure!(!waiting.is_finished());
    old.faults().context("faults")?.expire().await?;
    let after = tokio::time::timeout(WITHIN, waiting).await???;
    ensure!(after.node() == queue[1].path && !after.is_lost() && before.is_lost());
    ensure!(matches!(before.release().await, Err(Error::Lost { .. })));
    after.release().await?;

    // 2. A waiter whose session is replaced while its old node is listed.
    let (holder, waiter) = (h.session().await, h.session().await);
    let held = Mutex::new(&holder, &path)?.acquire().await?;
    let m = Mutex::new(&waiter, &path)?;
    let waiting = tokio::spawn(async move { m.acquire().await });
    let queue = await_nodes(&holder, &path, "the waiter queued", |n| n.len() == 2).await?;
    let (old_node, old_session) = (queue[1].path.clone(), waiter.session_id());
    waiter.faults().context("faults")?.suspend(h.timeout() * 2);
    held.release().await?;
    let got = tokio::time::timeout(WITHIN, waiting).await???;
    ensure!(
        got.node() != old_node,
        "acquired with the node of its lost session"
    );
    ensure!(!got.is_lost() && waiter.session_id() != old_session);
    let stat = waiter
        .exists(got.node())
        .await?
        .context("the new node exists")?;
    ensure!(stat.ephemeral_owner == waiter.session_id());
    await_gone(&holder, &old_node, WITHIN).await?;
    got.release().await?;
    Ok(())
}

/// CURATOR-315 ("Reconnect during InterProcessSemaphoreV2.acquire can lead
/// to orphaned node"; later acquires fail once the orphans fill the
/// maximum): the connection blips while X creates its lease node — the
/// create is applied, its reply lost. X finds its node again by its
/// protection prefix and waits with exactly one lease node; no orphan is
/// left, and the semaphore's one lease can be had again afterwards.
///
/// X queues on the internal lock behind Y (who holds it while waiting for
/// the lease H holds), so that X's next create is its lease node.
async fn a_reconnect_during_a_lease_acquire_leaves_no_orphan(h: &Harness) -> Result<()> {
    let (sh, sy, sx) = (h.session().await, h.session().await, h.session().await);
    let path = h.path("/semaphore");
    let (locks, leases) = (format!("{path}/locks"), format!("{path}/leases"));
    let held = Semaphore::new(&sh, &path, 1)?.acquire_one().await?;
    let y = Semaphore::new(&sy, &path, 1)?;
    let y_waiting = tokio::spawn(async move { y.acquire_one().await });
    await_nodes(&sh, &leases, "Y's lease node", |n| n.len() == 2).await?;
    let x = Semaphore::new(&sx, &path, 1)?;
    let x_waiting = tokio::spawn(async move { x.acquire_one().await });
    await_nodes(&sh, &locks, "X queued on the internal lock", |n| {
        n.len() == 2 && n[1].owner == sx.session_id()
    })
    .await?;
    let retries = sx.retries();
    sx.faults().context("faults")?.lose_next_create_reply();
    held.release().await?;
    let ly = tokio::time::timeout(WITHIN, y_waiting).await???;
    let with_x = await_nodes(&sh, &leases, "X's lease node", |n| {
        n.iter().any(|n| n.owner == sx.session_id())
    })
    .await?;
    ensure!(
        with_x.len() == 2 && with_x.iter().filter(|n| n.owner == sx.session_id()).count() == 1,
        "one lease node for X, no orphan: {with_x:?}"
    );
    ensure!(
        !x_waiting.is_finished(),
        "X got a lease while Y held the only one"
    );
    ly.release().await?;
    let lx = tokio::time::timeout(WITHIN, x_waiting).await???;
    ensure!(sx.retries() > retries, "the lost create was retried");
    ensure!(nodes(&sh, &leases).await?.len() == 1 && !lx.is_lost());
    lx.release().await?;
    await_children(&sh, &leases, 0, WITHIN).await?;
    let again = Semaphore::new(&sh, &path, 1)?
        .try_acquire(1)
        .await?
        .context("the only lease is free again")?;
    for lease in again {
        lease.release().await?;
    }
    Ok(())
}

/// CURATOR-315 and CURATOR-595 ("LOST isn't releasing permits for other
/// clients"): the holder of the only lease dies without a word — no
/// release, no close, its connection silent past the session timeout. Its
/// lease must not count forever: the server reaps it with the session and
/// the waiting client gets the lease. The dead holder learns it lost, and
/// its late release takes nothing from the new holder.
async fn an_orphaned_lease_is_reclaimed(h: &Harness) -> Result<()> {
    let lot = rivals(h, "/semaphore", |s, p| Semaphore::new(s, p, 1)).await?;
    let (dead, live, path, sem) = (&lot.first, &lot.second, &lot.path, &lot.theirs);
    let leases = format!("{path}/leases");
    let orphan = lot.mine.acquire_one().await?;
    ensure!(sem.try_acquire(1).await?.is_none(), "the lease is taken");
    let waiter = sem.clone();
    let waiting = tokio::spawn(async move { waiter.acquire_one().await });
    await_nodes(live, &leases, "the waiter's lease node", |n| n.len() == 2).await?;
    let old = dead.session_id();
    dead.faults().context("faults")?.suspend(h.timeout() * 2);
    let lease = tokio::time::timeout(WITHIN + h.timeout(), waiting).await???;
    tokio::time::timeout(WITHIN, orphan.lost()).await?;
    ensure!(orphan.is_lost() && (dead.session_id() != old || dead.state() == SessionState::Lost));
    await_gone(live, orphan.node(), WITHIN).await?;
    ensure!(!lease.is_lost() && lease.token() > orphan.token());
    let err = orphan.release().await.unwrap_err();
    ensure!(matches!(err, Error::Lost { .. }), "{err}");
    let left = nodes(live, &leases).await?;
    ensure!(
        left.len() == 1 && left[0].path == lease.node(),
        "only the new holder's lease: {left:?}"
    );
    lease.release().await?;
    let again = sem.try_acquire(1).await?.context("the lease is free")?;
    for lease in again {
        lease.release().await?;
    }
    Ok(())
}

/// CURATOR-462 (a semaphore acquire "interrupted at the wrong time" left its
/// node behind), in its narrowest window: the acquire is cancelled after
/// its create was applied but before it knew — the reply was lost and the
/// acquire is backing off before looking for its node. The node is found by
/// its protection prefix and deleted in the background; the lock is free.
/// (Cancelling a queued waiter is `mutex::timeouts_and_cancellation_leave_nothing`
/// and `semaphore::a_cancelled_acquire_leaves_nothing`.)
async fn cancelling_an_acquire_leaves_no_node(h: &Harness) -> Result<()> {
    // A second's backoff: the cancellation lands inside it.
    let s = session_retrying_after(h, Duration::from_secs(1)).await;
    let path = h.path("/locks/cancelled");
    let m = Mutex::new(&s, &path)?;
    s.faults().context("faults")?.lose_next_create_reply();
    let acquiring = tokio::spawn(async move { m.acquire().await });
    let created = await_nodes(&s, &path, "the applied create", |n| n.len() == 1).await?;
    acquiring.abort();
    let outcome = acquiring.await;
    ensure!(
        outcome.as_ref().is_err_and(|e| e.is_cancelled()),
        "the acquire was still unfinished: {outcome:?}"
    );
    await_gone(&s, &created[0].path, WITHIN).await?;
    let other = h.session().await;
    let tried = Mutex::new(&other, &path)?.try_acquire().await?;
    release_tried(tried, "the lock is free").await
}

/// kazoo#649 (a read lock counted writers queued *behind* it and
/// deadlocked): a reader queued between a holding writer and a later
/// writer gets in as soon as the first writer is done; the later writer
/// waits for the reader.
async fn a_reader_is_not_blocked_by_a_writer_queued_behind_it(h: &Harness) -> Result<()> {
    let (s1, s2, s3) = (h.session().await, h.session().await, h.session().await);
    let path = h.path("/rw");
    let w1 = ReadWriteLock::new(&s1, &path)?.write().await?;
    let reader = ReadWriteLock::new(&s2, &path)?;
    let reading = tokio::spawn(async move { reader.read().await });
    await_nodes(&s1, &path, "the reader queued", |n| n.len() == 2).await?;
    let writer = ReadWriteLock::new(&s3, &path)?;
    let writing = tokio::spawn(async move { writer.write().await });
    await_nodes(&s1, &path, "the second writer queued", |n| n.len() == 3).await?;
    w1.release().await?;
    let r = tokio::time::timeout(WITHIN, reading).await???;
    let queue = ReadWriteLock::new(&s1, &path)?.participants().await?;
    ensure!(
        queue.len() == 2 && queue[0].node == r.node() && queue[0].holds && !queue[1].holds,
        "{queue:#?}"
    );
    ensure!(!writing.is_finished(), "the writer got in past the reader");
    r.release().await?;
    finished(writing, WITHIN).await?.release().await?;
    Ok(())
}

/// kazoo#760/#732 (a non-blocking acquire that hit SUSPENDED left an
/// orphaned contender node): try-locks through a lost create reply and
/// through a suspension leave exactly the nodes they should.
async fn a_non_blocking_acquire_through_a_connection_blip_leaves_no_node(
    h: &Harness,
) -> Result<()> {
    let (holder, c) = (h.session().await, h.session().await);
    let path = h.path("/locks/try");
    let m = Mutex::new(&c, &path)?;
    let faults = c.faults().context("faults")?;
    // Free: the try-lock's create is applied, its reply lost; it adopts
    // the node and holds with exactly one.
    faults.lose_next_create_reply();
    let g = m.try_acquire().await?.context("the lock was free")?;
    let one = nodes(&holder, &path).await?;
    ensure!(one.len() == 1 && one[0].path == g.node(), "{one:?}");
    g.release().await?;
    // Held: a zero-timeout acquire whose create reply is lost, then one
    // issued while suspended, both time out and take their node with them.
    let held = Mutex::new(&holder, &path)?.acquire().await?;
    faults.lose_next_create_reply();
    let err = m.acquire_timeout(Duration::ZERO).await.unwrap_err();
    ensure!(err == Error::Timeout(Duration::ZERO), "{err}");
    ensure!(nodes(&holder, &path).await?.len() == 1, "no orphan");
    faults.suspend(h.timeout() / 4);
    let err = m.acquire_timeout(Duration::ZERO).await.unwrap_err();
    ensure!(err == Error::Timeout(Duration::ZERO), "{err}");
    // Free of the suspension by now, or not (Consul's is 2.5 s, past the
    // clean-up grace): either answer leaves no node.
    let now = m.try_acquire().await.map(|g| g.is_some());
    ensure!(
        matches!(now, Ok(false) | Err(Error::ConnectionLoss)),
        "{now:?}"
    );
    let left = nodes(&holder, &path).await?;
    ensure!(
        left.len() == 1 && left[0].path == held.node(),
        "only the holder's node: {left:?}"
    );
    held.release().await?;
    Ok(())
}

/// §0.3 of the research note: the sequence suffix is not a fencing token —
/// it restarts when the lock directory is reaped and created again (as
/// Curator's `LockInternals.clean()` intends). The token (czxid, etcd
/// create revision) keeps growing across the recreation.
async fn tokens_keep_growing_after_the_lock_directory_is_recreated(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/locks/recreated");
    let first = Mutex::new(&s, &path)?.acquire().await?;
    let (first_token, first_name) = (first.token(), first.node().to_string());
    first.release().await?;
    await_gone(&s, &path, WITHIN).await?;
    let second = Mutex::new(&s, &path)?.acquire().await?;
    ensure!(
        second.token() > first_token,
        "{} after {first_token}",
        second.token()
    );
    if matches!(
        s.backend(),
        dlock::store::BackendKind::Embedded | dlock::store::BackendKind::ZooKeeper
    ) {
        // ZooKeeper numbering (etcd's and Consul's suffixes are unique,
        // not counted).
        let key = |p: &str| sequence_key(p, &["lock-"]).to_string();
        ensure!(
            key(second.node()) == key(&first_name),
            "the sequence restarted with the directory: {first_name} then {}",
            second.node()
        );
    }
    second.release().await?;
    Ok(())
}

/// CURATOR-620 (two RECONNECTED events in quick succession) and
/// CURATOR-652/653 (both candidates suspended at once by an ensemble leader
/// change, then racing on reconnection): never two leaders at the same
/// time, and afterwards exactly one, with one node per candidate.
async fn quick_reconnections_never_make_two_leaders(h: &Harness) -> Result<()> {
    let (sa, sb) = (h.session().await, h.session().await);
    let path = h.path("/election");
    let a = LeaderLatch::new(&sa, &path)?.with_id("a");
    let b = LeaderLatch::new(&sb, &path)?.with_id("b");
    a.start()?;
    a.await_leadership_timeout(WITHIN).await?;
    b.start()?;
    await_nodes(&sa, &path, "both candidates", |n| n.len() == 2).await?;
    // A watcher of both leadership channels: any moment with two leaders.
    let both = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(tokio::sync::Notify::new());
    let monitor = {
        let (mut ca, mut cb) = (a.watch_leadership(), b.watch_leadership());
        let (both, stop) = (both.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                if ca.borrow_and_update().is_some() && cb.borrow_and_update().is_some() {
                    both.store(true, Ordering::SeqCst);
                }
                tokio::select! {
                    _ = ca.changed() => {}
                    _ = cb.changed() => {}
                    _ = stop.notified() => return,
                }
            }
        })
    };
    let outage = h.timeout() / 4;
    let (fa, fb) = (
        sa.faults().context("faults")?,
        sb.faults().context("faults")?,
    );
    for _ in 0..2 {
        // Both at once, then again right after the reconnection.
        fa.suspend(outage);
        fb.suspend(outage);
        for s in [&sa, &sb] {
            tokio::time::timeout(
                WITHIN,
                s.watch_status()
                    .wait_for(|st| st.state == SessionState::Reconnected),
            )
            .await??;
        }
    }
    // Settled: one leader, and its node is the first of the two. A latch
    // may still lead for a moment after its session's second blip, until
    // its task sees it, so this is judged on one look at both, again after
    // every change, not on reads spread over several waits.
    let settled = tokio::time::timeout(WITHIN, async {
        loop {
            // Armed before looking, so no change is missed.
            let (mut ca, mut cb) = (a.watch_leadership(), b.watch_leadership());
            let (_, children) = sa.children_watch(&path).await?;
            let now = nodes(&sa, &path).await?;
            let leader = match (a.has_leadership(), b.has_leadership()) {
                (true, false) => a.our_path(),
                (false, true) => b.our_path(),
                _ => None,
            };
            if now.len() == 2
                && now[0].owner != now[1].owner
                && leader.as_deref() == Some(now[0].path.as_str())
            {
                return anyhow::Ok(now);
            }
            tokio::select! {
                _ = ca.changed() => {}
                _ = cb.changed() => {}
                _ = children.changed() => {}
            }
        }
    })
    .await
    .context("one leader again, on the first node")??;
    stop.notify_one();
    monitor.await?;
    ensure!(
        !both.load(Ordering::SeqCst),
        "two leaders at once: {settled:?}"
    );
    a.close().await?;
    b.close().await?;
    Ok(())
}

// Every case on every backend.
per_backend!(every_backend {
    a_session_expiring_while_queued_never_acquires,
    a_queued_reader_losing_its_session_starts_over,
    a_lost_delete_reply_does_not_delete_a_newer_holder,
    a_new_session_ignores_its_old_sessions_node,
    a_reconnect_during_a_lease_acquire_leaves_no_orphan,
    an_orphaned_lease_is_reclaimed,
    cancelling_an_acquire_leaves_no_node,
    a_reader_is_not_blocked_by_a_writer_queued_behind_it,
    a_non_blocking_acquire_through_a_connection_blip_leaves_no_node,
    tokens_keep_growing_after_the_lock_directory_is_recreated,
    quick_reconnections_never_make_two_leaders,
});
