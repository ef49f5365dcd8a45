//! Consul's layouts (`dlock::Layout::Consul`): the `api.Lock` layout of
//! [`ConsulLock`] and the `api.Semaphore` layout of the `KvSemaphore`, on
//! every backend; on Consul, the keys carry Consul's flag values.
//! Interop with the `consul lock` binary is in the CLI's
//! `consul_interop.rs`.

mod common;

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use common::tests1::rivals;
use common::Harness;
use dlock::recipes::layout::{CONSUL_LOCK_FLAGS, CONSUL_SEMAPHORE_FLAGS};
use dlock::store::{BackendKind, CreateMode, CreateOptions, Op};
use dlock::Error;
use dlock::{ConsulLock, KvSemaphore, Layout};

const WITHIN: Duration = Duration::from_secs(10);

/// One holder at a time; a waiter is woken by the release (a watch, no
/// retry sleep); tokens grow; release leaves nothing behind.
async fn consul_lock_excludes_and_hands_over(h: &Harness) -> Result<()> {
    let lock = rivals(h, "/lock", ConsulLock::new).await?;
    let (prefix, la, lb) = (lock.path, lock.mine, lock.theirs);
    let held = la.acquire().await?;
    ensure!(held.node() == format!("{prefix}/.lock"), "{}", held.node());
    ensure!(lb.try_acquire().await?.is_none(), "held by a");
    let first = held.token();
    let waiter = tokio::spawn(async move { lb.acquire_timeout(WITHIN).await });
    // The waiter has watched the node once it sees it held; give it the
    // chance to be waiting, then release: it must get in well before any
    // 5 s retry sleep would end.
    tokio::task::yield_now().await;
    let released = std::time::Instant::now();
    held.release().await?;
    let next = waiter.await??;
    ensure!(
        released.elapsed() < Duration::from_secs(3),
        "handed over in {:?}",
        released.elapsed()
    );
    ensure!(next.token() > first, "{} after {first}", next.token());
    ensure!(la.try_acquire().await?.is_none(), "held by b");
    next.release().await?;
    Ok(())
}

/// A key that `api.Lock` released (no owner, left until its `Destroy`) is
/// free: it is taken over, and a stale holder's key is not. It is told by
/// its flags: where the store drops tags, a node without an owner is
/// never taken for one (nothing but Consul's `api.Lock` leaves such keys).
async fn consul_lock_takes_over_a_released_key(h: &Harness) -> Result<()> {
    let (a, b) = (h.session().await, h.session().await);
    let prefix = h.path("/released");
    let node = format!("{prefix}/.lock");
    let opts = CreateOptions::new(CreateMode::Persistent)
        .with_parents()
        .with_tag(CONSUL_LOCK_FLAGS);
    a.create(&node, b"", opts).await?;
    if b.tag(&node).await?.is_none() {
        let refused = ConsulLock::new(&b, &prefix)?.try_acquire().await;
        ensure!(
            matches!(refused, Err(Error::InvalidArgument(_))),
            "an unowned node without the lock's flags: {refused:?}"
        );
        ensure!(b.exists(&node).await?.is_some(), "left alone");
        a.delete(&node, None).await?;
        return Ok(());
    }
    // Free, as `inspect` tells too: a mutex that nobody holds.
    let seen = dlock::inspect(&b, &prefix).await?;
    ensure!(
        seen.recipe == dlock::RecipeKind::Mutex && seen.participants.is_empty(),
        "{seen:?}"
    );
    let guard = ConsulLock::new(&b, &prefix)?
        .acquire_timeout(WITHIN)
        .await
        .context("a released key is free")?;
    let stat = b.exists(&node).await?.context("held")?;
    ensure!(stat.ephemeral_owner == b.session_id(), "{stat:?}");
    guard.release().await?;
    ensure!(a.exists(&node).await?.is_none());
    Ok(())
}

/// A `ConsulLock` whose create's reply was lost reads its key back as
/// ours: the store learns it as from the reply, so that a guarded write
/// under the lock fails once another session's key took the name — on the
/// stores that fence (etcd, Consul); ZooKeeper's check only asks that the
/// name exist.
async fn a_consul_lock_read_back_after_a_lost_reply_is_fenced(h: &Harness) -> Result<()> {
    let (a, b) = (h.session().await, h.session().await);
    let prefix = h.path("/read-back");
    let node = format!("{prefix}/.lock");
    a.faults().context("faults")?.lose_next_create_reply();
    let held = ConsulLock::new(&a, &prefix)?
        .acquire_timeout(WITHIN)
        .await?;
    ensure!(a.retries() > 0, "the create's reply was lost");
    let check = [Op::Check {
        path: node.clone(),
        version: None,
    }];
    a.multi(&check).await.context("held, the check passes")?;
    b.delete(&node, None).await?;
    let taken = ConsulLock::new(&b, &prefix)?
        .acquire_timeout(WITHIN)
        .await?;
    let checked = a.multi(&check).await;
    let fenced = matches!(a.backend(), BackendKind::Etcd | BackendKind::Consul);
    match (fenced, checked) {
        (true, Err(Error::MultiFailed { index: 0, source }))
            if matches!(&*source, Error::NoNode { .. }) => {}
        (false, Ok(_)) => {}
        (_, other) => bail!("fenced: {fenced}, the check after the key changed hands: {other:?}"),
    }
    taken.release().await?;
    let _ = held.release().await;
    Ok(())
}

/// Consul's semaphore layout: entries named after the native session id,
/// the record in Consul's format, the limit kept.
async fn kv_semaphore_consul_layout_keeps_the_limit(h: &Harness) -> Result<()> {
    let path = h.path("/sem");
    let sessions = [h.session().await, h.session().await, h.session().await];
    let sems: Vec<KvSemaphore> = sessions
        .iter()
        .map(|s| Ok(KvSemaphore::new(s, &path, 2)?.with_layout(Layout::Consul)))
        .collect::<Result<_>>()?;
    let one = sems[0].acquire_timeout(WITHIN).await?;
    let two = sems[1].acquire_timeout(WITHIN).await?;
    ensure!(one.holder() == sessions[0].native_session_id().1);
    ensure!(sems[2].try_acquire().await?.is_none(), "two of two taken");
    let (data, _) = sessions[0].get_data(&format!("{path}/.lock")).await?;
    let record: serde_json::Value = serde_json::from_slice(&data)?;
    ensure!(record["Limit"] == 2, "{record}");
    for s in &sessions[..2] {
        ensure!(
            record["Holders"][s.native_session_id().1] == true,
            "{record}"
        );
    }
    let third = sems[2].clone();
    let waiter = tokio::spawn(async move { third.acquire_timeout(WITHIN).await });
    one.release().await?;
    let three = waiter.await??;
    ensure!(three.holder() == sessions[2].native_session_id().1);
    // A holder whose session ended is pruned.
    sessions[1].close().await;
    let again = sems[0].acquire_timeout(WITHIN).await?;
    for lease in [again, three] {
        lease.release().await?;
    }
    drop(two);
    Ok(())
}

/// `inspect` tells both layouts: a ConsulLock is a mutex with its holder,
/// a Consul-layout semaphore lists its holders.
async fn inspect_reads_consuls_layouts(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let lock = ConsulLock::new(&s, &h.path("/il"))?.acquire().await?;
    let seen = dlock::inspect(&s, &h.path("/il")).await?;
    ensure!(seen.recipe == dlock::RecipeKind::Mutex, "{:?}", seen.recipe);
    ensure!(seen.participants.len() == 1 && seen.participants[0].node == lock.node());
    // dlock's own holders of Consul's layouts are not Consul's clients.
    ensure!(seen.participants[0].foreign.is_none(), "{seen:?}");
    lock.release().await?;
    let sem = KvSemaphore::new(&s, &h.path("/is"), 2)?.with_layout(Layout::Consul);
    let lease = sem.acquire().await?;
    let seen = dlock::inspect(&s, &h.path("/is")).await?;
    ensure!(
        seen.recipe == dlock::RecipeKind::KvSemaphore,
        "{:?}",
        seen.recipe
    );
    ensure!(seen.participants.len() == 1, "{:?}", seen.participants);
    ensure!(seen.participants[0].role == dlock::Role::Holder);
    ensure!(seen.participants[0].foreign.is_none(), "{seen:?}");
    lease.release().await?;
    Ok(())
}

/// A semaphore's record at `.lock` — held, or emptied by its last holder —
/// is not a lock's key: a `ConsulLock` on the same prefix fails with
/// `InvalidArgument` and leaves it (and its holder) alone, as `api.Lock`
/// answers `ErrLockConflict`.
async fn a_consul_lock_never_takes_a_semaphores_record(h: &Harness) -> Result<()> {
    let (a, b) = (h.session().await, h.session().await);
    for layout in [Layout::Consul, Layout::Curator] {
        let prefix = h.path(&format!("/shared-{layout}"));
        let sem = KvSemaphore::new(&a, &prefix, 2)?.with_layout(layout);
        let lease = sem.acquire().await?;
        let lock = ConsulLock::new(&b, &prefix)?;
        let refused = lock.try_acquire().await;
        ensure!(
            matches!(&refused, Err(Error::InvalidArgument(m)) if m.contains(".lock")),
            "{layout}, held: {refused:?}"
        );
        ensure!(
            sem.holders().await? == [lease.holder()],
            "{layout}: holder intact"
        );
        lease.release().await?;
        let refused = lock.try_acquire().await;
        ensure!(
            matches!(refused, Err(Error::InvalidArgument(_))),
            "{layout}, emptied: {refused:?}"
        );
        sem.acquire().await?.release().await?;
    }
    Ok(())
}

/// A timed acquire whose creates keep failing on a live connection (a
/// cluster without a leader, an overloaded one) ends within the clean-up
/// grace of its deadline with `Timeout`: the create of its key, run as a
/// task of its own, is not retried past the deadline (before, with the
/// default policy, it went on for about 11 s). Once creates pass again,
/// the same session takes both at once.
async fn a_timed_acquire_stops_retrying_failing_creates_at_its_deadline(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let faults = s.faults().context("faults")?;
    let timeout = Duration::from_millis(300);
    // The grace (1 s), and twice as much again for a loaded machine.
    let bound = timeout + Duration::from_secs(3);
    let (lock, sem) = (h.path("/failing-lock"), h.path("/failing-sem"));
    faults.fail_next_creates(u32::MAX);
    let started = tokio::time::Instant::now();
    let locked = ConsulLock::new(&s, &lock)?.acquire_timeout(timeout).await;
    let took = started.elapsed();
    ensure!(
        matches!(locked, Err(Error::Timeout(t)) if t == timeout),
        "lock: {locked:?}"
    );
    ensure!(
        took <= bound,
        "the lock ended after {took:?}, past {bound:?}"
    );
    let started = tokio::time::Instant::now();
    let leased = KvSemaphore::new(&s, &sem, 1)?
        .acquire_timeout(timeout)
        .await;
    let took = started.elapsed();
    ensure!(
        matches!(leased, Err(Error::Timeout(t)) if t == timeout),
        "semaphore: {leased:?}"
    );
    ensure!(
        took <= bound,
        "the semaphore ended after {took:?}, past {bound:?}"
    );
    faults.fail_next_creates(0);
    ConsulLock::new(&s, &lock)?
        .acquire()
        .await?
        .release()
        .await?;
    KvSemaphore::new(&s, &sem, 1)?
        .acquire()
        .await?
        .release()
        .await?;
    Ok(())
}

/// A lock key whose create landed unanswered, and could not be read back
/// (reads failing on a live connection), is ours and is deleted in the
/// background once reads pass again — not left, held by a live session
/// with no holder, to block every client of the lock until that session
/// ends (before, the clean-up tried once and gave up). More reads fail
/// than the acquire's and one clean-up's retries take together.
async fn a_lock_key_made_unanswered_and_unread_is_deleted_later(h: &Harness) -> Result<()> {
    let (s, observer) = (h.impatient_session().await, h.session().await);
    let faults = s.faults().context("faults")?;
    let prefix = h.path("/unread");
    let node = format!("{prefix}/.lock");
    faults.lose_next_create_reply();
    faults.fail_next_reads(60);
    let failed = ConsulLock::new(&s, &prefix)?.acquire().await.map(drop);
    ensure!(failed == Err(Error::ConnectionLoss), "{failed:?}");
    ensure!(observer.exists(&node).await?.is_some(), "the create landed");
    common::await_gone(&observer, &node, WITHIN).await?;
    let lock = ConsulLock::new(&observer, &prefix)?;
    lock.acquire_timeout(WITHIN).await?.release().await?;
    Ok(())
}

per_backend!(every_backend {
    a_timed_acquire_stops_retrying_failing_creates_at_its_deadline,
    a_lock_key_made_unanswered_and_unread_is_deleted_later,
    consul_lock_excludes_and_hands_over,
    consul_lock_takes_over_a_released_key,
    a_consul_lock_never_takes_a_semaphores_record,
    a_consul_lock_read_back_after_a_lost_reply_is_fenced,
    kv_semaphore_consul_layout_keeps_the_limit,
    inspect_reads_consuls_layouts,
});

/// On Consul the keys carry the flag values Consul's tools require.
#[cfg(feature = "consul")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_consul_the_keys_carry_consuls_flags() {
    let h = common::consul();
    let consul = dlock_testkit::shared_consul();
    let flags = |path: &str| -> Result<u64> {
        let (status, body) = consul.http("GET", &format!("/v1/kv{path}"), None)?;
        ensure!(status == 200, "{status} {body}");
        let v: serde_json::Value = serde_json::from_str(&body)?;
        v[0]["Flags"].as_u64().context("Flags")
    };
    let run = async {
        let s = h.session().await;
        let lock = ConsulLock::new(&s, &h.path("/l"))?.acquire().await?;
        ensure!(flags(&h.path("/l/.lock"))? == CONSUL_LOCK_FLAGS);
        lock.release().await?;
        let sem = KvSemaphore::new(&s, &h.path("/s"), 3)?.with_layout(Layout::Consul);
        let lease = sem.acquire().await?;
        ensure!(flags(&h.path("/s/.lock"))? == CONSUL_SEMAPHORE_FLAGS);
        ensure!(flags(&h.path(&format!("/s/{}", lease.holder())))? == CONSUL_SEMAPHORE_FLAGS);
        lease.release().await?;
        Ok(())
    };
    run.await.expect("flags");
    h.finish().await;
}

/// On Consul a semaphore's record can be deleted under dlock (`consul lock
/// -n` deletes it when it leaves last) and made again: a compare-and-set
/// on a version read from the old record never lands on the new one — a
/// tagged key's version is its `ModifyIndex`, which only grows.
#[cfg(feature = "consul")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_consul_a_record_made_again_never_takes_an_old_version() {
    let h = common::consul();
    let run = async {
        let s = h.session().await;
        let record = h.path("/s/.lock");
        let tagged = CreateOptions::new(CreateMode::Persistent)
            .with_parents()
            .with_tag(CONSUL_SEMAPHORE_FLAGS);
        let old = s
            .create(&record, br#"{"Limit":1,"Holders":{}}"#, tagged)
            .await?;
        s.delete(&record, None).await?;
        s.create(&record, br#"{"Limit":1,"Holders":{"b":true}}"#, tagged)
            .await?;
        let stale = s.set_data(
            &record,
            br#"{"Limit":1,"Holders":{"c":true}}"#,
            Some(old.stat.version),
        );
        let stale = stale.await;
        ensure!(matches!(stale, Err(Error::BadVersion { .. })), "{stale:?}");
        s.delete(&record, None).await?;
        Ok::<_, anyhow::Error>(())
    };
    run.await.expect("versions");
    h.finish().await;
}

/// `consul lock`'s sessions have a 15 s lock delay: once such a holder's
/// session is invalidated (here destroyed from outside, as when its TTL
/// runs out), Consul refuses to lock the key for that long. A waiting
/// `ConsulLock` waits it out and then gets the lock — neither failing nor
/// getting in early. (The holder's session here has a 4 s lock delay: the
/// mechanism is the same, the test shorter.)
#[cfg(feature = "consul")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_consul_a_consul_lock_waits_out_the_lock_delay() {
    let h = common::consul();
    let consul = dlock_testkit::shared_consul();
    let delay = Duration::from_secs(4);
    let run = async {
        let holder = dlock::connect(&format!(
            "consul://{}?lock-delay={}s",
            consul.endpoint(),
            delay.as_secs()
        ))
        .await?;
        let waiter = h.session().await;
        let prefix = h.path("/delayed");
        let held = ConsulLock::new(&holder, &prefix)?.acquire().await?;
        let uuid = holder.native_session_id().1;
        let lock = ConsulLock::new(&waiter, &prefix)?;
        let within = delay + WITHIN;
        let waiting = tokio::spawn(async move { lock.acquire_timeout(within).await });
        let (status, body) = consul.http("PUT", &format!("/v1/session/destroy/{uuid}"), None)?;
        ensure!(status == 200, "{status} {body}");
        let invalidated = std::time::Instant::now();
        let next = waiting
            .await?
            .context("the waiter gets the lock after the delay")?;
        let took = invalidated.elapsed();
        eprintln!("lock delay {delay:?}: the next holder got in after {took:?}");
        // Consul counts the delay from its own invalidation, a moment
        // after ours; the waiter retries with a pause of at most 2 s.
        ensure!(
            took + Duration::from_millis(500) >= delay,
            "got in {took:?} after the invalidation, within the {delay:?} lock delay"
        );
        ensure!(
            took <= delay + Duration::from_secs(3),
            "got in {took:?} after a {delay:?} lock delay"
        );
        ensure!(next.token() > held.token());
        next.release().await?;
        let _ = held.release().await;
        holder.close().await;
        Ok::<(), anyhow::Error>(())
    };
    run.await.expect("the lock delay is waited out");
    h.finish().await;
}

/// A `consul lock -n` holder whose session ends leaves its entry key
/// (Consul's sessions there release their keys): held by nobody, it
/// proves no holder lives. A waiting `KvSemaphore` wakes on that release
/// and takes the slot, pruning the dead holder from the record.
#[cfg(feature = "consul")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_consul_a_semaphore_holder_whose_session_released_its_entry_is_pruned() {
    let h = common::consul();
    let consul = dlock_testkit::shared_consul();
    let put = |path: &str, body: &str| -> Result<String> {
        let (status, answer) = consul.http("PUT", path, Some(body))?;
        ensure!(status == 200, "PUT {path}: {status} {answer}");
        Ok(answer)
    };
    let run = async {
        let dir = h.path("/released-entry");
        // A foreign holder as `consul lock -n 1` leaves one: a session with
        // behavior `release`, its entry, and the record naming it.
        let created = put(
            "/v1/session/create",
            // A TTL, so that a failed run leaves nothing for good.
            r#"{"Behavior":"release","LockDelay":"0s","TTL":"30s"}"#,
        )?;
        let created: serde_json::Value = serde_json::from_str(&created)?;
        let foreign = created["ID"].as_str().context("a session ID")?.to_string();
        let flags = CONSUL_SEMAPHORE_FLAGS;
        put(
            &format!("/v1/kv{dir}/{foreign}?acquire={foreign}&flags={flags}"),
            "",
        )?;
        let record = format!(r#"{{"Limit":1,"Holders":{{"{foreign}":true}}}}"#);
        put(&format!("/v1/kv{dir}/.lock?flags={flags}"), &record)?;

        let s = h.session().await;
        let sem = KvSemaphore::new(&s, &dir, 1)?.with_layout(Layout::Consul);
        ensure!(
            sem.try_acquire().await?.is_none(),
            "the foreign holder lives"
        );
        let waiting = tokio::spawn({
            let sem = sem.clone();
            async move { sem.acquire_timeout(WITHIN).await }
        });
        // Its entry there, the waiter has looked or is about to.
        let entry = format!("{dir}/{}", s.native_session_id().1);
        common::await_exists(&s, &entry, WITHIN).await?;
        // What wakes a waiter: the entries' watch fires when the holder's
        // session lets go of its entry.
        let (_, entries) = s.children_watch(&dir).await?;
        put(&format!("/v1/session/destroy/{foreign}"), "")?;
        tokio::time::timeout(WITHIN, entries.changed())
            .await
            .context("the entries' watch fires on the release")?;
        let lease = waiting.await?.context("the slot of the dead holder")?;
        let (data, _) = s.get_data(&format!("{dir}/.lock")).await?;
        let record: serde_json::Value = serde_json::from_slice(&data)?;
        ensure!(
            record["Holders"] == serde_json::json!({ lease.holder(): true }),
            "the dead holder is pruned: {record}"
        );
        lease.release().await?;
        let (status, answer) = consul.http("DELETE", &format!("/v1/kv{dir}/{foreign}"), None)?;
        ensure!(status == 200, "{status} {answer}");
        Ok::<(), anyhow::Error>(())
    };
    run.await.expect("the dead holder is pruned");
    h.finish().await;
}
