//! The ZooKeeper backend against a real ZooKeeper 3.8 server (started by
//! `dlock-testkit`: the shared one, or a private one for outage tests).
//!
//! Every test works under its own root node and deletes it at the end.

#![cfg(feature = "zookeeper")]

mod common;

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use common::tests2::{
    failed_with, no_auth, no_node, tokens_grow_across_sessions, versions_guard_writes_at,
    watched_ephemeral, WatchBy,
};
use common::{
    await_gone, await_state, ephemeral, persistent, persistent_only, remove_tree, sequential,
};
use dlock::store::{
    BackendKind, CreateMode, CreateOptions, Created, Op, OpResult, SessionState, Watch, WatchEvent,
};
use dlock::{Error, Session, SessionOptions};
use dlock_testkit::{shared_zk, ZkServer};

/// Short, so that expiry tests are quick (ZooKeeper grants 1 s to 60 s with
/// the testkit's `tickTime=500`).
const TIMEOUT: Duration = Duration::from_secs(2);
/// How long anything that should happen may take.
const WITHIN: Duration = Duration::from_secs(15);

fn url() -> String {
    format!("zk://{}", shared_zk().connect_string())
}

fn options() -> SessionOptions {
    SessionOptions::default().with_session_timeout(TIMEOUT)
}

async fn connect(url: &str) -> Session {
    dlock::connect_with(url, options())
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

async fn session() -> Session {
    connect(&url()).await
}

/// An empty node at `path`, created in `mode`; its parent must exist.
async fn create_empty(s: &Session, path: &str, mode: CreateMode) -> dlock::Result<Created> {
    s.create(path, b"", CreateOptions::new(mode)).await
}

/// One test on the shared server: its own root, and the sessions it opens,
/// all closed at its end before the root's tree is removed.
struct ZkTest {
    root: String,
    sessions: std::sync::Mutex<Vec<Session>>,
}

impl ZkTest {
    fn new() -> Self {
        ZkTest {
            root: format!("/zkb-{}", uuid::Uuid::new_v4().simple()),
            sessions: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// A path under the test's root.
    fn path(&self, rest: &str) -> String {
        format!("{}{rest}", self.root)
    }

    /// A session on the shared server, closed when the test finishes.
    async fn session(&self) -> Session {
        self.connect(&url()).await
    }

    /// A session on `url`, closed when the test finishes.
    async fn connect(&self, url: &str) -> Session {
        let session = connect(url).await;
        self.sessions.lock().unwrap().push(session.clone());
        session
    }

    /// A session owning an ephemeral node at `/e`, and another session
    /// watching it (`by`).
    async fn watched_by_another(&self, by: WatchBy) -> Result<(Session, Session, Created, Watch)> {
        let (s, observer) = (self.session().await, self.session().await);
        let (node, watch) = watched_ephemeral(&s, &observer, &self.path("/e"), by).await?;
        Ok((s, observer, node, watch))
    }

    /// Closes the test's sessions, then removes its tree.
    async fn finish(self) {
        for s in self.sessions.into_inner().unwrap() {
            s.close().await;
        }
        cleanup(&self.root).await;
    }
}

/// Removes the test's tree with a fresh session and checks it is gone.
async fn cleanup(root: &str) {
    let s = session().await;
    remove_tree(&s, root).await.expect("remove the test's tree");
    assert!(s.exists(root).await.unwrap().is_none(), "{root} removed");
    s.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connects_and_closes() -> Result<()> {
    let s = session().await;
    ensure!(s.backend() == BackendKind::ZooKeeper);
    let status = s.status();
    ensure!(status.state == SessionState::Connected, "{status:?}");
    ensure!(status.session_id != 0);
    ensure!(
        s.session_timeout() == TIMEOUT,
        "negotiated {:?}",
        s.session_timeout()
    );
    ensure!(s.exists("/").await?.is_some());
    s.close().await;
    ensure!(s.state() == SessionState::Closed);
    ensure!(
        s.session_id() == status.session_id,
        "the last session stays named"
    );
    let err = s.exists("/").await.unwrap_err();
    ensure!(err == Error::Closed, "use after close: {err}");
    s.close().await; // twice is fine
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_reported_with_its_address() -> Result<()> {
    let port = dlock_testkit::free_port();
    let started = Instant::now();
    let opts = SessionOptions::default().with_session_timeout(Duration::from_secs(1));
    let err = dlock::connect_with(&format!("zk://127.0.0.1:{port}"), opts)
        .await
        .unwrap_err();
    let Error::Unreachable(message) = &err else {
        bail!("expected Unreachable, got {err:?}");
    };
    ensure!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
    // The message reports the very duration that was checked.
    let took = started.elapsed();
    ensure!(took < Duration::from_secs(5), "took {took:?}");
    Ok(())
}

async fn creates_every_mode(t: &ZkTest) -> Result<()> {
    let s = t.session().await;
    let observer = t.session().await;

    let p = s.create(&t.path("/p"), b"data", persistent()).await?;
    ensure!(p.path == t.path("/p"));
    ensure!(p.stat.ephemeral_owner == 0 && p.stat.version == 0 && p.stat.data_length == 4);
    let (data, stat) = observer.get_data(&p.path).await?;
    ensure!(
        data == b"data" && stat == p.stat,
        "{stat:?} vs {:?}",
        p.stat
    );

    // Sequential names: the parent's child-change counter, %010d.
    let dir = s.create(&t.path("/seq"), b"", persistent()).await?.path;
    let prefix = format!("{dir}/n-");
    let mut names = Vec::new();
    for mode in [
        CreateMode::PersistentSequential,
        CreateMode::EphemeralSequential,
        CreateMode::PersistentSequential,
    ] {
        names.push(create_empty(&s, &prefix, mode).await?);
    }
    for (i, c) in names.iter().enumerate() {
        ensure!(c.path == format!("{dir}/n-{i:010}"), "{}", c.path);
    }
    ensure!(names[1].stat.ephemeral_owner == s.session_id());
    // The sequence counts child *creations* only: a delete leaves no gap.
    // (ZooKeeper stores that count; the `cversion` it reports is computed
    // as `2 × creations − children`, i.e. creations + deletions.)
    s.delete(&names[0].path, None).await?;
    let after_delete = create_empty(&s, &prefix, CreateMode::PersistentSequential).await?;
    ensure!(
        after_delete.path == format!("{dir}/n-0000000003"),
        "{}",
        after_delete.path
    );
    let (_, dir_stat) = s.get_data(&dir).await?;
    ensure!(
        dir_stat.cversion == 5 && dir_stat.num_children == 3,
        "{dir_stat:?}"
    );
    ensure!(names[0].stat.ephemeral_owner == 0 && names[2].stat.ephemeral_owner == 0);

    // Ephemeral nodes go with their session.
    let (e, gone) = watched_ephemeral(&s, &observer, &t.path("/e"), WatchBy::Exists).await?;
    s.close().await;
    ensure!(gone.changed().await == WatchEvent::NodeDeleted);
    ensure!(observer.exists(&e.path).await?.is_none());
    ensure!(observer.exists(&names[1].path).await?.is_none());
    ensure!(observer.exists(&names[2].path).await?.is_some());

    // A container is reaped by the server once its last child goes.
    let c = create_empty(&observer, &t.path("/c"), CreateMode::Container).await?;
    let child = observer
        .create(&format!("{}/x", c.path), b"", ephemeral())
        .await?;
    observer.delete(&child.path, None).await?;
    await_gone(&observer, &c.path, WITHIN).await?;

    Ok(())
}

async fn parents_are_containers_and_reaped(t: &ZkTest) -> Result<()> {
    let s = t.session().await;
    let leaf = s.create(&t.path("/a/b/leaf"), b"", ephemeral()).await?;
    for dir in [t.path("/a"), t.path("/a/b")] {
        let (data, stat) = s.get_data(&dir).await?;
        ensure!(data.is_empty() && stat.ephemeral_owner == 0, "{dir}");
    }
    s.delete(&leaf.path, None).await?;
    await_gone(&s, &t.path("/a/b"), WITHIN).await?;
    await_gone(&s, &t.path("/a"), WITHIN).await?;
    Ok(())
}

async fn fencing_tokens_strictly_increase(t: &ZkTest) -> Result<()> {
    let (s1, s2) = (t.session().await, t.session().await);
    let created =
        tokens_grow_across_sessions([&s1, &s2], 10, |_| t.path("/n-"), sequential()).await?;
    for c in created {
        ensure!(c.stat.mzxid == c.stat.czxid, "{c:?}");
    }
    Ok(())
}

async fn create_and_list_sees_its_own_node(t: &ZkTest) -> Result<()> {
    let root = &t.root;
    let s = t.session().await;
    let store = s.store();
    let dir = t.path("/locks");
    let seq = sequential();
    // Missing parents: the fallback creates them, then creates and lists.
    let (first, kids) = store
        .create_and_list(&format!("{dir}/lock-"), b"", seq, &dir)
        .await?;
    let names: Vec<_> = kids.iter().map(|c| c.name.clone()).collect();
    ensure!(names == [first.name()], "{names:?}");
    ensure!(
        first.path == format!("{dir}/lock-0000000000"),
        "{}",
        first.path
    );
    // Parents present: one pipelined round trip, and the listing sees it.
    for i in 1..20 {
        let (created, kids) = store
            .create_and_list(&format!("{dir}/lock-"), b"", seq, &dir)
            .await?;
        ensure!(
            kids.len() == i + 1,
            "{} children after {i} creates",
            kids.len()
        );
        ensure!(
            kids.iter().any(|c| c.name == created.name()),
            "{} not in the listing",
            created.name()
        );
    }
    // Errors of either half are reported.
    failed_with(
        store
            .create_and_list(&format!("{dir}/lock-"), b"", seq, &t.path("/absent"))
            .await,
        no_node(t.path("/absent")),
    )?;
    failed_with(
        store
            .create_and_list(&t.path("/x/y"), b"", persistent_only(), root)
            .await,
        no_node(t.path("/x")),
    )?;
    Ok(())
}

async fn errors_map_onto_the_contract(t: &ZkTest) -> Result<()> {
    let s = t.session().await;
    let p = t.path("/v");
    let (created, st) = versions_guard_writes_at(&s, &p).await?;
    ensure!(st.czxid == created.stat.czxid);

    s.create(&format!("{p}/child"), b"", persistent()).await?;

    let missing = t.path("/missing");
    failed_with(s.get_data(&missing).await, no_node(&missing))?;
    failed_with(s.delete(&missing, None).await, no_node(&missing))?;
    failed_with(s.set_data(&missing, b"", None).await, no_node(&missing))?;
    failed_with(s.children(&missing).await, no_node(&missing))?;
    ensure!(s.exists(&missing).await?.is_none());
    failed_with(
        s.create(&format!("{missing}/x"), b"", persistent_only())
            .await,
        no_node(&missing),
    )
    .context("a create names the missing parent")?;

    let e = s.create(&t.path("/eph"), b"", ephemeral()).await?;
    failed_with(
        s.create(&format!("{}/x", e.path), b"", persistent()).await,
        Error::NoChildrenForEphemerals {
            path: e.path.clone(),
        },
    )?;

    let (data, stat) = s.get_data(&p).await?;
    ensure!(data == b"b" && stat.version == 1 && stat.num_children == 1);
    Ok(())
}

/// What the conformance suite's `watches_fire_once_on_node_events` leaves
/// open: a listing's children carry no creation, an exists() watch also
/// reports data changes, a deletion fires the parent's children watch too,
/// and a get_data watch on a missing node is not armed.
async fn watches_fire_on_node_events(t: &ZkTest) -> Result<()> {
    let root = &t.root;
    let (s, other) = (t.session().await, t.session().await);
    let p = t.path("/w");
    s.create(root, b"", persistent()).await?;

    other.create(&p, b"", persistent()).await?;
    other.create(&format!("{p}/c"), b"", persistent()).await?;
    let (kids, child_watch) = s.children_watch(&p).await?;
    ensure!(kids.len() == 1 && kids[0].name == "c" && kids[0].created.is_none());
    other.delete(&format!("{p}/c"), None).await?;
    ensure!(child_watch.changed().await == WatchEvent::ChildrenChanged);

    // An exists() watch also reports data changes; dropped watches are fine.
    let (_, dropped) = s.exists_watch(&p).await?;
    drop(dropped);
    let (_, data_watch) = s.exists_watch(&p).await?;
    other.set_data(&p, b"2", None).await?;
    ensure!(data_watch.changed().await == WatchEvent::DataChanged);

    let (_, _, deleted) = s.get_data_watch(&p).await?;
    let (_, parent_watch) = s.children_watch(root).await?;
    other.delete(&p, None).await?;
    ensure!(deleted.changed().await == WatchEvent::NodeDeleted);
    ensure!(parent_watch.changed().await == WatchEvent::ChildrenChanged);

    // A get_data watch on a missing node is not armed: NoNode instead.
    ensure!(matches!(
        s.get_data_watch(&p).await.unwrap_err(),
        Error::NoNode { .. }
    ));
    Ok(())
}

async fn a_watch_fires_on_session_expiry(t: &ZkTest) -> Result<()> {
    let root = &t.root;
    let s = t.session().await;
    let p = s.create(&t.path("/n"), b"", persistent()).await?.path;
    let (_, _, watch) = s.get_data_watch(&p).await?;
    let (_, child_watch) = s.children_watch(root).await?;
    s.faults().expect("faults").expire().await?;
    ensure!(watch.changed().await == WatchEvent::Session(SessionState::Lost));
    ensure!(child_watch.changed().await == WatchEvent::Session(SessionState::Lost));
    Ok(())
}

/// What the conformance suite's `multi_is_all_or_nothing` leaves open: a
/// failing create names its missing parent, and a passing multi is one
/// transaction (one zxid) that leaves the parent's counter to the creates.
async fn multi_is_atomic(t: &ZkTest) -> Result<()> {
    let s = t.session().await;
    let base = s.create(&t.path("/m"), b"", persistent()).await?.path;
    let a = format!("{base}/a");
    // A failing create names its index and its missing parent; the create
    // before it, rolled back, leaves the parent's change counter alone.
    let ops = [
        Op::Check {
            path: base.clone(),
            version: None,
        },
        Op::Create {
            path: a.clone(),
            data: b"1".to_vec(),
            mode: CreateMode::Persistent,
        },
        Op::Create {
            path: t.path("/none/x"),
            data: vec![],
            mode: CreateMode::Persistent,
        },
    ];
    failed_with(
        s.multi(&ops).await,
        Error::MultiFailed {
            index: 2,
            source: Box::new(no_node(t.path("/none"))),
        },
    )?;
    ensure!(s.exists(&a).await?.is_none(), "the create was rolled back");

    let ok = [
        Op::Check {
            path: base.clone(),
            version: Some(0),
        },
        Op::Create {
            path: format!("{base}/s-"),
            data: b"q".to_vec(),
            mode: CreateMode::PersistentSequential,
        },
        Op::Create {
            path: a.clone(),
            data: b"1".to_vec(),
            mode: CreateMode::Persistent,
        },
        Op::SetData {
            path: a.clone(),
            data: b"2".to_vec(),
            version: Some(0),
        },
        Op::Delete {
            path: a.clone(),
            version: Some(1),
        },
    ];
    let results = s.multi(&ok).await?;
    let [OpResult::Checked, OpResult::Created(seq), OpResult::Created(plain), OpResult::Set(set), OpResult::Deleted] =
        &results[..]
    else {
        bail!("{results:?}");
    };
    // The failed multi left the parent's change counter alone.
    ensure!(seq.path == format!("{base}/s-0000000000"), "{}", seq.path);
    ensure!(plain.path == a && set.version == 1);
    ensure!(
        seq.stat.czxid == plain.stat.czxid,
        "one transaction, one zxid"
    );
    ensure!(s.multi(&[]).await?.is_empty());
    Ok(())
}

async fn expire_loses_the_session_and_the_next_operation_renews_it(t: &ZkTest) -> Result<()> {
    let (s, observer, node, gone) = t.watched_by_another(WatchBy::Exists).await?;
    let old = s.status();
    s.faults().expect("faults").expire().await?;
    let lost = s.status();
    ensure!(
        lost.state == SessionState::Lost && lost.session_id == old.session_id,
        "{lost:?}"
    );
    ensure!(
        lost.changes == old.changes + 1,
        "straight to Lost: {old:?} → {lost:?}"
    );
    ensure!(gone.changed().await == WatchEvent::NodeDeleted);
    ensure!(
        observer.exists(&node.path).await?.is_none(),
        "the ephemeral node went with the session"
    );

    let again = s.create(&node.path, b"", ephemeral()).await?;
    let renewed = s.status();
    ensure!(renewed.state == SessionState::Reconnected, "{renewed:?}");
    ensure!(renewed.session_id != old.session_id, "a new session");
    ensure!(again.stat.ephemeral_owner == renewed.session_id);
    // The new session works like the first: it can be expired too.
    s.faults().expect("faults").expire().await?;
    ensure!(s.state() == SessionState::Lost);
    ensure!(s.exists(&node.path).await?.is_none());
    ensure!(s.state() == SessionState::Reconnected && s.session_id() != renewed.session_id);
    Ok(())
}

async fn suspension_holds_operations_and_keeps_the_session(t: &ZkTest) -> Result<()> {
    let s = t.session().await;
    let id = s.session_id();
    let (node, watch) = watched_ephemeral(&s, &s, &t.path("/e"), WatchBy::Data).await?;
    let started = Instant::now();
    s.faults().expect("faults").suspend(TIMEOUT / 4);
    ensure!(s.state() == SessionState::Suspended);
    ensure!(watch.changed().await == WatchEvent::Session(SessionState::Suspended));
    let stat = s.exists(&node.path).await?;
    ensure!(
        started.elapsed() >= TIMEOUT / 4 - Duration::from_millis(20),
        "held back: {:?}",
        started.elapsed()
    );
    ensure!(stat.is_some(), "the ephemeral node survived");
    ensure!(s.state() == SessionState::Reconnected && s.session_id() == id);
    Ok(())
}

async fn suspension_past_the_timeout_loses_the_session(t: &ZkTest) -> Result<()> {
    let (s, _observer, node, watch) = t.watched_by_another(WatchBy::Data).await?;
    let id = s.session_id();
    s.faults().expect("faults").suspend(TIMEOUT * 2);
    // Issued while suspended: runs in the new session once the old is lost.
    let held = s.exists(&node.path).await?;
    ensure!(held.is_none(), "the server expired the ephemeral node");
    ensure!(s.session_id() != id && s.state() == SessionState::Reconnected);
    ensure!(watch.changed().await == WatchEvent::NodeDeleted);
    Ok(())
}

async fn a_chroot_keeps_paths_relative(t: &ZkTest) -> Result<()> {
    let chroot = t.path("/app");
    let s = t.connect(&format!("{}{chroot}", url())).await;
    let created = s.create("/a/b", b"x", persistent()).await?;
    ensure!(created.path == "/a/b", "{}", created.path);
    let seq = create_empty(&s, "/a/n-", CreateMode::EphemeralSequential).await?;
    ensure!(seq.path == "/a/n-0000000001", "{}", seq.path);
    let kids = s.children("/").await?;
    ensure!(kids.len() == 1 && kids[0].name == "a", "{kids:?}");
    let results = s
        .multi(&[Op::Create {
            path: "/m".into(),
            data: vec![],
            mode: CreateMode::Persistent,
        }])
        .await?;
    ensure!(
        matches!(&results[..], [OpResult::Created(c)] if c.path == "/m"),
        "{results:?}"
    );
    let (_, _, watch) = s.get_data_watch("/a/b").await?;

    let plain = t.session().await;
    let (data, _) = plain.get_data(&format!("{chroot}/a/b")).await?;
    ensure!(data == b"x");
    ensure!(plain.exists(&format!("{chroot}/m")).await?.is_some());
    plain.set_data(&format!("{chroot}/a/b"), b"y", None).await?;
    ensure!(watch.changed().await == WatchEvent::DataChanged);
    ensure!(s.get_data("/a/b").await?.0 == b"y");
    failed_with(s.get_data("/absent").await, no_node("/absent"))
        .context("errors name the relative path")?;
    Ok(())
}

async fn digest_credentials_protect_the_nodes_created_with_them(t: &ZkTest) -> Result<()> {
    let root = &t.root;
    let hosts = shared_zk().connect_string();
    let alice = t.connect(&format!("zk://alice:secret@{hosts}")).await;
    let alice2 = t.connect(&format!("zk://alice:secret@{hosts}")).await;
    let bob = t.connect(&format!("zk://bob:secret@{hosts}")).await;
    let anonymous = t.session().await;
    let secure = t.path("/secure");
    alice
        .create(&format!("{secure}/child"), b"s", persistent())
        .await?;
    let child = format!("{secure}/child");

    failed_with(anonymous.delete(&child, None).await, no_auth(&child))?;
    failed_with(
        anonymous.set_data(&secure, b"x", None).await,
        no_auth(&secure),
    )?;
    failed_with(anonymous.get_data(&child).await, no_auth(&child))?;
    failed_with(bob.delete(&child, None).await, no_auth(&child)).context("another user")?;
    failed_with(
        anonymous
            .create(&format!("{secure}/x"), b"", persistent())
            .await,
        no_auth(format!("{secure}/x")),
    )?;

    // The same user in another session may.
    ensure!(alice2.get_data(&child).await?.0 == b"s");
    // Credentials are applied again in a renewed session.
    alice.faults().expect("faults").expire().await?;
    alice.set_data(&child, b"t", None).await?;
    ensure!(alice.state() == SessionState::Reconnected);
    alice2.delete(&child, None).await?;
    remove_tree(&alice, root).await?;
    ensure!(anonymous.exists(root).await?.is_none());
    Ok(())
}

async fn dropping_the_session_closes_it(t: &ZkTest) -> Result<()> {
    // Not the test's: the test would keep it open.
    let s = session().await;
    let observer = t.session().await;
    let (node, gone) = watched_ephemeral(&s, &observer, &t.path("/e"), WatchBy::Exists).await?;
    drop(s);
    tokio::time::timeout(WITHIN, gone.changed())
        .await
        .context("the session closed on drop")?;
    ensure!(observer.exists(&node.path).await?.is_none());
    Ok(())
}

async fn many_sessions_in_one_process(t: &ZkTest) -> Result<()> {
    let sessions = futures::future::try_join_all(
        (0..40).map(|_| async { dlock::connect_with(&url(), options()).await }),
    )
    .await?;
    let mut ids: Vec<_> = sessions.iter().map(|s| s.session_id()).collect();
    ids.sort();
    ids.dedup();
    ensure!(ids.len() == sessions.len(), "distinct sessions");
    let dir = t.path("/q");
    let seq = sequential();
    let (dir, prefix) = (dir.as_str(), format!("{dir}/n-"));
    let prefix = prefix.as_str();
    let created = futures::future::try_join_all(
        sessions
            .iter()
            .map(|s| async move { s.store().create_and_list(prefix, b"", seq, dir).await }),
    )
    .await?;
    let mut czxids: Vec<_> = created.iter().map(|(c, _)| c.stat.czxid).collect();
    czxids.sort();
    czxids.dedup();
    ensure!(czxids.len() == sessions.len(), "one transaction each");
    futures::future::join_all(sessions.iter().map(|s| s.close())).await;
    let checker = t.session().await;
    let left = checker.children(dir).await.or_else(|e| match e {
        Error::NoNode { .. } => Ok(Vec::new()),
        e => Err(e),
    })?;
    ensure!(
        left.is_empty(),
        "every ephemeral node went with its session: {left:?}"
    );
    Ok(())
}

/// A private server, stopped and restarted: the session is suspended, then
/// reconnected (same session); an outage past the session timeout loses it
/// and the next operation runs in a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_outage_suspends_and_then_loses_the_session() -> Result<()> {
    let mut server = ZkServer::start()?;
    let url = format!("zk://{}", server.connect_string());
    // Long enough for the server to restart within it.
    let timeout = Duration::from_secs(8);
    let s = dlock::connect_with(
        &url,
        SessionOptions::default().with_session_timeout(timeout),
    )
    .await?;
    let id = s.session_id();
    let node = s.create("/outage/e", b"", ephemeral()).await?;

    // A short outage: Suspended, then Reconnected in the same session.
    let (_, _, watch) = s.get_data_watch(&node.path).await?;
    server.stop();
    ensure!(watch.changed().await == WatchEvent::Session(SessionState::Suspended));
    ensure!(s.state() == SessionState::Suspended);
    server.restart()?;
    await_state(&s, SessionState::Reconnected, WITHIN).await?;
    ensure!(s.session_id() == id, "same session");
    ensure!(
        s.exists(&node.path).await?.is_some(),
        "the ephemeral node survived"
    );

    // A long one: Lost after the session timeout (simulated expiry), then a
    // new session on the next operation.
    server.stop();
    await_state(&s, SessionState::Suspended, WITHIN).await?;
    let suspended = Instant::now();
    await_state(&s, SessionState::Lost, WITHIN).await?;
    ensure!(
        suspended.elapsed() >= timeout - Duration::from_millis(200),
        "lost after {:?}",
        suspended.elapsed()
    );
    server.restart()?;
    let renewed = s.create("/outage/f", b"", ephemeral()).await?;
    ensure!(s.state() == SessionState::Reconnected && s.session_id() != id);
    ensure!(renewed.stat.ephemeral_owner == s.session_id());
    // The old session's ephemeral node goes when the server expires it.
    await_gone(&s, &node.path, WITHIN).await?;
    s.close().await;
    Ok(())
}

per_backend!(shared_server => super::ZkTest::new(); {
    creates_every_mode,
    parents_are_containers_and_reaped,
    fencing_tokens_strictly_increase,
    create_and_list_sees_its_own_node,
    errors_map_onto_the_contract,
    watches_fire_on_node_events,
    a_watch_fires_on_session_expiry,
    multi_is_atomic,
    expire_loses_the_session_and_the_next_operation_renews_it,
    suspension_holds_operations_and_keeps_the_session,
    suspension_past_the_timeout_loses_the_session,
    a_chroot_keeps_paths_relative,
    digest_credentials_protect_the_nodes_created_with_them,
    dropping_the_session_closes_it,
    many_sessions_in_one_process,
});
