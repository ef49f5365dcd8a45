//! `dlock::inspect`: each recipe's participants, as the recipe orders them,
//! on every backend; and etcd Go (`etcdctl lock`/`elect`) holders on etcd.

mod common;

use std::time::Duration;

use anyhow::{ensure, Result};
use common::tests2::release_then_waiters;
use common::{await_children, persistent, queued, Harness};
use dlock::{inspect, Access, Contender, Inspection, RecipeKind, Role};

const WITHIN: Duration = Duration::from_secs(20);

fn roles(seen: &Inspection) -> Vec<Role> {
    seen.participants.iter().map(|p| p.role).collect()
}

/// What `inspect` sees at `path`: `recipe`'s participants in `roles`.
async fn inspected(
    s: &dlock::Session,
    path: &str,
    recipe: RecipeKind,
    want: &[Role],
) -> Result<Inspection> {
    let seen = inspect(s, path).await?;
    ensure!(seen.recipe == recipe, "{seen:?}");
    ensure!(roles(&seen) == want, "{seen:?}");
    Ok(seen)
}

/// The sessions of the participants, in order.
fn sessions(seen: &Inspection) -> Vec<dlock::store::SessionId> {
    seen.participants.iter().map(|p| p.session).collect()
}

fn ordered(list: &[Contender]) -> bool {
    list.windows(2).all(|w| w[0].token < w[1].token)
}

/// A mutex: the holder, then the waiters in queue order, each with its
/// session; nothing foreign.
async fn a_mutex_lists_its_holder_then_its_waiters(h: &Harness) -> Result<()> {
    let path = h.path("/mutex");
    let holder = h.session().await;
    let guard = dlock::Mutex::new(&holder, &path)?.acquire().await?;
    let mut waiters = Vec::new();
    for i in 0..2 {
        let s = h.session().await;
        let mutex = dlock::Mutex::new(&s, &path)?;
        waiters.push((s, tokio::spawn(async move { mutex.acquire().await })));
        await_children(&holder, &path, i + 2, WITHIN).await?;
    }
    let held_and_waited = [Role::Holder, Role::Waiter, Role::Waiter];
    let seen = inspected(&holder, &path, RecipeKind::Mutex, &held_and_waited).await?;
    ensure!(seen.path == path, "{seen:?}");
    let first = &seen.participants[0];
    ensure!(first.node == guard.node() && first.token == guard.token());
    ensure!(first.session == holder.session_id());
    ensure!(seen.participants[1].session == waiters[0].0.session_id());
    ensure!(seen.participants[2].session == waiters[1].0.session_id());
    ensure!(ordered(&seen.participants), "{seen:?}");
    ensure!(seen
        .participants
        .iter()
        .all(|p| p.foreign.is_none() && p.access.is_none()));
    let waiters = waiters.into_iter().map(|(_, waiter)| waiter).collect();
    release_then_waiters(vec![Box::new(guard)], waiters).await?;
    ensure!(inspect(&holder, &path).await?.recipe == RecipeKind::None);
    Ok(())
}

/// A read-write lock: readers share, a writer waits behind them; each
/// participant says which half it is queued for.
async fn a_read_write_lock_tells_readers_from_writers(h: &Harness) -> Result<()> {
    let path = h.path("/rw");
    let (a, b, c) = (h.session().await, h.session().await, h.session().await);
    let r1 = dlock::ReadWriteLock::new(&a, &path)?.read().await?;
    let r2 = dlock::ReadWriteLock::new(&b, &path)?.read().await?;
    let writer = dlock::ReadWriteLock::new(&c, &path)?;
    let waiting = queued(&a, &path, 3, WITHIN, async move { writer.write().await }).await?;
    let two_held = [Role::Holder, Role::Holder, Role::Waiter];
    let seen = inspected(&a, &path, RecipeKind::ReadWriteLock, &two_held).await?;
    let access: Vec<_> = seen.participants.iter().map(|p| p.access).collect();
    ensure!(access == [Some(Access::Read), Some(Access::Read), Some(Access::Write)]);
    ensure!(seen.participants[2].session == c.session_id());
    release_then_waiters(vec![Box::new(r1), Box::new(r2)], vec![waiting]).await?;
    Ok(())
}

/// A semaphore of one lease: the holder's lease; then the acquirer at the
/// head of the internal lock queue, whose lease node waits; then the one
/// queued behind it.
async fn a_semaphore_lists_leases_then_acquirers(h: &Harness) -> Result<()> {
    let path = h.path("/sem");
    let (a, b, c) = (h.session().await, h.session().await, h.session().await);
    let lease = dlock::Semaphore::new(&a, &path, 1)?.acquire_one().await?;
    let second = dlock::Semaphore::new(&b, &path, 1)?;
    let second = queued(&a, &format!("{path}/leases"), 2, WITHIN, async move {
        second.acquire_one().await
    })
    .await?;
    let third = dlock::Semaphore::new(&c, &path, 1)?;
    let third = queued(&a, &format!("{path}/locks"), 2, WITHIN, async move {
        third.acquire_one().await
    })
    .await?;
    let one_held = [Role::Holder, Role::Waiter, Role::Waiter];
    let seen = inspected(&a, &path, RecipeKind::Semaphore, &one_held).await?;
    ensure!(sessions(&seen) == [a.session_id(), b.session_id(), c.session_id()]);
    ensure!(seen.participants[0].node == lease.node());
    release_then_waiters(vec![Box::new(lease)], vec![second, third]).await?;
    Ok(())
}

/// An acquirer asking for two leases of which one was admitted: the
/// admitted lease is a holder, its newest lease the one still waiting.
async fn a_semaphore_acquirer_of_two_leases_waits_with_its_newest(h: &Harness) -> Result<()> {
    let path = h.path("/sem2");
    let (a, b) = (h.session().await, h.session().await);
    let lease = dlock::Semaphore::new(&a, &path, 2)?.acquire_one().await?;
    let both = dlock::Semaphore::new(&b, &path, 2)?;
    let both = queued(&a, &format!("{path}/leases"), 3, WITHIN, async move {
        both.acquire(2).await
    })
    .await?;
    let one_each = [Role::Holder, Role::Holder, Role::Waiter];
    let seen = inspected(&a, &path, RecipeKind::Semaphore, &one_each).await?;
    ensure!(sessions(&seen) == [a.session_id(), b.session_id(), b.session_id()]);
    let (admitted, waiting) = (&seen.participants[1], &seen.participants[2]);
    ensure!(admitted.token < waiting.token, "{seen:?}");
    lease.release().await?;
    for lease in tokio::time::timeout(WITHIN, both).await??? {
        lease.release().await?;
    }
    Ok(())
}

/// kazoo's readers (`ReadLock`, `<uuid>__rlock__<seq>`) hold together: a
/// path of kazoo readers and a writer (`Lock`, `__lock__`) is a read-write
/// lock whose readers ahead of the writer all hold, and the rest wait.
async fn kazoo_readers_hold_together(h: &Harness) -> Result<()> {
    let path = h.path("/kazoo-rw");
    let s = h.session().await;
    let mut nodes = Vec::new();
    for kind in ["__rlock__", "__rlock__", "__lock__", "__rlock__"] {
        let name = format!("{path}/{}{kind}", uuid::Uuid::new_v4().simple());
        nodes.push(s.create(&name, b"", common::sequential()).await?.path);
    }
    let readers_first = [Role::Holder, Role::Holder, Role::Waiter, Role::Waiter];
    let seen = inspected(&s, &path, RecipeKind::ReadWriteLock, &readers_first).await?;
    let access: Vec<_> = seen.participants.iter().map(|p| p.access).collect();
    let (read, write) = (Some(Access::Read), Some(Access::Write));
    ensure!(access == [read, read, write, read], "{seen:?}");
    for node in nodes {
        s.delete(&node, None).await?;
    }
    Ok(())
}

/// A KV semaphore: holders as its record admitted them, then waiters. An
/// entry no session holds (on Consul, one left by a session that ended
/// with behavior `release`) is nobody's, as the semaphore itself sees it.
async fn a_kv_semaphore_lists_its_record_holders_then_waiters(h: &Harness) -> Result<()> {
    let path = h.path("/kv");
    let (a, b, c) = (h.session().await, h.session().await, h.session().await);
    let first = dlock::KvSemaphore::new(&a, &path, 2)?.acquire().await?;
    let second = dlock::KvSemaphore::new(&b, &path, 2)?.acquire().await?;
    let third = dlock::KvSemaphore::new(&c, &path, 2)?;
    let third = tokio::spawn(async move { third.acquire().await });
    let unheld = format!("{path}/00000000000000ff");
    a.create(
        &unheld,
        uuid::Uuid::new_v4().to_string().as_bytes(),
        persistent(),
    )
    .await?;
    // Two entries, the third, the one nobody holds, and the record.
    await_children(&a, &path, 5, WITHIN).await?;
    let two_held = [Role::Holder, Role::Holder, Role::Waiter];
    let seen = inspected(&a, &path, RecipeKind::KvSemaphore, &two_held).await?;
    ensure!(sessions(&seen) == [a.session_id(), b.session_id(), c.session_id()]);
    ensure!(seen.participants[0].node == first.node());
    ensure!(seen.participants.iter().all(|p| p.foreign.is_none()));
    a.delete(&unheld, None).await?;
    release_then_waiters(vec![Box::new(first), Box::new(second)], vec![third]).await?;
    Ok(())
}

/// A leader latch: the leader, then the other candidates, with their ids.
async fn a_leader_latch_lists_its_leader_first(h: &Harness) -> Result<()> {
    let path = h.path("/latch");
    let (a, b) = (h.session().await, h.session().await);
    let leader = dlock::LeaderLatch::new(&a, &path)?.with_id("a");
    leader.start()?;
    let leadership = leader.await_leadership_timeout(WITHIN).await?;
    let follower = dlock::LeaderLatch::new(&b, &path)?.with_id("b");
    follower.start()?;
    await_children(&a, &path, 2, WITHIN).await?;
    let seen = inspected(
        &a,
        &path,
        RecipeKind::LeaderLatch,
        &[Role::Holder, Role::Waiter],
    )
    .await?;
    ensure!(seen.participants[0].token == leadership.epoch());
    ensure!(seen.participants[0].data == b"a" && seen.participants[1].data == b"b");
    ensure!(seen.participants[1].session == b.session_id());
    follower.close().await?;
    leader.close().await?;
    Ok(())
}

/// A shared count: its value, no participants.
async fn a_shared_count_shows_its_value(h: &Harness) -> Result<()> {
    let path = h.path("/count");
    let s = h.session().await;
    let count = dlock::SharedCount::new(&s, &path, 41)?;
    count.start().await?;
    count.set(42).await?;
    count.close().await;
    let seen = inspect(&s, &path).await?;
    ensure!(
        seen.recipe == RecipeKind::SharedCount && seen.count == Some(42),
        "{seen:?}"
    );
    ensure!(seen.participants.is_empty());
    s.delete(&path, None).await?;
    Ok(())
}

/// Nothing there, or nothing any recipe wrote: `None`.
async fn anything_else_is_none(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let missing = inspect(&s, &h.path("/missing")).await?;
    ensure!(missing.recipe == RecipeKind::None && missing.participants.is_empty());
    ensure!(missing.count.is_none());
    let other = h.path("/other/config");
    s.create(&other, b"not a recipe", persistent()).await?;
    let seen = inspect(&s, &h.path("/other")).await?;
    ensure!(
        seen.recipe == RecipeKind::None && seen.participants.is_empty(),
        "{seen:?}"
    );
    // Data that is not 4 bytes is no count.
    let seen = inspect(&s, &other).await?;
    ensure!(seen.recipe == RecipeKind::None, "{seen:?}");
    s.delete(&other, None).await?;
    // No recipe lives at the root.
    ensure!(inspect(&s, "/").await?.recipe == RecipeKind::None);
    Ok(())
}

/// Directories that hold recipes, named as people name them (`locks/`,
/// `clock-sync/`), and a `.lock` file nobody's recipe wrote: none of them
/// is taken for a recipe — and the mutex below them is found where it is.
async fn ordinary_directories_are_no_recipes(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let app = h.path("/app");
    let nightly = format!("{app}/locks/nightly");
    let guard = dlock::Mutex::new(&s, &nightly)?.acquire().await?;
    let clock = format!("{app}/clock-sync/state");
    s.create(&clock, b"ok", persistent()).await?;
    let file = format!("{app}/files/.lock");
    s.create(&file, b"pid 1", persistent()).await?;
    for dir in [&app, &format!("{app}/locks"), &format!("{app}/files")] {
        let seen = inspect(&s, dir).await?;
        ensure!(
            seen.recipe == RecipeKind::None && seen.participants.is_empty(),
            "{dir}: {seen:?}"
        );
    }
    let seen = inspected(&s, &nightly, RecipeKind::Mutex, &[Role::Holder]).await?;
    ensure!(seen.participants[0].token == guard.token(), "{seen:?}");
    guard.release().await?;
    for node in [
        clock.as_str(),
        &format!("{app}/clock-sync"),
        &file,
        &format!("{app}/files"),
    ] {
        // Parents made on the way may be containers, reaped once empty.
        match s.delete(node, None).await {
            Ok(()) | Err(dlock::Error::NoNode { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

per_backend!(every_backend {
    ordinary_directories_are_no_recipes,
    kazoo_readers_hold_together,
    a_semaphore_acquirer_of_two_leases_waits_with_its_newest,
    a_mutex_lists_its_holder_then_its_waiters,
    a_read_write_lock_tells_readers_from_writers,
    a_semaphore_lists_leases_then_acquirers,
    a_kv_semaphore_lists_its_record_holders_then_waiters,
    a_leader_latch_lists_its_leader_first,
    a_shared_count_shows_its_value,
    anything_else_is_none,
});

/// Holders written by etcd's Go client, through `etcdctl`.
#[cfg(feature = "etcd")]
mod etcd_go {
    use std::process::Stdio;

    use anyhow::{bail, Context};
    use tokio::io::{AsyncBufReadExt, BufReader};
    use tokio::process::{Child, Command};

    use super::*;
    use dlock::Foreign;

    /// `etcdctl <args>` against the test's etcd, holding until SIGINT;
    /// returns once it printed its key (it then holds), and the key.
    async fn etcdctl_holding(args: &[&str]) -> Result<(Child, String)> {
        let mut child = Command::new(std::env::var("DLOCK_ETCDCTL").unwrap_or("etcdctl".into()))
            .env("ETCDCTL_API", "3")
            .arg(format!(
                "--endpoints={}",
                dlock_testkit::shared_etcd().url()
            ))
            .args(args)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("run etcdctl")?;
        let stdout = child.stdout.take().expect("piped");
        let mut lines = BufReader::new(stdout).lines();
        let key = tokio::time::timeout(WITHIN, lines.next_line())
            .await
            .context("etcdctl printed no key")??
            .context("etcdctl ended without a key")?;
        // The rest of its output is not needed, but must not block it.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok((child, key))
    }

    /// SIGINT: etcdctl unlocks (or resigns) and exits.
    async fn interrupt(mut child: Child) -> Result<()> {
        let pid = child.id().context("etcdctl's pid")? as libc::pid_t;
        // SAFETY: kill(2) on our own child, not reaped yet.
        unsafe { libc::kill(pid, libc::SIGINT) };
        let status = tokio::time::timeout(WITHIN, child.wait()).await??;
        if !status.success() {
            bail!("etcdctl exited with {status}");
        }
        Ok(())
    }

    /// `etcdctl lock P` holds `P/<lease hex>`: a foreign mutex holder, and a
    /// dlock waiter queues behind it and gets the lock once it unlocks.
    async fn an_etcdctl_lock_holder_is_a_foreign_mutex_holder(h: &Harness) -> Result<()> {
        let path = h.path("/golock");
        let (child, key) = etcdctl_holding(&["lock", &path]).await?;
        ensure!(key.starts_with(&format!("{path}/")), "{key}");
        let s = h.session().await;
        let seen = inspect(&s, &path).await?;
        ensure!(seen.recipe == RecipeKind::Mutex, "{seen:?}");
        ensure!(seen.participants.len() == 1, "{seen:?}");
        let go = &seen.participants[0];
        ensure!(go.role == Role::Holder && go.foreign == Some(Foreign::EtcdGo));
        ensure!(go.node == key && format!("{}/{:x}", path, go.session) == key);
        // A dlock mutex on the same path waits for it: on etcd both order
        // by create revision.
        let waiter = dlock::Mutex::new(&s, &path)?;
        let waiting = queued(&s, &path, 2, WITHIN, async move { waiter.acquire().await }).await?;
        let seen = inspected(&s, &path, RecipeKind::Mutex, &[Role::Holder, Role::Waiter]).await?;
        ensure!(seen.participants[0].foreign == Some(Foreign::EtcdGo));
        ensure!(seen.participants[1].foreign.is_none());
        ensure!(seen.participants[1].session == s.session_id());
        ensure!(!waiting.is_finished(), "dlock took the lock etcdctl holds");
        interrupt(child).await?;
        let guard = tokio::time::timeout(WITHIN, waiting).await???;
        let seen = inspect(&s, &path).await?;
        ensure!(roles(&seen) == [Role::Holder] && seen.participants[0].node == guard.node());
        guard.release().await?;
        Ok(())
    }

    /// `etcdctl elect P proposal` campaigns with `P/<lease hex>` holding the
    /// proposal: a foreign leader election.
    async fn an_etcdctl_elect_leader_is_a_foreign_election_leader(h: &Harness) -> Result<()> {
        let path = h.path("/goelect");
        let (child, key) = etcdctl_holding(&["elect", &path, "proposal-a"]).await?;
        let s = h.session().await;
        let seen = inspected(&s, &path, RecipeKind::LeaderElection, &[Role::Holder]).await?;
        let leader = &seen.participants[0];
        ensure!(leader.node == key && leader.data == b"proposal-a");
        ensure!(leader.foreign == Some(Foreign::EtcdGo));
        interrupt(child).await?;
        ensure!(inspect(&s, &path).await?.recipe == RecipeKind::None);
        Ok(())
    }

    per_backend!(etcd => crate::common::etcd(); {
        an_etcdctl_lock_holder_is_a_foreign_mutex_holder,
        an_etcdctl_elect_leader_is_a_foreign_election_leader,
    });
}
