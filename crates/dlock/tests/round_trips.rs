//! Round trips of an uncontended acquire + release on real servers, counted
//! by a proxy between client and server that holds each reply back a
//! little (so that only real waits for an answer count; requests sent
//! together before any answer share one round trip). The number follows
//! from each backend's protocol:
//!
//! - **ZooKeeper: 2** — the create and the listing pipelined on one
//!   connection, then the delete.
//! - **Consul: 3** — the reads of the node's ancestors, sent together
//!   (a Consul transaction cannot ask "absent or not held by a session",
//!   so that no node is created below an ephemeral one is checked by
//!   reading them first); the create and the listing in one `/v1/txn`
//!   (`check-not-exists`, `lock` with the session, `get-tree`); then the
//!   delete, one `/v1/txn` fenced by the node's modify index, which the
//!   create returned.
//!
//! etcd's uncontended cycle is not pinned here: by its protocol it is 2 (the create and
//! the listing in one `Txn`, then the delete), but its gRPC runs over
//! HTTP/2, and the proxy sees bytes, not frames: what the client sends
//! after an answer without waiting for one (HTTP/2 flow-control frames)
//! starts a flight too, so the proxy counts 4 per cycle.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dlock::store::{CreateMode, CreateOptions};
use dlock::{ConsulLock, KvSemaphore, Layout, Mutex, Session, SessionOptions};
use dlock_testkit::TcpProxy;
use futures::future::BoxFuture;

/// Measures 5 acquire + release cycles through a proxy to `upstream`
/// (`scheme://` + the proxy's address is the endpoint) and checks that an
/// uncontended cycle takes `expected` round trips: a keep-alive may add one
/// to a cycle, never fewer.
async fn an_uncontended_cycle_takes(
    scheme: &str,
    upstream: &str,
    expected: u64,
) -> anyhow::Result<()> {
    let cycles = round_trips_of(scheme, upstream, |session, path| {
        Box::pin(async move {
            let mutex = Mutex::new(&session, &path)?;
            mutex.acquire().await?.release().await?;
            Ok(())
        })
    })
    .await?;
    let fewest = *cycles.iter().min().unwrap();
    assert_eq!(
        fewest, expected,
        "round trips per acquire+release: {cycles:?}"
    );
    assert!(
        cycles.iter().filter(|&&c| c == expected).count() >= 4,
        "{cycles:?}"
    );
    Ok(())
}

/// One acquire + release of a recipe on `session` at the lock path.
type Cycle = fn(Session, String) -> BoxFuture<'static, dlock::Result<()>>;

/// The round trips of 5 `cycle`s through a proxy to `upstream`, after one
/// to warm up (as [`an_uncontended_cycle_takes`] measures them).
async fn round_trips_of(scheme: &str, upstream: &str, cycle: Cycle) -> anyhow::Result<Vec<u64>> {
    let proxy = TcpProxy::start(upstream)?;
    // A long session: few keep-alives (one every third of it) in the way.
    let options = SessionOptions::default().with_session_timeout(Duration::from_secs(30));
    let session = dlock::connect_with(&format!("{scheme}://{}", proxy.address()), options).await?;
    let root = format!("/rt-{}", uuid::Uuid::new_v4().simple());
    // A persistent lock directory is never reaped between cycles, so every
    // cycle is the steady state (no directory to re-create).
    let options = CreateOptions::new(CreateMode::Persistent).with_parents();
    session
        .create(&format!("{root}/lock"), b"", options)
        .await?;
    let path = format!("{root}/lock");
    cycle(session.clone(), path.clone()).await?;
    proxy.delay_replies(Duration::from_millis(20));
    let mut cycles = Vec::new();
    for _ in 0..5 {
        let before = proxy.flights();
        cycle(session.clone(), path.clone()).await?;
        cycles.push(proxy.flights() - before);
    }
    // The container reaper may have removed the empty directories already;
    // a KV semaphore's record stays, emptied.
    for dir in [format!("{root}/lock/.lock"), format!("{root}/lock"), root] {
        match session.delete(&dir, None).await {
            Ok(()) | Err(dlock::Error::NoNode { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    session.close().await;
    Ok(cycles)
}

#[cfg(feature = "zookeeper")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_acquire_and_release_is_two_round_trips() -> anyhow::Result<()> {
    let upstream = dlock_testkit::shared_zk().connect_string();
    an_uncontended_cycle_takes("zk", &upstream, 2).await
}

#[cfg(feature = "consul")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_acquire_and_release_is_three_round_trips_on_consul() -> anyhow::Result<()> {
    let upstream = dlock_testkit::shared_consul().endpoint();
    an_uncontended_cycle_takes("consul", &upstream, 3).await
}

/// A `ConsulLock` taken and given back, uncontended, on Consul: 3 — the
/// `.lock` key's create (its ancestors' reads, then the acquiring
/// transaction: 2) and the release's delete, fenced by our session's hold
/// of the key (`Store::deletes_only_created`: 1). It was 5 while the
/// release read the key first to check it was still the node it made.
#[cfg(feature = "consul")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consul_lock_cycle_deletes_its_key_in_one_round_trip() -> anyhow::Result<()> {
    let upstream = dlock_testkit::shared_consul().endpoint();
    let cycles = round_trips_of("consul", &upstream, |session, path| {
        Box::pin(async move {
            ConsulLock::new(&session, &path)?
                .acquire()
                .await?
                .release()
                .await
        })
    })
    .await?;
    let fewest = cycles.iter().min();
    assert_eq!(fewest, Some(&3), "round trips per cycle: {cycles:?}");
    Ok(())
}

/// A Consul-layout `KvSemaphore` slot, taken and given back: 11 — the
/// entry's create (its ancestors' reads, then the transaction: 2), a look
/// (the record, then the entries, whose listing tells who holds each, so
/// no read per entry: 2), the join's compare-and-set on the record (a read,
/// then the transaction: 2); then the release's look (2), emptying the
/// record (the same: 2) and deleting the entry
/// (fenced by what its create returned: 1). The lease's watch on its entry
/// (its lost signal) starts alongside, off the acquire's path; its first
/// query goes out with the others' or, now and then, in a flight of its
/// own: 12.
#[cfg(feature = "consul")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kv_semaphore_slot_is_eleven_round_trips_on_consul() -> anyhow::Result<()> {
    let upstream = dlock_testkit::shared_consul().endpoint();
    let cycles = round_trips_of("consul", &upstream, |session, path| {
        Box::pin(async move {
            let sem = KvSemaphore::new(&session, &path, 2)?.with_layout(Layout::Consul);
            sem.acquire().await?.release().await
        })
    })
    .await?;
    let (fewest, most) = (cycles.iter().min(), cycles.iter().max());
    assert_eq!(fewest, Some(&11), "round trips per slot: {cycles:?}");
    assert!(most <= Some(&12), "round trips per slot: {cycles:?}");
    Ok(())
}

/// What a server has sent and served so far, as its own counters tell:
/// (messages it sent that a handoff can multiply — etcd: watch responses;
/// ZooKeeper: every packet to a client — and requests it served).
type Counters = (u64, u64);

/// What a handoff of a busy mutex costs the server, among `clients`
/// clients that each acquire and release it in a loop (each with its own
/// session; the queue keeps its order, as on any busy lock): messages and
/// requests per handoff (from `counters`), round after round of `HANDOFFS`
/// handoffs, until `steady` accepts three rounds in a row — or `ROUNDS`
/// rounds went by, which fails, with what each round cost.
///
/// A herd shows as messages that grow with the clients: each handoff
/// waking, or telling, every waiting client.
async fn handoffs_settle_at(
    endpoint: &str,
    clients: usize,
    counters: &dyn Fn() -> anyhow::Result<Counters>,
    steady: &dyn Fn(f64, f64) -> bool,
) -> anyhow::Result<()> {
    const HANDOFFS: u64 = 100;
    const ROUNDS: usize = 40;
    let path = format!("/handoffs-{}/lock", uuid::Uuid::new_v4().simple());
    let (acquired_tx, mut acquired) = tokio::sync::watch::channel(0u64);
    let acquired_tx = Arc::new(acquired_tx);
    let stop = Arc::new(AtomicBool::new(false));
    let mut sessions = Vec::new();
    let mut loops = Vec::new();
    for _ in 0..clients {
        let session = dlock::connect(endpoint).await?;
        let mutex = Mutex::new(&session, &path)?;
        let (acquired_tx, stop) = (acquired_tx.clone(), stop.clone());
        loops.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let guard = mutex.acquire().await?;
                acquired_tx.send_modify(|n| *n += 1);
                guard.release().await?;
            }
            anyhow::Ok(())
        }));
        sessions.push(session);
    }
    let mut costs = Vec::new();
    let mut in_a_row = 0;
    let mut outcome = Err(anyhow::anyhow!("never steady"));
    for _ in 0..ROUNDS {
        let start = *acquired.borrow_and_update();
        let (sent, served) = counters()?;
        // Generous: a handoff takes milliseconds; a stuck queue fails here.
        tokio::time::timeout(
            Duration::from_secs(120),
            acquired.wait_for(|&n| n >= start + HANDOFFS),
        )
        .await
        .map_err(|_| anyhow::anyhow!("{HANDOFFS} handoffs took over 2 minutes"))??;
        let (sent_after, served_after) = counters()?;
        let handoffs = (*acquired.borrow() - start) as f64;
        let per_handoff = (
            (sent_after - sent) as f64 / handoffs,
            (served_after - served) as f64 / handoffs,
        );
        costs.push(per_handoff);
        in_a_row = if steady(per_handoff.0, per_handoff.1) {
            in_a_row + 1
        } else {
            0
        };
        if in_a_row == 3 {
            outcome = Ok(());
            break;
        }
    }
    stop.store(true, Ordering::SeqCst);
    for l in loops {
        l.await??;
    }
    let last = sessions.last().expect("a client").clone();
    for dir in [path.clone(), dlock::path::parent(&path).to_string()] {
        match last.delete(&dir, None).await {
            Ok(()) | Err(dlock::Error::NoNode { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    for s in sessions {
        s.close().await;
    }
    let costs: Vec<String> = costs
        .iter()
        .map(|(m, r)| format!("{m:.1} msg + {r:.1} req"))
        .collect();
    eprintln!("{clients} clients, per handoff: {costs:?}");
    outcome.map_err(|e| anyhow::anyhow!("{clients} clients, per handoff: {costs:?}: {e}"))
}

/// A counter's value in a Prometheus text exposition: the sum over the
/// lines that start with `name{` and contain every one of `labels`.
#[cfg(feature = "etcd")]
fn prometheus_sum(body: &str, name: &str, labels: &[&str]) -> u64 {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// What a handoff among etcd waiters costs the server today, pinned: the
/// woken waiter asks nothing (its client's watch on the queue's directory
/// delivered the deletion, and the copy of the directory kept from it says
/// nobody is ahead), so a handoff is two KV requests — the holder's
/// delete, and its next create-and-list, one `Txn` — however many wait;
/// but that watch delivers every deletion in the directory to every client
/// with a waiter there (and it stays open between a client's waits): one
/// watch message per handoff per client (the holder's delete; not its
/// next create, which the watch filters out). This is the herd issue #23
/// asks to cut to O(1) messages (BENCHMARKS.md, "Session 15"); it was two
/// messages per client before the watch left out creations. Pinned as an
/// upper bound: a change that costs more fails here, one that cuts the
/// herd should tighten it.
#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_handoff_costs_at_most_two_requests_and_a_watch_message_per_client(
) -> anyhow::Result<()> {
    // A private server: its counters are this test's alone.
    let server = dlock_testkit::EtcdServer::start()?;
    let counters = || -> anyhow::Result<Counters> {
        let (_, body) = dlock_testkit::http_get(server.port(), "/metrics")?;
        Ok((
            prometheus_sum(
                &body,
                "grpc_server_msg_sent_total",
                &["grpc_method=\"Watch\""],
            ),
            prometheus_sum(
                &body,
                "grpc_server_started_total",
                &["grpc_service=\"etcdserverpb.KV\""],
            ),
        ))
    };
    let endpoint = format!("etcd://{}", server.endpoint());
    for clients in [4, 12] {
        // Every client's directory watch stays open between its waits (the
        // holder's too), and each gets the delete.
        let herd = clients as f64;
        handoffs_settle_at(&endpoint, clients, &counters, &|messages, requests| {
            messages <= herd + 1.5 && requests <= 2.2
        })
        .await?;
    }
    Ok(())
}

/// On ZooKeeper a handoff costs the same among 4 or 12 waiters, by
/// Curator's design: a waiter watches its predecessor alone, and lists the
/// queue once woken. Every packet the server sends counts (the replies to
/// the holder's delete, its create and listing, the woken waiter's listing
/// and the next waiter's read that arms its watch, the one notification;
/// and the clients' pings): about 6 per handoff, whether 4 or 12 clients
/// wait.
#[cfg(feature = "zookeeper")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zookeeper_handoff_costs_the_same_among_4_or_12_waiters() -> anyhow::Result<()> {
    // A private server: its counters are this test's alone.
    let server = dlock_testkit::ZkServer::start()?;
    let counters = || -> anyhow::Result<Counters> {
        let mntr = server.four_letter("mntr")?;
        let value = |name: &str| -> anyhow::Result<u64> {
            mntr.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
                .ok_or_else(|| anyhow::anyhow!("no {name} in mntr: {mntr}"))
        };
        Ok((value("zk_packets_sent")?, value("zk_packets_received")?))
    };
    let endpoint = format!("zk://{}", server.connect_string());
    for clients in [4, 12] {
        handoffs_settle_at(&endpoint, clients, &counters, &|messages, requests| {
            messages <= 7.0 && requests <= 7.0
        })
        .await?;
    }
    Ok(())
}
