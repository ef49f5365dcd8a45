//! LeaderLatch: ports of Curator's TestLeaderLatch (curator-5.4-compat.md
//! §5.10), the post-5.4 fixes (CURATOR-696, CURATOR-724), epochs, and
//! interop with Curator's own LeaderLatch — on every backend.
//!
//! Curator's server stops and restarts map onto session faults: a
//! suspension shorter than the session timeout is a stop/restart, one
//! reaching it is an outage until LOST; "no server at start" is a
//! suspension at start.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use common::tests2::{
    a_silent_leader_is_replaced, all_ended_well, alone_inside, bad_paths_refused,
    curators_protected_name, failed_with, the_policy_ends_the_term,
};
use common::{await_children, await_state, sorted_names, Harness};
use dlock::recipes::error_policy::ErrorPolicy;
use dlock::recipes::leader_latch::{
    CloseMode, LatchState, LeaderLatch, Leadership, LeadershipEvent,
};
use dlock::store::Op;
use dlock::{Error, Session, SessionState};
use tokio::sync::{broadcast, watch};
use tokio::time::timeout;

const WITHIN: Duration = Duration::from_secs(20);
/// How long "nothing else happens" is watched for.
const QUIET: Duration = Duration::from_millis(300);

/// Every event until the latch's channel ends.
async fn drain(mut events: broadcast::Receiver<LeadershipEvent>) -> Result<Vec<LeadershipEvent>> {
    let mut all = Vec::new();
    loop {
        match timeout(WITHIN, events.recv()).await? {
            Ok(e) => all.push(e),
            Err(broadcast::error::RecvError::Closed) => return Ok(all),
            Err(e) => bail!("events: {e}"),
        }
    }
}

/// The next event, within the test's patience.
async fn next_event(events: &mut broadcast::Receiver<LeadershipEvent>) -> Result<LeadershipEvent> {
    Ok(timeout(WITHIN, events.recv())
        .await
        .context("no leadership event")??)
}

/// Waits (on the latches' leadership channels) until `cond` holds.
async fn until(latches: &[&LeaderLatch], cond: impl Fn() -> bool) -> Result<()> {
    let mut channels: Vec<watch::Receiver<Option<Leadership>>> =
        latches.iter().map(|l| l.watch_leadership()).collect();
    timeout(WITHIN, async {
        while !cond() {
            let changes = channels.iter_mut().map(|c| Box::pin(c.changed()));
            let _ = futures::future::select_all(changes).await;
        }
    })
    .await
    .context("the latches did not get there")
}

fn leaders(latches: &[&LeaderLatch]) -> usize {
    latches.iter().filter(|l| l.has_leadership()).count()
}

/// Starts latches one after another, each after the previous one's node
/// exists, so that queue order is start order.
async fn start_in_order(h: &Harness, path: &str, n: usize) -> Result<(Vec<LeaderLatch>, Session)> {
    let observer = h.session().await;
    let mut latches = Vec::new();
    for i in 0..n {
        let latch = LeaderLatch::new(&h.session().await, path)?.with_id(format!("latch-{i}"));
        latch.start()?;
        await_children(&observer, path, i + 1, WITHIN).await?;
        latches.push(latch);
    }
    Ok((latches, observer))
}

/// Two latches at the test's election path (returned first), each in a
/// session of its own; `make` sets up the first (0) and the second (1).
async fn two_latches(
    h: &Harness,
    make: impl Fn(usize, LeaderLatch) -> LeaderLatch,
) -> Result<(String, [LeaderLatch; 2])> {
    let path = h.path("/one/two/me");
    let first = make(0, LeaderLatch::new(&h.session().await, &path)?);
    let second = make(1, LeaderLatch::new(&h.session().await, &path)?);
    Ok((path, [first, second]))
}

/// Curator's layout: `<path>/_c_<uuid>-latch-<10 digits>`, ephemeral, the id
/// as UTF-8 (an empty id stores nothing); the epoch is the node's czxid.
async fn node_layout_is_curators(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/one/two/me");
    let latch = LeaderLatch::new(&s, &path)?.with_id("Ünïcode id");
    latch.start()?;
    let term = latch.await_leadership_timeout(WITHIN).await?;
    let node = latch.our_path().context("a node")?;
    ensure!(term.node() == node && latch.last_path_is_leader().as_deref() == Some(node.as_str()));
    let name = node.rsplit('/').next().unwrap();
    ensure!(node == format!("{path}/{name}"));
    curators_protected_name(name, "latch-")?;
    let (data, stat) = s.get_data(&node).await?;
    ensure!(data == "Ünïcode id".as_bytes());
    ensure!(stat.ephemeral_owner == s.session_id() && term.session_id() == s.session_id());
    ensure!(
        term.epoch().0 == stat.czxid,
        "the epoch is the node's czxid"
    );

    let anonymous = LeaderLatch::new(&s, &path)?;
    anonymous.start()?;
    await_children(&s, &path, 2, WITHIN).await?;
    let listed = latch.participants().await?;
    ensure!(
        listed.len() == 2 && listed[0].id == "Ünïcode id" && listed[1].id.is_empty(),
        "{listed:?}"
    );
    ensure!(
        s.get_data(&listed[1].node).await?.0.is_empty(),
        "an empty id stores no data"
    );
    anonymous.close().await?;
    latch.close().await?;
    await_children(&s, &path, 0, WITHIN).await?;
    Ok(())
}

/// Curator `testBasic`: the leader is always the earliest remaining
/// candidate; closing it passes leadership on, each term with a larger epoch.
async fn the_earliest_candidate_leads(h: &Harness) -> Result<()> {
    let path = h.path("/one/two/me");
    let (latches, observer) = start_in_order(h, &path, 5).await?;
    let mut last_epoch = None;
    for (i, latch) in latches.iter().enumerate() {
        let term = latch.await_leadership_timeout(WITHIN).await?;
        let all: Vec<&LeaderLatch> = latches.iter().collect();
        ensure!(leaders(&all) == 1, "one leader");
        ensure!(last_epoch < Some(term.epoch()), "epochs grow");
        last_epoch = Some(term.epoch());
        let leader = latch.leader().await?.context("a leader")?;
        ensure!(
            leader.id == format!("latch-{i}") && leader.is_leader && leader.epoch == term.epoch()
        );
        latch.close().await?;
        ensure!(term.is_cancelled() && !latch.has_leadership());
    }
    await_children(&observer, &path, 0, WITHIN).await?;
    Ok(())
}

/// Curator `testCorrectWatching`: closing candidate #2 must not make #1 the
/// leader — each candidate watches only its predecessor and looks again.
async fn a_follower_leaving_changes_nothing(h: &Harness) -> Result<()> {
    let path = h.path("/one/two/me");
    let (latches, observer) = start_in_order(h, &path, 10).await?;
    latches[0].await_leadership_timeout(WITHIN).await?;
    latches[2].close().await?;
    await_children(&observer, &path, 9, WITHIN).await?;
    // #3 now watches #1; give the election a moment to (wrongly) react.
    ensure!(
        timeout(QUIET, latches[1].await_leadership()).await.is_err(),
        "#1 must not lead"
    );
    ensure!(latches[0].has_leadership());
    latches[0].close().await?;
    latches[1].await_leadership_timeout(WITHIN).await?;
    for (i, latch) in latches.iter().enumerate().skip(1) {
        if i != 2 {
            latch.close().await?;
        }
    }
    Ok(())
}

/// Curator `testWaiting`: rounds of candidates that start together, wait
/// for leadership, check that they lead alone, and leave.
async fn candidates_take_turns_alone(h: &Harness) -> Result<()> {
    let path = h.path("/one/two/me");
    let mut sessions = Vec::new();
    for _ in 0..10 {
        sessions.push(h.session().await);
    }
    let leading = Arc::new(AtomicBool::new(false));
    for _round in 0..5 {
        let mut tasks = Vec::new();
        for s in &sessions {
            let latch = LeaderLatch::new(s, &path)?;
            let leading = leading.clone();
            tasks.push(tokio::spawn(async move {
                latch.start()?;
                latch.await_leadership_timeout(WITHIN).await?;
                alone_inside(&leading, "more than one leader").await?;
                latch.close().await?;
                anyhow::Ok(())
            }));
        }
        all_ended_well(tasks).await?;
    }
    Ok(())
}

/// Curator `testCallbackNotifyLeader` (and `testCallbackSanity`): ten
/// candidates, three silent; each one resets on its first leadership and
/// closes on its second: 20 × IsLeader, 10 + 7 × NotLeader.
async fn subscribers_hear_every_change(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/one/two/me");
    let is_leader = Arc::new(AtomicUsize::new(0));
    let not_leader = Arc::new(AtomicUsize::new(0));
    let mut latches = Vec::new();
    let mut drivers = Vec::new();
    for i in 0..10 {
        let mode = if i < 3 {
            CloseMode::Silent
        } else {
            CloseMode::NotifyLeader
        };
        let latch = Arc::new(LeaderLatch::new(&s, &path)?.with_close_mode(mode));
        let mut events = latch.subscribe();
        let (driven, is_leader, not_leader) =
            (latch.clone(), is_leader.clone(), not_leader.clone());
        drivers.push(tokio::spawn(async move {
            let mut terms = 0;
            loop {
                match events.recv().await {
                    Ok(LeadershipEvent::IsLeader { .. }) => {
                        is_leader.fetch_add(1, Ordering::SeqCst);
                        terms += 1;
                        if terms == 1 {
                            driven.reset()?;
                        } else {
                            driven.close().await?;
                        }
                    }
                    Ok(LeadershipEvent::NotLeader { .. }) => {
                        not_leader.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(broadcast::error::RecvError::Closed) => return anyhow::Ok(driven.state()),
                    Err(e) => bail!("{e}"),
                }
            }
        }));
        latches.push(latch);
    }
    for latch in &latches {
        latch.start()?;
    }
    for d in drivers {
        ensure!(timeout(WITHIN, d).await??? == LatchState::Closed);
    }
    ensure!(is_leader.load(Ordering::SeqCst) == 20);
    ensure!(not_leader.load(Ordering::SeqCst) == 2 * 10 - 3);
    Ok(())
}

/// Curator `testCallbackDontNotify`: closing a follower tells nobody
/// anything; a silent leader closed with `NotifyLeader` says so once.
async fn close_modes_decide_the_last_word(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/one/two/me");
    let leader = LeaderLatch::new(&s, &path)?;
    let follower = LeaderLatch::new(&s, &path)?.with_close_mode(CloseMode::NotifyLeader);
    let (leader_events, follower_events) = (leader.subscribe(), follower.subscribe());
    leader.start()?;
    let term = leader.await_leadership_timeout(WITHIN).await?;
    follower.start()?;
    await_children(&s, &path, 2, WITHIN).await?;
    follower.close().await?;
    ensure!(
        drain(follower_events).await?.is_empty(),
        "a follower has nothing to say"
    );
    leader.close_with(CloseMode::NotifyLeader).await?;
    let heard = drain(leader_events).await?;
    let epoch = term.epoch();
    ensure!(
        heard
            == [
                LeadershipEvent::IsLeader { epoch },
                LeadershipEvent::NotLeader { epoch }
            ],
        "{heard:?}"
    );
    Ok(())
}

/// Curator `testNoServerAtStart`: started while the connection is down, the
/// latch leads once the connection is back — exactly one IsLeader, no
/// NotLeader.
async fn starts_without_a_connection(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/one/two/me");
    s.faults().context("faults")?.suspend(h.timeout() / 2);
    await_state(&s, SessionState::Suspended, WITHIN).await?;
    let latch = LeaderLatch::new(&s, &path)?;
    let events = latch.subscribe();
    latch.start()?;
    ensure!(!latch.has_leadership());
    latch.await_leadership_timeout(WITHIN).await?;
    ensure!(
        s.state() == SessionState::Reconnected,
        "led only after reconnecting"
    );
    latch.close().await?;
    let heard = drain(events).await?;
    ensure!(
        heard.len() == 1 && matches!(heard[0], LeadershipEvent::IsLeader { .. }),
        "{heard:?}"
    );
    Ok(())
}

/// Curator `testRelativePath` (and dlock's other path rules).
async fn relative_paths_are_refused(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let bad = ["parent", "/a//b", "/trailing/", "/", ""];
    bad_paths_refused(&bad, |path| LeaderLatch::new(&s, path))
}

/// Curator `testLostConnection`: ten candidates on one session; an outage
/// until the session is lost leaves no leader; once back there is exactly
/// one, in the new session, with a larger epoch.
async fn a_lost_session_elects_again(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/one/two/me");
    let mut latches = Vec::new();
    for i in 0..10 {
        let latch = LeaderLatch::new(&s, &path)?.with_id(format!("{i}"));
        latch.start()?;
        latches.push(latch);
    }
    let all: Vec<&LeaderLatch> = latches.iter().collect();
    until(&all, || leaders(&all) == 1).await?;
    let before = all
        .iter()
        .find_map(|l| l.leadership())
        .context("a leader")?;
    let old_session = s.session_id();
    s.faults().context("faults")?.suspend(h.timeout() * 2);
    timeout(WITHIN, before.cancelled()).await?;
    ensure!(leaders(&all) == 0, "no leader while the connection is down");
    timeout(WITHIN, s.lost(old_session)).await?;
    until(&all, || leaders(&all) == 1).await?;
    let after = all
        .iter()
        .find_map(|l| l.leadership())
        .context("a leader")?;
    ensure!(after.session_id() != old_session && after.epoch() > before.epoch());
    // Every candidate is back, in the new session, behind the one leader.
    let observer = h.session().await;
    await_children(&observer, &path, 10, WITHIN).await?;
    let listed = latches[0].participants().await?;
    ensure!(listed[0].node == after.node() && listed.iter().filter(|p| p.is_leader).count() == 1);
    ensure!(leaders(&all) == 1);
    for latch in &latches {
        latch.close().await?;
    }
    Ok(())
}

/// Curator `testErrorPolicies`: with `Standard` a suspension ends
/// leadership before the session is lost; with `Session` only the loss does.
async fn error_policies_decide_when_leadership_ends(h: &Harness) -> Result<()> {
    for policy in [ErrorPolicy::Standard, ErrorPolicy::Session] {
        let s = h.session().await;
        let latch = LeaderLatch::new(&s, &h.path("/one/two/me"))?.with_error_policy(policy);
        let mut events = latch.subscribe();
        latch.start()?;
        latch.await_leadership_timeout(WITHIN).await?;
        ensure!(matches!(
            next_event(&mut events).await?,
            LeadershipEvent::IsLeader { .. }
        ));
        let term_ended = async {
            let event = next_event(&mut events).await?;
            ensure!(
                matches!(event, LeadershipEvent::NotLeader { .. }),
                "{policy:?}: {event:?}"
            );
            Ok(())
        };
        the_policy_ends_the_term(&latch, policy, h.timeout(), WITHIN, term_ended).await?;
    }
    Ok(())
}

/// Curator `testSessionErrorPolicy`: a short outage. `Session`: the leader
/// keeps its term, nothing happens. `Standard`: leadership ends and comes
/// back on the same node (the children are the same as before).
async fn a_short_outage_keeps_the_node(h: &Harness) -> Result<()> {
    let path = h.path("/one/two/me");
    for policy in [ErrorPolicy::Session, ErrorPolicy::Standard] {
        let s = h.session().await;
        let latch = LeaderLatch::new(&s, &path)?.with_error_policy(policy);
        let mut events = latch.subscribe();
        latch.start()?;
        let term = latch.await_leadership_timeout(WITHIN).await?;
        ensure!(matches!(
            next_event(&mut events).await?,
            LeadershipEvent::IsLeader { .. }
        ));
        let children = sorted_names(&s, &path).await?;
        s.faults().context("faults")?.suspend(h.timeout() / 2);
        await_state(&s, SessionState::Suspended, WITHIN).await?;
        await_state(&s, SessionState::Reconnected, WITHIN).await?;
        match policy {
            ErrorPolicy::Session => {
                let heard = timeout(QUIET, events.recv()).await;
                ensure!(heard.is_err(), "Session: nothing happens, got {heard:?}");
                ensure!(
                    !term.is_cancelled() && latch.has_leadership(),
                    "the term goes on"
                );
            }
            ErrorPolicy::Standard => {
                ensure!(matches!(
                    next_event(&mut events).await?,
                    LeadershipEvent::NotLeader { .. }
                ));
                let again = next_event(&mut events).await?;
                ensure!(
                    again
                        == LeadershipEvent::IsLeader {
                            epoch: term.epoch()
                        },
                    "{again:?}"
                );
                ensure!(term.is_cancelled(), "the old term ended");
                let now = latch.await_leadership().await?;
                ensure!(now.node() == term.node(), "the same node leads again");
            }
        }
        ensure!(
            sorted_names(&s, &path).await? == children,
            "the node was kept"
        );
        latch.close().await?;
    }
    Ok(())
}

/// Curator `testSessionInterruptionDoNotCauseBrainSplit` (CURATOR-696): the
/// leader's session expires; the follower leads, and the old leader rejoins
/// behind it without leading again. Its old term is stale: cancelled,
/// smaller epoch, fenced writes refused.
async fn an_expired_leader_does_not_lead_again(h: &Harness) -> Result<()> {
    let (path, [latch0, latch1]) = two_latches(h, |i, latch| latch.with_id(i.to_string())).await?;
    let (s0, s1) = (latch0.session(), latch1.session());
    let mut events0 = latch0.subscribe();
    latch0.start()?;
    let term0 = latch0.await_leadership_timeout(WITHIN).await?;
    latch1.start()?;
    await_children(s1, &path, 2, WITHIN).await?;
    ensure!(matches!(
        next_event(&mut events0).await?,
        LeadershipEvent::IsLeader { .. }
    ));
    s0.faults().context("faults")?.expire().await?;
    let term1 = latch1
        .await_leadership_timeout(h.timeout() + Duration::from_secs(1))
        .await?;
    ensure!(
        next_event(&mut events0).await?
            == LeadershipEvent::NotLeader {
                epoch: term0.epoch()
            }
    );
    ensure!(term0.is_cancelled() && term1.epoch() > term0.epoch());
    // latch0 rejoins with a node of its new session, behind latch1.
    await_children(s1, &path, 2, WITHIN).await?;
    let listed = latch1.participants().await?;
    ensure!(
        listed
            .iter()
            .map(|p| (p.id.as_str(), p.is_leader))
            .eq([("1", true), ("0", false)]),
        "{listed:?}"
    );
    ensure!(!latch0.has_leadership() && latch1.has_leadership());
    let heard = timeout(QUIET, events0.recv()).await;
    ensure!(
        heard.is_err(),
        "the old leader does not lead again: {heard:?}"
    );
    let write = Op::Check {
        path: path.clone(),
        version: None,
    };
    let err = term0
        .guarded(std::slice::from_ref(&write))
        .await
        .unwrap_err();
    ensure!(
        matches!(err, Error::Lost { .. }),
        "a stale term's write: {err}"
    );
    term1.guarded(&[write]).await?;
    latch0.close().await?;
    latch1.close().await?;
    Ok(())
}

/// A leader cut off from the store (even one that keeps leading through
/// suspensions) loses leadership when its session expires; another
/// candidate leads within the session timeout plus a second, with a larger
/// epoch, and the old term can no longer write.
async fn a_silent_leader_is_replaced_within_the_timeout(h: &Harness) -> Result<()> {
    let first_keeps_leading = |i, latch: LeaderLatch| match i {
        0 => latch.with_error_policy(ErrorPolicy::Session),
        _ => latch,
    };
    let (_, [latch0, latch1]) = two_latches(h, first_keeps_leading).await?;
    a_silent_leader_is_replaced(&latch0, &latch1, h.timeout(), WITHIN).await
}

/// CURATOR-18: closing right after starting (the create may be in flight)
/// leaves no node.
async fn close_right_after_start_leaves_nothing(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/one/two/me");
    for _ in 0..5 {
        let latch = LeaderLatch::new(&s, &path)?;
        latch.start()?;
        latch.close().await?;
        ensure!(latch.state() == LatchState::Closed && latch.our_path().is_none());
        ensure!(matches!(latch.await_leadership().await, Err(Error::Closed)));
    }
    s.background_idle().await;
    await_children(&s, &path, 0, WITHIN).await?;
    Ok(())
}

/// CURATOR-724: when the latch directory vanishes (nodes and all), the
/// candidates start over and one of them leads again.
async fn a_vanished_directory_is_recreated(h: &Harness) -> Result<()> {
    let path = h.path("/one/two/me");
    let (latches, admin) = start_in_order(h, &path, 2).await?;
    let first = latches[0].await_leadership_timeout(WITHIN).await?;
    let mut wipe: Vec<Op> = admin
        .children(&path)
        .await?
        .into_iter()
        .map(|c| Op::Delete {
            path: format!("{path}/{}", c.name),
            version: None,
        })
        .collect();
    wipe.push(Op::Delete {
        path: path.clone(),
        version: None,
    });
    admin.multi(&wipe).await?;
    timeout(WITHIN, first.cancelled()).await?;
    let all: Vec<&LeaderLatch> = latches.iter().collect();
    await_children(&admin, &path, 2, WITHIN).await?;
    until(&all, || leaders(&all) == 1).await?;
    let now = all
        .iter()
        .find_map(|l| l.leadership())
        .context("a leader")?;
    ensure!(now.node() != first.node() && now.epoch() > first.epoch());
    for latch in &latches {
        latch.close().await?;
    }
    Ok(())
}

/// CURATOR-436: asking for the leader of an election nobody joined is not an
/// error.
async fn an_uncreated_path_has_no_leader(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let latch = LeaderLatch::new(&s, &h.path("/never/created"))?;
    ensure!(latch.leader().await?.is_none() && latch.participants().await?.is_empty());
    ensure!(
        matches!(latch.close().await, Err(Error::InvalidArgument(_))),
        "close before start"
    );
    latch.start()?;
    ensure!(
        matches!(latch.start(), Err(Error::InvalidArgument(_))),
        "started twice"
    );
    latch.close().await?;
    failed_with(latch.close().await, Error::Closed).context("closed twice")?;
    Ok(())
}

/// Dropping a started latch without closing it still withdraws its node.
async fn dropping_a_latch_withdraws_it(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/one/two/me");
    let latch = LeaderLatch::new(&s, &path)?;
    latch.start()?;
    let term = latch.await_leadership_timeout(WITHIN).await?;
    drop(latch);
    timeout(WITHIN, term.cancelled()).await?;
    await_children(&s, &path, 0, WITHIN).await?;
    Ok(())
}

/// Interop: a Java `LeaderLatch` (Curator 5.4) joins dlock's candidates;
/// Curator's `getParticipants()` shows dlock's ids in queue order with the
/// leader marked, dlock lists Curator's id, and leadership passes from dlock
/// to Curator when dlock's candidates leave.
async fn curator_and_dlock_list_each_other(h: &Harness) -> Result<()> {
    let common::Backend::ZooKeeper(hosts) = &h.backend else {
        bail!("ZooKeeper only")
    };
    let path = h.path("/interop/latch");
    let (latches, observer) = start_in_order(h, &path, 2).await?;
    latches[0].await_leadership_timeout(WITHIN).await?;
    let mut peer = curator::LatchPeer::start(hosts, &path, "curator-ä")?;
    let seen = tokio::task::block_in_place(|| peer.participants())?;
    ensure!(
        seen == [
            ("latch-0".to_string(), true),
            ("latch-1".to_string(), false),
            ("curator-ä".to_string(), false)
        ],
        "Curator sees {seen:?}"
    );
    let ours: Vec<(String, bool)> = latches[1]
        .participants()
        .await?
        .into_iter()
        .map(|p| (p.id, p.is_leader))
        .collect();
    ensure!(ours == seen, "dlock sees {ours:?}");
    for latch in &latches {
        latch.close().await?;
    }
    let leader = LeaderLatch::new(&observer, &path)?;
    let now = timeout(WITHIN, async {
        loop {
            match leader.leader().await? {
                Some(p) if p.id == "curator-ä" => return anyhow::Ok(p),
                _ => {
                    let (_, watch) = observer.children_watch(&path).await?;
                    watch.changed().await;
                }
            }
        }
    })
    .await??;
    ensure!(now.is_leader);
    tokio::task::block_in_place(|| peer.finish())?;
    await_children(&observer, &path, 0, WITHIN).await?;
    Ok(())
}

/// A Curator 5.4 peer, compiled from a few lines of Java with Debian's jars.
mod curator {
    use std::io::{BufRead, BufReader, Write};
    use std::path::PathBuf;
    use std::process::{Child, ChildStdout, Command, Stdio};

    use anyhow::{bail, ensure, Context, Result};

    const SOURCE: &str = r#"
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.Participant;
import org.apache.curator.retry.RetryOneTime;
import java.io.*;
import java.nio.charset.StandardCharsets;

// LatchPeer <connect> <path> <id>: joins the election with a LeaderLatch,
// prints getParticipants() (id TAB isLeader, then "--"), and closes when a
// line arrives on stdin.
public class LatchPeer {
    public static void main(String[] a) throws Exception {
        PrintStream out = new PrintStream(System.out, true, "UTF-8");
        CuratorFramework c = CuratorFrameworkFactory.newClient(a[0], 10000, 15000, new RetryOneTime(100));
        c.start();
        c.blockUntilConnected();
        LeaderLatch mine = new LeaderLatch(c, a[1], a[2]);
        mine.start();
        while (mine.getOurPath() == null) Thread.sleep(5);
        for (Participant p : mine.getParticipants()) out.println(p.getId() + "\t" + p.isLeader());
        out.println("--");
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
        mine.close();
        c.close();
        out.println("closed");
    }
}
"#;

    fn classpath() -> String {
        dlock_testkit::curator_classpath()
    }

    /// Compiles the peer once per build directory.
    fn compiled() -> Result<PathBuf> {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("curator-latch-peer");
        let class = dir.join("LatchPeer.class");
        let source = dir.join("LatchPeer.java");
        let current = std::fs::read_to_string(&source)
            .map(|s| s == SOURCE)
            .unwrap_or(false);
        if !current || !class.exists() {
            std::fs::create_dir_all(&dir)?;
            std::fs::write(&source, SOURCE)?;
            let out = Command::new("javac")
                .args(["-nowarn", "-encoding", "UTF-8", "-cp", &classpath(), "-d"])
                .arg(&dir)
                .arg(&source)
                .output()
                .context(
                    "run javac (install a JDK and libcurator-recipes-java: scripts/test.sh does)",
                )?;
            ensure!(
                out.status.success(),
                "javac failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(dir)
    }

    pub struct LatchPeer {
        child: Child,
        out: BufReader<ChildStdout>,
    }

    impl LatchPeer {
        pub fn start(hosts: &str, path: &str, id: &str) -> Result<LatchPeer> {
            let dir = compiled()?;
            let mut child = Command::new("java")
                .arg("-cp")
                .arg(format!("{}:{}", dir.display(), classpath()))
                .args(["LatchPeer", hosts, path, id])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .context("run java")?;
            let out = BufReader::new(child.stdout.take().context("stdout")?);
            Ok(LatchPeer { child, out })
        }

        /// What Curator's `getParticipants()` returned: (id, isLeader).
        pub fn participants(&mut self) -> Result<Vec<(String, bool)>> {
            let mut all = Vec::new();
            loop {
                let mut line = String::new();
                if self.out.read_line(&mut line)? == 0 {
                    bail!("the Curator peer exited: {:?}", self.child.wait()?);
                }
                let line = line.trim_end_matches('\n');
                if line == "--" {
                    return Ok(all);
                }
                let (id, leader) = line.split_once('\t').context("id TAB isLeader")?;
                all.push((id.to_string(), leader == "true"));
            }
        }

        /// Closes Curator's latch and waits for the peer to exit.
        pub fn finish(mut self) -> Result<()> {
            writeln!(self.child.stdin.as_mut().context("stdin")?)?;
            let mut line = String::new();
            self.out.read_line(&mut line)?;
            ensure!(line.trim() == "closed", "the peer said {line:?}");
            ensure!(self.child.wait()?.success());
            Ok(())
        }
    }

    impl Drop for LatchPeer {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

per_backend!(every_backend {
    the_earliest_candidate_leads,
    a_follower_leaving_changes_nothing,
    candidates_take_turns_alone,
    subscribers_hear_every_change,
    close_modes_decide_the_last_word,
    starts_without_a_connection,
    relative_paths_are_refused,
    a_lost_session_elects_again,
    error_policies_decide_when_leadership_ends,
    a_short_outage_keeps_the_node,
    an_expired_leader_does_not_lead_again,
    a_silent_leader_is_replaced_within_the_timeout,
    close_right_after_start_leaves_nothing,
    a_vanished_directory_is_recreated,
    an_uncreated_path_has_no_leader,
    dropping_a_latch_withdraws_it,
});

// The Curator layout: ZooKeeper's naming only (etcd orders nodes by
// revision, not by Curator names).
per_backend!({
    embedded_layout => crate::common::embedded(),
    zookeeper_layout => crate::common::zookeeper(),
} {
    node_layout_is_curators,
});

// Interoperability with Java Curator: ZooKeeper only.
per_backend!(zookeeper_interop => crate::common::zookeeper();
    curator_and_dlock_list_each_other,
);
