//! Wire compatibility with Apache Curator 5.4, proven against the real thing:
//! Java Curator and dlock contend for the same paths on one ZooKeeper.
//!
//! Needs Debian's Curator jars (`scripts/test.sh` installs them) and Java;
//! the Java side is `dlock_testkit::CuratorProbe`.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use common::{
    await_children, dlock_excludes_peer, peer_excludes_dlock, sold_exactly_the_stock, zk_hosts,
    Harness,
};
use dlock::store::{CreateMode, CreateOptions};
use dlock::{
    AtomicCounter, Barrier, DoubleBarrier, Error, Lockable, Mutex, PromotedToLock, ReadWriteLock,
    RetryPolicy, Session, SharedValue,
};

type Probe = dlock_testkit::CuratorProbe;

/// While Curator holds an InterProcessMutex, dlock's Mutex cannot have the
/// lock; once Curator releases, dlock gets it.
async fn curator_holder_excludes_dlock(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/interop/m1");
    let mut curator = Probe::start(&zk_hosts(h))?;
    let answer = curator.ask(&format!("mutex {path} 10000"))?;
    ensure!(
        answer.starts_with(&format!("acquired {path}/_c_")) && answer.contains("-lock-"),
        "{answer}"
    );
    let mutex = Mutex::new(&s, &path)?;
    let within = Duration::from_secs(10);
    let waiting = peer_excludes_dlock(&s, &mutex, &path, "Curator", within).await?;
    ensure!(curator.ask(&format!("release {path}"))? == "released");
    let g = tokio::time::timeout(Duration::from_secs(10), waiting).await???;
    g.release().await?;
    Ok(())
}

/// While dlock holds the Mutex, Curator's InterProcessMutex times out; once
/// dlock releases, Curator gets it.
async fn dlock_holder_excludes_curator(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/interop/m2");
    let mut curator = Probe::start(&zk_hosts(h))?;
    let g = Mutex::new(&s, &path)?.acquire().await?;
    let lock = |timeout: &str| format!("mutex {path} {timeout}");
    dlock_excludes_peer(&s, g, &mut curator, lock, &path, Duration::from_secs(10)).await?;
    ensure!(curator.ask(&format!("release {path}"))? == "released");
    Ok(())
}

/// A dlock holder's session expires: the Curator waiter acquires within the
/// session timeout plus a second, and the dlock guard learns it lost.
async fn an_expired_dlock_holder_hands_over_to_curator(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/interop/m3");
    let mut curator = Probe::start(&zk_hosts(h))?;
    let g = Mutex::new(&s, &path)?.acquire().await?;
    curator.send(&format!("mutex {path} -1"))?;
    await_children(&s, &path, 2, Duration::from_secs(10)).await?;
    s.faults()
        .context("ZooKeeper fault injection")?
        .expire()
        .await?;
    let answer = curator.next_line(s.session_timeout() + Duration::from_secs(1))?;
    ensure!(answer.starts_with("acquired"), "{answer}");
    tokio::time::timeout(Duration::from_secs(5), g.lost()).await?;
    ensure!(matches!(g.release().await.unwrap_err(), Error::Lost { .. }));
    ensure!(curator.ask(&format!("release {path}"))? == "released");
    Ok(())
}

/// The read-write lock's halves exclude Curator's: a Curator writer keeps
/// dlock readers out; dlock readers keep a Curator writer out.
async fn read_write_halves_interoperate(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/interop/rw");
    let mut curator = Probe::start(&zk_hosts(h))?;
    let answer = curator.ask(&format!("write {path} 10000"))?;
    ensure!(answer.contains("__WRIT__"), "{answer}");
    let rw = ReadWriteLock::new(&s, &path)?;
    ensure!(
        rw.try_read().await?.is_none(),
        "dlock read while Curator writes"
    );
    curator.ask(&format!("release {path}"))?;
    let r = rw.read().await?;
    ensure!(
        curator.ask(&format!("write {path} 300"))? == "timeout",
        "Curator wrote while dlock reads"
    );
    let answer = curator.ask(&format!("read {path} 5000"))?;
    ensure!(
        answer.starts_with("acquired"),
        "readers share across implementations: {answer}"
    );
    curator.ask(&format!("release {path}"))?;
    r.release().await?;
    Ok(())
}

/// Revocation works both ways: dlock asks a Curator holder, Curator asks a
/// dlock holder.
async fn revocation_crosses_implementations(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let mut curator = Probe::start(&zk_hosts(h))?;
    // dlock revokes a Curator holder.
    let path = h.path("/interop/rev1");
    let answer = curator.ask(&format!("revocable {path} 10000"))?;
    let node = answer
        .strip_prefix("acquired ")
        .context("acquired")?
        .to_string();
    dlock::revoke(&s, &node).await?;
    ensure!(curator.next_line(Duration::from_secs(10))? == format!("revoked {node}"));
    curator.ask(&format!("release {path}"))?;
    // Curator revokes a dlock holder.
    let path = h.path("/interop/rev2");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let g = Mutex::new(&s, &path)?
        .revocable(move |node| {
            let _ = tx.send(node.to_string());
        })
        .acquire()
        .await?;
    ensure!(curator.ask(&format!("revoke {}", g.node()))? == "revoke-sent");
    let asked = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await?;
    ensure!(asked.as_deref() == Some(g.node()));
    g.release().await?;
    Ok(())
}

/// Buys from the stock under `lock` until it is gone; returns how many.
async fn dlock_buyer(
    session: Session,
    lock: Box<dyn Lockable>,
    stock: String,
    sold: Arc<AtomicU64>,
) -> Result<()> {
    loop {
        let hold = lock.lock_for(None).await?.context("no timeout given")?;
        let (data, _) = session.get_data(&stock).await?;
        let left: u32 = std::str::from_utf8(&data)?.trim().parse()?;
        if left > 0 {
            session
                .set_data(&stock, (left - 1).to_string().as_bytes(), None)
                .await?;
            sold.fetch_add(1, Ordering::SeqCst);
        }
        hold.release().await?;
        if left == 0 {
            return Ok(());
        }
    }
}

/// The flash sale with Curator buyers (`shared/peers/curator/run.sh buy`)
/// and dlock buyers on one lock path and stock node: together they sell
/// exactly the stock.
async fn mixed_buyers_sell_exactly_the_stock(h: &Harness, kind: &str) -> Result<()> {
    let stock_total = 200;
    let (lock_path, stock_path) = (h.path("/shop/lock"), h.path("/shop/stock"));
    let admin = h.session().await;
    admin
        .create(
            &stock_path,
            stock_total.to_string().as_bytes(),
            CreateOptions::new(CreateMode::Persistent).with_parents(),
        )
        .await?;
    let run_sh =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/peers/curator/run.sh");
    ensure!(
        run_sh.exists(),
        "the Curator peer harness is missing at {}",
        run_sh.display()
    );
    let curator = tokio::process::Command::new("bash")
        .arg(&run_sh)
        .args([
            "buy",
            "--connect",
            &zk_hosts(h),
            "--path",
            &lock_path,
            "--stock",
            &stock_path,
            "--clients",
            "3",
            "--lock",
            kind,
        ])
        .env(
            "PEER_BUILD_DIR",
            dlock_testkit::curator_peerbench_classes()?,
        )
        .stdout(Stdio::piped())
        .spawn()?;
    // Let Curator's JVM get going: start when it has sold its first item.
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let (data, _, watch) = admin.get_data_watch(&stock_path).await?;
            if data != stock_total.to_string().as_bytes() {
                return anyhow::Ok(());
            }
            watch.changed().await;
        }
    })
    .await
    .context("Curator's buyers never bought")??;
    let sold = Arc::new(AtomicU64::new(0));
    let mut buyers = Vec::new();
    for _ in 0..3 {
        let s = h.session().await;
        let lock: Box<dyn Lockable> = match kind {
            "mutex" => Box::new(Mutex::new(&s, &lock_path)?),
            "write" => Box::new(ReadWriteLock::new(&s, &lock_path)?.write_half()),
            "semaphore-mutex" => Box::new(dlock::SemaphoreMutex::new(&s, &lock_path)?),
            other => bail!("no dlock buyer for {other}"),
        };
        buyers.push(tokio::spawn(dlock_buyer(
            s,
            lock,
            stock_path.clone(),
            sold.clone(),
        )));
    }
    for b in buyers {
        b.await??;
    }
    let out = tokio::time::timeout(Duration::from_secs(120), curator.wait_with_output()).await??;
    ensure!(out.status.success(), "the Curator buyers failed");
    let line = String::from_utf8(out.stdout)?;
    let curator_sold: u64 = line
        .trim()
        .rsplit("sold=")
        .next()
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("unexpected Curator output {line:?}"))?;
    let dlock_sold = sold.load(Ordering::SeqCst);
    sold_exactly_the_stock(
        &admin,
        &stock_path,
        stock_total,
        dlock_sold,
        "Curator",
        curator_sold,
    )
    .await
}

async fn mixed_mutex_buyers_sell_exactly_the_stock(h: &Harness) -> Result<()> {
    mixed_buyers_sell_exactly_the_stock(h, "mutex").await
}

async fn mixed_write_lock_buyers_sell_exactly_the_stock(h: &Harness) -> Result<()> {
    mixed_buyers_sell_exactly_the_stock(h, "write").await
}

async fn mixed_semaphore_mutex_buyers_sell_exactly_the_stock(h: &Harness) -> Result<()> {
    mixed_buyers_sell_exactly_the_stock(h, "semaphore-mutex").await
}

/// A barrier Curator sets holds a dlock waiter until Curator removes it, and
/// a barrier dlock sets holds a Curator waiter until dlock removes it.
async fn barriers_cross_implementations(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/interop/barrier");
    let mut curator = Probe::start(&zk_hosts(h))?;
    let barrier = Barrier::new(&s, &path)?;

    ensure!(curator.ask(&format!("barrier-set {path}"))? == "set");
    let err = (barrier.wait_on_barrier_timeout(Duration::from_millis(300)))
        .await
        .unwrap_err();
    ensure!(matches!(err, Error::Timeout(_)), "{err}");
    let waiting = tokio::spawn({
        let barrier = barrier.clone();
        async move { barrier.wait_on_barrier().await }
    });
    ensure!(curator.ask(&format!("barrier-remove {path}"))? == "removed");
    tokio::time::timeout(Duration::from_secs(10), waiting).await???;

    barrier.set_barrier().await?;
    ensure!(curator.ask(&format!("barrier-wait {path} 300"))? == "timeout passed");
    curator.send(&format!("barrier-wait {path} -1"))?;
    barrier.remove_barrier().await?;
    ensure!(curator.next_line(Duration::from_secs(10))? == "passed");
    Ok(())
}

/// Two dlock and two Curator members of one DoubleBarrier for 4 on one path:
/// nobody is in before the fourth enters, and all are out once the last
/// leaves (a dlock member not before).
async fn double_barrier_members_mix(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/interop/double");
    let within = Duration::from_secs(20);
    let mut curator = Probe::start(&zk_hosts(h))?;
    curator.send(&format!("dbenter c1 {path} 4"))?;
    curator.send(&format!("dbenter c2 {path} 4"))?;
    let barrier = DoubleBarrier::new(&s, &path, 4)?;
    let first = tokio::spawn({
        let barrier = barrier.clone();
        async move { barrier.enter().await }
    });
    await_children(&s, &path, 3, within).await?;
    ensure!(!first.is_finished(), "dlock entered with 3 of 4");
    ensure!(
        curator.next_line(Duration::ZERO).is_err(),
        "Curator entered with 3 of 4"
    );
    let second = barrier.enter().await?;
    let first = tokio::time::timeout(within, first).await???;
    let mut entered = [curator.next_line(within)?, curator.next_line(within)?];
    entered.sort();
    ensure!(entered == ["entered c1", "entered c2"], "{entered:?}");

    curator.send("dbleave c1")?;
    curator.send("dbleave c2")?;
    let leaving = tokio::spawn(first.leave());
    // Curator 5.4's leave: the lowest-named member keeps its node until it
    // is alone, the others delete theirs at once. Wait (by watch) until at
    // most the second dlock member and that lowest one are left.
    let last = dlock::path::node_name(second.path()).to_string();
    tokio::time::timeout(within, async {
        loop {
            let (children, watch) = s.children_watch(&path).await?;
            let members: Vec<_> = children.iter().filter(|c| c.name != "ready").collect();
            if members.len() <= 2 && members.iter().any(|c| c.name == last) {
                return anyhow::Ok(());
            }
            watch.changed().await;
        }
    })
    .await??;
    // dlock's leave waits for every member.
    ensure!(!leaving.is_finished(), "dlock left before the last member");
    second.leave().await?;
    tokio::time::timeout(within, leaving).await???;
    let mut left = [curator.next_line(within)?, curator.next_line(within)?];
    left.sort();
    ensure!(left == ["left c1", "left c2"], "{left:?}");
    await_children(&s, &path, 0, within).await?;
    Ok(())
}

async fn next_member_event(
    seen: &mut futures::stream::BoxStream<'static, dlock::MemberEvent>,
    within: Duration,
) -> Result<dlock::MemberEvent> {
    use futures::StreamExt;
    tokio::time::timeout(within, seen.next())
        .await
        .context("no membership event in time")?
        .context("the stream ended")
}

/// A Curator `GroupMember` and a dlock `GroupMember` on one path see each
/// other with their payloads, follow each other's payload updates and
/// departures; Curator's member node is the one dlock writes (ephemeral,
/// `<path>/<id>`, the payload as data).
async fn group_members_see_each_other(h: &Harness) -> Result<()> {
    use dlock::{GroupMember, MemberEvent};
    let s = h.session().await;
    let path = h.path("/interop/group");
    let within = Duration::from_secs(20);
    let mut curator = Probe::start(&zk_hosts(h))?;
    let ours = GroupMember::new(&s, &path, "d")?.with_payload(b"dp".to_vec());
    ours.start().await?;
    let mut seen = ours.events();
    ensure!(curator.ask(&format!("member-join {path} c cp"))? == "joined c");
    let (data, stat) = s.get_data(&format!("{path}/c")).await?;
    ensure!(stat.ephemeral_owner != 0 && data == b"cp", "{data:?}");
    ensure!(
        next_member_event(&mut seen, within).await?
            == MemberEvent::Joined {
                id: "c".into(),
                payload: b"cp".to_vec()
            }
    );
    let all: Vec<(String, Vec<u8>)> = ours.current_members().into_iter().collect();
    ensure!(
        all == [("c".into(), b"cp".to_vec()), ("d".into(), b"dp".to_vec())],
        "{all:?}"
    );
    ensure!(curator.ask("members c c=cp,d=dp 20000")? == "members c=cp,d=dp");

    ensure!(curator.ask("member-update c cp2")? == "updated c");
    ensure!(
        next_member_event(&mut seen, within).await?
            == MemberEvent::Updated {
                id: "c".into(),
                payload: b"cp2".to_vec()
            }
    );
    ours.set_payload(b"dp2".to_vec()).await?;
    // Our own update is a change of the group as well.
    ensure!(
        next_member_event(&mut seen, within).await?
            == MemberEvent::Updated {
                id: "d".into(),
                payload: b"dp2".to_vec()
            }
    );
    ensure!(curator.ask("members c c=cp2,d=dp2 20000")? == "members c=cp2,d=dp2");

    ensure!(curator.ask("member-leave c")? == "left c");
    ensure!(next_member_event(&mut seen, within).await? == MemberEvent::Left { id: "c".into() });
    ensure!(ours.current_members().keys().collect::<Vec<_>>() == ["d"]);
    ours.close().await?;
    Ok(())
}

/// A dlock member's departure (its session's end) is seen by Curator.
async fn curator_sees_a_dlock_member_leave(h: &Harness) -> Result<()> {
    use dlock::GroupMember;
    let s = h.session().await;
    let path = h.path("/interop/group-leave");
    let mut curator = Probe::start(&zk_hosts(h))?;
    ensure!(curator.ask(&format!("member-join {path} c cp"))? == "joined c");
    let ours = GroupMember::new(&s, &path, "d")?.with_payload(b"dp".to_vec());
    ours.start().await?;
    ensure!(curator.ask("members c c=cp,d=dp 20000")? == "members c=cp,d=dp");
    s.close().await;
    ensure!(curator.ask("members c c=cp 20000")? == "members c=cp");
    ensure!(curator.ask("member-leave c")? == "left c");
    Ok(())
}

async fn next_leader(
    leaders: &mut futures::stream::BoxStream<'static, Option<dlock::LeaderParticipant>>,
    within: Duration,
) -> Result<Option<String>> {
    use futures::StreamExt;
    let leader = tokio::time::timeout(within, leaders.next())
        .await
        .context("no leader change in time")?
        .context("the stream ended")?;
    Ok(leader.map(|l| l.id))
}

/// An observer sees Curator's and dlock's LeaderLatches lead in turn, in
/// order, on one path, without taking part.
async fn an_observer_follows_curator_and_dlock_leaders(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/interop/observe");
    let within = Duration::from_secs(20);
    let observer = dlock::observe(&h.session().await, &path).await?;
    let mut leaders = observer.leader_changes();
    ensure!(next_leader(&mut leaders, within).await?.is_none());
    let mut curator = Probe::start(&zk_hosts(h))?;
    ensure!(curator.ask(&format!("latch-start {path} c1"))? == "started c1");
    ensure!(next_leader(&mut leaders, within).await?.as_deref() == Some("c1"));
    let ours = dlock::LeaderLatch::new(&s, &path)?.with_id("d1");
    ours.start()?;
    await_children(&s, &path, 2, within).await?;
    ensure!(curator.ask("latch-close c1")? == "closed c1");
    ensure!(next_leader(&mut leaders, within).await?.as_deref() == Some("d1"));
    ours.await_leadership_timeout(within).await?;
    ours.close().await?;
    ensure!(next_leader(&mut leaders, within).await?.is_none());
    observer.close().await;
    Ok(())
}

/// One counter, both implementations: each reads what the other wrote,
/// a stale compare-and-set fails on either side, and Curator and dlock
/// clients incrementing at once (optimistic and promoted to one lock) sum
/// exactly.
async fn counters_cross_implementations(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/interop/counter");
    let lock_path = h.path("/interop/counter-lock");
    let within = Duration::from_secs(60);
    let mut curator = Probe::start(&zk_hosts(h))?;
    let counter = AtomicCounter::new(&s, &path)?;

    ensure!(curator.ask(&format!("counter-add {path} 5"))? == "added ok 0 5");
    ensure!(
        s.get_data(&path).await?.0 == 5i64.to_be_bytes(),
        "Curator's bytes"
    );
    let v = counter.add(-7).await?;
    ensure!(
        v.succeeded && v.pre_value == 5 && v.post_value == -2,
        "{v:?}"
    );
    ensure!(curator.ask(&format!("counter-get {path}"))? == "counter -2");
    ensure!(curator.ask(&format!("counter-cas {path} 5 9"))? == "cas failed -2");
    ensure!(curator.ask(&format!("counter-cas {path} -2 9"))? == "cas ok -2");
    ensure!(!counter.compare_and_set(-2, 0).await?.succeeded, "stale");
    ensure!(counter.compare_and_set(9, 0).await?.succeeded);
    ensure!(curator.ask(&format!("counter-get {path}"))? == "counter 0");

    // Two Curator threads (one promoted to the lock) and two dlock
    // sessions (promoted to the same lock) at once.
    const ROUNDS: usize = 40;
    curator.send(&format!("counter-incr c1 {path} {ROUNDS} {lock_path}"))?;
    curator.send(&format!("counter-incr c2 {path} {ROUNDS}"))?;
    let patient = RetryPolicy {
        base_sleep: Duration::from_millis(1),
        max_sleep: Duration::from_millis(20),
        max_retries: 100,
    };
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let counter = AtomicCounter::new(&h.session().await, &path)?
            .with_retry(RetryPolicy {
                max_retries: 3,
                ..patient
            })
            .promoted_to_lock(PromotedToLock::new(&lock_path)?.with_retry(patient));
        tasks.push(tokio::spawn(async move {
            let mut ok = 0i64;
            for _ in 0..ROUNDS {
                ensure!(counter.increment().await?.succeeded);
                ok += 1;
            }
            anyhow::Ok(ok)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    for _ in 0..2 {
        let line = curator.next_line(within)?;
        let words: Vec<&str> = line.split(' ').collect();
        ensure!(words.len() == 4 && words[0] == "incremented", "{line}");
        total += words[2].parse::<i64>()?;
    }
    ensure!(total >= 3 * ROUNDS as i64, "too many failed: {total}");
    ensure!(
        counter.get().await?.post_value == total,
        "dlock reads {total}"
    );
    ensure!(curator.ask(&format!("counter-get {path}"))? == format!("counter {total}"));
    s.delete(&path, None).await?;
    Ok(())
}

/// One SharedValue, both implementations: bytes Curator sets reach a
/// started dlock value by its watch, and bytes dlock sets are what
/// Curator reads, at the version dlock reports.
async fn shared_values_cross_implementations(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/interop/value");
    let within = Duration::from_secs(20);
    let mut curator = Probe::start(&zk_hosts(h))?;
    // Curator's start creates the node with the seed, its set writes it
    // again: version 1.
    ensure!(curator.ask(&format!("value-set {path} 00ff10"))? == "value-set 1");
    let value = SharedValue::new(&s, &path, b"ignored seed".to_vec())?;
    value.start().await?;
    ensure!(value.get() == [0x00, 0xff, 0x10], "{:?}", value.get());
    let mut rx = value.subscribe();
    ensure!(curator.ask(&format!("value-set {path} 68656c6c6f"))? == "value-set 2");
    tokio::time::timeout(within, rx.wait_for(|v| v.value == b"hello")).await??;
    ensure!(value.versioned().version == 2);

    ensure!(
        value
            .try_set(&value.versioned(), b"from dlock".to_vec())
            .await?
    );
    let hex: String = b"from dlock".iter().map(|b| format!("{b:02x}")).collect();
    ensure!(curator.ask(&format!("value-get {path}"))? == format!("value 3 {hex}"));
    value.set(Vec::new()).await?;
    ensure!(curator.ask(&format!("value-get {path}"))? == "value 4 ");
    // A SharedCount's bytes through Curator's SharedValue.
    value.set(1i32.to_be_bytes().to_vec()).await?;
    let count = dlock::SharedCount::new(&s, &path, 0)?;
    count.start().await?;
    count.set(258).await?;
    ensure!(curator.ask(&format!("value-get {path}"))? == "value 6 00000102");
    count.close().await;
    value.close().await;
    s.delete(&path, None).await?;
    Ok(())
}

per_backend!(zookeeper => crate::common::zookeeper();
    counters_cross_implementations,
    shared_values_cross_implementations,
    barriers_cross_implementations,
    double_barrier_members_mix,
    group_members_see_each_other,
    curator_sees_a_dlock_member_leave,
    an_observer_follows_curator_and_dlock_leaders,
    curator_holder_excludes_dlock,
    dlock_holder_excludes_curator,
    an_expired_dlock_holder_hands_over_to_curator,
    read_write_halves_interoperate,
    revocation_crosses_implementations,
    mixed_mutex_buyers_sell_exactly_the_stock,
    mixed_write_lock_buyers_sell_exactly_the_stock,
    mixed_semaphore_mutex_buyers_sell_exactly_the_stock,
);
