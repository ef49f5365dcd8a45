//! The store conformance suite: pins the store contract, once, for every
//! backend.

mod common;

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use common::tests2::{
    a_lost_reply, failed_with, no_node, tokens_grow_across_sessions, versions_guard_writes_at,
    watched_ephemeral, WatchBy,
};
use common::{
    await_gone, await_state, ephemeral, hand_over, is_node_event, persistent, persistent_only,
    sequential, Harness,
};
use dlock::store::BackendKind;
use dlock::store::{
    sort_sequenced, Child, CreateMode, CreateOptions, Op, OpResult, SessionState, WatchEvent,
};
use dlock::Error;

const WITHIN: Duration = Duration::from_secs(10);

/// ZooKeeper 3.8, measured: the sequence counts the parent's child
/// creations; its `cversion` counts creations and deletions.
async fn sequential_names_count_the_parents_creations(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let dir = h.path("/seq");
    s.create(&dir, b"", persistent()).await?;
    let seq = CreateOptions::new(CreateMode::PersistentSequential);
    let a = s.create(&format!("{dir}/n-"), b"", seq).await?;
    let b = s.create(&format!("{dir}/n-"), b"", seq).await?;
    s.delete(&b.path, None).await?;
    let c = s.create(&format!("{dir}/n-"), b"", seq).await?;
    ensure!(a.path == format!("{dir}/n-0000000000"), "{}", a.path);
    ensure!(b.path == format!("{dir}/n-0000000001"), "{}", b.path);
    ensure!(
        c.path == format!("{dir}/n-0000000002"),
        "the delete does not count: {}",
        c.path
    );
    ensure!(
        s.exists(&dir).await?.unwrap().cversion == 4,
        "cversion counts the delete"
    );
    // Non-sequential children count too: sequences have gaps.
    s.create(&format!("{dir}/plain"), b"", persistent()).await?;
    s.delete(&format!("{dir}/plain"), None).await?;
    let d = s.create(&format!("{dir}/n-"), b"", seq).await?;
    ensure!(d.path == format!("{dir}/n-0000000004"), "{}", d.path);
    s.delete(&d.path, None).await?;
    for p in [&a.path, &c.path, &dir] {
        s.delete(p, None).await?;
    }
    Ok(())
}

async fn fencing_tokens_only_grow(h: &Harness) -> Result<()> {
    let (s1, s2) = (h.session().await, h.session().await);
    let path_of = |i| h.path(&format!("/f/{i}"));
    tokens_grow_across_sessions([&s1, &s2], 6, path_of, ephemeral()).await?;
    s1.close().await;
    s2.close().await;
    Ok(())
}

async fn ephemeral_nodes_die_with_their_session(h: &Harness) -> Result<()> {
    let owner = h.session().await;
    let observer = h.session().await;
    let node = owner.create(&h.path("/eph/a"), b"x", ephemeral()).await?;
    let stat = observer
        .exists(&node.path)
        .await?
        .expect("visible to others");
    ensure!(stat.ephemeral_owner == owner.session_id());
    let (_, watch) = observer.exists_watch(&node.path).await?;
    owner.close().await;
    ensure!(watch.changed().await == WatchEvent::NodeDeleted);
    ensure!(observer.exists(&node.path).await?.is_none());
    ensure!(owner.state() == SessionState::Closed);
    let err = owner.exists("/").await.unwrap_err();
    ensure!(err == Error::Closed, "use after close: {err}");
    Ok(())
}

async fn ephemeral_nodes_cannot_have_children(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let parent = s.create(&h.path("/e"), b"", ephemeral()).await?;
    let err = s
        .create(&format!("{}/child", parent.path), b"", persistent())
        .await
        .unwrap_err();
    ensure!(
        matches!(err, Error::NoChildrenForEphemerals { .. }),
        "{err}"
    );
    s.delete(&parent.path, None).await?;
    Ok(())
}

async fn versions_guard_writes(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let p = h.path("/v");
    versions_guard_writes_at(&s, &p).await?;
    let (data, stat) = s.get_data(&p).await?;
    ensure!(data == b"b" && stat.version == 1);
    s.set_data(&p, b"", None).await?;
    s.delete(&p, Some(2)).await?;
    Ok(())
}

/// A tagged node (Consul's tools' keys) still guards writes by version:
/// changed by every set (by how much is the backend's), and
/// stale versions are refused; tags below `TAG_MIN` are refused. The tag
/// reads back where the store keeps tags.
async fn tagged_nodes_keep_versions_for_compare_and_set(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let p = h.path("/tagged");
    let tag = 0xe0f6_9a2b_aa41_4de0;
    let created = s
        .create(
            &p,
            b"a",
            CreateOptions::new(CreateMode::Ephemeral)
                .with_parents()
                .with_tag(tag),
        )
        .await?;
    let v0 = created.stat.version;
    // The tag reads back where the store keeps tags (Consul), and is never
    // another value; an untagged node has none anywhere.
    let kept = s.tag(&p).await?;
    let keeps_tags = s.backend() == BackendKind::Consul;
    ensure!(kept == keeps_tags.then_some(tag), "{kept:?}");
    let set = s.set_data(&p, b"b", Some(v0)).await?;
    ensure!(set.version != v0, "a set changes the version: {set:?}");
    ensure!(s.tag(&p).await? == kept, "a set keeps the tag");
    let (data, stat) = s.get_data(&p).await?;
    ensure!(data == b"b" && stat.version == set.version, "{stat:?}");
    let err = s.set_data(&p, b"c", Some(v0)).await.unwrap_err();
    ensure!(matches!(err, Error::BadVersion { .. }), "{err}");
    let again = s.set_data(&p, b"c", Some(stat.version)).await?;
    ensure!(again.version != stat.version, "{again:?}");
    let err = s.delete(&p, Some(stat.version)).await.unwrap_err();
    ensure!(matches!(err, Error::BadVersion { .. }), "{err}");
    s.delete(&p, Some(again.version)).await?;
    let err = s.tag(&p).await.unwrap_err();
    ensure!(
        matches!(err, Error::NoNode { .. }),
        "the tag of no node: {err}"
    );
    let untagged = CreateOptions::new(CreateMode::Ephemeral).with_parents();
    s.create(&p, b"", untagged).await?;
    ensure!(s.tag(&p).await?.is_none(), "an untagged node has no tag");
    s.delete(&p, None).await?;
    let low = CreateOptions::new(CreateMode::Persistent).with_tag(7);
    let err = s.create(&p, b"", low).await.unwrap_err();
    ensure!(matches!(err, Error::InvalidArgument(_)), "{err}");
    ensure!(s.exists(&p).await?.is_none());
    Ok(())
}

/// The native session id names the session ephemeral nodes report as their
/// owner, is path-safe, and differs between sessions.
async fn native_session_ids_name_the_owner(h: &Harness) -> Result<()> {
    let (a, b) = (h.session().await, h.session().await);
    let node = a.create(&h.path("/native"), b"", ephemeral()).await?;
    let (id, name) = a.native_session_id();
    ensure!(
        id == node.stat.ephemeral_owner && id == a.session_id(),
        "{id:#x} {:?}",
        node.stat
    );
    ensure!(!name.is_empty() && !name.contains('/'), "{name:?}");
    let named = a
        .create(&h.path(&format!("/{name}")), b"", ephemeral())
        .await?;
    ensure!(b.native_session_id().1 != name);
    for p in [&named.path, &node.path] {
        a.delete(p, None).await?;
    }
    Ok(())
}

/// dlock's own nodes, owned or not, have no foreign owner — seen from
/// another session too; a missing node has none either. (A foreign owner
/// exists on Consul, for keys of `consul lock`: `consul_interop` in the
/// CLI's tests.)
async fn dlocks_own_nodes_have_no_foreign_owner(h: &Harness) -> Result<()> {
    let (a, b) = (h.session().await, h.session().await);
    let owned = a.create(&h.path("/owned"), b"", ephemeral()).await?;
    let plain = a.create(&h.path("/plain"), b"", persistent()).await?;
    for p in [&owned.path, &plain.path] {
        ensure!(a.foreign_owner(p).await?.is_none(), "{p}");
        ensure!(b.foreign_owner(p).await?.is_none(), "{p}");
        a.delete(p, None).await?;
    }
    ensure!(b.foreign_owner(&owned.path).await?.is_none());
    Ok(())
}

async fn errors_name_the_node(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let p = h.path("/err");
    s.create(&format!("{p}/child"), b"", persistent()).await?;
    failed_with(
        s.delete(&p, None).await,
        Error::NotEmpty { path: p.clone() },
    )?;
    let child = format!("{p}/child");
    let exists = Error::NodeExists {
        path: child.clone(),
    };
    failed_with(s.create(&child, b"", persistent()).await, exists)?;
    let missing = h.path("/missing");
    failed_with(s.get_data(&missing).await, no_node(&missing))?;
    let err = s
        .create(&h.path("/no/parent"), b"", persistent_only())
        .await
        .unwrap_err();
    ensure!(matches!(err, Error::NoNode { .. }), "{err}");
    let err = s.create("relative", b"", persistent()).await.unwrap_err();
    ensure!(matches!(err, Error::InvalidPath { .. }), "{err}");
    s.delete(&format!("{p}/child"), None).await?;
    // `p` is a container: the reaper may take it first (ZooKeeper's runs
    // every few milliseconds in the tests; on etcd and Consul parents are
    // implicit and vanish with their last child, see
    // `etcd_backend.rs`'s `errors_name_the_node_with_implicit_parents`).
    match s.delete(&p, None).await {
        Ok(()) | Err(Error::NoNode { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn watches_fire_once_on_node_events(h: &Harness) -> Result<()> {
    let (s, other) = (h.session().await, h.session().await);
    let p = h.path("/w");
    // exists() on an absent node fires on its creation.
    let (stat, created) = s.exists_watch(&p).await?;
    ensure!(stat.is_none());
    other.create(&p, b"", persistent()).await?;
    ensure!(created.changed().await == WatchEvent::NodeCreated);
    // get_data fires on a data change.
    let (_, _, changed) = s.get_data_watch(&p).await?;
    other.set_data(&p, b"1", None).await?;
    ensure!(changed.changed().await == WatchEvent::DataChanged);
    // children fires on a child creation and deletion.
    let (kids, child_watch) = s.children_watch(&p).await?;
    ensure!(kids.is_empty());
    other.create(&format!("{p}/c"), b"", persistent()).await?;
    ensure!(child_watch.changed().await == WatchEvent::ChildrenChanged);
    let (_, child_watch) = s.children_watch(&p).await?;
    other.delete(&format!("{p}/c"), None).await?;
    ensure!(child_watch.changed().await == WatchEvent::ChildrenChanged);
    // get_data fires on deletion.
    let (_, _, deleted) = s.get_data_watch(&p).await?;
    other.set_data(&p, b"", None).await?;
    ensure!(
        deleted.changed().await == WatchEvent::DataChanged,
        "one-shot: first event only"
    );
    let (_, _, deleted) = s.get_data_watch(&p).await?;
    other.delete(&p, None).await?;
    ensure!(deleted.changed().await == WatchEvent::NodeDeleted);
    Ok(())
}

async fn multi_is_all_or_nothing(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let base = h.path("/m");
    s.create(&base, b"", persistent()).await?;
    let a = format!("{base}/a");
    // Watches on what a failed multi touched stay armed, untouched: they
    // tell of the next real change, not of the rolled-back ones.
    let (_, _, data_watch) = s.get_data_watch(&base).await?;
    let (_, children_watch) = s.children_watch(&base).await?;
    // A failing check rolls back everything before it and names its index
    // and its reason.
    let absent = format!("{base}/absent");
    for (check, failure) in [
        (
            Op::Check {
                path: absent.clone(),
                version: None,
            },
            Error::NoNode { path: absent },
        ),
        (
            Op::Check {
                path: base.clone(),
                version: Some(5),
            },
            Error::BadVersion { path: base.clone() },
        ),
    ] {
        let ops = [
            Op::Create {
                path: a.clone(),
                data: b"1".to_vec(),
                mode: CreateMode::Persistent,
            },
            Op::SetData {
                path: base.clone(),
                data: b"x".to_vec(),
                version: None,
            },
            check,
            Op::Delete {
                path: a.clone(),
                version: None,
            },
        ];
        let err = s.multi(&ops).await.unwrap_err();
        ensure!(
            err == Error::MultiFailed {
                index: 2,
                source: Box::new(failure)
            },
            "{err}"
        );
        ensure!(s.exists(&a).await?.is_none(), "the create was rolled back");
        let (data, stat) = s.get_data(&base).await?;
        ensure!(
            data.is_empty() && stat.version == 0,
            "the set was rolled back"
        );
    }
    // A passing check lets the rest through.
    let ok = [
        Op::Check {
            path: base.clone(),
            version: Some(0),
        },
        Op::Create {
            path: a.clone(),
            data: b"1".to_vec(),
            mode: CreateMode::Persistent,
        },
        Op::Delete {
            path: a.clone(),
            version: Some(0),
        },
    ];
    let results = s.multi(&ok).await?;
    ensure!(
        matches!(
            results[..],
            [OpResult::Checked, OpResult::Created(_), OpResult::Deleted]
        ),
        "{results:?}"
    );
    // (On some stores a multi that made and removed `a` at once tells no
    // change: a create of its own does on all.)
    s.create(&a, b"", persistent()).await?;
    let event = children_watch.changed().await;
    ensure!(event == WatchEvent::ChildrenChanged, "{event:?}");
    s.delete(&a, None).await?;
    s.set_data(&base, b"y", None).await?;
    let event = data_watch.changed().await;
    ensure!(event == WatchEvent::DataChanged, "{event:?}");
    let err = s
        .multi(&[Op::Check {
            path: base.clone(),
            version: Some(5),
        }])
        .await
        .unwrap_err();
    ensure!(matches!(err, Error::MultiFailed { index: 0, .. }), "{err}");
    s.delete(&base, None).await?;
    Ok(())
}

/// A multi's results describe the nodes it wrote, as a read after it does:
/// a set's version and mzxid are the new ones, and a node made again in
/// the multi that deleted it has the czxid and owner a read finds (before,
/// on Consul, each result was that of the first entry of its key: the
/// check's or the deleted node's, so a takeover handed out the old
/// holder's fence and owner). ZooKeeper's multi tells no created node's
/// stat (czxid -1).
async fn multi_results_describe_the_written_nodes(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let base = h.path("/mr");
    let node = format!("{base}/n");
    let old = s.create(&node, b"old", ephemeral()).await?;
    let results = s
        .multi(&[
            Op::Check {
                path: node.clone(),
                version: Some(0),
            },
            Op::SetData {
                path: node.clone(),
                data: b"new".to_vec(),
                version: Some(0),
            },
        ])
        .await?;
    let (_, read) = s.get_data(&node).await?;
    let [OpResult::Checked, OpResult::Set(set)] = &results[..] else {
        bail!("{results:?}");
    };
    ensure!(
        (set.version, set.mzxid) == (read.version, read.mzxid) && set.version == 1,
        "the set's result {set:?}, a read after it {read:?}"
    );
    let results = s
        .multi(&[
            Op::Delete {
                path: node.clone(),
                version: Some(1),
            },
            Op::Create {
                path: node.clone(),
                data: b"again".to_vec(),
                mode: CreateMode::Persistent,
            },
        ])
        .await?;
    let (_, read) = s.get_data(&node).await?;
    let [OpResult::Deleted, OpResult::Created(made)] = &results[..] else {
        bail!("{results:?}");
    };
    let told = made.stat.czxid != -1;
    ensure!(
        !told || made.stat.czxid == read.czxid,
        "the create's czxid {}, the old node's {}, a read's {}",
        made.stat.czxid,
        old.stat.czxid,
        read.czxid
    );
    ensure!(
        made.stat.ephemeral_owner == 0 && read.ephemeral_owner == 0,
        "a persistent node made again has an owner: {:?}",
        made.stat
    );
    s.delete(&node, None).await?;
    // A set after another write of the multi, of another node and of the
    // node it made: its result is what a read finds, and the next write
    // moves the node's mzxid on (one multi, one transaction id).
    let (n, made) = (format!("{base}/n2"), format!("{base}/made"));
    s.create(&n, b"", ephemeral()).await?;
    for (create, set) in [
        (format!("{base}/a"), n.clone()),
        (made.clone(), made.clone()),
    ] {
        let results = s
            .multi(&[
                Op::Create {
                    path: create.clone(),
                    data: b"".to_vec(),
                    mode: CreateMode::Ephemeral,
                },
                Op::SetData {
                    path: set.clone(),
                    data: b"set".to_vec(),
                    version: None,
                },
            ])
            .await?;
        let (_, read) = s.get_data(&set).await?;
        let [OpResult::Created(_), OpResult::Set(told)] = &results[..] else {
            bail!("{results:?}");
        };
        ensure!(
            (told.version, told.mzxid) == (read.version, read.mzxid),
            "a set after a create: told {told:?}, read {read:?}"
        );
        let after = s.set_data(&set, b"again", None).await?;
        ensure!(
            after.mzxid > read.mzxid,
            "the next write's mzxid {} is not past the multi's {}",
            after.mzxid,
            read.mzxid
        );
        s.delete(&create, None).await?;
    }
    s.delete(&n, None).await?;
    // A directory made for a child, at the version a look tells.
    let child = format!("{base}/dir/c");
    s.create(&child, b"", ephemeral()).await?;
    let dir = format!("{base}/dir");
    let version = s.exists(&dir).await?.context("the directory")?.version;
    s.multi(&[Op::Check {
        path: dir,
        version: Some(version),
    }])
    .await
    .context("a check on the version exists told")?;
    s.delete(&child, None).await?;
    Ok(())
}

/// `fail_next_reads(n)`: the next `n` reads fail with `ConnectionLoss`,
/// the connection staying up; then reads pass again.
async fn failing_reads_fail_while_connected(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let store = s.store();
    s.faults().context("faults")?.fail_next_reads(3);
    let (exists, data, children) = (
        store.exists("/", false).await.map(drop),
        store.get_data("/", false).await.map(drop),
        store.children("/", false).await.map(drop),
    );
    for (what, read) in [
        ("exists", exists),
        ("get_data", data),
        ("children", children),
    ] {
        ensure!(read == Err(Error::ConnectionLoss), "{what}: {read:?}");
    }
    ensure!(s.state().is_connected(), "{:?}", s.state());
    store.exists("/", false).await?;
    Ok(())
}

/// `fail_next_sets(n)`: the next `n` sets fail with `ConnectionLoss`
/// without writing, the connection staying up; then sets pass again.
async fn failing_sets_fail_without_writing(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let node = s.create(&h.path("/sets"), b"v0", persistent()).await?.path;
    s.faults().context("faults")?.fail_next_sets(2);
    for _ in 0..2 {
        let set = s.store().set_data(&node, b"v1", None).await.map(drop);
        ensure!(set == Err(Error::ConnectionLoss), "{set:?}");
    }
    ensure!(s.state().is_connected(), "{:?}", s.state());
    ensure!(s.get_data(&node).await?.0 == b"v0", "a failed set wrote");
    s.set_data(&node, b"v2", None).await?;
    ensure!(s.get_data(&node).await?.0 == b"v2");
    s.delete(&node, None).await?;
    Ok(())
}

/// `fail_next_deletes(n)`: the next `n` deletes fail with `ConnectionLoss`
/// without deleting, the connection staying up; then deletes pass again.
async fn failing_deletes_fail_without_deleting(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let node = s.create(&h.path("/deletes"), b"", ephemeral()).await?.path;
    s.faults().context("faults")?.fail_next_deletes(2);
    for _ in 0..2 {
        let delete = s.store().delete(&node, None).await;
        ensure!(delete == Err(Error::ConnectionLoss), "{delete:?}");
    }
    ensure!(s.state().is_connected(), "{:?}", s.state());
    ensure!(s.exists(&node).await?.is_some(), "a failed delete deleted");
    s.delete(&node, None).await?;
    ensure!(s.exists(&node).await?.is_none());
    Ok(())
}

/// The root is never deleted and has no data of its own here: watches of
/// it fire no node event while nodes come and go below it (before, on
/// Consul its first look fired `NodeDeleted` at once, and on etcd an
/// emptied namespace did).
async fn a_root_watch_fires_no_node_event(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let (_, _, root_data) = s.get_data_watch("/").await?;
    let (_, root_exists) = s.exists_watch("/").await?;
    let node = h.path("/root-watch/n");
    let (_, appeared) = s.exists_watch(&node).await?;
    s.create(&node, b"", ephemeral()).await?;
    let event = appeared.changed().await;
    ensure!(event == WatchEvent::NodeCreated, "{event:?}");
    let (_, _, gone) = s.get_data_watch(&node).await?;
    s.delete(&node, None).await?;
    let event = gone.changed().await;
    ensure!(event == WatchEvent::NodeDeleted, "{event:?}");
    // Later events came; a root event, had one been on its way, too.
    let quiet = Duration::from_millis(500);
    for (what, watch) in [("data", root_data), ("exists", root_exists)] {
        let fired = tokio::time::timeout(quiet, watch.changed()).await;
        ensure!(fired.is_err(), "the root's {what} watch fired: {fired:?}");
    }
    Ok(())
}

/// Where parents are implicit (etcd, Consul), a parent made for a child is
/// gone the moment its last child is; a directory made on purpose is a key
/// (a node with no children, which stays). Elsewhere the parent is a node,
/// there until a delete or the reaper.
async fn implicit_parents_go_with_their_last_child(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let dir = h.path("/implicit/d");
    let node = s.create(&format!("{dir}/leaf"), b"", ephemeral()).await?;
    let implicit = s.store().has_implicit_parents();
    ensure!(
        implicit == matches!(s.backend(), BackendKind::Etcd | BackendKind::Consul),
        "{:?}: implicit parents {implicit}",
        s.backend()
    );
    s.delete(&node.path, None).await?;
    if implicit {
        ensure!(s.exists(&dir).await?.is_none(), "{dir} outlived its child");
        s.create(&dir, b"", persistent()).await?;
        let (children, _) = s.store().children(&dir, false).await?;
        ensure!(children.is_empty() && s.exists(&dir).await?.is_some());
        s.delete(&dir, None).await?;
    }
    Ok(())
}

async fn parents_are_created_as_containers_and_reaped(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let dir = h.path("/c/d");
    let node = s.create(&format!("{dir}/leaf"), b"", ephemeral()).await?;
    ensure!(s.exists(&dir).await?.is_some());
    s.delete(&node.path, None).await?;
    // A multi that would have deleted the emptied container, rolled back,
    // leaves it to be reaped all the same.
    let failing = [
        Op::Delete {
            path: dir.clone(),
            version: None,
        },
        Op::Check {
            path: format!("{dir}-absent"),
            version: None,
        },
    ];
    ensure!(s.multi(&failing).await.is_err(), "the multi failed");
    // The emptied containers go, deepest first, without anyone deleting them.
    await_gone(&s, &dir, WITHIN).await?;
    await_gone(&s, &h.path("/c"), WITHIN).await?;
    Ok(())
}

async fn create_and_list_sees_its_own_node(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let dir = h.path("/cl");
    let store = s.store();
    s.create(&format!("{dir}/other"), b"", ephemeral()).await?;
    let (created, kids) = store
        .create_and_list(
            &format!("{dir}/n-"),
            b"",
            CreateOptions::new(CreateMode::EphemeralSequential),
            &dir,
        )
        .await?;
    let names: Vec<_> = kids.iter().map(|c| c.name.as_str()).collect();
    ensure!(
        names.contains(&created.name()) && names.contains(&"other"),
        "{names:?}"
    );
    s.delete(&created.path, None).await?;
    s.delete(&format!("{dir}/other"), None).await?;
    Ok(())
}

/// A listing that tells a child's czxid tells its node's; a node created
/// again under a listed name has another one, so a waiter can tell the node
/// it queued behind from a newer one that took its name.
async fn a_listed_czxid_is_the_nodes_and_a_recreated_node_has_another(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let dir = h.path("/czxid");
    let node = format!("{dir}/n");
    let listed = |kids: Vec<Child>| kids.into_iter().find(|c| c.name == "n").map(|c| c.czxid);
    let first = s.create(&node, b"", ephemeral()).await?;
    let before = listed(s.children(&dir).await?).context("n is listed")?;
    ensure!(
        before.is_none_or(|c| c == first.stat.czxid),
        "{before:?} vs {first:?}"
    );
    s.delete(&node, None).await?;
    let again = s.create(&node, b"", ephemeral()).await?;
    let after = listed(s.children(&dir).await?).context("n is listed again")?;
    ensure!(
        after.is_none_or(|c| c == again.stat.czxid),
        "{after:?} vs {again:?}"
    );
    ensure!(again.stat.czxid != first.stat.czxid);
    ensure!(
        before.is_none() || after != before,
        "the same czxid listed for a new node"
    );
    s.delete(&node, None).await?;
    Ok(())
}

/// A listed child's owner, where the listing tells it (Consul), is the
/// session holding it: ours for our ephemeral node, nobody (0) for a
/// persistent one; elsewhere `None`. (The KV semaphore takes an entry held
/// by nobody as dead.)
async fn a_listed_owner_is_the_session_holding_the_child(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let dir = h.path("/owner");
    s.create(&format!("{dir}/ours"), b"", ephemeral()).await?;
    s.create(&format!("{dir}/nobodys"), b"", persistent())
        .await?;
    let kids = s.children(&dir).await?;
    let owner = |name: &str| kids.iter().find(|c| c.name == name).map(|c| c.owner);
    let (ours, nobodys) = (owner("ours"), owner("nobodys"));
    // Consul's listing tells (its keys can outlive their session).
    let told = s.backend() == BackendKind::Consul;
    let expected = |owner: i64| told.then_some(owner);
    ensure!(
        ours.context("listed")? == expected(s.session_id()),
        "{kids:?}"
    );
    ensure!(nobodys.context("listed")? == expected(0), "{kids:?}");
    for n in ["ours", "nobodys"] {
        s.delete(&format!("{dir}/{n}"), None).await?;
    }
    Ok(())
}

/// A check on a node our session made passes while that node is there.
/// Once another session's node took its name, a store that fences (etcd,
/// Consul) fails it — a guarded write never lands under a lock lost to a
/// holder of the same node name; ZooKeeper's check (and the embedded
/// store's, which follows it) only asks that the name exist.
async fn a_check_on_our_node_fails_once_another_sessions_node_took_its_name(
    h: &Harness,
) -> Result<()> {
    let (ours, theirs) = (h.session().await, h.session().await);
    let node = h.path("/fenced-check/n");
    let check = [Op::Check {
        path: node.clone(),
        version: None,
    }];
    ours.create(&node, b"", ephemeral()).await?;
    ours.multi(&check).await.context("our node is there")?;
    theirs.delete(&node, None).await?;
    theirs.create(&node, b"", ephemeral()).await?;
    let fenced = matches!(ours.backend(), BackendKind::Etcd | BackendKind::Consul);
    // Alone, and after a write to the node earlier in the same multi.
    let write = Op::SetData {
        path: node.clone(),
        data: b"x".to_vec(),
        version: None,
    };
    for (ops, at) in [
        (check.to_vec(), 0),
        ([vec![write], check.to_vec()].concat(), 1),
    ] {
        let done = ours.multi(&ops).await;
        let refused = |source: &Error| matches!(source, Error::NoNode { path } if *path == node);
        match (fenced, done) {
            (true, Err(Error::MultiFailed { index, source }))
                if index == at && refused(&source) => {}
            (false, Ok(_)) => {}
            (_, other) => {
                bail!("fenced: {fenced}, {ops:?} after the name changed hands: {other:?}")
            }
        }
    }
    theirs.delete(&node, None).await?;
    Ok(())
}

/// A fence outlives the session that set it: once our session expired and
/// was renewed, a check or a delete of the node we had at a name fails
/// (`NoNode`) on etcd and Consul although another session's node took the
/// name meanwhile — a guarded write that waited out the renewal must not
/// land on the new holder's node, nor a retried delete remove it. (ZooKeeper
/// and the embedded store can only check that the name exists.)
async fn a_fence_outlives_the_session_that_set_it(h: &Harness) -> Result<()> {
    let (ours, theirs) = (h.session().await, h.session().await);
    let node = h.path("/fence-renewed/n");
    let first = ours.session_id();
    ours.create(&node, b"", ephemeral()).await?;
    ours.faults().context("faults")?.expire().await?;
    await_gone(&theirs, &node, h.timeout()).await?;
    theirs.create(&node, b"", ephemeral()).await?;
    let fenced = matches!(ours.backend(), BackendKind::Etcd | BackendKind::Consul);
    let check = [Op::Check {
        path: node.clone(),
        version: None,
    }];
    let checked = ours.multi(&check).await;
    ensure!(
        ours.session_id() != first,
        "the check ran in a renewed session"
    );
    let refused = |e: &Error| matches!(e, Error::NoNode { path } if *path == node);
    match (fenced, checked) {
        (true, Err(Error::MultiFailed { index: 0, source })) if refused(&source) => {}
        (false, Ok(_)) => {}
        (_, other) => bail!("fenced: {fenced}, a check after the renewal: {other:?}"),
    }
    if fenced {
        match ours.delete(&node, None).await {
            Err(e) if refused(&e) => {}
            other => bail!("a delete of our gone node after the renewal: {other:?}"),
        }
        ensure!(theirs.exists(&node).await?.is_some(), "their node stays");
        // Our own node of that name, made in the new session, is ours
        // again: to delete, also one whose create lost its reply (none was
        // learned); and to check, once learned.
        theirs.delete(&node, None).await?;
        let create = ours.create(&node, b"", ephemeral());
        a_lost_reply(&ours, |faults| faults.lose_next_create_reply(), create).await?;
        ours.delete(&node, None)
            .await
            .context("our new node, unanswered, is ours to delete")?;
        ours.create(&node, b"", ephemeral()).await?;
        ours.multi(&check).await.context("our new node passes")?;
        ours.delete(&node, None)
            .await
            .context("and is ours to delete")?;
    } else {
        theirs.delete(&node, None).await?;
    }
    ensure!(theirs.exists(&node).await?.is_none(), "nothing left");
    Ok(())
}

/// Our node made again in a name whose fence is stale (another session
/// deleted our first node, and the create of the second lost its reply, so
/// the store never learned it) is still ours to delete: a delete holds
/// while our session holds the key (etcd: the key's lease; Consul:
/// `check-session`), not by a remembered create index.
async fn a_node_of_ours_made_again_unanswered_is_ours_to_delete(h: &Harness) -> Result<()> {
    let (ours, theirs) = (h.session().await, h.session().await);
    let node = h.path("/unanswered/n");
    ours.create(&node, b"", ephemeral()).await?;
    theirs.delete(&node, None).await?;
    let create = ours.create(&node, b"", ephemeral());
    a_lost_reply(&ours, |faults| faults.lose_next_create_reply(), create).await?;
    let made = theirs.exists(&node).await?.context("made, unanswered")?;
    ensure!(made.ephemeral_owner == ours.session_id(), "{made:?}");
    ours.delete(&node, None).await.context("ours to delete")?;
    ensure!(theirs.exists(&node).await?.is_none(), "deleted");
    Ok(())
}

/// A session the client gave up on (its connection was down for longer
/// than the session timeout) may still live at the server for a while: our
/// node of it, deleted in the next session, is deleted (or was already gone
/// with it) — never refused while it is still there.
async fn our_node_of_a_session_given_up_on_is_deleted_in_the_next(h: &Harness) -> Result<()> {
    let (ours, observer) = (h.session().await, h.session().await);
    let node = h.path("/given-up/n");
    let first = ours.session_id();
    ours.create(&node, b"", ephemeral()).await?;
    ours.faults().context("faults")?.suspend(h.timeout() * 2);
    await_state(&ours, SessionState::Lost, h.timeout() * 4).await?;
    match ours.delete(&node, None).await {
        Ok(()) | Err(Error::NoNode { .. }) => {}
        other => bail!("a delete of our node of the lost session: {other:?}"),
    }
    ensure!(
        ours.session_id() != first,
        "the delete ran in the next session"
    );
    ensure!(observer.exists(&node).await?.is_none(), "our node is gone");
    Ok(())
}

/// A delete with a version names the node it read: it removes another
/// session's node in the name of our gone one (alone and in a multi), where
/// a delete without a version would refuse it as not ours.
async fn a_delete_with_a_version_removes_the_node_it_read(h: &Harness) -> Result<()> {
    let (ours, theirs) = (h.session().await, h.session().await);
    let keep = h.path("/versioned/keep");
    ours.create(&keep, b"", persistent()).await?;
    let node = h.path("/versioned/n");
    for in_multi in [false, true] {
        ours.create(&node, b"", ephemeral()).await?;
        theirs.delete(&node, None).await?;
        theirs.create(&node, b"", persistent_only()).await?;
        let stat = ours.exists(&node).await?.context("their node")?;
        let version = Some(stat.version);
        match in_multi {
            false => ours.delete(&node, version).await,
            true => ours
                .multi(&[Op::Delete {
                    path: node.clone(),
                    version,
                }])
                .await
                .map(drop),
        }
        .with_context(|| format!("in a multi: {in_multi}"))?;
        ensure!(theirs.exists(&node).await?.is_none(), "deleted");
    }
    ours.delete(&keep, None).await?;
    Ok(())
}

/// Where a store says its plain delete of our node removes only the node
/// created at a given creation (`deletes_only_created`: etcd and Consul),
/// that holds: our node is deleted in its name, and not in an earlier
/// node's name, once ours took that name; elsewhere the store cannot tell.
async fn a_delete_in_the_name_of_a_creation_removes_only_that_node(h: &Harness) -> Result<()> {
    let (ours, theirs) = (h.session().await, h.session().await);
    let node = h.path("/created/n");
    let first = ours.create(&node, b"", ephemeral()).await?;
    let fences = matches!(ours.backend(), BackendKind::Etcd | BackendKind::Consul);
    let czxid = first.stat.czxid;
    let says = ours.store().deletes_only_created(&node, czxid);
    ensure!(
        says == fences.then_some(true),
        "our node, as made: {says:?}"
    );
    // Not a node of ours: no store can tell.
    let theirs_node = h.path("/created/theirs");
    let made = theirs.create(&theirs_node, b"", ephemeral()).await?;
    let says = ours
        .store()
        .deletes_only_created(&theirs_node, made.stat.czxid);
    ensure!(says.is_none(), "their node: {says:?}");
    theirs.delete(&theirs_node, None).await?;
    // Ours again, made anew: the earlier creation is not the node there.
    ours.delete(&node, None).await?;
    let second = ours.create(&node, b"", ephemeral()).await?;
    ensure!(second.stat.czxid != czxid, "{second:?}");
    let says = ours.store().deletes_only_created(&node, czxid);
    ensure!(
        says == fences.then_some(false),
        "an earlier creation: {says:?}"
    );
    ours.delete(&node, None).await?;
    Ok(())
}

/// A fence ends when the name gets a persistent node of ours: our
/// ephemeral node there was deleted (by someone else, or by the multi that
/// makes the persistent one), and our persistent node that took the name,
/// by a create or in a multi, is checked and deleted as any node.
async fn a_persistent_node_in_the_name_of_our_gone_ephemeral_is_not_fenced_out(
    h: &Harness,
) -> Result<()> {
    let (ours, theirs) = (h.session().await, h.session().await);
    let node = h.path("/fence-ends/n");
    let check = [Op::Check {
        path: node.clone(),
        version: None,
    }];
    let persistent_by_multi = Op::Create {
        path: node.clone(),
        data: Vec::new(),
        mode: CreateMode::Persistent,
    };
    let delete_by_multi = Op::Delete {
        path: node.clone(),
        version: None,
    };
    // The directory stays while the name changes hands (a multi makes no
    // parents).
    let keep = h.path("/fence-ends/keep");
    ours.create(&keep, b"", persistent()).await?;
    // Made by a create, a multi, and a multi that deletes our ephemeral
    // node and makes the persistent one in its place.
    for round in ["create", "multi", "multi replacing ours"] {
        ours.create(&node, b"", ephemeral()).await?;
        match round {
            "create" => {
                theirs.delete(&node, None).await?;
                ours.create(&node, b"", persistent()).await?;
            }
            "multi" => {
                theirs.delete(&node, None).await?;
                ours.multi(std::slice::from_ref(&persistent_by_multi))
                    .await?;
            }
            _ => {
                let replace = [delete_by_multi.clone(), persistent_by_multi.clone()];
                ours.multi(&replace).await?;
            }
        }
        ours.multi(&check)
            .await
            .with_context(|| format!("{round}: our persistent node passes"))?;
        ours.delete(&node, None)
            .await
            .with_context(|| format!("{round}: and is ours to delete"))?;
        ensure!(theirs.exists(&node).await?.is_none(), "{round}: deleted");
    }
    ours.delete(&keep, None).await?;
    Ok(())
}

/// What a woken waiter relies on: once the watch on a listed child fired
/// for its deletion, `children_seen` no longer lists it but lists the
/// waiter's own node, and `watch_child` on it (or on a newer node under its
/// name, where the listing tells czxids) says it is gone. Two rounds: a
/// backend that answers from what its watches delivered does so in the
/// second.
async fn a_listing_seen_after_a_watch_has_what_the_watch_delivered(h: &Harness) -> Result<()> {
    let (a, b) = (h.session().await, h.session().await);
    let dir = h.path("/seen");
    let stays = a.create(&format!("{dir}/n-"), b"", sequential()).await?;
    for round in 0..2 {
        let handoff = hand_over(&a, &b, &dir).await?;
        let names: Vec<_> = handoff.seen.iter().map(|c| c.name.as_str()).collect();
        ensure!(
            !names.contains(&handoff.ahead.name.as_str())
                && names.contains(&stays.name())
                && names.contains(&handoff.ours.name()),
            "round {round}: {names:?}"
        );
        ensure!(
            b.store().watch_child(&dir, &handoff.ahead).await?.is_none(),
            "round {round}: a deleted child was watched"
        );
        b.delete(&handoff.ours.path, None).await?;
    }
    let named = format!("{dir}/x");
    a.create(&named, b"", ephemeral()).await?;
    let old = b
        .children(&dir)
        .await?
        .into_iter()
        .find(|c| c.name == "x")
        .context("x is listed")?;
    a.delete(&named, None).await?;
    a.create(&named, b"", ephemeral()).await?;
    let watched = b.store().watch_child(&dir, &old).await?;
    ensure!(
        old.czxid.is_none() || watched.is_none(),
        "the newer x was taken for the listed one"
    );
    a.delete(&named, None).await?;
    a.delete(&stays.path, None).await?;
    Ok(())
}

async fn children_sort_by_sequence_like_curator(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let dir = h.path("/sort");
    let seq = sequential();
    let mut made = Vec::new();
    for prefix in ["_c_zzz-lock-", "_c_aaa-lock-", "_c_mmm-lock-"] {
        made.push(
            s.create(&format!("{dir}/{prefix}"), b"", seq)
                .await?
                .name()
                .to_string(),
        );
    }
    let mut kids = s.children(&dir).await?;
    sort_sequenced(&mut kids, &["lock-"]);
    let sorted: Vec<_> = kids.iter().map(|c| c.name.clone()).collect();
    ensure!(sorted == made, "creation order, not name order: {sorted:?}");
    for n in made {
        s.delete(&format!("{dir}/{n}"), None).await?;
    }
    // Native creation order wins where a backend provides it.
    let mut native = vec![
        Child {
            name: "b".into(),
            created: Some(5),
            czxid: Some(5),
            owner: None,
        },
        Child {
            name: "a".into(),
            created: Some(9),
            czxid: Some(9),
            owner: None,
        },
        Child {
            name: "c".into(),
            created: Some(5),
            czxid: Some(5),
            owner: None,
        },
    ];
    sort_sequenced(&mut native, &["lock-"]);
    ensure!(native.iter().map(|c| c.name.as_str()).collect::<Vec<_>>() == ["b", "c", "a"]);
    Ok(())
}

async fn suspension_within_the_timeout_keeps_the_session(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let id = s.session_id();
    let (node, watch) = watched_ephemeral(&s, &s, &h.path("/susp"), WatchBy::Data).await?;
    let mut states = s.watch_status();
    s.faults().expect("faults").suspend(h.timeout() / 5);
    ensure!(watch.changed().await == WatchEvent::Session(SessionState::Suspended));
    // An operation issued while suspended waits for the connection.
    let stat = s.exists(&node.path).await?;
    ensure!(stat.is_some(), "the ephemeral node survived");
    states
        .wait_for(|st| st.state == SessionState::Reconnected)
        .await?;
    ensure!(s.session_id() == id, "same session after reconnecting");
    s.delete(&node.path, None).await?;
    Ok(())
}

async fn suspension_past_the_timeout_loses_the_session(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let observer = h.session().await;
    let id = s.session_id();
    let (node, mut watch) =
        watched_ephemeral(&s, &observer, &h.path("/lost"), WatchBy::Data).await?;
    s.faults().expect("faults").suspend(h.timeout() * 2);
    s.lost(id).await;
    ensure!(s.state() == SessionState::Lost);
    // The server expired it. A blip of the observer's own session also
    // wakes its watch (the contract: a waiter never sleeps through one);
    // then it looks again (seen once under load on ZooKeeper).
    loop {
        match watch.changed().await {
            WatchEvent::NodeDeleted => break,
            WatchEvent::Session(_) => match observer.exists_watch(&node.path).await? {
                (None, _) => break,
                (Some(_), again) => watch = again,
            },
            other => anyhow::bail!("the server expired it, yet the watch saw {other:?}"),
        }
    }
    // Used again, the client runs in a new session.
    ensure!(s.exists(&node.path).await?.is_none());
    ensure!(s.session_id() != id && s.state() == SessionState::Reconnected);
    Ok(())
}

/// A session replaced while its keep-alive slept (suspended, then
/// expired): a suspension of the new session that spans its next renewal
/// ends as any does. (The old session's keep-alive, asleep until its own
/// expiry, took the wake-up that ends the suspension; the new session's
/// slept on until its expiry and was lost.)
///
/// The timing is the scenario (renewals come every third of the timeout
/// T): the first session is suspended at once, so its keep-alive, due at
/// T/3, sleeps on until about T; it is expired at 2T/5, and the new
/// session, suspended from then until 4T/5, misses its renewal at 11T/15.
async fn a_suspension_of_a_renewed_session_ends(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let first = s.session_id();
    let faults = s.faults().context("faults")?;
    faults.suspend(h.timeout() * 5);
    tokio::time::sleep(h.timeout() * 2 / 5).await;
    faults.expire().await?;
    let node = s.create(&h.path("/renewed"), b"", ephemeral()).await?;
    let renewed = s.session_id();
    ensure!(renewed != first, "the expired session was not replaced");
    let mut states = s.watch_status();
    let before = states.borrow_and_update().changes;
    faults.suspend(h.timeout() * 2 / 5);
    let over = states.wait_for(|st| st.changes > before && st.state != SessionState::Suspended);
    let over = tokio::time::timeout(h.timeout() * 2, over)
        .await
        .context("the suspension did not end")??;
    ensure!(
        over.state == SessionState::Reconnected && over.session_id == renewed,
        "{over:?}"
    );
    s.delete(&node.path, None).await?;
    Ok(())
}

async fn expiry_fires_watches_and_renews_the_session(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let id = s.session_id();
    let (node, watch) = watched_ephemeral(&s, &s, &h.path("/exp"), WatchBy::Data).await?;
    s.faults().expect("faults").expire().await?;
    let event = watch.changed().await;
    ensure!(
        !is_node_event(event) || event == WatchEvent::NodeDeleted,
        "{event:?}"
    );
    ensure!(s.state() == SessionState::Lost);
    let again = s.create(&node.path, b"", ephemeral()).await?;
    ensure!(again.stat.ephemeral_owner != id && again.stat.ephemeral_owner == s.session_id());
    s.delete(&again.path, None).await?;
    // A closed session has nothing left to expire.
    s.close().await;
    let expired = s.faults().expect("faults").expire().await;
    ensure!(expired == Err(dlock::Error::Closed), "{expired:?}");
    Ok(())
}

/// `end_on_server`: the session's ephemeral nodes go (another session sees
/// them go) and the session learns it from the first request the server
/// refuses — that request alone fails, with `SessionExpired` (on
/// ZooKeeper the server tells the client at once: none fails) — then goes
/// on in a new session. A closed session has nothing left to end.
async fn a_session_ended_on_the_server_is_learned_and_renewed(h: &Harness) -> Result<()> {
    let (s, observer) = (h.session().await, h.session().await);
    let id = s.session_id();
    let node = s.create(&h.path("/ended"), b"", ephemeral()).await?.path;
    s.faults().context("faults")?.end_on_server().await?;
    await_gone(&observer, &node, WITHIN).await?;
    let mut refused = 0;
    let again = loop {
        match s.create(&node, b"", ephemeral()).await {
            Err(Error::SessionExpired) if refused == 0 => refused += 1,
            again => break again?,
        }
    };
    ensure!(
        again.stat.ephemeral_owner == s.session_id() && s.session_id() != id,
        "made by {:#x} in session {:#x}, the ended one {id:#x}",
        again.stat.ephemeral_owner,
        s.session_id()
    );
    s.delete(&again.path, None).await?;
    s.close().await;
    let ended = s.faults().context("faults")?.end_on_server().await;
    ensure!(ended == Err(Error::Closed), "{ended:?}");
    Ok(())
}

/// The create is applied although its reply is lost; the caller gets
/// `ConnectionLoss` and the status blips `Suspended` → `Reconnected` in the
/// same session. The hook fires once: the next create gets its reply.
async fn a_lost_create_reply_still_creates_the_node(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let p = h.path("/reply");
    let create = s.create(&p, b"", ephemeral());
    a_lost_reply(&s, |faults| faults.lose_next_create_reply(), create).await?;
    ensure!(
        s.exists(&p).await?.is_some(),
        "applied although the reply was lost"
    );
    let next = s.create(&h.path("/next"), b"", ephemeral()).await?;
    for node in [&p, &next.path] {
        s.delete(node, None).await?;
    }
    Ok(())
}

/// The hook for etcd#22082-style tests: the delete is applied (another
/// session sees the node go) although its reply is lost; the caller gets
/// `ConnectionLoss`, the status blips `Suspended` → `Reconnected` in the
/// same session, and a retry finds `NoNode`. The hook fires once.
async fn a_lost_delete_reply_still_deletes_the_node(h: &Harness) -> Result<()> {
    let (s, other) = (h.session().await, h.session().await);
    let p = h.path("/reply");
    s.create(&p, b"", ephemeral()).await?;
    let (_, deleted) = other.exists_watch(&p).await?;
    let delete = s.delete(&p, None);
    a_lost_reply(&s, |faults| faults.lose_next_delete_reply(), delete).await?;
    ensure!(
        tokio::time::timeout(WITHIN, deleted.changed()).await? == WatchEvent::NodeDeleted,
        "applied although the reply was lost"
    );
    let err = s.delete(&p, None).await.unwrap_err();
    ensure!(matches!(err, Error::NoNode { .. }), "the retry: {err}");
    s.create(&p, b"", ephemeral()).await?;
    s.delete(&p, None).await?;
    ensure!(s.exists(&p).await?.is_none());
    Ok(())
}

/// The read-write lock's downgrade (CURATOR-621) at the store level: a
/// node created without a sequence but named with a sequential sibling's
/// suffix sorts at that sibling's place, even once the sibling is gone —
/// so a writer queued behind cannot get ahead of it. ZooKeeper-style
/// stores get this from the name; etcd orders by create revision and keeps
/// the place in a position marker.
async fn a_node_named_after_a_siblings_sequence_takes_its_place(h: &Harness) -> Result<()> {
    let (s, other) = (h.session().await, h.session().await);
    let dir = h.path("/place");
    let names = ["__READ__", "__WRIT__"];
    let seq = sequential();
    let write = s.create(&format!("{dir}/_c_a-__WRIT__"), b"", seq).await?;
    let queued = other
        .create(&format!("{dir}/_c_b-__WRIT__"), b"", seq)
        .await?;
    let suffix = dlock::store::sequence_key(write.name(), &names).to_string();
    let read = s
        .create(&format!("{dir}/_c_c-__READ__{suffix}"), b"", ephemeral())
        .await?;
    let sorted = |mut kids: Vec<Child>| {
        sort_sequenced(&mut kids, &names);
        kids.into_iter().map(|c| c.name).collect::<Vec<_>>()
    };
    let before = sorted(s.children(&dir).await?);
    ensure!(
        before.iter().position(|n| n == read.name())
            < before.iter().position(|n| n == queued.name()),
        "{before:?}"
    );
    s.delete(&write.path, None).await?;
    let after = sorted(other.children(&dir).await?);
    ensure!(
        after == [read.name(), queued.name()],
        "the read node keeps the write node's place: {after:?}"
    );
    // Deleting it removes everything it brought along.
    s.delete(&read.path, None).await?;
    other.delete(&queued.path, None).await?;
    ensure!(s.children(&dir).await.map(|k| k.is_empty()).unwrap_or(true));
    Ok(())
}

/// The name of an ephemeral node whose session ended (closed, expired,
/// destroyed) can be taken again at once by another session: no lock
/// delay by default (`Error::LockDelay` only where a session asked for
/// one; `consul_backend.rs` pins that on Consul).
async fn an_ended_sessions_node_name_is_free_at_once(h: &Harness) -> Result<()> {
    let (owner, next) = (h.session().await, h.session().await);
    let path = h.path("/named/holder");
    owner.create(&path, b"", ephemeral()).await?;
    owner.close().await;
    await_gone(&next, &path, WITHIN).await?;
    let again = next.create(&path, b"", ephemeral()).await?;
    ensure!(again.stat.ephemeral_owner == next.session_id(), "{again:?}");
    next.delete(&path, None).await?;
    Ok(())
}

/// The whole contract, on `$backends` (as `per_backend!` takes them).
macro_rules! the_contract_on {
    ($($backends:tt)+) => {
        per_backend!($($backends)+ {
    fencing_tokens_only_grow,
    a_children_watch_hears_its_node_go_past_a_tombstone,
    ephemeral_nodes_die_with_their_session,
    ephemeral_nodes_cannot_have_children,
    versions_guard_writes,
    watches_fire_once_on_node_events,
    multi_is_all_or_nothing,
    multi_results_describe_the_written_nodes,
    a_root_watch_fires_no_node_event,
    failing_reads_fail_while_connected,
    failing_sets_fail_without_writing,
    failing_deletes_fail_without_deleting,
    parents_are_created_as_containers_and_reaped,
    implicit_parents_go_with_their_last_child,
    create_and_list_sees_its_own_node,
    children_sort_by_sequence_like_curator,
    a_listed_czxid_is_the_nodes_and_a_recreated_node_has_another,
    a_listed_owner_is_the_session_holding_the_child,
    a_check_on_our_node_fails_once_another_sessions_node_took_its_name,
    a_persistent_node_in_the_name_of_our_gone_ephemeral_is_not_fenced_out,
    a_fence_outlives_the_session_that_set_it,
    a_delete_with_a_version_removes_the_node_it_read,
    a_delete_in_the_name_of_a_creation_removes_only_that_node,
    our_node_of_a_session_given_up_on_is_deleted_in_the_next,
    a_node_of_ours_made_again_unanswered_is_ours_to_delete,
    a_listing_seen_after_a_watch_has_what_the_watch_delivered,
    suspension_within_the_timeout_keeps_the_session,
    suspension_past_the_timeout_loses_the_session,
    expiry_fires_watches_and_renews_the_session,
    a_session_ended_on_the_server_is_learned_and_renewed,
    a_suspension_of_a_renewed_session_ends,
    a_lost_create_reply_still_creates_the_node,
    a_lost_delete_reply_still_deletes_the_node,
    a_node_named_after_a_siblings_sequence_takes_its_place,
    tagged_nodes_keep_versions_for_compare_and_set,
    native_session_ids_name_the_owner,
    dlocks_own_nodes_have_no_foreign_owner,
    an_ended_sessions_node_name_is_free_at_once,
    errors_name_the_node,
});
    };
}

the_contract_on!(every_backend);

// Again below an etcd namespace: the namespace maps every path in and out,
// and what the store learns from a create's reply (its fences) too.
the_contract_on!({
    #[cfg(feature = "etcd")]
    etcd_namespaced => crate::common::etcd_namespaced(),
});

// ZooKeeper-style stores only; etcd differs (see `dlock::store::etcd`):
// - `sequential_names_count_the_parents_creations` pins ZooKeeper's
//   numbering (`%010d` of the parent's creations, cversion): etcd has no
//   per-directory counter; its queues order by create revision and the
//   10-digit suffix is only unique, not counted.
/// A children watch on a node with data and no children hears the node's
/// deletion at once — also after a child came and went. (On Consul the
/// prefix's index then stays at the child's tombstone, which the deletion
/// of the node's own key, not below it, does not move: the watch heard it
/// only when its blocking query's 30 s wait ran out.)
async fn a_children_watch_hears_its_node_go_past_a_tombstone(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let node = h.path("/watched");
    s.create(&node, b"x", persistent()).await?;
    let child = format!("{node}/child");
    s.create(&child, b"", persistent()).await?;
    s.delete(&child, None).await?;
    let (children, watch) = s.children_watch(&node).await?;
    ensure!(children.is_empty(), "{children:?}");
    s.delete(&node, None).await?;
    let heard = tokio::time::timeout(Duration::from_secs(10), watch.changed()).await;
    ensure!(
        matches!(heard, Ok(dlock::store::WatchEvent::NodeDeleted)),
        "{heard:?}"
    );
    Ok(())
}

per_backend!({
    embedded_numbering => crate::common::embedded(),
    zookeeper_numbering => crate::common::zookeeper(),
} {
    sequential_names_count_the_parents_creations,
});
