//! Revocation everywhere and hold limits (issue #22, items 1 and 2), on
//! every backend: a hold revoked by force, a hold past its maximum, and an
//! expired semaphore permit each show that the holder learns it at once
//! (its lost signal fires), that its guarded write is refused, and that the
//! next waiter proceeds within [`HANDOVER`] — while the holder's session
//! stays alive, so nobody waited for it to expire. Also: revocation
//! requests reach semaphore, KV-semaphore and `ConsulLock` holders, and a hold released
//! before its limit is never touched by it.

mod common;

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use common::{await_children, Harness};
use dlock::recipes::leader_latch::LeaderLatch;
use dlock::store::{CreateMode, CreateOptions, Op};
use dlock::{
    Acquisition, ConsulLock, Error, Hold, KvSemaphore, Layout, Mutex, ReadWriteLock, Semaphore,
    Session,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// The stated bound: from the revocation (or the limit) to the holder's
/// lost signal, and to the next waiter holding. One watch event and one
/// listing — far below every backend's session timeout in these tests
/// except the embedded store's, whose sessions are not expiring anyway.
const HANDOVER: Duration = Duration::from_secs(5);

/// The maximum hold time the limit tests ask for.
const MAX_HOLD: Duration = Duration::from_millis(300);

/// A persistent node the guarded writes aim at.
async fn fenced_resource(h: &Harness, session: &Session) -> Result<String> {
    let path = h.path("/resource");
    let opts = CreateOptions::new(CreateMode::Persistent).with_parents();
    session.create(&path, b"v0", opts).await?;
    Ok(path)
}

/// What every taken-away hold must show: lost at once, guarded write
/// refused, the session itself alive.
async fn shows_taken_away(held: &Acquisition, resource: &str, session: &Session) -> Result<()> {
    tokio::time::timeout(HANDOVER, held.lost())
        .await
        .context("the lost signal did not fire within the bound")?;
    ensure!(held.is_lost(), "lost() fired but is_lost() says held");
    refuses_late_writes(held, resource, session).await
}

/// A guarded write by `held` is refused and lands nothing; the session
/// itself is alive.
async fn refuses_late_writes(held: &Acquisition, resource: &str, session: &Session) -> Result<()> {
    let write = Op::SetData {
        path: resource.to_string(),
        data: b"late".to_vec(),
        version: None,
    };
    let refused = held.guarded(&[write]).await;
    ensure!(
        matches!(refused, Err(Error::Lost { .. })),
        "guarded write after the hold was taken away: {refused:?}"
    );
    let (data, _) = session.get_data(resource).await?;
    ensure!(data == b"v0", "the refused write landed: {data:?}");
    ensure!(
        !matches!(
            session.state(),
            dlock::SessionState::Lost | dlock::SessionState::Closed
        ),
        "the holder's session itself must still be alive"
    );
    Ok(())
}

/// A guarded write lands while the hold is ours (so a refusal later is the
/// revocation's doing).
async fn guarded_write_lands(held: &Acquisition, resource: &str) -> Result<()> {
    let write = Op::SetData {
        path: resource.to_string(),
        data: b"v0".to_vec(),
        version: None,
    };
    held.guarded(&[write]).await?;
    Ok(())
}

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> Result<T> {
    tokio::time::timeout(HANDOVER, f)
        .await
        .with_context(|| format!("{what} did not happen within {HANDOVER:?}"))
}

/// What every hold taken away while a waiter queues ends with: the holder
/// learns it at once ([`shows_taken_away`]), the waiter gets in within the
/// bound, the taken hold's release reports the loss. Returns the waiter's
/// hold.
async fn hands_over<N: Hold + 'static>(
    taken: impl Hold,
    waiting: JoinHandle<dlock::Result<N>>,
    resource: &str,
    holder: &Session,
) -> Result<N> {
    shows_taken_away(taken.acquisition(), resource, holder).await?;
    let next = within("the waiter's acquire", waiting).await???;
    ensure!(
        next.token() > taken.token(),
        "the next hold is fenced above the taken one"
    );
    let released = Box::new(taken).release().await;
    ensure!(
        matches!(released, Err(Error::Lost { .. })),
        "a taken hold's release reports the loss: {released:?}"
    );
    Ok(next)
}

/// An operator deletes `node` by force once `queue` lists `queued` nodes
/// (the holder's and the waiter's).
async fn revoke_once_queued(
    operator: &Session,
    queue: &str,
    queued: usize,
    node: &str,
) -> Result<()> {
    await_children(operator, queue, queued, HANDOVER).await?;
    dlock::revoke_forced(operator, node).await?;
    Ok(())
}

/// A hold revoked by force while a waiter queues: `hold` takes the hold
/// in the holder's session (a guarded write lands), then `wait` queues in
/// the waiter's; an operator deletes the holder's node once `queue` lists
/// `queued` nodes, and the hold [`hands_over`]. Returns the waiter's hold
/// and the operator's session.
async fn revoked_by_force<H, N, Held, Waited>(
    h: &Harness,
    queue: &str,
    queued: usize,
    hold: impl FnOnce(Session) -> Held,
    wait: impl FnOnce(Session) -> Waited,
) -> Result<(N, Session)>
where
    H: Hold,
    N: Hold + 'static,
    Held: std::future::Future<Output = dlock::Result<H>>,
    Waited: std::future::Future<Output = dlock::Result<N>> + Send + 'static,
{
    let (holder, waiter, operator) = (h.session().await, h.session().await, h.session().await);
    let resource = fenced_resource(h, &holder).await?;
    let taken = hold(holder.clone()).await?;
    guarded_write_lands(taken.acquisition(), &resource).await?;
    let waiting = tokio::spawn(wait(waiter));
    revoke_once_queued(&operator, queue, queued, taken.acquisition().node()).await?;
    let next = hands_over(taken, waiting, &resource, &holder).await?;
    holder.delete(&resource, None).await?;
    Ok((next, operator))
}

/// A recipe of one permit whose holds these tests take away.
trait OnePermit: Sized + Send + 'static {
    type Held: Hold + 'static;
    /// The recipe at `path`, in `session`.
    fn at(session: &Session, path: &str) -> dlock::Result<Self>;
    /// A hold of it ends by itself after `max_hold`.
    fn limited_to(self, max_hold: Duration) -> Self;
    /// Takes its permit.
    fn take(self) -> impl std::future::Future<Output = dlock::Result<Self::Held>> + Send;
}

/// The recipes' `OnePermit`: each made with one permit, limited and
/// taken as its own type does.
macro_rules! one_permit {
    ($($recipe:ident => $held:ty, |$s:ident, $p:ident| $made:expr, |$r:ident| $taken:expr;)*) => {$(
        impl OnePermit for $recipe {
            type Held = $held;
            fn at($s: &Session, $p: &str) -> dlock::Result<Self> {
                $made
            }
            fn limited_to(self, max_hold: Duration) -> Self {
                self.with_max_hold(max_hold)
            }
            async fn take(self) -> dlock::Result<Self::Held> {
                let $r = self;
                $taken.await
            }
        }
    )*};
}

one_permit! {
    Mutex => dlock::MutexGuard, |s, p| Mutex::new(s, p), |m| m.acquire();
    Semaphore => dlock::Lease, |s, p| Semaphore::new(s, p, 1), |sem| sem.acquire_one();
    KvSemaphore => dlock::KvLease, |s, p| KvSemaphore::new(s, p, 1), |sem| sem.acquire();
    ConsulLock => dlock::LockGuard, |s, p| ConsulLock::new(s, p), |lock| lock.acquire();
}

/// `session` takes `P`'s permit at `path`, limited to `max_hold` if given.
fn take_at<P: OnePermit>(
    session: &Session,
    path: &str,
    max_hold: Option<Duration>,
) -> impl std::future::Future<Output = dlock::Result<P::Held>> + Send + 'static {
    let made = P::at(session, path).map(|p| match max_hold {
        Some(max_hold) => p.limited_to(max_hold),
        None => p,
    });
    async move { made?.take().await }
}

/// CURATOR-150: an operator deletes a mutex holder's node.
async fn a_mutex_holder_revoked_by_force(h: &Harness) -> Result<()> {
    let path = h.path("/locks/forced");
    let acquire = |session: Session| take_at::<Mutex>(&session, &path, None);
    let (next, _) = revoked_by_force(h, &path, 2, acquire, acquire).await?;
    next.release().await?;
    Ok(())
}

/// The write half of a read-write lock revoked by force lets the reader in.
async fn a_writer_revoked_by_force(h: &Harness) -> Result<()> {
    let path = h.path("/locks/rw");
    let lock = |session: Session| ReadWriteLock::new(&session, &path);
    let write = |session| {
        let lock = lock(session);
        async move { lock?.write().await }
    };
    let read = |session| {
        let lock = lock(session);
        async move { lock?.read().await }
    };
    let (reading, _) = revoked_by_force(h, &path, 2, write, read).await?;
    reading.release().await?;
    Ok(())
}

/// A semaphore lease revoked by force frees its permit for the waiter.
async fn a_semaphore_lease_revoked_by_force(h: &Harness) -> Result<()> {
    let path = h.path("/sem/forced");
    let acquire = |session: Session| take_at::<Semaphore>(&session, &path, None);
    let leases = format!("{path}/leases");
    let (next, _) = revoked_by_force(h, &leases, 2, acquire, acquire).await?;
    next.release().await?;
    Ok(())
}

/// A KvSemaphore entry deleted by force: the holder learns it, a waiting
/// contender prunes it and takes the slot — in both layouts.
async fn a_kv_lease_revoked_by_force(h: &Harness) -> Result<()> {
    for layout in [Layout::Curator, Layout::Consul] {
        let path = h.path(&format!("/kv/forced-{layout}"));
        let kv = |session: &Session| -> dlock::Result<KvSemaphore> {
            Ok(KvSemaphore::new(session, &path, 1)?.with_layout(layout))
        };
        let acquire = |session: Session| {
            let sem = kv(&session);
            async move { sem?.acquire().await }
        };
        // The record and both entries.
        let (next, operator) = revoked_by_force(h, &path, 3, acquire, acquire).await?;
        let holders = kv(&operator)?.holders().await?;
        ensure!(holders == [next.holder()], "{layout}: {holders:?}");
        next.release().await?;
    }
    Ok(())
}

/// A `KvSemaphore` lease revoked by force, unwatched, and the slot taken
/// again by another handle of the same session, whose entry has the same
/// name: the new lease has a token of its own, the revoked lease's guarded
/// writes are refused, and its release reports the loss and takes nothing
/// from the new lease. (Before, the new lease reused the revoked one's
/// token, the revoked one's writes landed, and its release took the
/// session's id out of the record and deleted the new entry by name: a
/// slot held by nobody the record knew.)
async fn a_kv_lease_revoked_by_force_spares_its_sessions_next_lease(h: &Harness) -> Result<()> {
    let (holder, other, operator) = (h.session().await, h.session().await, h.session().await);
    let resource = fenced_resource(h, &holder).await?;
    let path = h.path("/kv/same-session");
    let old = KvSemaphore::new(&holder, &path, 1)?.acquire().await?;
    dlock::revoke_forced(&operator, old.node()).await?;
    let next = KvSemaphore::new(&holder, &path, 1)?
        .acquire_timeout(HANDOVER)
        .await?;
    // It took the place the record still listed for our session, by a
    // write of its own: a token of its own.
    ensure!(
        next.token() > old.token(),
        "the next lease's token {:?} is not above the revoked one's {:?}",
        next.token(),
        old.token()
    );
    refuses_late_writes(&old, &resource, &holder).await?;
    let released = old.release().await;
    ensure!(
        matches!(released, Err(Error::Lost { .. })),
        "the revoked lease's release said {released:?}"
    );
    ensure!(!next.is_lost(), "the next lease was lost");
    guarded_write_lands(&next, &resource).await?;
    let outsider = KvSemaphore::new(&other, &path, 1)?.try_acquire().await?;
    ensure!(outsider.is_none(), "a second holder got the one slot");
    next.release().await?;
    holder.delete(&resource, None).await?;
    Ok(())
}

/// A `ConsulLock`'s `.lock` deleted by force. Its waiters have no node of
/// their own (they watch `.lock`), so the operator acts once the holder's
/// node is there; the waiter either already waits on it or finds it gone.
async fn a_consul_lock_holder_revoked_by_force(h: &Harness) -> Result<()> {
    let path = h.path("/consul-lock/forced");
    let acquire = |session: Session| take_at::<ConsulLock>(&session, &path, None);
    let (next, operator) = revoked_by_force(h, &path, 1, acquire, acquire).await?;
    // The revoked holder's release came after the next holder made
    // `.lock` again: it must not have taken that node.
    let now = operator.exists(next.node()).await?;
    ensure!(
        now.is_some_and(|stat| stat.czxid == next.token().0) && !next.is_lost(),
        "the revoked holder's release took the next holder's node: {now:?}"
    );
    next.release().await?;
    Ok(())
}

/// A `ConsulLock` holder that never asked whether it was lost, its `.lock`
/// deleted by force and made again by the next holder: its guarded writes
/// are refused. (Where a store's check only finds a node at the name —
/// ZooKeeper, embedded — they landed, as nothing had watched the node.)
/// Also when the next holder is in the holder's own session: there the
/// check finds the session's newest node at the name (etcd, Consul), and
/// the writes landed while the next holder held the lock.
async fn an_unwatched_consul_lock_revoked_by_force_writes_nothing(h: &Harness) -> Result<()> {
    let (holder, other, operator) = (h.session().await, h.session().await, h.session().await);
    let resource = fenced_resource(h, &holder).await?;
    for next_holder in [&other, &holder] {
        let path = h.path("/consul-lock/unwatched");
        let held = ConsulLock::new(&holder, &path)?.acquire().await?;
        guarded_write_lands(held.acquisition(), &resource).await?;
        dlock::revoke_forced(&operator, held.node()).await?;
        let next = ConsulLock::new(next_holder, &path)?
            .acquire_timeout(HANDOVER)
            .await?;
        refuses_late_writes(held.acquisition(), &resource, &holder).await?;
        ensure!(!next.is_lost(), "the next holder lost the lock");
        next.release().await?;
        let _ = held.release().await;
    }
    holder.delete(&resource, None).await?;
    Ok(())
}

/// `P`'s hold revoked by force while its holder never asked whether it
/// was lost: nothing watched its node, so only the release's own delete
/// can find it gone, and it must report the loss all the same.
async fn unwatched_and_revoked<P: OnePermit>(h: &Harness, path: &str) -> Result<()> {
    let (holder, operator) = (h.session().await, h.session().await);
    let held = take_at::<P>(&holder, path, None).await?;
    dlock::revoke_forced(&operator, held.acquisition().node()).await?;
    let released = Box::new(held).release().await;
    ensure!(
        matches!(released, Err(Error::Lost { .. })),
        "{path}: the release of a hold revoked by force said {released:?}"
    );
    Ok(())
}

/// Every one-permit hold revoked by force, unwatched, reports the loss
/// when released (its release found its node gone).
async fn an_unwatched_hold_revoked_by_force_reports_the_loss(h: &Harness) -> Result<()> {
    unwatched_and_revoked::<Mutex>(h, &h.path("/unwatched/mutex")).await?;
    unwatched_and_revoked::<Semaphore>(h, &h.path("/unwatched/semaphore")).await?;
    unwatched_and_revoked::<KvSemaphore>(h, &h.path("/unwatched/kv")).await?;
    unwatched_and_revoked::<ConsulLock>(h, &h.path("/unwatched/consul-lock")).await
}

/// A leader whose node is deleted by force loses its term at once.
async fn a_leader_revoked_by_force(h: &Harness) -> Result<()> {
    let (holder, operator) = (h.session().await, h.session().await);
    let resource = fenced_resource(h, &holder).await?;
    let path = h.path("/election");
    let latch = LeaderLatch::new(&holder, &path)?;
    latch.start()?;
    let term = within("leadership", latch.await_leadership()).await??;
    guarded_write_lands(&term, &resource).await?;
    dlock::revoke_forced(&operator, term.node()).await?;
    shows_taken_away(&term, &resource, &holder).await?;
    latch.close().await?;
    holder.delete(&resource, None).await?;
    Ok(())
}

/// CURATOR-28 / Redisson's leaseTime: a mutex hold past its maximum ends by
/// itself while the holder does nothing (stuck), and the waiter gets in.
async fn a_mutex_hold_past_its_maximum(h: &Harness) -> Result<()> {
    let (holder, waiter) = (h.session().await, h.session().await);
    let resource = fenced_resource(h, &holder).await?;
    let path = h.path("/locks/limited");
    let guard = Mutex::new(&holder, &path)?
        .with_max_hold(MAX_HOLD)
        .acquire()
        .await?;
    let acquired = tokio::time::Instant::now();
    guarded_write_lands(&guard, &resource).await?;
    let next = Mutex::new(&waiter, &path)?;
    let waiting = tokio::spawn(async move { next.acquire().await });
    let next = hands_over(guard, waiting, &resource, &holder).await?;
    ensure!(
        acquired.elapsed() >= MAX_HOLD,
        "ended before its maximum: {:?}",
        acquired.elapsed()
    );
    next.release().await?;
    holder.delete(&resource, None).await?;
    Ok(())
}

/// A session whose retries end soon: a read that fails twice is given up.
async fn giving_up_soon(h: &Harness) -> Session {
    let retry = dlock::RetryPolicy {
        base_sleep: Duration::from_millis(1),
        max_sleep: Duration::from_millis(5),
        max_retries: 1,
    };
    h.session_with(dlock::SessionOptions::default().with_retry(retry))
        .await
}

/// A holder whose first look at its node for a forced removal fails
/// through every retry (requests timing out on a live connection) looks
/// again: the removal is still told (before, that watch gave up for good,
/// and `lost()` never fired).
async fn a_forced_removal_is_told_after_failed_reads(h: &Harness) -> Result<()> {
    let (holder, other) = (giving_up_soon(h).await, h.session().await);
    let path = h.path("/locks/failed-reads");
    let guard = Mutex::new(&holder, &path)?.acquire().await?;
    holder.faults().context("faults")?.fail_next_reads(2);
    {
        let lost = guard.lost();
        tokio::pin!(lost);
        ensure!(futures::poll!(&mut lost).is_pending(), "lost at once");
        dlock::revoke_forced(&other, guard.node()).await?;
        within("the forced removal being told", lost).await?;
    }
    let released = guard.release().await;
    ensure!(matches!(released, Err(Error::Lost { .. })), "{released:?}");
    Ok(())
}

/// A hold past its maximum whose node's deletion fails through every
/// retry (its read first, where the store cannot fence a delete by its
/// creation) is deleted all the same, in the background: the waiter gets
/// in (before, the node stayed until the session ended).
async fn an_expired_hold_whose_delete_failed_is_deleted_later(h: &Harness) -> Result<()> {
    let (holder, waiter) = (giving_up_soon(h).await, h.session().await);
    let path = h.path("/locks/limited-failing");
    let guard = Mutex::new(&holder, &path)?
        .with_max_hold(MAX_HOLD)
        .acquire()
        .await?;
    holder.faults().context("faults")?.fail_next_reads(2);
    let next = within(
        "the waiter getting in",
        Mutex::new(&waiter, &path)?.acquire(),
    )
    .await??;
    ensure!(guard.is_lost(), "the first hold ended at its maximum");
    next.release().await?;
    let _ = guard.release().await;
    Ok(())
}

/// A hold given back before its maximum is not touched by the limit —
/// not even when the same client holds the same lock again (on etcd, under
/// the same key name).
async fn a_hold_released_in_time_stands_the_limit_down(h: &Harness) -> Result<()> {
    let holder = h.session().await;
    let path = h.path("/locks/in-time");
    let limited = Mutex::new(&holder, &path)?.with_max_hold(MAX_HOLD);
    limited.acquire().await?.release().await?;
    let again = Mutex::new(&holder, &path)?.acquire().await?;
    let started = tokio::time::Instant::now();
    // Past the first hold's limit, by a margin: nothing must fire.
    let fired = tokio::time::timeout(MAX_HOLD * 3, again.lost()).await;
    ensure!(
        fired.is_err() && !again.is_lost(),
        "a limit fired for a hold that had been released ({:?})",
        started.elapsed()
    );
    ensure!(Mutex::new(&holder, &path)?.participants().await?.len() == 1);
    again.release().await?;
    Ok(())
}

/// An expired permit goes to the waiting acquirer at once: the holder's
/// `P` at `path` is limited to [`MAX_HOLD`], the waiter's is not.
async fn an_expired_permit_goes_to_the_waiter<P: OnePermit>(h: &Harness, path: &str) -> Result<()> {
    let (holder, waiter) = (h.session().await, h.session().await);
    let resource = fenced_resource(h, &holder).await?;
    let lease = take_at::<P>(&holder, path, Some(MAX_HOLD)).await?;
    let waiting = tokio::spawn(take_at::<P>(&waiter, path, None));
    let next = hands_over(lease, waiting, &resource, &holder).await?;
    Box::new(next).release().await?;
    holder.delete(&resource, None).await?;
    Ok(())
}

/// Redisson's PermitExpirableSemaphore: an expired permit goes to the
/// waiting acquirer at once.
async fn an_expired_semaphore_permit(h: &Harness) -> Result<()> {
    an_expired_permit_goes_to_the_waiter::<Semaphore>(h, &h.path("/sem/expiring")).await
}

/// An expired KvSemaphore slot: the entry goes, the waiter prunes it.
async fn an_expired_kv_permit(h: &Harness) -> Result<()> {
    an_expired_permit_goes_to_the_waiter::<KvSemaphore>(h, &h.path("/kv/expiring")).await
}

/// A `ConsulLock` hold past its maximum: `.lock` goes, the waiter takes it.
async fn an_expired_consul_lock(h: &Harness) -> Result<()> {
    an_expired_permit_goes_to_the_waiter::<ConsulLock>(h, &h.path("/consul-lock/expiring")).await
}

/// A revocation request reaches a `ConsulLock` holder and takes nothing by
/// itself: the lock stays held (a contender is refused) until the holder
/// cooperates.
async fn revocation_requests_reach_consul_lock_holders(h: &Harness) -> Result<()> {
    let (holder, other) = (h.session().await, h.session().await);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let path = h.path("/consul-lock/revocable");
    let guard = ConsulLock::new(&holder, &path)?
        .revocable(move |node: &str| {
            let _ = tx.send(node.to_string());
        })
        .acquire()
        .await?;
    dlock::revoke(&other, guard.node()).await?;
    let asked = within("the lock holder being told", rx.recv()).await?;
    ensure!(asked.as_deref() == Some(guard.node()), "told {asked:?}");
    ensure!(
        !guard.is_lost(),
        "a revocation request takes nothing by itself"
    );
    let contender = ConsulLock::new(&other, &path)?;
    ensure!(contender.try_acquire().await?.is_none(), "still held");
    guard.release().await?;
    contender.acquire().await?.release().await?;
    Ok(())
}

/// CURATOR-650: revocation requests reach semaphore lease holders, and
/// KvSemaphore slot holders; the holder cooperates and the waiter gets in.
async fn revocation_requests_reach_semaphore_holders(h: &Harness) -> Result<()> {
    let (holder, other) = (h.session().await, h.session().await);
    let (tx, mut rx) = mpsc::unbounded_channel();
    // A holder that is asked to let go passes the node on to the test.
    let tell = move |node: &str| {
        let _ = tx.send(node.to_string());
    };
    let path = h.path("/sem/revocable");
    let sem = Semaphore::new(&holder, &path, 1)?.revocable(tell.clone());
    let lease = sem.acquire_one().await?;
    ensure!(
        lease.data().is_empty(),
        "revocable lease nodes carry no data"
    );
    dlock::revoke(&other, lease.node()).await?;
    let asked = within("the lease holder being told", rx.recv()).await?;
    ensure!(asked.as_deref() == Some(lease.node()));
    // Asked again (the holder let the first pass): told again. (Not so for
    // a ConsulLock's or a KvSemaphore's key on Consul: a tagged key keeps
    // its flags, and Consul does not record a write that changes nothing.)
    dlock::revoke(&other, lease.node()).await?;
    let again = within("the lease holder being told again", rx.recv()).await?;
    ensure!(again.as_deref() == Some(lease.node()), "told {again:?}");
    ensure!(
        !lease.is_lost(),
        "a revocation request takes nothing by itself"
    );
    lease.release().await?;

    let kv_path = h.path("/kv/revocable");
    let slot = KvSemaphore::new(&holder, &kv_path, 1)?
        .revocable(tell)
        .acquire()
        .await?;
    let kv_other = KvSemaphore::new(&other, &kv_path, 1)?;
    ensure!(kv_other.holders().await? == [slot.holder()]);
    dlock::revoke(&other, slot.node()).await?;
    let asked = within("the slot holder being told", rx.recv()).await?;
    ensure!(asked.as_deref() == Some(slot.node()));
    // The request changes nobody's view of who holds.
    ensure!(kv_other.holders().await? == [slot.holder()]);
    ensure!(kv_other.try_acquire().await?.is_none());
    slot.release().await?;
    kv_other.acquire().await?.release().await?;
    Ok(())
}

/// Only a participant's node is revoked: a node no session owns (a
/// lock's directory, a shared count) is refused both ways and left as it
/// was (before, a request overwrote a count's bytes, and by force deleted
/// it); a node already gone is fine.
async fn only_a_participants_node_is_revoked(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/revoke/ownerless");
    let guard = Mutex::new(&s, &path)?.acquire().await?;
    let count = h.path("/revoke/ownerless-count");
    s.create(&count, b"7", common::persistent()).await?;
    for node in [path.as_str(), count.as_str()] {
        let asked = dlock::revoke(&s, node).await;
        ensure!(
            matches!(asked, Err(Error::InvalidArgument(_))),
            "revoke {node}: {asked:?}"
        );
        let forced = dlock::revoke_forced(&s, node).await;
        ensure!(
            matches!(forced, Err(Error::InvalidArgument(_))),
            "revoke_forced {node}: {forced:?}"
        );
    }
    ensure!(s.get_data(&count).await?.0 == b"7", "the count was touched");
    ensure!(!guard.is_lost(), "the holder lost its lock");
    let node = guard.node().to_string();
    guard.release().await?;
    dlock::revoke(&s, &node).await?;
    dlock::revoke_forced(&s, &node).await?;
    s.delete(&count, None).await?;
    Ok(())
}

per_backend!(every_backend {
    only_a_participants_node_is_revoked,
    a_mutex_holder_revoked_by_force,
    a_writer_revoked_by_force,
    a_semaphore_lease_revoked_by_force,
    a_kv_lease_revoked_by_force,
    a_kv_lease_revoked_by_force_spares_its_sessions_next_lease,
    a_leader_revoked_by_force,
    a_consul_lock_holder_revoked_by_force,
    an_unwatched_consul_lock_revoked_by_force_writes_nothing,
    an_unwatched_hold_revoked_by_force_reports_the_loss,
    a_mutex_hold_past_its_maximum,
    a_forced_removal_is_told_after_failed_reads,
    an_expired_hold_whose_delete_failed_is_deleted_later,
    a_hold_released_in_time_stands_the_limit_down,
    an_expired_semaphore_permit,
    an_expired_kv_permit,
    an_expired_consul_lock,
    revocation_requests_reach_semaphore_holders,
    revocation_requests_reach_consul_lock_holders,
});
