//! Faults on real ZooKeeper: an ensemble losing its leader under
//! contention, connections cut within and past the session, a paused holder
//! with and without fencing. Histories are checked afterwards (see
//! `dlock_testkit::history`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dlock::store::{CreateMode, CreateOptions, Op, SessionState};
use dlock::{Error, LockGuard, Mutex, Session, SessionOptions};
use dlock_testkit::history::check_fenced_log;
use dlock_testkit::{shared_zk, TcpProxy, ZkEnsemble};

fn root() -> String {
    format!("/faults-{}", uuid::Uuid::new_v4().simple())
}

async fn connect(hosts: &str, timeout: Duration) -> Result<Session> {
    let options = SessionOptions::default().with_session_timeout(timeout);
    Ok(dlock::connect_with(&format!("zk://{hosts}"), options).await?)
}

/// Appends `token:mark` to the fenced resource, only while `guard` holds:
/// a compare-and-set on the resource's version inside a multi that also
/// checks the lock node. The resource's data is the log of accepted writes,
/// in acceptance order.
async fn fenced_append(
    session: &Session,
    guard: &LockGuard,
    resource: &str,
    begin: bool,
) -> Result<bool> {
    loop {
        let (data, stat) = match session.get_data(resource).await {
            Ok(read) => read,
            Err(e) if e.is_retryable() => continue,
            Err(e) => return Err(e.into()),
        };
        let mut log = String::from_utf8(data)?;
        let mark = format!("{}:{}\n", guard.token(), if begin { "b" } else { "w" });
        // A retry after a lost reply: if our mark is last, the earlier
        // attempt landed (only the holder writes), so do not write it twice.
        if log.ends_with(&mark) {
            return Ok(true);
        }
        log.push_str(&mark);
        let write = Op::SetData {
            path: resource.into(),
            data: log.into_bytes(),
            version: Some(stat.version),
        };
        match guard.guarded(&[write]).await {
            Ok(_) => return Ok(true),
            Err(Error::Lost { .. }) => return Ok(false),
            // Someone appended meanwhile (a holder we raced with would be a
            // violation, which the log check reports); read again.
            Err(Error::MultiFailed { .. }) => continue,
            Err(e) if e.is_retryable() => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

fn parse_log(data: &[u8]) -> Vec<(i64, bool)> {
    String::from_utf8_lossy(data)
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(t, m)| (t.parse().unwrap(), m == "b"))
        .collect()
}

/// Clients contend for a fenced mutex on a 3-node ensemble; the ensemble's
/// leader is killed (-9) mid-run. No two sections interleave, tokens only
/// grow, and sections keep completing after the new leader is elected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ensemble_leader_dies_during_contention() -> Result<()> {
    let mut ensemble = ZkEnsemble::start(3)?;
    let hosts = ensemble.connect_string();
    let root = root();
    let (lock, resource) = (format!("{root}/lock"), format!("{root}/resource"));
    let admin = connect(&hosts, Duration::from_secs(6)).await?;
    admin
        .create(
            &resource,
            b"",
            CreateOptions::new(CreateMode::Persistent).with_parents(),
        )
        .await?;
    let sections = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let session = connect(&hosts, Duration::from_secs(6)).await?;
        let (lock, resource, sections, stop) = (
            lock.clone(),
            resource.clone(),
            sections.clone(),
            stop.clone(),
        );
        clients.push(tokio::spawn(async move {
            let mutex = Mutex::new(&session, &lock)?;
            while !stop.load(Ordering::SeqCst) {
                let guard = match mutex.acquire().await {
                    Ok(g) => g,
                    Err(e) if e.is_retryable() => continue,
                    Err(e) => return Err(anyhow::Error::from(e)),
                };
                if fenced_append(&session, &guard, &resource, true).await?
                    && fenced_append(&session, &guard, &resource, false).await?
                {
                    sections.fetch_add(1, Ordering::SeqCst);
                }
                let _ = guard.release().await;
            }
            session.close().await;
            anyhow::Ok(())
        }));
    }
    let wait_for = |n: usize| {
        let sections = sections.clone();
        async move {
            tokio::time::timeout(Duration::from_secs(60), async {
                while sections.load(Ordering::SeqCst) < n {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await
        }
    };
    wait_for(20).await.context("no progress before the fault")?;
    let leader = ensemble
        .leader_index()
        .context("the ensemble has a leader")?;
    ensemble.kill(leader);
    let before = sections.load(Ordering::SeqCst);
    wait_for(before + 20)
        .await
        .context("no progress after the leader died")?;
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await??;
    }
    let (data, _) = admin.get_data(&resource).await?;
    let log = parse_log(&data);
    let checked = check_fenced_log(&log).map_err(anyhow::Error::msg)?;
    ensure!(checked >= before + 20, "{checked} sections in the log");
    admin.delete(&resource, None).await?;
    admin.close().await;
    Ok(())
}

/// A connection cut shorter than the session: the holder is suspended,
/// reconnects to the same session, and still holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_cut_keeps_the_lock() -> Result<()> {
    let proxy = TcpProxy::start(&shared_zk().connect_string())?;
    let holder = connect(&proxy.address(), Duration::from_secs(6)).await?;
    let observer = connect(&shared_zk().connect_string(), Duration::from_secs(6)).await?;
    let root = root();
    let guard = Mutex::new(&holder, &format!("{root}/lock"))?
        .acquire()
        .await?;
    let session = holder.session_id();
    let mut status = holder.watch_status();
    proxy.cut();
    tokio::time::timeout(
        Duration::from_secs(10),
        status.wait_for(|s| s.state == SessionState::Suspended),
    )
    .await??;
    ensure!(guard.is_suspended() && !guard.is_lost());
    proxy.restore();
    tokio::time::timeout(
        Duration::from_secs(10),
        status.wait_for(|s| s.state == SessionState::Reconnected),
    )
    .await??;
    ensure!(
        holder.session_id() == session && !guard.is_lost(),
        "same session, still held"
    );
    ensure!(
        observer.exists(guard.node()).await?.is_some(),
        "the lock node survived"
    );
    ensure!(Mutex::new(&observer, &format!("{root}/lock"))?
        .try_acquire()
        .await?
        .is_none());
    guard.release().await?;
    for s in [&holder, &observer] {
        let _ = s.delete(&format!("{root}/lock"), None).await;
        let _ = s.delete(&root, None).await;
        s.close().await;
    }
    Ok(())
}

/// A connection cut longer than the session: the server expires it, the
/// next client takes the lock, and the old holder learns it lost: its
/// guarded writes are rejected, so there is never a second accepted holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_cut_loses_the_lock_without_a_double_holder() -> Result<()> {
    let proxy = TcpProxy::start(&shared_zk().connect_string())?;
    let timeout = Duration::from_secs(2);
    let holder = connect(&proxy.address(), timeout).await?;
    let other = connect(&shared_zk().connect_string(), timeout).await?;
    let root = root();
    let (lock, resource) = (format!("{root}/lock"), format!("{root}/resource"));
    other
        .create(
            &resource,
            b"",
            CreateOptions::new(CreateMode::Persistent).with_parents(),
        )
        .await?;
    let g1 = Mutex::new(&holder, &lock)?.acquire().await?;
    ensure!(fenced_append(&holder, &g1, &resource, true).await?);
    let m2 = Mutex::new(&other, &lock)?;
    let waiting = tokio::spawn(async move { m2.acquire().await });
    proxy.cut();
    let g2 = tokio::time::timeout(timeout + Duration::from_secs(2), waiting).await???;
    ensure!(fenced_append(&other, &g2, &resource, true).await?);
    proxy.restore();
    tokio::time::timeout(Duration::from_secs(10), g1.lost()).await?;
    ensure!(
        !fenced_append(&holder, &g1, &resource, false).await?,
        "the old holder's write was rejected"
    );
    ensure!(fenced_append(&other, &g2, &resource, false).await?);
    let log = parse_log(&other.get_data(&resource).await?.0);
    ensure!(check_fenced_log(&log).map_err(anyhow::Error::msg)? == 2);
    ensure!(matches!(
        g1.release().await.unwrap_err(),
        Error::Lost { .. }
    ));
    g2.release().await?;
    other.delete(&resource, None).await?;
    holder.close().await;
    other.close().await;
    Ok(())
}

/// Kleppmann's scenario: a holder stalls (its traffic frozen) past its
/// session between reading and writing; another client takes the lock and
/// writes. The stalled holder's write is rejected with fencing, and shown to
/// corrupt the value without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_is_fenced_and_unfenced_writes_are_unsafe() -> Result<()> {
    for fenced in [true, false] {
        let proxy = TcpProxy::start(&shared_zk().connect_string())?;
        let timeout = Duration::from_secs(2);
        let stalled = connect(&proxy.address(), timeout).await?;
        let other = connect(&shared_zk().connect_string(), timeout).await?;
        let root = root();
        let (lock, counter) = (format!("{root}/lock"), format!("{root}/counter"));
        other
            .create(
                &counter,
                b"0",
                CreateOptions::new(CreateMode::Persistent).with_parents(),
            )
            .await?;
        // Each client adds one to the counter under the lock: two increments.
        let g1 = Mutex::new(&stalled, &lock)?.acquire().await?;
        let seen: i64 = std::str::from_utf8(&stalled.get_data(&counter).await?.0)?.parse()?;
        proxy.pause();
        let g2 = Mutex::new(&other, &lock)?
            .acquire_timeout(timeout * 3)
            .await?;
        let now: i64 = std::str::from_utf8(&other.get_data(&counter).await?.0)?.parse()?;
        g2.guarded(&[Op::SetData {
            path: counter.clone(),
            data: (now + 1).to_string().into(),
            version: None,
        }])
        .await?;
        g2.release().await?;
        proxy.resume();
        let late = (seen + 1).to_string().into_bytes();
        let result = if fenced {
            g1.guarded(&[Op::SetData {
                path: counter.clone(),
                data: late,
                version: None,
            }])
            .await
            .map(|_| ())
        } else {
            stalled.set_data(&counter, &late, None).await.map(|_| ())
        };
        let value: i64 = std::str::from_utf8(&other.get_data(&counter).await?.0)?.parse()?;
        if fenced {
            ensure!(matches!(result, Err(Error::Lost { .. })), "{result:?}");
            ensure!(
                value == 1,
                "fenced: the stale write was rejected, value {value}"
            );
        } else {
            result?;
            ensure!(
                value == 1,
                "unfenced: the stale write landed over the other's ({value})"
            );
            // Both clients incremented, but the value says 1: a lost update.
        }
        let _ = g1.release().await;
        other.delete(&counter, None).await?;
        stalled.close().await;
        other.close().await;
    }
    Ok(())
}
