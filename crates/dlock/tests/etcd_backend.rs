//! What only the etcd backend has: lease TTLs in whole seconds, our own
//! keep-alive loop, revocation from outside, keys named like paths, watch
//! streams that break and resume, compaction, authentication, one round
//! trip per step, fenced deletes, and hand-over after a lease expires —
//! all on real etcd 3.4 servers started by the tests.
#![cfg(feature = "etcd")]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use common::tests1::{got_within, hand_to, queued_lock, rivals, PrivateEtcd, Queued};
use common::{
    await_children, ephemeral, persistent, persistent_only, queued, sequential, sorted_names,
    Harness,
};
use dlock::store::{CreateMode, Created, SessionState, WatchEvent};
use dlock::{Error, Mutex, Session, SessionOptions};
use dlock_testkit::{shared_etcd, EtcdCluster, EtcdServer, TcpProxy};
use etcd_client::{Client, GetOptions};

const WITHIN: Duration = Duration::from_secs(20);

/// A plain etcd client, as `etcdctl` would be.
async fn raw(url: &str) -> Result<Client> {
    Ok(Client::connect([url], None).await?)
}

/// A session on the etcd at `endpoint` (`host:port`, or several joined by
/// commas) whose lease has the TTL `ttl`.
async fn etcd_session(endpoint: impl std::fmt::Display, ttl: Duration) -> dlock::Result<Session> {
    let options = SessionOptions::default().with_session_timeout(ttl);
    dlock::connect_with(&format!("etcd://{endpoint}"), options).await
}

/// A session with a long TTL through `proxy` (so a cut shorter than the TTL
/// neither loses nor, if no keep-alive falls into it, suspends it).
async fn via(proxy: &TcpProxy, ttl: Duration) -> Result<Session> {
    Ok(etcd_session(proxy.address(), ttl).await?)
}

async fn session_with_timeout(h: &Harness, timeout: Duration) -> Session {
    h.session_with(SessionOptions::default().with_session_timeout(timeout))
        .await
}

/// A session whose lease outlives any test here.
async fn long_session(h: &Harness) -> Session {
    session_with_timeout(h, Duration::from_secs(30)).await
}

/// A session owning an ephemeral node at `rest`, and another to observe it.
async fn a_node_and_an_observer(h: &Harness, rest: &str) -> Result<(Session, Session, Created)> {
    let (s, observer) = (h.session().await, h.session().await);
    let node = s.create(&h.path(rest), b"", ephemeral()).await?;
    Ok((s, observer, node))
}

/// Millisecond timeouts become whole-second TTLs (rounded up), and the
/// server's minimum (2 s on etcd 3.4 defaults) wins over smaller ones; the
/// session reports what the server granted.
async fn lease_ttl_is_the_timeout_in_whole_seconds(h: &Harness) -> Result<()> {
    let mut etcd = raw(&shared_etcd().url()).await?;
    for (asked, granted) in [(1, 2), (1500, 2), (2000, 2), (2001, 3), (4500, 5)] {
        let s = session_with_timeout(h, Duration::from_millis(asked)).await;
        ensure!(
            s.session_timeout() == Duration::from_secs(granted),
            "{asked} ms gave {:?}",
            s.session_timeout()
        );
        let ttl = etcd.lease_time_to_live(s.session_id(), None).await?;
        ensure!(
            ttl.granted_ttl() == granted as i64,
            "{asked} ms: the server granted {}",
            ttl.granted_ttl()
        );
        s.close().await;
        let ttl = etcd.lease_time_to_live(s.session_id(), None).await?;
        ensure!(
            ttl.ttl() == -1,
            "close revokes the lease (ttl {})",
            ttl.ttl()
        );
    }
    Ok(())
}

/// Our keep-alive loop holds a 2 s lease for several TTLs: same session,
/// never lost, its node still there. (A keep-alive answered later than a
/// third of the TTL would show as a brief suspension on a loaded machine;
/// that is allowed, a loss is not.)
async fn keep_alive_holds_the_session_past_several_ttls(h: &Harness) -> Result<()> {
    let (s, observer, node) = a_node_and_an_observer(h, "/alive").await?;
    let id = s.session_id();
    let mut states = s.watch_status();
    let watching = tokio::spawn(async move {
        let mut seen = Vec::new();
        while states.changed().await.is_ok() {
            let status = *states.borrow_and_update();
            if status.state == SessionState::Closed {
                break;
            }
            seen.push(status);
        }
        seen
    });
    tokio::time::sleep(s.session_timeout() * 3 + Duration::from_millis(500)).await;
    let status = s.status();
    ensure!(
        status.session_id == id && status.state != SessionState::Lost,
        "{status:?}"
    );
    let stat = observer
        .exists(&node.path)
        .await?
        .context("the node outlived three TTLs")?;
    ensure!(stat.ephemeral_owner == id);
    s.delete(&node.path, None).await?;
    s.close().await;
    let seen = watching.await?;
    ensure!(
        seen.iter()
            .all(|st| st.session_id == id && st.state != SessionState::Lost),
        "{seen:?}"
    );
    Ok(())
}

/// Someone revokes our lease (`etcdctl lease revoke`): its keys go at once,
/// the session learns it at its next keep-alive (`Lost`), and the next
/// operation runs with a new lease.
async fn a_lease_revoked_from_outside_is_lost(h: &Harness) -> Result<()> {
    let (s, observer, node) = a_node_and_an_observer(h, "/revoked").await?;
    let id = s.session_id();
    let (_, _, watch) = observer.get_data_watch(&node.path).await?;
    raw(&shared_etcd().url()).await?.lease_revoke(id).await?;
    ensure!(watch.changed().await == WatchEvent::NodeDeleted);
    tokio::time::timeout(s.session_timeout(), s.lost(id))
        .await
        .context("lost within a TTL")?;
    ensure!(s.state() == SessionState::Lost);
    let again = s.create(&node.path, b"", ephemeral()).await?;
    ensure!(s.state() == SessionState::Reconnected && s.session_id() != id);
    ensure!(again.stat.ephemeral_owner == s.session_id());
    s.delete(&again.path, None).await?;
    Ok(())
}

/// A store path is the etcd key with the same bytes: readable and settable
/// with a plain client; parents are implicit (no keys); an ephemeral node
/// carries the session's lease.
async fn keys_are_the_paths(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let mut etcd = raw(&shared_etcd().url()).await?;
    let stock = h.path("/shop/stock");
    s.create(&stock, b"5", persistent()).await?;
    let got = etcd.get(stock.as_str(), None).await?;
    ensure!(got.kvs().len() == 1 && got.kvs()[0].value() == b"5");
    ensure!(
        etcd.get(h.path("/shop"), None).await?.kvs().is_empty(),
        "parents are not written"
    );
    etcd.put(stock.as_str(), "4", None).await?;
    let (data, stat) = s.get_data(&stock).await?;
    ensure!(data == b"4" && stat.version == 1, "{stat:?}");
    // The directory exists while something is below it.
    ensure!(s.exists(&h.path("/shop")).await?.is_some());
    let names: Vec<_> = s
        .children(&h.root)
        .await?
        .into_iter()
        .map(|c| c.name)
        .collect();
    ensure!(names == ["shop"], "{names:?}");
    let lock = Mutex::new(&s, &h.path("/shop/lock"))?.acquire().await?;
    let kv = etcd.get(lock.node(), None).await?;
    ensure!(
        kv.kvs()[0].lease() == s.session_id(),
        "lock nodes carry the lease"
    );
    ensure!(
        lock.token().0 == kv.kvs()[0].create_revision(),
        "the token is the create revision"
    );
    lock.release().await?;
    s.delete(&stock, None).await?;
    ensure!(
        s.exists(&h.path("/shop")).await?.is_none(),
        "an emptied directory is gone"
    );
    Ok(())
}

/// What the conformance suite's `errors_name_the_node` leaves open, with
/// implicit parents: a create under a missing parent names the first
/// missing directory, and the parent vanishes with its last child.
async fn errors_name_the_node_with_implicit_parents(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let p = h.path("/err");
    s.create(&format!("{p}/child"), b"", persistent()).await?;
    let err = s
        .create(&h.path("/no/parent"), b"", persistent_only())
        .await
        .unwrap_err();
    ensure!(
        err == Error::NoNode {
            path: h.path("/no")
        },
        "{err}"
    );
    // A child of an implicit directory may be created without parents.
    s.create(&format!("{p}/sibling"), b"", persistent_only())
        .await?;
    let err = s.set_data(&p, b"x", None).await.unwrap_err();
    ensure!(
        err == Error::NoNode { path: p.clone() },
        "an implicit directory has no data to set: {err}"
    );
    s.delete(&format!("{p}/child"), None).await?;
    s.delete(&format!("{p}/sibling"), None).await?;
    let err = s.delete(&p, None).await.unwrap_err();
    ensure!(
        err == Error::NoNode { path: p.clone() },
        "gone with its last child: {err}"
    );
    Ok(())
}

/// A watch stream that breaks (the connection is cut for less than a TTL,
/// between keep-alives) resumes from the last revision it saw: the delete
/// that happened meanwhile is delivered, and the session never noticed.
async fn a_broken_watch_stream_resumes_where_it_was(h: &Harness) -> Result<()> {
    let proxy = TcpProxy::start(&shared_etcd().endpoint())?;
    let s = via(&proxy, Duration::from_secs(30)).await?;
    let other = h.session().await;
    // A persistent node gets a watch of its own; an ephemeral one joins
    // its directory's shared watch.
    for (name, mode) in [("/resume/n", persistent()), ("/resume/e/n", ephemeral())] {
        let node = other.create(&h.path(name), b"", mode).await?;
        let (_, _, watch) = s.get_data_watch(&node.path).await?;
        proxy.cut();
        other.delete(&node.path, None).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        proxy.restore();
        let event = tokio::time::timeout(WITHIN, watch.changed()).await?;
        ensure!(event == WatchEvent::NodeDeleted, "{name}: {event:?}");
    }
    ensure!(
        s.status().changes == 0,
        "the session stayed connected: {:?}",
        s.status()
    );
    s.close().await;
    Ok(())
}

/// How many watchers the server has now.
fn server_watchers(server: &EtcdServer) -> Result<u64> {
    let (_, body) = dlock_testkit::http_get(server.port(), "/metrics")?;
    body.lines()
        .find_map(|l| l.strip_prefix("etcd_debugging_mvcc_watcher_total "))
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
        .context("no etcd_debugging_mvcc_watcher_total in /metrics")
}

/// Waiters of one client in one queue share one server watch (a watch
/// created per wait can be filed unsynced by a busy server and then waits
/// up to 100 ms), and it closes a few seconds after the last waiter left.
async fn waiters_in_one_directory_share_one_server_watch(h: &PrivateEtcd) -> Result<()> {
    let server = &h.server;
    let (holder, waiter) = (
        h.session_with(SessionOptions::default()).await,
        h.session_with(SessionOptions::default()).await,
    );
    let path = h.path("/shared/lock");
    let held = Mutex::new(&holder, &path)?.acquire().await?;
    let mut waiting = Vec::new();
    for _ in 0..4 {
        let m = Mutex::new(&waiter, &path)?;
        waiting.push(tokio::spawn(
            async move { m.acquire().await?.release().await },
        ));
    }
    await_children(&holder, &path, 5, WITHIN).await?;
    // Polled: the server's count is the only witness (a watch the test's
    // own listing left behind is cancelled within a second).
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let watchers = server_watchers(server)?;
        if watchers == 1 {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "4 waiters of one client: {watchers} watchers"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    held.release().await?;
    for w in waiting {
        tokio::time::timeout(WITHIN, w).await???;
    }
    ensure!(server_watchers(server)? <= 1);
    let deadline = tokio::time::Instant::now() + WITHIN;
    while server_watchers(server)? > 0 {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the shared watch stayed open"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// A waiter whose watch stream broke while the store was compacted past
/// its watch's start revision still wakes: the watch reads again, sees the
/// predecessor gone, and fires; an unrelated compaction does not wake a
/// watch whose node did not change.
async fn a_waiter_wakes_although_its_watch_start_was_compacted(h: &PrivateEtcd) -> Result<()> {
    // A private server: compaction affects every client of a server.
    let proxy = TcpProxy::start(&h.server.endpoint())?;
    let mut etcd = raw(&h.server.url()).await?;
    let holder = session_with_timeout(h, Duration::from_secs(2)).await;
    let waiter = via(&proxy, Duration::from_secs(30)).await?;
    let path = h.path("/compaction/lock");
    let held = Mutex::new(&holder, &path)?.acquire().await?;
    let waiting = queued_lock(&holder, &path, 2, Mutex::new(&waiter, &path)?).await?;

    // Nothing changed: a compaction under a broken stream re-arms quietly.
    let bystander = h.path("/compaction/bystander");
    proxy.cut();
    compact_past_writes_to(&mut etcd, &bystander).await?;
    proxy.restore();
    tokio::time::sleep(Duration::from_secs(1)).await;
    ensure!(!waiting.is_finished(), "the waiter woke without a reason");

    // The holder releases while the waiter's stream is down, and the store
    // is compacted past the release.
    proxy.cut();
    held.release().await?;
    compact_past_writes_to(&mut etcd, &bystander).await?;
    proxy.restore();
    let guard = got_within(waiting, WITHIN).await?;
    guard.release().await?;
    etcd.delete(bystander, None).await?;
    ensure!(etcd
        .get(h.path("/compaction"), Some(GetOptions::new().with_prefix()))
        .await?
        .kvs()
        .is_empty());
    waiter.close().await;
    Ok(())
}

/// Writes `key` five times, then compacts the store up to the last write.
async fn compact_past_writes_to(etcd: &mut Client, key: &str) -> Result<()> {
    for i in 0..5 {
        etcd.put(key, i.to_string(), None).await?;
    }
    let now = etcd
        .get(key, None)
        .await?
        .header()
        .context("a response header")?
        .revision();
    etcd.compact(now, None).await?;
    Ok(())
}

/// The promise: when a holder's lease expires (its process is cut
/// off from etcd: no more keep-alives), the next waiter acquires within the
/// TTL plus a second — and not before the lease could have expired.
async fn a_holder_whose_lease_expires_hands_over_within_ttl_plus_a_second(
    h: &Harness,
) -> Result<()> {
    let proxy = TcpProxy::start(&shared_etcd().endpoint())?;
    let holder = via(&proxy, h.timeout()).await?;
    let ttl = holder.session_timeout();
    let waiter = h.session().await;
    let path = h.path("/expiring");
    let held = Mutex::new(&holder, &path)?.acquire().await?;
    let m = Mutex::new(&waiter, &path)?;
    let waiting = queued(&waiter, &path, 2, WITHIN, async move { m.acquire().await }).await?;
    let cut = tokio::time::Instant::now();
    proxy.cut();
    let guard = tokio::time::timeout(ttl + Duration::from_secs(1), waiting)
        .await
        .context("the waiter did not acquire within TTL + 1 s")???;
    let took = cut.elapsed();
    // The last keep-alive went out at most a third of the TTL before the
    // cut (plus however late a loaded machine sent it): the lease lived at
    // least two thirds of the TTL after the cut; a third leaves room for a
    // late keep-alive, and still rules out a handover the cut itself caused.
    ensure!(
        took >= ttl / 3,
        "handed over after {took:?}, before the lease could expire"
    );
    ensure!(took <= ttl + Duration::from_secs(1), "{took:?}");
    // The cut-off holder learns it: Suspended at once, Lost within the TTL.
    tokio::time::timeout(ttl + Duration::from_secs(1), held.lost()).await?;
    ensure!(held.is_lost());
    guard.release().await?;
    drop(held);
    proxy.restore();
    holder.close().await;
    Ok(())
}

/// KV requests etcd has served so far (its `/metrics`): `Range`, `Put`,
/// `DeleteRange`, `Txn`, `Compact`.
fn kv_requests(server: &EtcdServer) -> Result<u64> {
    Ok(kv_requests_by_method(server)?.values().sum())
}

/// [`kv_requests`] by method.
fn kv_requests_by_method(server: &EtcdServer) -> Result<BTreeMap<String, u64>> {
    let (_, body) = dlock_testkit::http_get(server.port(), "/metrics")?;
    let mut served = BTreeMap::new();
    for line in body.lines().filter(|l| {
        l.starts_with("grpc_server_started_total{")
            && l.contains("grpc_service=\"etcdserverpb.KV\"")
    }) {
        let method = line
            .split("grpc_method=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .context(format!("no method in {line}"))?;
        let count = line
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse::<f64>().ok())
            .context(format!("no count in {line}"))?;
        *served.entry(method.to_string()).or_default() += count as u64;
    }
    Ok(served)
}

/// The KV requests `during` made, by method (those it made none of left out).
async fn kv_requests_during<T>(
    server: &EtcdServer,
    during: impl std::future::Future<Output = Result<T>>,
) -> Result<(T, BTreeMap<String, u64>)> {
    let before = kv_requests_by_method(server)?;
    let value = during.await?;
    let mut made = kv_requests_by_method(server)?;
    for (method, count) in made.iter_mut() {
        *count -= before.get(method).copied().unwrap_or(0);
    }
    made.retain(|_, count| *count > 0);
    Ok((value, made))
}

fn requests(made: &[(&str, u64)]) -> BTreeMap<String, u64> {
    made.iter().map(|(m, n)| (m.to_string(), *n)).collect()
}

/// A release deletes our queue node with a plain delete: a transaction
/// comparing its create revision costs etcd 3.4 markedly more, and the
/// name is ours alone (protected). A delete whose reply never came may
/// still land much later, so that name is never created again, not even
/// in a later lease — the next acquisition takes another suffix — and the
/// retry compares the create revision (etcd#22082). Nodes that are not
/// protected queue nodes keep the fenced transaction.
async fn a_release_is_a_plain_delete_and_one_unanswered_retires_the_name(
    h: &PrivateEtcd,
) -> Result<()> {
    let (server, s) = (&h.server, long_session(h).await);
    let mutex = Mutex::new(&s, &h.path("/plain/lock"))?;
    let first = mutex.acquire().await?;
    let node = first.node().to_string();
    let ((), made) = kv_requests_during(server, async { Ok(first.release().await?) }).await?;
    ensure!(
        made == requests(&[("DeleteRange", 1)]),
        "a release: {made:?}"
    );

    let again = mutex.acquire().await?;
    ensure!(again.node() == node, "the name is reused: {}", again.node());
    s.faults().context("faults")?.lose_next_delete_reply();
    let ((), made) = kv_requests_during(server, async { Ok(again.release().await?) }).await?;
    ensure!(
        made == requests(&[("DeleteRange", 1), ("Txn", 1)]),
        "an unanswered delete, then a retry that compares: {made:?}"
    );

    // The unanswered delete may land at any time, even in a later lease.
    let lease = s.session_id();
    s.faults().context("faults")?.expire().await?;
    let third = mutex.acquire().await?;
    ensure!(s.session_id() != lease, "a new lease");
    let prefix =
        |n: &str| dlock::path::protection_prefix(dlock::path::node_name(n)).map(String::from);
    ensure!(
        third.node() != node && prefix(third.node()) == prefix(&node),
        "the same protection prefix, but the name is retired: {} after {node}",
        third.node()
    );
    let ((), made) = kv_requests_during(server, async { Ok(third.release().await?) }).await?;
    ensure!(
        made == requests(&[("DeleteRange", 1)]),
        "a release: {made:?}"
    );

    let unprotected = s.create(&h.path("/plain/node-"), b"", sequential()).await?;
    let ((), made) = kv_requests_during(server, async {
        Ok(s.delete(&unprotected.path, None).await?)
    })
    .await?;
    ensure!(
        made == requests(&[("Txn", 1)]),
        "an unprotected node: {made:?}"
    );

    s.close().await;
    let left = raw(&format!("http://{}", server.endpoint()))
        .await?
        .get(
            h.path("/plain"),
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await?
        .count();
    ensure!(left == 0, "{left} keys left under /plain");
    Ok(())
}

/// A plain delete given up before its reply came (dropped by a timeout, say)
/// may still land later too: its name is never created again either, even
/// in a later lease. The node is protected and sequential, as a queue's;
/// replies are slowed down so that the delete is given up in flight.
async fn a_plain_delete_given_up_in_flight_retires_the_name(h: &Harness) -> Result<()> {
    let proxy = TcpProxy::start(&shared_etcd().endpoint())?;
    let s = via(&proxy, Duration::from_secs(30)).await?;
    let dir = h.path("/given-up");
    let prefix = format!("{dir}/_c_{}-lock-", uuid::Uuid::new_v4());
    let node = s.create(&prefix, b"", sequential()).await?.path;
    proxy.delay_replies(Duration::from_millis(500));
    let gave_up = tokio::time::timeout(Duration::from_millis(100), s.delete(&node, None)).await;
    ensure!(gave_up.is_err(), "the delete was answered: {gave_up:?}");
    proxy.delay_replies(Duration::ZERO);
    let lease = s.session_id();
    s.faults().context("faults")?.expire().await?;
    let again = s.create(&prefix, b"", sequential()).await?.path;
    ensure!(s.session_id() != lease, "a new lease");
    ensure!(again != node, "the name came back: {again}");
    s.delete(&again, None).await?;
    await_children(&s, &dir, 0, WITHIN).await?;
    s.close().await;
    Ok(())
}

/// An uncontended acquire is one request (create and list in one
/// transaction), a release another: two sequential round trips, counted
/// by the server.
async fn an_uncontended_acquire_and_release_is_two_round_trips(h: &PrivateEtcd) -> Result<()> {
    let (server, s) = (&h.server, long_session(h).await);
    let mutex = Mutex::new(&s, &h.path("/rt/lock"))?;
    mutex.acquire().await?.release().await?;
    for _ in 0..5 {
        let before = kv_requests(server)?;
        mutex.acquire().await?.release().await?;
        let requests = kv_requests(server)? - before;
        ensure!(requests == 2, "requests per acquire+release: {requests}");
    }
    Ok(())
}

/// Leading and leaving is two requests too, once the directory is warm:
/// join (create and list), then leave (delete). The leader's watch on its
/// own node — to stop leading at once if the node is deleted — comes from
/// the directory's shared watch, without a read.
///
/// Warm means that shared watch is up. The first leader's watch opens it in
/// the background, and a leader that leaves at once may be gone before
/// that (a busy machine runs the watch task late), so the next leaders read
/// until one finds it up.
async fn a_leadership_is_two_round_trips(h: &PrivateEtcd) -> Result<()> {
    let (server, s) = (&h.server, long_session(h).await);
    let leader = h.path("/rt/leader");
    let lead_once = || async {
        let latch = dlock::LeaderLatch::new(&s, &leader)?;
        latch.start()?;
        latch.await_leadership().await?;
        ensure!(latch.has_leadership());
        latch.close().await?;
        Ok(())
    };
    let two = requests(&[("DeleteRange", 1), ("Txn", 1)]);
    let mut warming = Vec::new();
    while warming.last() != Some(&two) {
        ensure!(warming.len() < 20, "never warm: {warming:?}");
        warming.push(kv_requests_during(server, lead_once()).await?.1);
    }
    for _ in 0..5 {
        let ((), made) = kv_requests_during(server, lead_once()).await?;
        ensure!(made == two, "requests per leadership: {made:?}");
    }
    Ok(())
}

/// A waiter of a warm directory asks the server nothing, neither to arm
/// its watch on the node ahead nor, once woken, to see whether anyone is
/// still ahead: its client's shared watch on the directory delivered every
/// change there, and the copy of the directory kept from it answers both.
/// So a handoff is the holder's delete alone. Counted by the server: a
/// round is the node ahead's create, the waiter's create-and-list, and the
/// delete. The first round warms the directory up.
async fn a_waiter_of_a_warm_directory_asks_the_server_nothing(h: &PrivateEtcd) -> Result<()> {
    let (a, b) = (long_session(h).await, long_session(h).await);
    let warm = h.path("/warm");
    for round in 0..3 {
        let before = kv_requests(&h.server)?;
        let handoff = common::hand_over(&a, &b, &warm).await?;
        let requests = kv_requests(&h.server)? - before;
        let names: Vec<_> = handoff.seen.iter().map(|c| c.name.as_str()).collect();
        ensure!(names == [handoff.ours.name()], "round {round}: {names:?}");
        ensure!(
            round == 0 || requests == 3,
            "round {round}: {requests} requests for a handoff"
        );
        b.delete(&handoff.ours.path, None).await?;
    }
    Ok(())
}

/// etcd#22082: a delete of our node (say, retried after its reply was
/// lost) never deletes a newer key of the same name.
async fn a_delete_never_removes_a_newer_node_of_the_same_name(h: &Harness) -> Result<()> {
    let (s, other) = (h.session().await, h.session().await);
    let p = h.path("/fenced");
    let ours = s.create(&p, b"ours", ephemeral()).await?;
    other.delete(&p, None).await?;
    let theirs = other.create(&p, b"theirs", ephemeral()).await?;
    ensure!(theirs.stat.czxid > ours.stat.czxid);
    // A guarded write on our replaced node fails.
    let check = dlock::store::Op::Check {
        path: p.clone(),
        version: None,
    };
    let err = s.multi(&[check]).await.unwrap_err();
    ensure!(matches!(err, Error::MultiFailed { index: 0, .. }), "{err}");
    for _ in 0..2 {
        let err = s.delete(&p, None).await.unwrap_err();
        ensure!(matches!(err, Error::NoNode { .. }), "{err}");
    }
    ensure!(
        other.get_data(&p).await?.0 == b"theirs",
        "the newer node is untouched"
    );
    other.delete(&p, None).await?;
    Ok(())
}

/// The etcd 3.4.3 Jepsen bug: a waiter whose key vanished while it waited
/// (its lease expired, or an operator deleted it) must not claim the lock
/// when its predecessor goes. It queues again with a new node.
async fn a_waiter_whose_key_vanished_does_not_claim_the_lock(h: &Harness) -> Result<()> {
    let Queued {
        first: holder,
        path,
        held,
        waiter: waiting,
        ..
    } = rivals(h, "/jepsen", Mutex::new)
        .await?
        .hold_and_queue("", 2)
        .await?;
    let queue = Mutex::new(&holder, &path)?.participants().await?;
    let vanished = queue[1].node.clone();
    // The waiter's key goes, and the waiter is woken (its watch on the
    // holder fires) only afterwards.
    holder.delete(&vanished, None).await?;
    let late = queued_lock(&holder, &path, 2, Mutex::new(&holder, &path)?).await?;
    held.release().await?;
    let first = got_within(late, WITHIN).await?;
    ensure!(
        !waiting.is_finished(),
        "the waiter with the vanished key took the lock"
    );
    let second = hand_to(
        first,
        waiting,
        "it acquired with a new node (perhaps under the old name)",
    )
    .await?;
    second.release().await?;
    Ok(())
}

/// A session acquiring one lock again and again uses one key: etcd keeps
/// every key name used below a directory (as a tombstone) until the next
/// compaction, and every listing of the directory scans them, so fresh
/// names would slow a busy lock down with each acquisition.
async fn a_sessions_acquisitions_of_one_lock_reuse_one_key(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let mutex = Mutex::new(&s, &h.path("/reuse"))?;
    let first = mutex.acquire().await?;
    let (node, token) = (first.node().to_string(), first.token());
    first.release().await?;
    for _ in 0..3 {
        let again = mutex.acquire().await?;
        ensure!(again.node() == node, "{} after {node}", again.node());
        ensure!(
            again.token() > token,
            "a new incarnation, with a larger token"
        );
        again.release().await?;
    }
    Ok(())
}

/// A waiter never waits for a newer node that took the name of the one it
/// queued behind. The waiter's replies are slowed down so that, between
/// its listing (holder first) and its look at the holder's node, the holder
/// releases and queues again under the same name, behind the waiter.
/// Waiting on that node would deadlock: it waits for the waiter.
async fn a_waiter_does_not_wait_for_a_newer_node_with_its_predecessors_name(
    h: &Harness,
) -> Result<()> {
    let proxy = TcpProxy::start(&shared_etcd().endpoint())?;
    let holder = long_session(h).await;
    let waiter = via(&proxy, Duration::from_secs(30)).await?;
    let path = h.path("/aba");
    let held = Mutex::new(&holder, &path)?.acquire().await?;
    let first_node = held.node().to_string();
    proxy.delay_replies(Duration::from_millis(500));
    let m = Mutex::new(&waiter, &path)?;
    let waiting = tokio::spawn(async move { m.acquire().await });
    // The waiter's node is in; its listing is still on its way to it.
    await_children(&holder, &path, 2, WITHIN).await?;
    held.release().await?;
    let requeued = queued_lock(&holder, &path, 2, Mutex::new(&holder, &path)?).await?;
    let names = sorted_names(&holder, &path).await?;
    ensure!(
        names.iter().any(|n| first_node.ends_with(n.as_str())),
        "the holder queued again under its old name: {names:?}"
    );
    let got = tokio::time::timeout(WITHIN, waiting)
        .await
        .context("the waiter deadlocked behind the newer node")???;
    proxy.delay_replies(Duration::ZERO);
    ensure!(
        !requeued.is_finished(),
        "the holder's newer node queued behind the waiter"
    );
    got.release().await?;
    let last = got_within(requeued, WITHIN).await?;
    ensure!(last.acquisition().node() == first_node);
    last.release().await?;
    waiter.close().await;
    Ok(())
}

/// `etcd://user:password@host:port` authenticates; wrong credentials are
/// `AuthFailed`; a user without permissions gets `NoAuth`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_authenticate() -> Result<()> {
    let server = EtcdServer::start()?;
    let mut etcd = raw(&server.url()).await?;
    etcd.user_add("root", "rootpw", None).await?;
    etcd.user_grant_role("root", "root").await?;
    etcd.user_add("nobody", "nopw", None).await?;
    etcd.auth_enable().await?;
    let endpoint = server.endpoint();
    let s = dlock::connect(&format!("etcd://root:rootpw@{endpoint}")).await?;
    let g = Mutex::new(&s, "/auth/lock")?.acquire().await?;
    g.release().await?;
    s.close().await;
    let err = dlock::connect(&format!("etcd://root:wrong@{endpoint}"))
        .await
        .unwrap_err();
    ensure!(matches!(err, Error::AuthFailed(_)), "{err}");
    // etcd 3.4 grants leases to anyone; without credentials, key access is
    // refused.
    match dlock::connect(&format!("etcd://{endpoint}")).await {
        Ok(s) => {
            let err = s.create("/auth/x", b"", persistent()).await.unwrap_err();
            ensure!(matches!(err, Error::AuthFailed(_)), "no credentials: {err}");
            s.close().await;
        }
        Err(e) => ensure!(matches!(e, Error::AuthFailed(_)), "no credentials: {e}"),
    }
    let err = dlock::connect(&format!("etcd://nobody:nopw@{endpoint}")).await;
    match err {
        // etcd 3.4 lets any user grant leases; the key writes are refused.
        Ok(s) => {
            let err = s.create("/auth/x", b"", persistent()).await.unwrap_err();
            ensure!(matches!(err, Error::NoAuth { .. }), "{err}");
            s.close().await;
        }
        Err(e) => ensure!(matches!(e, Error::NoAuth { .. }), "{e}"),
    }
    Ok(())
}

/// On a 3-member cluster, a lock held through all endpoints survives the
/// loss of a member, and the queue keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_survives_losing_a_cluster_member() -> Result<()> {
    let mut cluster = EtcdCluster::start(3)?;
    let endpoints = cluster.endpoints().join(",");
    let ttl = Duration::from_secs(5);
    let (a, b) = (
        etcd_session(&endpoints, ttl).await?,
        etcd_session(&endpoints, ttl).await?,
    );
    let path = "/cluster/lock";
    let held = Mutex::new(&a, path)?.acquire().await?;
    let mb = Mutex::new(&b, path)?;
    let waiting = queued(&a, path, 2, WITHIN, async move { mb.acquire().await }).await?;
    let leader = cluster.leader_index().context("a leader")?;
    cluster.kill(leader);
    cluster.wait_for_quorum(WITHIN)?;
    ensure!(!held.is_lost(), "the lease outlives a leader change");
    ensure!(!waiting.is_finished());
    held.release().await?;
    let g = tokio::time::timeout(WITHIN, waiting).await???;
    g.release().await?;
    a.close().await;
    b.close().await;
    Ok(())
}

/// Without the `etcd` feature the endpoint is refused with a clear message;
/// with it, a bad endpoint is `Unreachable`, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_cluster_is_named() -> Result<()> {
    let port = dlock_testkit::free_port();
    let err = etcd_session(format!("127.0.0.1:{port}"), Duration::from_secs(2))
        .await
        .unwrap_err();
    ensure!(
        matches!(&err, Error::Unreachable(m) if m.contains(&port.to_string())),
        "{err}"
    );
    Ok(())
}

/// A full database (etcd's NOSPACE alarm, raised when the backend passes
/// its quota) refuses writes until an operator compacts it and disarms the
/// alarm: a write fails at once, naming it, and is not retried as if the
/// connection had failed (which ended in `ConnectionLoss` after every
/// retry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_database_fails_writes_naming_it() -> Result<()> {
    let server = EtcdServer::start_with(dlock_testkit::EtcdOptions {
        extra_args: vec!["--quota-backend-bytes=1048576".into()],
        ..Default::default()
    })?;
    let session = etcd_session(server.endpoint(), Duration::from_secs(6)).await?;
    let data = vec![b'x'; 256 * 1024];
    let (mut written, mut refused) = (Vec::new(), None);
    for i in 0..64 {
        let node = format!("/full/{i}");
        match session.create(&node, &data, persistent()).await {
            Ok(_) => written.push(node),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let refused = refused.context("1 MiB of quota took 16 MiB")?;
    ensure!(
        matches!(&refused, Error::Backend(why) if why.contains("space exceeded")),
        "{refused:?}"
    );
    // Deletes are still allowed.
    for node in written {
        session.delete(&node, None).await?;
    }
    ensure!(session
        .children("/full")
        .await
        .unwrap_or_default()
        .is_empty());
    session.close().await;
    Ok(())
}

/// A multi is one transaction, yet behaves as ZooKeeper's ordered
/// operations: later operations see earlier ones on the same path, a check
/// or delete of an implicit directory works (the delete once its children
/// went earlier in the multi), and the failing operation is named.
async fn multis_see_their_own_operations(h: &Harness) -> Result<()> {
    use dlock::store::{Op, OpResult};
    let s = h.session().await;
    let dir = h.path("/multi/dir");
    let (a, b) = (format!("{dir}/a"), format!("{dir}/b"));
    s.create(&a, b"1", persistent()).await?;
    s.create(&b, b"2", persistent()).await?;
    // Set twice, check the version in between, on one key.
    let ops = [
        Op::SetData {
            path: a.clone(),
            data: b"x".to_vec(),
            version: Some(0),
        },
        Op::Check {
            path: a.clone(),
            version: Some(1),
        },
        Op::SetData {
            path: a.clone(),
            data: b"y".to_vec(),
            version: Some(1),
        },
        Op::Check {
            path: dir.clone(),
            version: None,
        },
    ];
    let results = s.multi(&ops).await?;
    ensure!(
        matches!(
            results[..],
            [
                OpResult::Set(_),
                OpResult::Checked,
                OpResult::Set(_),
                OpResult::Checked
            ]
        ),
        "{results:?}"
    );
    ensure!(s.get_data(&a).await?.0 == b"y");
    // A later operation failing statically is still named by its index.
    let ops = [
        Op::Delete {
            path: b.clone(),
            version: None,
        },
        Op::Check {
            path: b.clone(),
            version: None,
        },
    ];
    let err = s.multi(&ops).await.unwrap_err();
    ensure!(
        matches!(&err, Error::MultiFailed { index: 1, source } if matches!(**source, Error::NoNode { .. })),
        "{err}"
    );
    ensure!(s.exists(&b).await?.is_some(), "nothing was applied");
    // The directory is not empty; emptied first, it can be deleted.
    let err = s
        .multi(&[Op::Delete {
            path: dir.clone(),
            version: None,
        }])
        .await
        .unwrap_err();
    ensure!(
        matches!(&err, Error::MultiFailed { index: 0, source } if matches!(**source, Error::NotEmpty { .. })),
        "{err}"
    );
    let ops = [
        Op::Delete {
            path: a.clone(),
            version: None,
        },
        Op::Delete {
            path: b.clone(),
            version: None,
        },
        Op::Delete {
            path: dir.clone(),
            version: None,
        },
    ];
    s.multi(&ops).await?;
    ensure!(s.exists(&dir).await?.is_none());
    // Create under a missing parent: NoNode, naming the parent.
    let ops = [Op::Create {
        path: format!("{dir}/c"),
        data: vec![],
        mode: CreateMode::Persistent,
    }];
    let err = s.multi(&ops).await.unwrap_err();
    ensure!(
        matches!(&err, Error::MultiFailed { index: 0, source } if **source == Error::NoNode { path: dir.clone() }),
        "{err}"
    );
    Ok(())
}

/// A multi of the most operations etcd's backend takes (42), each a create
/// three directories deep, fits one transaction: the check that no
/// ancestor is ephemeral is made once per ancestor, not once per create
/// (168 compares, over etcd's 128).
async fn a_multi_of_the_most_creates_in_a_deep_directory_fits(h: &Harness) -> Result<()> {
    use dlock::store::{Op, OpResult};
    let s = h.session().await;
    let dir = h.path("/wide/a/b/c");
    s.create(&dir, b"", persistent()).await?;
    let paths: Vec<String> = (0..42).map(|i| format!("{dir}/n{i}")).collect();
    let creates: Vec<Op> = paths
        .iter()
        .map(|path| Op::Create {
            path: path.clone(),
            data: b"x".to_vec(),
            mode: CreateMode::Persistent,
        })
        .collect();
    let results = s.multi(&creates).await?;
    ensure!(
        results.iter().all(|r| matches!(r, OpResult::Created(_))),
        "{results:?}"
    );
    let deletes: Vec<Op> = paths
        .into_iter()
        .map(|path| Op::Delete {
            path,
            version: None,
        })
        .collect();
    s.multi(&deletes).await?;
    s.delete(&dir, None).await?;
    Ok(())
}

per_backend!(etcd => crate::common::etcd();
    a_multi_of_the_most_creates_in_a_deep_directory_fits,
    lease_ttl_is_the_timeout_in_whole_seconds,
    keep_alive_holds_the_session_past_several_ttls,
    a_lease_revoked_from_outside_is_lost,
    keys_are_the_paths,
    errors_name_the_node_with_implicit_parents,
    a_delete_never_removes_a_newer_node_of_the_same_name,
    a_waiter_whose_key_vanished_does_not_claim_the_lock,
    a_sessions_acquisitions_of_one_lock_reuse_one_key,
    multis_see_their_own_operations,
    a_broken_watch_stream_resumes_where_it_was,
    a_holder_whose_lease_expires_hands_over_within_ttl_plus_a_second,
    a_plain_delete_given_up_in_flight_retires_the_name,
    a_waiter_does_not_wait_for_a_newer_node_with_its_predecessors_name,
);

// Cases whose server-wide counts (requests, watchers) or compactions must be
// the test's alone.
per_backend!(private_etcd => crate::common::tests1::PrivateEtcd::start();
    waiters_in_one_directory_share_one_server_watch,
    a_waiter_wakes_although_its_watch_start_was_compacted,
    a_release_is_a_plain_delete_and_one_unanswered_retires_the_name,
    an_uncontended_acquire_and_release_is_two_round_trips,
    a_leadership_is_two_round_trips,
    a_waiter_of_a_warm_directory_asks_the_server_nothing,
);
