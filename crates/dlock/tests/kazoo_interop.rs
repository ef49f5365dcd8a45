//! Sharing a path with kazoo 2.8 (Python), proven against the real thing:
//! kazoo and dlock contend for the same paths on one ZooKeeper (the
//! contract is in `dlock::recipes::layout`).
//!
//! Needs python3 with kazoo (`scripts/test.sh` installs Debian's
//! `python3-kazoo`); the Python side is `dlock_testkit::KazooProbe`.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use common::{
    await_children, dlock_excludes_peer, peer_excludes_dlock, persistent, zk_hosts, Harness,
};
use dlock::{Error, Layout, LeaderSelector, Mutex, RecipeKind, Role, Semaphore, Session};

type Probe = dlock_testkit::KazooProbe;

/// How long a handover may take: a watch firing and a round trip or two.
const WITHIN: Duration = Duration::from_secs(10);

/// Whether `node` is named as kazoo names lock nodes.
fn is_kazoo_name(node: &str) -> bool {
    let name = dlock::path::node_name(node);
    let (hex, rest) = name.split_at(32.min(name.len()));
    hex.len() == 32
        && hex
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        && rest
            .strip_prefix("__lock__")
            .is_some_and(|seq| seq.len() == 10)
}

/// Where a test meets kazoo: the path `name` under the test's root, and a
/// kazoo client on the same ZooKeeper.
fn meeting_kazoo(h: &Harness, name: &str) -> Result<(String, Probe)> {
    Ok((h.path(name), Probe::start(&zk_hosts(h))?))
}

/// kazoo's client lets go of what it holds at `path`.
fn kazoo_releases(kazoo: &mut Probe, path: &str) -> Result<()> {
    let answer = kazoo.ask(&format!("release {path}"))?;
    ensure!(answer == "released", "{answer}");
    Ok(())
}

/// A plain kazoo `Lock` holds: dlock's Mutex (default layout) cannot have
/// the lock, queues behind it, and gets it when kazoo releases.
async fn a_kazoo_holder_excludes_dlock(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let (path, mut kazoo) = meeting_kazoo(h, "/kazoo/m1")?;
    let answer = kazoo.ask(&format!("lock {path} 10000"))?;
    let node = answer.strip_prefix("acquired ").context("acquired")?;
    ensure!(is_kazoo_name(node), "{answer}");
    let mutex = Mutex::new(&s, &path)?;
    let waiting = peer_excludes_dlock(&s, &mutex, &path, "kazoo", WITHIN).await?;
    // dlock lists kazoo's holder first, itself waiting.
    let listed = mutex.participants().await?;
    ensure!(listed.len() == 2 && listed[0].holds && listed[0].node == node);
    ensure!(listed[0].data == b"kazoo-probe" && !listed[1].holds);
    let seen = dlock::inspect(&s, &path).await?;
    ensure!(seen.recipe == RecipeKind::Mutex, "{seen:?}");
    ensure!(seen.participants[0].role == Role::Holder);
    ensure!(seen.participants[0].foreign == Some(dlock::Foreign::Kazoo));
    ensure!(seen.participants[1].foreign.is_none());
    kazoo_releases(&mut kazoo, &path)?;
    let g = tokio::time::timeout(WITHIN, waiting).await???;
    g.release().await?;
    Ok(())
}

/// A kazoo `ReadLock` holder keeps a dlock Mutex out too (as it keeps out
/// kazoo's own `WriteLock`), in either layout.
async fn a_kazoo_reader_excludes_dlock(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let (path, mut kazoo) = meeting_kazoo(h, "/kazoo/read")?;
    let answer = kazoo.ask(&format!("read {path} 10000"))?;
    ensure!(answer.contains("__rlock__"), "{answer}");
    for layout in [Layout::Curator, Layout::Kazoo] {
        let mutex = Mutex::new(&s, &path)?.with_layout(layout)?;
        let err = mutex
            .acquire_timeout(Duration::from_millis(300))
            .await
            .unwrap_err();
        ensure!(matches!(err, Error::Timeout(_)), "{layout}: {err}");
    }
    kazoo_releases(&mut kazoo, &path)?;
    let mutex = Mutex::new(&s, &path)?;
    let g = tokio::time::timeout(WITHIN, mutex.acquire()).await??;
    g.release().await?;
    Ok(())
}

/// dlock holds in its default (Curator) layout: a kazoo `Lock` told about
/// Curator's names (`extra_lock_patterns=["-lock-"]`) waits for it.
async fn a_dlock_holder_excludes_kazoo_with_curator_patterns(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let (path, mut kazoo) = meeting_kazoo(h, "/kazoo/m2")?;
    let g = Mutex::new(&s, &path)?.acquire().await?;
    let lock = |timeout: &str| format!("lock {path} {timeout} -lock-");
    dlock_excludes_peer(&s, g, &mut kazoo, lock, &path, WITHIN).await?;
    kazoo_releases(&mut kazoo, &path)?;
    Ok(())
}

/// In kazoo's layout dlock writes kazoo's names: a plain kazoo `Lock`
/// (no patterns) waits for the dlock holder, and the other way round.
async fn in_kazoo_layout_plain_kazoo_and_dlock_exclude_each_other(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let (path, mut kazoo) = meeting_kazoo(h, "/kazoo/m3")?;
    let mutex = Mutex::new(&s, &path)?.with_layout(Layout::Kazoo)?;
    let g = mutex.acquire().await?;
    ensure!(is_kazoo_name(g.node()), "{}", g.node());
    let lock = |timeout: &str| format!("lock {path} {timeout}");
    dlock_excludes_peer(&s, g, &mut kazoo, lock, &path, WITHIN).await?;
    ensure!(
        mutex.try_acquire().await?.is_none(),
        "dlock got a lock kazoo holds"
    );
    kazoo_releases(&mut kazoo, &path)?;
    let g = tokio::time::timeout(WITHIN, mutex.acquire()).await??;
    g.release().await?;
    // The directory is persistent, as kazoo's ensure_path makes it.
    let stat = s.exists(&path).await?.context("the lock directory stays")?;
    ensure!(stat.ephemeral_owner == 0);
    Ok(())
}

/// dlock's buyers: `n` sessions, each buying with a mutex in `layout`
/// until the stock at `stock` is 0 (read, wait, write stock − 1 — safe only
/// under the lock). Returns how many they sold.
async fn dlock_buyers(
    h: &Harness,
    lock: &str,
    stock: &str,
    n: usize,
    layout: Layout,
) -> Result<u64> {
    let sold = Arc::new(AtomicU64::new(0));
    let mut buyers = Vec::new();
    for i in 0..n {
        let s: Session = h.session().await;
        let mutex = Mutex::new(&s, lock)?
            .with_layout(layout)?
            .with_data(format!("dlock-buyer-{i}"));
        let (stock, sold) = (stock.to_string(), sold.clone());
        buyers.push(tokio::spawn(async move {
            loop {
                let g = mutex.acquire().await?;
                let (data, _) = s.get_data(&stock).await?;
                let left: u64 = std::str::from_utf8(&data)?.trim().parse()?;
                if left == 0 {
                    g.release().await?;
                    return anyhow::Ok(());
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                s.set_data(&stock, (left - 1).to_string().as_bytes(), None)
                    .await?;
                sold.fetch_add(1, Ordering::Relaxed);
                g.release().await?;
            }
        }));
    }
    for b in buyers {
        b.await??;
    }
    Ok(sold.load(Ordering::Relaxed))
}

/// A mixed flash sale: kazoo buyers and dlock buyers share one lock and
/// sell exactly the stock. `patterns`: the kazoo lock's extra patterns.
async fn mixed_sale(h: &Harness, layout: Layout, patterns: &str) -> Result<()> {
    let s = h.session().await;
    let (lock, stock) = (h.path("/kazoo/sale/lock"), h.path("/kazoo/sale/stock"));
    let total = 150u64;
    s.create(&stock, total.to_string().as_bytes(), persistent())
        .await?;
    if layout == Layout::Curator {
        // kazoo takes the lock's directory for granted once it has seen it;
        // dlock's default layout creates it as a container (as Curator
        // does), which ZooKeeper removes whenever it is empty: so here it
        // is made beforehand, persistent (see the layout contract).
        s.create(&lock, b"", persistent()).await?;
    }
    let mut kazoo = Probe::start(&zk_hosts(h))?;
    ensure!(kazoo.ask(&format!("buy {lock} {stock} 3 {patterns}"))? == "buying");
    let ours = dlock_buyers(h, &lock, &stock, 3, layout).await?;
    let answer = kazoo.next_line(Duration::from_secs(120))?;
    let theirs: u64 = answer
        .strip_prefix("sold ")
        .with_context(|| format!("kazoo: {answer}"))?
        .parse()?;
    ensure!(
        ours + theirs == total,
        "sold {} of {total}: dlock {ours}, kazoo {theirs}",
        ours + theirs
    );
    let (left, _) = s.get_data(&stock).await?;
    ensure!(left == b"0", "{:?} left", String::from_utf8_lossy(&left));
    s.delete(&stock, None).await?;
    Ok(())
}

/// kazoo buyers with plain `Lock`s and dlock buyers in kazoo's layout.
async fn a_mixed_sale_in_kazoo_layout_sells_exactly_the_stock(h: &Harness) -> Result<()> {
    mixed_sale(h, Layout::Kazoo, "").await
}

/// kazoo buyers told about Curator's names and dlock buyers in the default
/// layout (the sale that oversold before dlock ordered kazoo's nodes).
async fn a_mixed_sale_with_curator_patterns_sells_exactly_the_stock(h: &Harness) -> Result<()> {
    mixed_sale(h, Layout::Curator, "-lock-").await
}

/// kazoo's `Election` and dlock's `LeaderSelector` (kazoo layout) on one
/// path: one leader at a time, in queue order, both listing alike.
async fn one_leader_across_kazoo_and_dlock(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let (path, mut kazoo) = meeting_kazoo(h, "/kazoo/election")?;
    ensure!(kazoo.ask(&format!("elect {path} k1"))? == "candidate");
    ensure!(kazoo.next_line(WITHIN)? == "leader k1");
    let (tx, mut terms) = tokio::sync::mpsc::unbounded_channel();
    let selector = LeaderSelector::new(&s, &path, move |term| {
        let tx = tx.clone();
        async move {
            let _ = tx.send(term.epoch());
            // Lead until the selector is closed.
            std::future::pending::<()>().await
        }
    })?
    .with_layout(Layout::Kazoo)?
    .with_id("d1");
    selector.start()?;
    await_children(&s, &path, 2, WITHIN).await?;
    ensure!(!selector.has_leadership(), "two leaders");
    ensure!(terms.try_recv().is_err(), "dlock led while kazoo leads");
    ensure!(kazoo.ask(&format!("contenders {path}"))? == "contenders k1,d1");
    let listed: Vec<(String, bool)> = selector
        .participants()
        .await?
        .into_iter()
        .map(|p| (p.id, p.is_leader))
        .collect();
    ensure!(
        listed == [("k1".to_string(), true), ("d1".to_string(), false)],
        "{listed:?}"
    );
    ensure!(kazoo.ask(&format!("resign {path}"))? == "resigned");
    tokio::time::timeout(WITHIN, terms.recv())
        .await?
        .context("dlock leads")?;
    ensure!(kazoo.ask(&format!("elect {path} k2"))? == "candidate");
    await_children(&s, &path, 2, WITHIN).await?;
    ensure!(kazoo.ask(&format!("contenders {path}"))? == "contenders d1,k2");
    ensure!(
        kazoo.next_line(Duration::ZERO).is_err(),
        "kazoo leads while dlock leads"
    );
    selector.close().await?;
    ensure!(kazoo.next_line(WITHIN)? == "leader k2");
    ensure!(kazoo.ask(&format!("resign {path}"))? == "resigned");
    Ok(())
}

/// kazoo's `Semaphore` and dlock's `Semaphore` in kazoo's layout share
/// one limit; a different maximum is refused, as kazoo refuses it.
async fn kazoo_and_dlock_semaphores_share_one_limit(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let (path, mut kazoo) = meeting_kazoo(h, "/kazoo/sem")?;
    let mut second = Probe::start(&zk_hosts(h))?;
    let answer = kazoo.ask(&format!("semaphore {path} 2 10000"))?;
    ensure!(answer.starts_with(&format!("acquired {path}/")), "{answer}");
    let sem = Semaphore::new(&s, &path, 2)?.with_layout(Layout::Kazoo)?;
    let lease = sem.acquire_one().await?;
    ensure!(sem.try_acquire(1).await?.is_none(), "a third lease of 2");
    ensure!(second.ask(&format!("semaphore {path} 2 300"))? == "timeout");
    let listed = sem.participants().await?;
    ensure!(listed.len() == 2 && listed.iter().all(|p| p.holds));
    let seen = dlock::inspect(&s, &path).await?;
    ensure!(seen.recipe == RecipeKind::Semaphore, "{seen:?}");
    ensure!(seen.participants.len() == 2, "{seen:?}");
    ensure!(seen
        .participants
        .iter()
        .all(|c| c.role == Role::Holder && c.foreign == Some(dlock::Foreign::Kazoo)));
    ensure!(seen.participants.iter().any(|c| c.data == b"kazoo-probe"));
    second.send(&format!("semaphore {path} 2 -1"))?;
    // Give the lease back: the waiting kazoo client takes it.
    let waiting_lock = format!("{path}-__lock__");
    await_children(&s, &waiting_lock, 1, WITHIN).await?;
    lease.release().await?;
    let answer = second.next_line(WITHIN)?;
    ensure!(answer.starts_with("acquired"), "{answer}");
    let err = Semaphore::new(&s, &path, 3)?
        .with_layout(Layout::Kazoo)?
        .try_acquire(1)
        .await
        .unwrap_err();
    ensure!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("max_leases 2")),
        "{err}"
    );
    // kazoo's clients release; then dlock has room again.
    kazoo_releases(&mut kazoo, &path)?;
    let lease = tokio::time::timeout(WITHIN, sem.acquire_one()).await??;
    kazoo_releases(&mut second, &path)?;
    lease.release().await?;
    // kazoo's semaphore node keeps its maximum as data: not ours to leave.
    await_children(&s, &path, 0, WITHIN).await?;
    s.delete(&path, None).await?;
    Ok(())
}

per_backend!(zookeeper => crate::common::zookeeper();
    a_kazoo_holder_excludes_dlock,
    a_kazoo_reader_excludes_dlock,
    a_dlock_holder_excludes_kazoo_with_curator_patterns,
    in_kazoo_layout_plain_kazoo_and_dlock_exclude_each_other,
    a_mixed_sale_in_kazoo_layout_sells_exactly_the_stock,
    a_mixed_sale_with_curator_patterns_sells_exactly_the_stock,
    one_leader_across_kazoo_and_dlock,
    kazoo_and_dlock_semaphores_share_one_limit,
);
