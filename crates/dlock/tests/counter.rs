//! AtomicCounter: ports of Curator's `TestDistributedAtomicLong` plus
//! dlock's own cases (exact sums under contention, the promoted lock, bad
//! input), run on every backend.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use common::tests1::recipe_on;
use common::{persistent, Harness};
use dlock::{AtomicCounter, AtomicValue, Error, PromotedToLock, RetryPolicy, Session};

/// Enough optimistic retries that no increment of a handful of clients
/// loses every try: backoff with jitter up to 50 ms.
const PATIENT: RetryPolicy = RetryPolicy {
    base_sleep: Duration::from_millis(1),
    max_sleep: Duration::from_millis(50),
    max_retries: 200,
};

/// One optimistic try, no retry: any collision goes to the promoted lock.
const ONCE: RetryPolicy = RetryPolicy {
    base_sleep: Duration::ZERO,
    max_sleep: Duration::ZERO,
    max_retries: 0,
};

/// The counter node is persistent data: a finished test removes it.
async fn remove(session: &Session, path: &str) -> Result<()> {
    match session.delete(path, None).await {
        Ok(()) | Err(Error::NoNode { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn check(v: &AtomicValue, pre: i64, post: i64) -> Result<()> {
    ensure!(
        v.succeeded && v.pre_value == pre && v.post_value == post,
        "expected {pre} -> {post}, got {v:?}"
    );
    ensure!(
        v.stats.optimistic_tries == 1 && v.stats.promoted_lock_tries == 0,
        "{v:?}"
    );
    Ok(())
}

/// Curator `testBasic`: increment, decrement, add, subtract on a counter
/// whose node (and parents) do not exist yet; the node is a persistent
/// 8-byte big-endian i64, as Curator writes it.
async fn updates_write_curators_bytes(h: &Harness) -> Result<()> {
    let (s, path, counter) = recipe_on(h, "/foo/bar/counter", AtomicCounter::new).await?;
    let v = counter.get().await?;
    ensure!(
        v.succeeded && v.pre_value == 0 && v.post_value == 0,
        "{v:?}"
    );
    ensure!(s.exists(&path).await?.is_none(), "a read creates nothing");
    check(&counter.increment().await?, 0, 1)?;
    let (data, stat) = s.get_data(&path).await?;
    ensure!(data == [0, 0, 0, 0, 0, 0, 0, 1], "{data:?}");
    ensure!(stat.ephemeral_owner == 0, "persistent");
    check(&counter.decrement().await?, 1, 0)?;
    check(&counter.add(10).await?, 0, 10)?;
    check(&counter.subtract(5).await?, 10, 5)?;
    check(&counter.add(-7).await?, 5, -2)?;
    ensure!(s.get_data(&path).await?.0 == (-2i64).to_be_bytes());
    // Another session's counter on the path sees the same value.
    let other = AtomicCounter::new(&h.session().await, &path)?;
    ensure!(other.get().await?.post_value == -2);
    // Empty data reads as 0, as in Curator.
    s.set_data(&path, b"", None).await?;
    check(&counter.increment().await?, 0, 1)?;
    remove(&s, &path).await
}

/// Several sessions increment one counter at once: every increment
/// succeeds, each sees a value nobody else saw, and the total is exact.
async fn concurrent_increments_sum_exactly(h: &Harness) -> Result<()> {
    const CLIENTS: usize = 4;
    const EACH: usize = 15;
    let path = h.path("/sum/counter");
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let counter = AtomicCounter::new(&h.session().await, &path)?.with_retry(PATIENT);
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..EACH {
                seen.push(counter.increment().await?);
            }
            anyhow::Ok(seen)
        }));
    }
    let mut posts = BTreeSet::new();
    let mut tries = 0;
    for t in tasks {
        for v in t.await?? {
            ensure!(v.succeeded, "{v:?}");
            ensure!(v.post_value == v.pre_value + 1, "{v:?}");
            ensure!(posts.insert(v.post_value), "{} seen twice", v.post_value);
            tries += v.stats.optimistic_tries;
        }
    }
    let total = (CLIENTS * EACH) as i64;
    ensure!(posts == (1..=total).collect(), "{posts:?}");
    let s = h.session().await;
    let final_value = AtomicCounter::new(&s, &path)?.get().await?.post_value;
    ensure!(final_value == total, "{final_value} != {total}");
    ensure!(tries >= total as u32, "{tries}");
    remove(&s, &path).await
}

/// Curator `testCompareAndSetWithFreshInstance` and `testCompareAndSet`:
/// no node never matches; `initialize` makes it once; a compare-and-set
/// from a stale value fails, also after another session's write.
async fn compare_and_set_refuses_a_stale_value(h: &Harness) -> Result<()> {
    let (s, path, counter) = recipe_on(h, "/cas/counter", AtomicCounter::new).await?;
    let v = counter.compare_and_set(0, 1).await?;
    ensure!(!v.succeeded, "no node yet: {v:?}");
    ensure!(counter.initialize(0).await?, "initialized");
    let v = counter.compare_and_set(0, 1).await?;
    ensure!(
        v.succeeded && v.pre_value == 0 && v.post_value == 1,
        "{v:?}"
    );
    ensure!(!counter.initialize(0).await?, "already initialized");

    counter.force_set(1).await?;
    ensure!(counter.compare_and_set(1, 5).await?.succeeded);
    let v = counter.compare_and_set(1, 5).await?;
    ensure!(
        !v.succeeded && v.pre_value == 5 && v.post_value == 5,
        "{v:?}"
    );
    // Another client moves it on: the value this one last saw is stale.
    let other = AtomicCounter::new(&h.session().await, &path)?;
    ensure!(other.increment().await?.succeeded);
    let v = counter.compare_and_set(5, 10).await?;
    ensure!(!v.succeeded && v.pre_value == 6, "{v:?}");
    ensure!(counter.get().await?.post_value == 6);

    // try_set sets whatever the value is; force_set creates a missing node.
    let v = counter.try_set(42).await?;
    ensure!(
        v.succeeded && v.pre_value == 6 && v.post_value == 42,
        "{v:?}"
    );
    remove(&s, &path).await?;
    counter.force_set(3).await?;
    ensure!(other.get().await?.post_value == 3);
    remove(&s, &path).await
}

/// With a single optimistic try and a lock to fall back to, clients that
/// collide take the lock: every increment succeeds, some of them under the
/// lock, the total is exact, and the lock leaves no node behind.
async fn the_promoted_lock_settles_contention(h: &Harness) -> Result<()> {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Arc;
    const CLIENTS: usize = 4;
    const MOST: usize = 500;
    let path = h.path("/promoted/counter");
    let lock_path = h.path("/promoted/lock");
    let promoted = PromotedToLock::new(&lock_path)?.with_retry(PATIENT);
    // Collisions are a matter of timing (an in-process store answers at
    // once): a rival in a session of its own increments all along, and the
    // clients go on until one of them was promoted.
    let rival = AtomicCounter::new(&h.session().await, &path)?.with_retry(PATIENT);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let rival = tokio::spawn(async move {
        let mut done = 0i64;
        while !*stopped.borrow() {
            ensure!(rival.increment().await?.succeeded);
            done += 1;
        }
        anyhow::Ok(done)
    });
    let seen_promoted = Arc::new(AtomicBool::new(false));
    let promoted_tries = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let counter = AtomicCounter::new(&h.session().await, &path)?
            .with_retry(ONCE)
            .promoted_to_lock(promoted.clone());
        let (seen_promoted, promoted_tries) = (seen_promoted.clone(), promoted_tries.clone());
        tasks.push(tokio::spawn(async move {
            let mut done = 0i64;
            while done < MOST as i64 && !seen_promoted.load(Ordering::SeqCst) {
                let v = counter.increment().await?;
                ensure!(v.succeeded, "{v:?}");
                ensure!(v.stats.optimistic_tries == 1, "{v:?}");
                if v.stats.promoted_lock_tries > 0 {
                    promoted_tries.fetch_add(v.stats.promoted_lock_tries, Ordering::SeqCst);
                    seen_promoted.store(true, Ordering::SeqCst);
                }
                done += 1;
            }
            anyhow::Ok(done)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    stop.send_replace(true);
    total += rival.await??;
    ensure!(
        promoted_tries.load(Ordering::SeqCst) > 0,
        "no collision in {total} increments"
    );
    let s = h.session().await;
    let value = AtomicCounter::new(&s, &path)?.get().await?.post_value;
    ensure!(value == total, "{value} != {total}");
    let holders = match s.children(&lock_path).await {
        Ok(children) => children.len(),
        Err(Error::NoNode { .. }) => 0,
        Err(e) => return Err(e.into()),
    };
    ensure!(holders == 0, "{holders} lock nodes left");
    remove(&s, &path).await
}

/// A lock held elsewhere bounds the promoted phase by its timeout: the
/// update reports failure instead of waiting forever.
async fn a_promoted_timeout_fails_the_update(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/timeout/counter");
    let lock_path = h.path("/timeout/lock");
    let holder = dlock::Mutex::new(&h.session().await, &lock_path)?
        .acquire()
        .await?;
    let counter = AtomicCounter::new(&s, &path)?
        .with_retry(ONCE)
        .promoted_to_lock(
            PromotedToLock::new(&lock_path)?.with_timeout(Duration::from_millis(200)),
        );
    // A write that loses its one optimistic try: a rival task in another
    // session increments all along, until one of ours was promoted.
    let rival = AtomicCounter::new(&h.session().await, &path)?.with_retry(PATIENT);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let rival = tokio::spawn(async move {
        while !*stopped.borrow() {
            ensure!(rival.increment().await?.succeeded);
        }
        anyhow::Ok(())
    });
    // Bounded by time, not by a count of tries: on the embedded store a try
    // takes microseconds, and on a loaded machine the two tasks rarely run
    // at once, so a few thousand tries can pass without one collision.
    let mut promoted = None;
    let give_up = tokio::time::Instant::now() + Duration::from_secs(20);
    while tokio::time::Instant::now() < give_up {
        let mine = counter.increment().await?;
        if mine.stats.promoted_time > Duration::ZERO {
            promoted = Some(mine);
            break;
        }
        ensure!(mine.succeeded, "{mine:?}");
    }
    stop.send_replace(true);
    rival.await??;
    let v = promoted.context("no collision in 20 s of tries")?;
    ensure!(
        !v.succeeded && v.stats.promoted_lock_tries == 0,
        "the lock was never had: {v:?}"
    );
    ensure!(v.stats.promoted_time >= Duration::from_millis(200), "{v:?}");
    holder.release().await?;
    remove(&s, &path).await
}

/// Data that is no counter, bad paths and overflows are typed errors that
/// name the problem; nothing is written.
async fn bad_input_is_a_typed_error(h: &Harness) -> Result<()> {
    let s = h.session().await;
    for bad in ["/", "relative", "/trailing/", "/a//b"] {
        let err = AtomicCounter::new(&s, bad).unwrap_err();
        ensure!(matches!(err, Error::InvalidPath { .. }), "{bad}: {err}");
        let err = PromotedToLock::new(bad).unwrap_err();
        ensure!(matches!(err, Error::InvalidPath { .. }), "{bad}: {err}");
    }
    let path = h.path("/bad/counter");
    // Curator `testCorruptedValue`, and a SharedCount's 4 bytes.
    for data in [&b"foo"[..], &7i32.to_be_bytes(), &[0u8; 9]] {
        s.create(&path, data, persistent()).await?;
        let counter = AtomicCounter::new(&s, &path)?;
        for err in [
            counter.get().await.unwrap_err(),
            counter.increment().await.unwrap_err(),
            counter.compare_and_set(0, 1).await.unwrap_err(),
        ] {
            ensure!(matches!(err, Error::MalformedData { .. }), "{err}");
            let text = err.to_string();
            ensure!(
                text.contains(&path) && text.contains("8 bytes") && text.contains("0x"),
                "{text}"
            );
        }
        ensure!(s.get_data(&path).await?.0 == data, "left as it was");
        s.delete(&path, None).await?;
    }
    let counter = AtomicCounter::new(&s, &path)?;
    counter.force_set(i64::MAX).await?;
    let err = counter.increment().await.unwrap_err();
    ensure!(
        matches!(err, Error::InvalidArgument(_)) && err.to_string().contains("overflow"),
        "{err}"
    );
    let err = counter.subtract(i64::MIN).await.unwrap_err();
    ensure!(matches!(err, Error::InvalidArgument(_)), "{err}");
    ensure!(counter.get().await?.post_value == i64::MAX, "unchanged");
    remove(&s, &path).await
}

per_backend!(every_backend {
    updates_write_curators_bytes,
    concurrent_increments_sum_exactly,
    compare_and_set_refuses_a_stale_value,
    the_promoted_lock_settles_contention,
    a_promoted_timeout_fails_the_update,
    bad_input_is_a_typed_error,
});
