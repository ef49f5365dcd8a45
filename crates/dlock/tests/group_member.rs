//! GroupMember and the children cache under it: Curator's node layout,
//! membership changes seen by everyone as events, a member that keeps its
//! node, and a cache that converges after session trouble — run on every
//! backend.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use common::tests2::next_within;
use common::{await_gone, await_state, persistent, persistent_only, Harness};
use dlock::recipes::group_member::{member_events, watch_group};
use dlock::{CacheEvent, ChildrenCache, Error, GroupMember, MemberEvent, Session};
use futures::stream::BoxStream;
use futures::StreamExt;

const WITHIN: Duration = Duration::from_secs(30);

/// The next event of a stream, within [`WITHIN`].
async fn next<T>(events: &mut BoxStream<'static, T>) -> Result<T> {
    next_within(events, WITHIN).await
}

/// The next event of a member stream is `expected`.
async fn sees(seen: &mut BoxStream<'static, MemberEvent>, expected: MemberEvent) -> Result<()> {
    let event = next(seen)
        .await
        .with_context(|| format!("waiting for {expected:?}"))?;
    ensure!(event == expected, "{event:?}, not {expected:?}");
    Ok(())
}

fn joined(id: &str, payload: &[u8]) -> MemberEvent {
    MemberEvent::Joined {
        id: id.into(),
        payload: payload.to_vec(),
    }
}

fn updated(id: &str, payload: &[u8]) -> MemberEvent {
    MemberEvent::Updated {
        id: id.into(),
        payload: payload.to_vec(),
    }
}

fn left(id: &str) -> MemberEvent {
    MemberEvent::Left { id: id.into() }
}

/// Member "a" of `dir` on `sa` (started, carrying `payload` if given), and
/// its group as `sb` watches it, with the member events `sb` sees.
async fn member_a_watched(
    sa: &Session,
    sb: &Session,
    dir: &str,
    payload: Option<&[u8]>,
) -> Result<(GroupMember, ChildrenCache, BoxStream<'static, MemberEvent>)> {
    let mut a = GroupMember::new(sa, dir, "a")?;
    if let Some(payload) = payload {
        a = a.with_payload(payload.to_vec());
    }
    a.start().await?;
    let group = watch_group(sb, dir).await?;
    let seen = member_events(group.events());
    Ok((a, group, seen))
}

/// `node` is back, owned by `session`'s new incarnation rather than by the
/// session `old` it had before.
async fn owned_anew(observer: &Session, node: &str, session: &Session, old: i64) -> Result<()> {
    let (_, stat) = observer.get_data(node).await?;
    ensure!(
        stat.ephemeral_owner != old && stat.ephemeral_owner == session.session_id(),
        "{node} is owned by {:#x}",
        stat.ephemeral_owner
    );
    Ok(())
}

fn members(pairs: &[(&str, &[u8])]) -> BTreeMap<String, Vec<u8>> {
    pairs
        .iter()
        .map(|(id, p)| (id.to_string(), p.to_vec()))
        .collect()
}

/// Curator's `GroupMember` layout: one ephemeral node `<path>/<id>` owned by
/// the member's session, holding the payload (default: the session's
/// default data); leaving deletes it.
async fn member_node_is_curators(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let dir = h.path("/g/layout");
    let plain = GroupMember::new(&s, &dir, "plain")?;
    plain.start().await?;
    let with_payload =
        GroupMember::new(&s, &dir, "carrying")?.with_payload(b"10.1.2.3:8080".to_vec());
    with_payload.start().await?;
    let (data, stat) = s.get_data(&format!("{dir}/plain")).await?;
    ensure!(stat.ephemeral_owner == s.session_id(), "ephemeral, ours");
    ensure!(data == s.options().default_data, "{data:?}");
    let (data, stat) = s.get_data(&format!("{dir}/carrying")).await?;
    ensure!(stat.ephemeral_owner == s.session_id() && data == b"10.1.2.3:8080");
    ensure!(s.children(&dir).await?.len() == 2);
    plain.close().await?;
    with_payload.close().await?;
    // A directory without children may be gone (etcd, Consul keep none).
    ensure!(s.children(&dir).await.map_or(true, |c| c.is_empty()));
    Ok(())
}

/// A join, a payload update and a departure are seen by another member as
/// events, in that order, and in its current members.
async fn join_update_leave_are_seen_by_others(h: &Harness) -> Result<()> {
    let (sa, sb) = (h.session().await, h.session().await);
    let dir = h.path("/g/events");
    let b = GroupMember::new(&sb, &dir, "b")?.with_payload(b"pb".to_vec());
    b.start().await?;
    ensure!(b.current_members() == members(&[("b", b"pb")]));
    let mut seen = b.events();

    let a = GroupMember::new(&sa, &dir, "a")?.with_payload(b"pa".to_vec());
    a.start().await?;
    ensure!(a.current_members() == members(&[("a", b"pa"), ("b", b"pb")]));
    sees(&mut seen, joined("a", b"pa")).await?;
    ensure!(b.current_members() == members(&[("a", b"pa"), ("b", b"pb")]));

    a.set_payload(b"pa2".to_vec()).await?;
    sees(&mut seen, updated("a", b"pa2")).await?;

    a.close().await?;
    sees(&mut seen, left("a")).await?;
    ensure!(b.current_members() == members(&[("b", b"pb")]));
    b.close().await?;
    ensure!(
        tokio::time::timeout(WITHIN, seen.next()).await?.is_none(),
        "the stream ends when the member closes"
    );
    Ok(())
}

/// A member whose session ends disappears from everyone's view.
async fn a_member_whose_session_ends_disappears(h: &Harness) -> Result<()> {
    let (sa, sb) = (h.session().await, h.session().await);
    let dir = h.path("/g/dies");
    let (a, group, mut seen) = member_a_watched(&sa, &sb, &dir, None).await?;
    ensure!(dlock::recipes::group_member::members_of(&group).contains_key("a"));
    sa.close().await;
    sees(&mut seen, left("a")).await?;
    ensure!(dlock::recipes::group_member::members_of(&group).is_empty());
    group.close().await;
    a.close().await?; // its session is gone: nothing to do, no error
    Ok(())
}

/// On a session expiry the member's node goes with the session and the
/// member creates it again in the new one (Curator's `PersistentNode`);
/// the others see it leave and come back.
async fn a_member_comes_back_after_its_session_expires(h: &Harness) -> Result<()> {
    let (sa, sb) = (h.session().await, h.session().await);
    let dir = h.path("/g/expires");
    let (a, group, mut seen) = member_a_watched(&sa, &sb, &dir, Some(b"pa")).await?;
    let old = sa.session_id();
    sa.faults().context("faults")?.expire().await?;
    sees(&mut seen, left("a")).await?;
    sees(&mut seen, joined("a", b"pa")).await?;
    owned_anew(&sb, &format!("{dir}/a"), &sa, old).await?;
    group.close().await;
    a.close().await?;
    Ok(())
}

/// Someone deletes a member's node: the member creates it again, with its
/// latest payload.
async fn a_deleted_member_node_comes_back(h: &Harness) -> Result<()> {
    let (sa, sb) = (h.session().await, h.session().await);
    let dir = h.path("/g/deleted");
    let a = GroupMember::new(&sa, &dir, "a")?;
    a.start().await?;
    a.set_payload(b"latest".to_vec()).await?;
    let group = watch_group(&sb, &dir).await?;
    let mut seen = member_events(group.events());
    sb.delete(&format!("{dir}/a"), None).await?;
    sees(&mut seen, left("a")).await?;
    sees(&mut seen, joined("a", b"latest")).await?;
    group.close().await;
    a.close().await?;
    await_gone(&sb, &format!("{dir}/a"), WITHIN).await?;
    Ok(())
}

/// Two members with one id: the second starts but leaves the first one's
/// node and payload alone (before, its `set_payload` overwrote them), and
/// takes the name with its own payload once the first leaves.
async fn a_second_member_with_one_id_waits_for_the_name(h: &Harness) -> Result<()> {
    let (sa, sb) = (h.session().await, h.session().await);
    let dir = h.path("/g/twins");
    let node = format!("{dir}/a");
    let first = GroupMember::new(&sa, &dir, "a")?.with_payload(b"first".to_vec());
    first.start().await?;
    let second = GroupMember::new(&sb, &dir, "a")?;
    second.start().await?;
    second.set_payload(b"second".to_vec()).await?;
    let (data, stat) = sb.get_data(&node).await?;
    ensure!(
        data == b"first" && stat.ephemeral_owner == sa.session_id(),
        "the first member's node: {:?}, owner {}",
        String::from_utf8_lossy(&data),
        stat.ephemeral_owner
    );
    let group = watch_group(&sa, &dir).await?;
    let mut seen = member_events(group.events());
    first.close().await?;
    sees(&mut seen, left("a")).await?;
    sees(&mut seen, joined("a", b"second")).await?;
    let (_, stat) = sa.get_data(&node).await?;
    ensure!(
        stat.ephemeral_owner == sb.session_id(),
        "the name is the second's"
    );
    group.close().await;
    second.close().await?;
    await_gone(&sa, &node, WITHIN).await?;
    Ok(())
}

/// A leave whose delete reply was lost tries again; by then the member
/// waiting for the name may have taken it. The retry deletes only the node
/// it left, not the next member's (before, on ZooKeeper and embedded, it
/// deleted by name: the next member was seen to leave and join again).
async fn a_leave_whose_reply_was_lost_spares_the_next_member(h: &Harness) -> Result<()> {
    let (sa, sb, sc) = (h.session().await, h.session().await, h.session().await);
    let dir = h.path("/g/lost-leave");
    let first = GroupMember::new(&sa, &dir, "a")?;
    first.start().await?;
    let second = GroupMember::new(&sb, &dir, "a")?.with_payload(b"second".to_vec());
    second.start().await?;
    let group = watch_group(&sc, &dir).await?;
    let mut seen = member_events(group.events());
    sa.faults().context("faults")?.lose_next_delete_reply();
    first.close().await?;
    sees(&mut seen, left("a")).await?;
    sees(&mut seen, joined("a", b"second")).await?;
    // The next event is this update: the second member stayed.
    second.set_payload(b"third".to_vec()).await?;
    sees(&mut seen, updated("a", b"third")).await?;
    group.close().await;
    second.close().await?;
    await_gone(&sc, &format!("{dir}/a"), WITHIN).await?;
    Ok(())
}

/// A start dropped once its node is there (before or after it finished)
/// leaves no node behind once the member is closed or dropped: before, a
/// start cancelled after making the node left it, with no keeper, until
/// the session ended.
async fn a_start_cancelled_after_making_the_node_leaves_it_to_nobody(h: &Harness) -> Result<()> {
    let (s, observer) = (h.session().await, h.session().await);
    let dir = h.path("/g/cancelled");
    let node = format!("{dir}/a");
    let member = GroupMember::new(&s, &dir, "a")?;
    tokio::select! {
        started = member.start() => started?,
        made = common::await_children(&observer, &dir, 1, WITHIN) => made?,
    }
    // Closing a member whose start was taken back says it never started.
    let _ = member.close().await;
    drop(member);
    await_gone(&observer, &node, WITHIN).await?;
    Ok(())
}

/// A member closed (from another task) while its start is making the node
/// leaves no node behind: before, the close found no node yet to delete,
/// and the start then made one that stayed, a member of nobody's, until
/// the session ended.
async fn a_member_closed_while_it_joins_leaves_no_node(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let dir = h.path("/g/closed-joining");
    let member = GroupMember::new(&s, &dir, "a")?;
    let start = member.start();
    tokio::pin!(start);
    // One poll begins the start and sends its create (a store that answers
    // at once may finish it).
    let first = futures::poll!(&mut start);
    member.close().await?;
    let started = match first {
        std::task::Poll::Ready(started) => started,
        std::task::Poll::Pending => start.await,
    };
    ensure!(
        matches!(started, Ok(()) | Err(Error::Closed)),
        "the start answered {started:?}"
    );
    let node = format!("{dir}/a");
    ensure!(
        s.exists(&node).await?.is_none(),
        "{node} outlived the member's close"
    );
    Ok(())
}

/// The member makes its deleted node again, but the reply is lost: the
/// node it then finds is its own, and its close deletes it (a store that
/// fences deletes must not take our unacknowledged node for someone
/// else's).
async fn a_member_node_made_again_unanswered_is_deleted_on_close(h: &Harness) -> Result<()> {
    let (sa, sb) = (h.session().await, h.session().await);
    let dir = h.path("/g/unanswered");
    let node = format!("{dir}/a");
    let a = GroupMember::new(&sa, &dir, "a")?;
    a.start().await?;
    let group = watch_group(&sb, &dir).await?;
    let mut seen = member_events(group.events());
    sa.faults().context("faults")?.lose_next_create_reply();
    sb.delete(&node, None).await?;
    sees(&mut seen, left("a")).await?;
    sees(&mut seen, joined("a", &sa.options().default_data)).await?;
    let (stat, _) = sb.exists_watch(&node).await?;
    ensure!(
        stat.is_some_and(|s| s.ephemeral_owner == sa.session_id()),
        "the node made again is the member's"
    );
    a.close().await?;
    await_gone(&sb, &node, WITHIN).await?;
    group.close().await;
    Ok(())
}

/// A close whose reads keep failing (an overloaded server times them out)
/// answers the failure, and the member's node goes in the background once
/// reads pass again: before, it stayed until the session ended, and a
/// second close did nothing.
async fn a_close_that_cannot_read_leaves_in_the_background(h: &Harness) -> Result<()> {
    let (s, observer) = (h.impatient_session().await, h.session().await);
    let dir = h.path("/g/unread-close");
    let node = format!("{dir}/a");
    let member = GroupMember::new(&s, &dir, "a")?;
    member.start().await?;
    s.faults().context("faults")?.fail_next_reads(u32::MAX);
    let closed = member.close().await;
    ensure!(closed == Err(Error::ConnectionLoss), "{closed:?}");
    ensure!(
        observer.exists(&node).await?.is_some(),
        "the node went unread"
    );
    s.faults().context("faults")?.fail_next_reads(0);
    await_gone(&observer, &node, WITHIN).await?;
    ensure!(member.close().await.is_ok(), "a second close");
    Ok(())
}

/// The cache follows any directory: children appear, change and go as
/// events; the directory itself may come and go.
async fn the_cache_follows_a_directory_that_comes_and_goes(h: &Harness) -> Result<()> {
    let (s, other) = (h.session().await, h.session().await);
    let dir = h.path("/c/dir");
    let cache = ChildrenCache::new(&s, &dir)?;
    cache.start().await?;
    ensure!(cache.snapshot().is_empty(), "a missing directory is empty");
    let mut events = cache.events();
    other
        .create(&format!("{dir}/x"), b"1", persistent())
        .await?;
    match next(&mut events).await? {
        CacheEvent::Added(c) if c.name == "x" && c.data == b"1" => {}
        e => bail!("{e:?}"),
    }
    other.set_data(&format!("{dir}/x"), b"2", None).await?;
    match next(&mut events).await? {
        CacheEvent::Updated { old, new } if old.data == b"1" && new.data == b"2" => {}
        e => bail!("{e:?}"),
    }
    other.delete(&format!("{dir}/x"), None).await?;
    match next(&mut events).await? {
        CacheEvent::Removed(c) if c.name == "x" => {}
        e => bail!("{e:?}"),
    }
    // The directory goes, and comes back with a child.
    other.delete(&dir, None).await.or_else(|e| match e {
        Error::NoNode { .. } => Ok(()), // reaped as an empty container
        e => Err(e),
    })?;
    other.create(&format!("{dir}/y"), b"", persistent()).await?;
    match next(&mut events).await? {
        CacheEvent::Added(c) if c.name == "y" => {}
        e => bail!("{e:?}"),
    }
    ensure!(cache.snapshot().keys().collect::<Vec<_>>() == ["y"]);
    other.delete(&format!("{dir}/y"), None).await?;
    ensure!(matches!(next(&mut events).await?, CacheEvent::Removed(_)));
    cache.close().await;
    Ok(())
}

/// Changes made while the cache's connection was down are seen once it is
/// back (the cache lists and reads everything again on a session event).
async fn the_cache_catches_up_after_a_session_blip(h: &Harness) -> Result<()> {
    let (s, other) = (h.session().await, h.session().await);
    let dir = h.path("/c/blip");
    other
        .create(&format!("{dir}/stays"), b"old", persistent())
        .await?;
    other
        .create(&format!("{dir}/goes"), b"", persistent())
        .await?;
    let cache = ChildrenCache::new(&s, &dir)?;
    cache.start().await?;
    let mut events = cache.events();
    let mut status = s.watch_status();
    s.faults().context("faults")?.suspend(h.timeout() / 4);
    status
        .wait_for(|st| st.state == dlock::SessionState::Suspended)
        .await?;
    other
        .set_data(&format!("{dir}/stays"), b"new", None)
        .await?;
    other.delete(&format!("{dir}/goes"), None).await?;
    other
        .create(&format!("{dir}/new"), b"n", persistent_only())
        .await?;
    let mut got = Vec::new();
    while got.len() < 3 {
        got.push(next(&mut events).await?);
    }
    ensure!(got.iter().any(|e| matches!(e, CacheEvent::Updated { new, .. } if new.name == "stays" && new.data == b"new")), "{got:?}");
    ensure!(
        got.iter()
            .any(|e| matches!(e, CacheEvent::Removed(c) if c.name == "goes")),
        "{got:?}"
    );
    ensure!(
        got.iter()
            .any(|e| matches!(e, CacheEvent::Added(c) if c.name == "new")),
        "{got:?}"
    );
    ensure!(cache.snapshot().keys().collect::<Vec<_>>() == ["new", "stays"]);
    cache.close().await;
    other.delete(&format!("{dir}/stays"), None).await?;
    other.delete(&format!("{dir}/new"), None).await?;
    Ok(())
}

/// A subscriber that falls further behind than the event buffer is brought
/// up to date with the net change: it ends up with exactly the children
/// there are, each told once.
async fn a_lagging_subscriber_gets_the_net_change(h: &Harness) -> Result<()> {
    const CHILDREN: usize = 400; // more than the cache buffers per subscriber
    let (s, other) = (h.session().await, h.session().await);
    let dir = h.path("/c/lag");
    let cache = ChildrenCache::new(&s, &dir)?;
    cache.start().await?;
    let mut lagging = cache.events();
    let mut keeping_up = cache.events();
    for i in 0..CHILDREN {
        other
            .create(&format!("{dir}/n{i:04}"), b"x", persistent())
            .await?;
    }
    let mut added = 0;
    while added < CHILDREN {
        if let CacheEvent::Added(_) = next(&mut keeping_up).await? {
            added += 1;
        }
    }
    let mut seen = BTreeMap::new();
    while seen.len() < CHILDREN {
        match next(&mut lagging).await? {
            CacheEvent::Added(c) => {
                ensure!(seen.insert(c.name.clone(), c).is_none(), "told twice");
            }
            e => bail!("only additions happened: {e:?}"),
        }
    }
    ensure!(seen == cache.snapshot());
    cache.close().await;
    for i in 0..CHILDREN {
        other.delete(&format!("{dir}/n{i:04}"), None).await?;
    }
    Ok(())
}

/// A session through a proxy the test can cut, to a real server, with a
/// session timeout long enough to outlast a cut.
async fn through_proxy(
    h: &Harness,
    timeout: Duration,
) -> Result<(dlock_testkit::TcpProxy, dlock::Session)> {
    let (scheme, hosts) = match &h.backend {
        common::Backend::ZooKeeper(hosts) => ("zk", hosts),
        common::Backend::Etcd(hosts) => ("etcd", hosts),
        _ => bail!("cuts are made on ZooKeeper and etcd connections"),
    };
    let proxy = dlock_testkit::TcpProxy::start(hosts)?;
    let options = dlock::SessionOptions::default().with_session_timeout(timeout);
    let session = dlock::connect_with(&format!("{scheme}://{}", proxy.address()), options).await?;
    Ok((proxy, session))
}

/// On a real server: changes made while the cache's connection was cut (a
/// payload update, a member leaving, one joining) are seen once it is back.
async fn the_cache_catches_up_after_a_cut(h: &Harness) -> Result<()> {
    let (proxy, s) = through_proxy(h, Duration::from_secs(20)).await?;
    let (sa, sb) = (h.session().await, h.session().await);
    let dir = h.path("/g/cut");
    let a = GroupMember::new(&sa, &dir, "a")?.with_payload(b"a1".to_vec());
    a.start().await?;
    let b = GroupMember::new(&sb, &dir, "b")?;
    b.start().await?;
    let group = watch_group(&s, &dir).await?;
    ensure!(dlock::recipes::group_member::members_of(&group).len() == 2);
    let mut seen = member_events(group.events());
    proxy.cut();
    await_state(&s, dlock::SessionState::Suspended, WITHIN).await?;
    a.set_payload(b"a2".to_vec()).await?;
    b.close().await?;
    let c = GroupMember::new(&sb, &dir, "c")?;
    c.start().await?;
    proxy.restore();
    let mut got = Vec::new();
    while got.len() < 3 {
        got.push(next(&mut seen).await?);
    }
    got.sort_by(|x, y| x.id().cmp(y.id()));
    ensure!(
        got == [
            updated("a", b"a2"),
            left("b"),
            joined("c", &sb.options().default_data),
        ],
        "{got:?}"
    );
    group.close().await;
    a.close().await?;
    c.close().await?;
    s.close().await;
    Ok(())
}

/// On a real server: a member cut off longer than its session timeout loses
/// its session and its node; once the connection is back it joins again in
/// a new session, and the others see it leave and come back.
async fn a_member_comes_back_after_a_session_loss(h: &Harness) -> Result<()> {
    let (proxy, sa) = through_proxy(h, h.timeout()).await?;
    let sb = h.session().await;
    let dir = h.path("/g/loss");
    let (a, group, mut seen) = member_a_watched(&sa, &sb, &dir, Some(b"pa")).await?;
    let old = sa.session_id();
    proxy.cut();
    await_state(&sa, dlock::SessionState::Lost, WITHIN).await?;
    sees(&mut seen, left("a")).await?;
    proxy.restore();
    sees(&mut seen, joined("a", b"pa")).await?;
    owned_anew(&sb, &format!("{dir}/a"), &sa, old).await?;
    group.close().await;
    a.close().await?;
    sa.close().await;
    Ok(())
}

/// Dropping a started member (its last clone) leaves the group in the
/// background.
async fn dropping_a_member_leaves(h: &Harness) -> Result<()> {
    let (sa, sb) = (h.session().await, h.session().await);
    let dir = h.path("/g/drop");
    let (a, group, mut seen) = member_a_watched(&sa, &sb, &dir, None).await?;
    drop(a);
    sees(&mut seen, left("a")).await?;
    group.close().await;
    Ok(())
}

/// Bad arguments are refused before any round trip; starting twice is
/// refused.
async fn bad_arguments_are_refused(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let dir = h.path("/g/bad");
    for id in ["", "a/b"] {
        let err = GroupMember::new(&s, &dir, id).unwrap_err();
        ensure!(
            matches!(err, Error::InvalidArgument(ref m) if m.contains("member id")),
            "{err}"
        );
    }
    ensure!(matches!(
        GroupMember::new(&s, "/", "a"),
        Err(Error::InvalidPath { .. })
    ));
    ensure!(matches!(
        ChildrenCache::new(&s, "rel"),
        Err(Error::InvalidPath { .. })
    ));
    let m = GroupMember::new(&s, &dir, "a")?;
    m.start().await?;
    ensure!(matches!(m.start().await, Err(Error::InvalidArgument(_))));
    m.close().await?;
    Ok(())
}

per_backend!(every_backend {
    member_node_is_curators,
    join_update_leave_are_seen_by_others,
    a_member_whose_session_ends_disappears,
    a_deleted_member_node_comes_back,
    a_second_member_with_one_id_waits_for_the_name,
    a_leave_whose_reply_was_lost_spares_the_next_member,
    a_start_cancelled_after_making_the_node_leaves_it_to_nobody,
    a_member_closed_while_it_joins_leaves_no_node,
    a_member_node_made_again_unanswered_is_deleted_on_close,
    a_close_that_cannot_read_leaves_in_the_background,
    the_cache_follows_a_directory_that_comes_and_goes,
    dropping_a_member_leaves,
    bad_arguments_are_refused,
});

// Expiring or suspending a session on demand needs fault injection (the
// embedded store's); on real servers a TCP proxy cuts the connection.
per_backend!(embedded_faults => crate::common::embedded();
    a_member_comes_back_after_its_session_expires,
    the_cache_catches_up_after_a_session_blip,
    a_lagging_subscriber_gets_the_net_change,
);
per_backend!({
    zookeeper_cut => crate::common::zookeeper(),
    #[cfg(feature = "etcd")]
    etcd_cut => crate::common::etcd(),
} {
    the_cache_catches_up_after_a_cut,
    a_member_comes_back_after_a_session_loss,
});
