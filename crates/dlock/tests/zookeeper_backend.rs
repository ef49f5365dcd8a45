//! The ZooKeeper backend against a real ZooKeeper 3.8 server (started by
//! `dlock-testkit`: the shared one, or a private one for outage tests).
//!
//! Every test works under its own root node and deletes it at the end.

#![cfg(feature = "zookeeper")]

mod common;

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use common::{
    await_gone, await_state, ephemeral, persistent, persistent_only, remove_tree, sequential,
};
use dlock::store::{
    BackendKind, CreateMode, CreateOptions, Op, OpResult, SessionState, WatchEvent,
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

/// A fresh root path for one test.
fn root(test: &str) -> String {
    format!("/zkb-{test}-{}", uuid::Uuid::new_v4().simple())
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
    ensure!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_every_mode() -> Result<()> {
    let root = root("modes");
    let s = session().await;
    let observer = session().await;

    let p = s
        .create(&format!("{root}/p"), b"data", persistent())
        .await?;
    ensure!(p.path == format!("{root}/p"));
    ensure!(p.stat.ephemeral_owner == 0 && p.stat.version == 0 && p.stat.data_length == 4);
    let (data, stat) = observer.get_data(&p.path).await?;
    ensure!(
        data == b"data" && stat == p.stat,
        "{stat:?} vs {:?}",
        p.stat
    );

    // Sequential names: the parent's child-change counter, %010d.
    let dir = s
        .create(&format!("{root}/seq"), b"", persistent())
        .await?
        .path;
    let names = [
        s.create(
            &format!("{dir}/n-"),
            b"",
            CreateOptions::new(CreateMode::PersistentSequential),
        )
        .await?,
        s.create(
            &format!("{dir}/n-"),
            b"",
            CreateOptions::new(CreateMode::EphemeralSequential),
        )
        .await?,
        s.create(
            &format!("{dir}/n-"),
            b"",
            CreateOptions::new(CreateMode::PersistentSequential),
        )
        .await?,
    ];
    for (i, c) in names.iter().enumerate() {
        ensure!(c.path == format!("{dir}/n-{i:010}"), "{}", c.path);
    }
    ensure!(names[1].stat.ephemeral_owner == s.session_id());
    // The sequence counts child *creations* only: a delete leaves no gap.
    // (ZooKeeper stores that count; the `cversion` it reports is computed
    // as `2 × creations − children`, i.e. creations + deletions.)
    s.delete(&names[0].path, None).await?;
    let after_delete = s
        .create(
            &format!("{dir}/n-"),
            b"",
            CreateOptions::new(CreateMode::PersistentSequential),
        )
        .await?;
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
    let e = s.create(&format!("{root}/e"), b"", ephemeral()).await?;
    ensure!(e.stat.ephemeral_owner == s.session_id());
    let (_, gone) = observer.exists_watch(&e.path).await?;
    s.close().await;
    ensure!(gone.changed().await == WatchEvent::NodeDeleted);
    ensure!(observer.exists(&e.path).await?.is_none());
    ensure!(observer.exists(&names[1].path).await?.is_none());
    ensure!(observer.exists(&names[2].path).await?.is_some());

    // A container is reaped by the server once its last child goes.
    let c = observer
        .create(
            &format!("{root}/c"),
            b"",
            CreateOptions::new(CreateMode::Container),
        )
        .await?;
    let child = observer
        .create(&format!("{}/x", c.path), b"", ephemeral())
        .await?;
    observer.delete(&child.path, None).await?;
    await_gone(&observer, &c.path, WITHIN).await?;

    observer.close().await;
    cleanup(&root).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parents_are_containers_and_reaped() -> Result<()> {
    let root = root("parents");
    let s = session().await;
    let leaf = s
        .create(&format!("{root}/a/b/leaf"), b"", ephemeral())
        .await?;
    for dir in [format!("{root}/a"), format!("{root}/a/b")] {
        let (data, stat) = s.get_data(&dir).await?;
        ensure!(data.is_empty() && stat.ephemeral_owner == 0, "{dir}");
    }
    s.delete(&leaf.path, None).await?;
    await_gone(&s, &format!("{root}/a/b"), WITHIN).await?;
    await_gone(&s, &format!("{root}/a"), WITHIN).await?;
    s.close().await;
    cleanup(&root).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_strictly_increase() -> Result<()> {
    let root = root("czxid");
    let (s1, s2) = (session().await, session().await);
    let mut last = 0;
    for i in 0..10 {
        let s = if i % 2 == 0 { &s1 } else { &s2 };
        let c = s.create(&format!("{root}/n-"), b"", sequential()).await?;
        ensure!(c.stat.czxid > last, "czxid {} after {last}", c.stat.czxid);
        ensure!(c.token().0 == c.stat.czxid && c.stat.mzxid == c.stat.czxid);
        let (_, stat) = s.get_data(&c.path).await?;
        ensure!(
            stat.czxid == c.stat.czxid,
            "the stat agrees with the create"
        );
        last = c.stat.czxid;
    }
    s1.close().await;
    s2.close().await;
    cleanup(&root).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_and_list_sees_its_own_node() -> Result<()> {
    let root = root("cal");
    let s = session().await;
    let store = s.store();
    let dir = format!("{root}/locks");
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
    let err = store
        .create_and_list(&format!("{dir}/lock-"), b"", seq, &format!("{root}/absent"))
        .await
        .unwrap_err();
    ensure!(
        err == Error::NoNode {
            path: format!("{root}/absent")
        },
        "{err}"
    );
    let err = store
        .create_and_list(&format!("{root}/x/y"), b"", persistent_only(), &root)
        .await
        .unwrap_err();
    ensure!(
        err == Error::NoNode {
            path: format!("{root}/x")
        },
        "{err}"
    );
    s.close().await;
    cleanup(&root).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_map_onto_the_contract() -> Result<()> {
    let root = root("errors");
    let s = session().await;
    let p = format!("{root}/v");
    let created = s.create(&p, b"a", persistent()).await?;
    ensure!(created.stat.version == 0);
    let st = s.set_data(&p, b"b", Some(0)).await?;
    ensure!(st.version == 1 && st.mzxid > created.stat.mzxid && st.czxid == created.stat.czxid);
    ensure!(
        s.set_data(&p, b"c", Some(0)).await.unwrap_err() == Error::BadVersion { path: p.clone() }
    );
    ensure!(s.delete(&p, Some(7)).await.unwrap_err() == Error::BadVersion { path: p.clone() });

    s.create(&format!("{p}/child"), b"", persistent()).await?;

    let missing = format!("{root}/missing");
    ensure!(
        s.get_data(&missing).await.unwrap_err()
            == Error::NoNode {
                path: missing.clone()
            }
    );
    ensure!(
        s.delete(&missing, None).await.unwrap_err()
            == Error::NoNode {
                path: missing.clone()
            }
    );
    ensure!(
        s.set_data(&missing, b"", None).await.unwrap_err()
            == Error::NoNode {
                path: missing.clone()
            }
    );
    ensure!(
        s.children(&missing).await.unwrap_err()
            == Error::NoNode {
                path: missing.clone()
            }
    );
    ensure!(s.exists(&missing).await?.is_none());
    let err = s
        .create(&format!("{missing}/x"), b"", persistent_only())
        .await
        .unwrap_err();
    ensure!(
        err == Error::NoNode {
            path: missing.clone()
        },
        "a create names the missing parent: {err}"
    );

    let e = s.create(&format!("{root}/eph"), b"", ephemeral()).await?;
    let err = s
        .create(&format!("{}/x", e.path), b"", persistent())
        .await
        .unwrap_err();
    ensure!(
        err == Error::NoChildrenForEphemerals {
            path: e.path.clone()
        },
        "{err}"
    );

    let (data, stat) = s.get_data(&p).await?;
    ensure!(data == b"b" && stat.version == 1 && stat.num_children == 1);
    s.close().await;
    cleanup(&root).await;
    Ok(())
}

/// What the conformance suite's `watches_fire_once_on_node_events` leaves
/// open: a listing's children carry no creation, an exists() watch also
/// reports data changes, a deletion fires the parent's children watch too,
/// and a get_data watch on a missing node is not armed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_fire_on_node_events() -> Result<()> {
    let root = root("watches");
    let (s, other) = (session().await, session().await);
    let p = format!("{root}/w");
    s.create(&root, b"", persistent()).await?;

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
    let (_, parent_watch) = s.children_watch(&root).await?;
    other.delete(&p, None).await?;
    ensure!(deleted.changed().await == WatchEvent::NodeDeleted);
    ensure!(parent_watch.changed().await == WatchEvent::ChildrenChanged);

    // A get_data watch on a missing node is not armed: NoNode instead.
    ensure!(matches!(
        s.get_data_watch(&p).await.unwrap_err(),
        Error::NoNode { .. }
    ));
    s.close().await;
    other.close().await;
    cleanup(&root).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_fires_on_session_expiry() -> Result<()> {
    let root = root("watch-expiry");
    let s = session().await;
    let p = s
        .create(&format!("{root}/n"), b"", persistent())
        .await?
        .path;
    let (_, _, watch) = s.get_data_watch(&p).await?;
    let (_, child_watch) = s.children_watch(&root).await?;
    s.faults().expect("faults").expire().await?;
    ensure!(watch.changed().await == WatchEvent::Session(SessionState::Lost));
    ensure!(child_watch.changed().await == WatchEvent::Session(SessionState::Lost));
    s.close().await;
    cleanup(&root).await;
    Ok(())
}

/// What the conformance suite's `multi_is_all_or_nothing` leaves open: a
/// failing create names its missing parent, and a passing multi is one
/// transaction (one zxid) that leaves the parent's counter to the creates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_is_atomic() -> Result<()> {
    let root = root("multi");
    let s = session().await;
    let base = s
        .create(&format!("{root}/m"), b"", persistent())
        .await?
        .path;
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
            path: format!("{root}/none/x"),
            data: vec![],
            mode: CreateMode::Persistent,
        },
    ];
    let err = s.multi(&ops).await.unwrap_err();
    ensure!(
        err == Error::MultiFailed {
            index: 2,
            source: Box::new(Error::NoNode {
                path: format!("{root}/none")
            })
        },
        "{err}"
    );
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
    s.close().await;
    cleanup(&root).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expire_loses_the_session_and_the_next_operation_renews_it() -> Result<()> {
    let root = root("expire");
    let s = session().await;
    let observer = session().await;
    let old = s.status();
    let node = s.create(&format!("{root}/e"), b"", ephemeral()).await?;
    let (_, gone) = observer.exists_watch(&node.path).await?;
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
    s.close().await;
    observer.close().await;
    cleanup(&root).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspension_holds_operations_and_keeps_the_session() -> Result<()> {
    let root = root("suspend");
    let s = session().await;
    let id = s.session_id();
    let node = s.create(&format!("{root}/e"), b"", ephemeral()).await?;
    let (_, _, watch) = s.get_data_watch(&node.path).await?;
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
    s.close().await;
    cleanup(&root).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspension_past_the_timeout_loses_the_session() -> Result<()> {
    let root = root("suspend-lost");
    let s = session().await;
    let observer = session().await;
    let id = s.session_id();
    let node = s.create(&format!("{root}/e"), b"", ephemeral()).await?;
    let (_, _, watch) = observer.get_data_watch(&node.path).await?;
    s.faults().expect("faults").suspend(TIMEOUT * 2);
    // Issued while suspended: runs in the new session once the old is lost.
    let held = s.exists(&node.path).await?;
    ensure!(held.is_none(), "the server expired the ephemeral node");
    ensure!(s.session_id() != id && s.state() == SessionState::Reconnected);
    ensure!(watch.changed().await == WatchEvent::NodeDeleted);
    s.close().await;
    observer.close().await;
    cleanup(&root).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_create_reply_still_creates_the_node() -> Result<()> {
    let root = root("reply");
    let s = session().await;
    let before = s.status();
    s.faults().expect("faults").lose_next_create_reply();
    let p = format!("{root}/n");
    let err = s.create(&p, b"", ephemeral()).await.unwrap_err();
    ensure!(err == Error::ConnectionLoss, "{err}");
    let after = s.status();
    ensure!(after.state == SessionState::Reconnected && after.session_id == before.session_id);
    ensure!(
        after.changes == before.changes + 2,
        "Suspended, then Reconnected"
    );
    ensure!(
        s.exists(&p).await?.is_some(),
        "applied although the reply was lost"
    );
    // Only the next one.
    s.create(&format!("{root}/m"), b"", ephemeral()).await?;
    s.close().await;
    cleanup(&root).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chroot_keeps_paths_relative() -> Result<()> {
    let top = root("chroot");
    let chroot = format!("{top}/app");
    let s = connect(&format!("{}{chroot}", url())).await;
    let created = s.create("/a/b", b"x", persistent()).await?;
    ensure!(created.path == "/a/b", "{}", created.path);
    let seq = s
        .create(
            "/a/n-",
            b"",
            CreateOptions::new(CreateMode::EphemeralSequential),
        )
        .await?;
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

    let plain = session().await;
    let (data, _) = plain.get_data(&format!("{chroot}/a/b")).await?;
    ensure!(data == b"x");
    ensure!(plain.exists(&format!("{chroot}/m")).await?.is_some());
    plain.set_data(&format!("{chroot}/a/b"), b"y", None).await?;
    ensure!(watch.changed().await == WatchEvent::DataChanged);
    ensure!(s.get_data("/a/b").await?.0 == b"y");
    let err = s.get_data("/absent").await.unwrap_err();
    ensure!(
        err == Error::NoNode {
            path: "/absent".into()
        },
        "errors name the relative path: {err}"
    );
    s.close().await;
    plain.close().await;
    cleanup(&top).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_credentials_protect_the_nodes_created_with_them() -> Result<()> {
    let root = root("auth");
    let hosts = shared_zk().connect_string();
    let alice = connect(&format!("zk://alice:secret@{hosts}")).await;
    let alice2 = connect(&format!("zk://alice:secret@{hosts}")).await;
    let bob = connect(&format!("zk://bob:secret@{hosts}")).await;
    let anonymous = session().await;
    let secure = format!("{root}/secure");
    alice
        .create(&format!("{secure}/child"), b"s", persistent())
        .await?;
    let child = format!("{secure}/child");

    let err = anonymous.delete(&child, None).await.unwrap_err();
    ensure!(
        err == Error::NoAuth {
            path: child.clone()
        },
        "{err}"
    );
    let err = anonymous.set_data(&secure, b"x", None).await.unwrap_err();
    ensure!(
        err == Error::NoAuth {
            path: secure.clone()
        },
        "{err}"
    );
    let err = anonymous.get_data(&child).await.unwrap_err();
    ensure!(
        err == Error::NoAuth {
            path: child.clone()
        },
        "{err}"
    );
    let err = bob.delete(&child, None).await.unwrap_err();
    ensure!(
        err == Error::NoAuth {
            path: child.clone()
        },
        "another user: {err}"
    );
    let err = anonymous
        .create(&format!("{secure}/x"), b"", persistent())
        .await
        .unwrap_err();
    ensure!(
        err == Error::NoAuth {
            path: format!("{secure}/x")
        },
        "{err}"
    );

    // The same user in another session may.
    ensure!(alice2.get_data(&child).await?.0 == b"s");
    // Credentials are applied again in a renewed session.
    alice.faults().expect("faults").expire().await?;
    alice.set_data(&child, b"t", None).await?;
    ensure!(alice.state() == SessionState::Reconnected);
    alice2.delete(&child, None).await?;
    remove_tree(&alice, &root).await?;
    ensure!(anonymous.exists(&root).await?.is_none());
    for s in [alice, alice2, bob, anonymous] {
        s.close().await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_session_closes_it() -> Result<()> {
    let root = root("drop");
    let s = session().await;
    let observer = session().await;
    let node = s.create(&format!("{root}/e"), b"", ephemeral()).await?;
    let (_, gone) = observer.exists_watch(&node.path).await?;
    drop(s);
    tokio::time::timeout(WITHIN, gone.changed())
        .await
        .context("the session closed on drop")?;
    ensure!(observer.exists(&node.path).await?.is_none());
    observer.close().await;
    cleanup(&root).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_sessions_in_one_process() -> Result<()> {
    let root = root("many");
    let sessions = futures::future::try_join_all(
        (0..40).map(|_| async { dlock::connect_with(&url(), options()).await }),
    )
    .await?;
    let mut ids: Vec<_> = sessions.iter().map(|s| s.session_id()).collect();
    ids.sort();
    ids.dedup();
    ensure!(ids.len() == sessions.len(), "distinct sessions");
    let dir = format!("{root}/q");
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
    let checker = session().await;
    let left = checker.children(dir).await.or_else(|e| match e {
        Error::NoNode { .. } => Ok(Vec::new()),
        e => Err(e),
    })?;
    ensure!(
        left.is_empty(),
        "every ephemeral node went with its session: {left:?}"
    );
    checker.close().await;
    cleanup(&root).await;
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
