//! LeaderSelector: ports of Curator's TestLeaderSelector and
//! TestLeaderSelectorParticipants (curator-5.4-compat.md §5.11), the
//! post-5.4 fixes (CURATOR-518, CURATOR-671), epochs and cancellation — on
//! every backend. Server stops map onto session faults, as in
//! `leader_latch.rs`.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use common::tests2::{
    a_silent_leader_is_replaced, curators_protected_name, the_policy_ends_the_term,
};
use common::{await_children, await_state, queued, Harness};
use dlock::recipes::error_policy::ErrorPolicy;
use dlock::recipes::leader_selector::{LeaderSelector, Leadership};
use dlock::{Error, Mutex, Session, SessionState};
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};

const WITHIN: Duration = Duration::from_secs(20);
/// How long "nothing else happens" is watched for.
const QUIET: Duration = Duration::from_millis(300);

/// What a test's `take_leadership` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// Took leadership (with the selector's tag).
    Took(usize),
    /// Noticed its cancellation and returned.
    Cancelled(usize),
}

/// A `take_leadership` that reports, then leads until cancelled.
fn lead_until_cancelled(
    tag: usize,
    seen: mpsc::UnboundedSender<(Seen, Leadership)>,
) -> impl Fn(Leadership) -> futures::future::BoxFuture<'static, ()> + Send + Sync + 'static {
    move |term: Leadership| {
        let seen = seen.clone();
        Box::pin(async move {
            let _ = seen.send((Seen::Took(tag), term.clone()));
            term.cancelled().await;
            let _ = seen.send((Seen::Cancelled(tag), term));
        })
    }
}

/// How often a [`counted`] `take_leadership` was called, and how many of
/// those calls ran to their end.
#[derive(Clone, Default)]
struct Calls {
    began: Arc<AtomicUsize>,
    ended: Arc<AtomicUsize>,
}

/// A `take_leadership` that counts its calls in `calls` and runs `body`
/// with the number of calls before this one.
fn counted<F>(
    calls: &Calls,
    body: impl Fn(usize) -> F + Send + Sync + 'static,
) -> impl Fn(Leadership) -> futures::future::BoxFuture<'static, ()> + Send + Sync + 'static
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let calls = calls.clone();
    move |_term: Leadership| {
        let calls = calls.clone();
        let body = body(calls.began.fetch_add(1, Ordering::SeqCst));
        Box::pin(async move {
            body.await;
            calls.ended.fetch_add(1, Ordering::SeqCst);
        })
    }
}

/// A selector in a new session at `path` that leads until cancelled and
/// reports to the returned receiver (tag 0), with `options` set; not
/// started.
async fn reporting_selector(
    h: &Harness,
    path: &str,
    options: impl FnOnce(LeaderSelector) -> LeaderSelector,
) -> Result<(Session, LeaderSelector, Reports)> {
    let s = h.session().await;
    let (tx, rx) = mpsc::unbounded_channel();
    let selector = options(LeaderSelector::new(&s, path, lead_until_cancelled(0, tx))?);
    Ok((s, selector, rx))
}

/// What the `take_leadership`s of [`lead_until_cancelled`] report.
type Reports = mpsc::UnboundedReceiver<(Seen, Leadership)>;

async fn next(rx: &mut mpsc::UnboundedReceiver<(Seen, Leadership)>) -> Result<(Seen, Leadership)> {
    timeout(WITHIN, rx.recv())
        .await
        .context("nothing seen")?
        .context("channel closed")
}

/// Waits until the selector's leadership is `leading`.
async fn await_leading(selector: &LeaderSelector, leading: bool) -> Result<()> {
    timeout(
        WITHIN,
        selector
            .watch_leadership()
            .wait_for(|l| l.is_some() == leading),
    )
    .await
    .context("leadership did not change")??;
    Ok(())
}

/// Curator's layout: a mutex on the path (`_c_<uuid>-lock-<seq>`) holding
/// the id; without an id, the session's default data. A plain Mutex on the
/// same path takes turns with the selector.
async fn layout_is_a_mutex_with_the_id(h: &Harness) -> Result<()> {
    let path = h.path("/one/two/me");
    let (s, selector, mut rx) = reporting_selector(h, &path, |sel| sel.with_id("A is A")).await?;
    selector.start()?;
    let (_, term) = next(&mut rx).await?;
    let name = term.node().rsplit('/').next().unwrap().to_string();
    ensure!(term.node() == format!("{path}/{name}"));
    curators_protected_name(&name, "lock-")?;
    let (data, stat) = s.get_data(term.node()).await?;
    ensure!(data == b"A is A" && term.epoch().0 == stat.czxid);
    // A plain mutex on the path waits for the leader.
    let mutex = Mutex::new(&s, &path)?;
    ensure!(
        mutex.try_acquire().await?.is_none(),
        "the selector holds the lock"
    );
    let waiting = queued(&s, &path, 2, WITHIN, async move { mutex.acquire().await }).await?;
    selector.close().await?;
    let guard = timeout(WITHIN, waiting).await???;
    ensure!(guard.token() > term.epoch());
    guard.release().await?;

    let (tx, mut rx) = mpsc::unbounded_channel();
    let anonymous = LeaderSelector::new(&s, &path, lead_until_cancelled(1, tx))?;
    anonymous.start()?;
    let (_, term) = next(&mut rx).await?;
    ensure!(
        s.get_data(term.node()).await?.0 == s.options().default_data,
        "no id: default data"
    );
    let leader = anonymous.leader().await?.context("a leader")?;
    ensure!(leader.id.as_bytes() == s.options().default_data.as_slice() && leader.is_leader);
    anonymous.close().await?;
    Ok(())
}

/// Curator `testInterruption` / `testInterruptLeadership`: interrupting the
/// leader makes `take_leadership` see its cancellation and return; the lock
/// is released cleanly (the node goes).
async fn an_interrupted_leader_stops_and_releases(h: &Harness) -> Result<()> {
    let path = h.path("/one/two/me");
    let grace = |sel: LeaderSelector| sel.with_cancel_grace(WITHIN);
    let (s, selector, mut rx) = reporting_selector(h, &path, grace).await?;
    ensure!(
        !selector.interrupt_leadership(),
        "nothing to interrupt before leading"
    );
    selector.start()?;
    let (seen, term) = next(&mut rx).await?;
    ensure!(seen == Seen::Took(0) && selector.has_leadership());
    ensure!(selector.interrupt_leadership());
    let (seen, _) = next(&mut rx).await?;
    ensure!(
        seen == Seen::Cancelled(0),
        "take_leadership saw the interruption"
    );
    await_leading(&selector, false).await?;
    await_children(&s, &path, 0, WITHIN).await?;
    ensure!(term.is_cancelled() && !selector.has_leadership());
    ensure!(s.exists(term.node()).await?.is_none(), "released");
    selector.close().await?;
    Ok(())
}

/// A leader whose node someone else deletes (`revoke_forced`, an
/// operator) is cancelled at once, as a latch stops leading at once: not
/// only when its `take_leadership` returns by itself.
async fn a_leader_whose_node_is_deleted_is_cancelled(h: &Harness) -> Result<()> {
    let path = h.path("/leader");
    // Given the time to say it saw its cancellation.
    let grace = |sel: LeaderSelector| sel.with_cancel_grace(WITHIN);
    let (s, first, mut first_seen) = reporting_selector(h, &path, grace).await?;
    first.start()?;
    let (seen, term) = next(&mut first_seen).await?;
    ensure!(seen == Seen::Took(0), "{seen:?}");
    let (_, second, mut second_seen) = reporting_selector(h, &path, |s| s).await?;
    second.start()?;
    await_children(&s, &path, 2, WITHIN).await?;
    dlock::revoke_forced(&h.session().await, term.node()).await?;
    let (seen, _) = next(&mut first_seen).await?;
    ensure!(seen == Seen::Cancelled(0), "the deposed leader: {seen:?}");
    let (seen, _) = next(&mut second_seen).await?;
    ensure!(seen == Seen::Took(0), "the next leader: {seen:?}");
    ensure!(!first.has_leadership() && term.is_cancelled());
    first.close().await?;
    second.close().await?;
    Ok(())
}

/// A term's guarded writes are refused once it is over — even while the
/// selector, requeued in the same session, waits again (on etcd under the
/// same key name, which the write's check alone would accept) and another
/// candidate leads.
async fn a_finished_term_guards_no_more_writes(h: &Harness) -> Result<()> {
    let (path, resource) = (h.path("/leader"), h.path("/resource"));
    let s = h.session().await;
    s.create(&resource, b"v0", common::persistent()).await?;
    let (tx, mut terms) = mpsc::unbounded_channel();
    let first = LeaderSelector::new(&s, &path, move |term: Leadership| {
        let tx = tx.clone();
        async move {
            let _ = tx.send(term);
        }
    })?
    .with_auto_requeue();
    first.start()?;
    let kept = timeout(WITHIN, terms.recv()).await?.context("a term")?;
    let (_, second, mut second_seen) = reporting_selector(h, &path, |s| s).await?;
    second.start()?;
    let (seen, _) = next(&mut second_seen).await?;
    ensure!(seen == Seen::Took(0), "{seen:?}");
    await_children(&s, &path, 2, WITHIN).await?;
    common::late_guarded_write_is_refused(&kept, &s, &resource, "a finished term").await?;
    second.close().await?;
    first.close().await?;
    s.delete(&resource, None).await?;
    Ok(())
}

/// Curator `testAutoRequeue`: a `take_leadership` that returns at once is
/// called again and again, each term with a larger epoch.
async fn auto_requeue_leads_again(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let selector = LeaderSelector::new(&s, &h.path("/leader"), move |term: Leadership| {
        let tx = tx.clone();
        async move {
            let _ = tx.send(term.epoch());
        }
    })?
    .with_auto_requeue();
    selector.start()?;
    let mut epochs = Vec::new();
    for _ in 0..3 {
        epochs.push(timeout(WITHIN, rx.recv()).await?.context("a term")?);
    }
    ensure!(epochs.windows(2).all(|w| w[0] < w[1]), "{epochs:?}");
    selector.close().await?;
    Ok(())
}

/// Curator `testInterruptLeadershipWithRequeue`, in its 5.5+ form
/// (CURATOR-518): with auto-requeue, interrupting — even twice, quickly —
/// ends the term, and leadership is taken again.
async fn interrupts_do_not_break_auto_requeue(h: &Harness) -> Result<()> {
    let requeue = |sel: LeaderSelector| sel.with_auto_requeue();
    let (_s, selector, mut rx) = reporting_selector(h, &h.path("/leader"), requeue).await?;
    selector.start()?;
    let (_, first) = next(&mut rx).await?;
    ensure!(selector.interrupt_leadership());
    selector.interrupt_leadership();
    tokio::time::sleep(Duration::from_millis(20)).await; // Curator's test: 20 ms apart.
    selector.interrupt_leadership();
    // Whatever the interrupts hit, a later term comes and stays.
    let later = await_term_after(&selector, &first).await?;
    ensure!(first.is_cancelled());
    ensure!(selector.interrupt_leadership());
    let last = await_term_after(&selector, &later).await?;
    ensure!(selector.has_leadership() && !last.is_cancelled() && later.is_cancelled());
    selector.close().await?;
    Ok(())
}

/// Waits for a running term later than `term`.
async fn await_term_after(selector: &LeaderSelector, term: &Leadership) -> Result<Leadership> {
    let mut leadership = selector.watch_leadership();
    let later = timeout(
        WITHIN,
        leadership
            .wait_for(|l| matches!(l, Some(t) if t.epoch() > term.epoch() && !t.is_cancelled())),
    )
    .await
    .context("no later term")??
    .clone();
    later.context("a term")
}

/// CURATOR-671: `requeue()` succeeds right after leadership was interrupted
/// (while the term is still ending), and a new turn follows. The cancelled
/// term waits for `ending` before it returns, so "still ending" is a fact
/// of the test rather than a race with a store that answers at once.
async fn requeue_right_after_an_interrupt(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let ending = Arc::new(tokio::sync::Semaphore::new(0));
    let take = {
        let ending = ending.clone();
        move |term: Leadership| {
            let (tx, ending) = (tx.clone(), ending.clone());
            async move {
                let _ = tx.send((Seen::Took(0), term.clone()));
                term.cancelled().await;
                let _ = ending.acquire().await.map(|permit| permit.forget());
                let _ = tx.send((Seen::Cancelled(0), term));
            }
        }
    };
    let selector = LeaderSelector::new(&s, &h.path("/leader"), take)?.with_cancel_grace(WITHIN);
    selector.start()?;
    let (_, first) = next(&mut rx).await?;
    ensure!(selector.interrupt_leadership());
    ensure!(selector.requeue()?, "requeue right after the interrupt");
    ensure!(!selector.requeue()?, "a turn is pending already");
    ensure!(selector.has_leadership(), "the interrupted term is ending");
    ending.add_permits(1);
    ensure!(next(&mut rx).await?.0 == Seen::Cancelled(0));
    let (seen, second) = next(&mut rx).await?;
    ensure!(seen == Seen::Took(0) && second.epoch() > first.epoch());
    // Without auto-requeue and without a requeue, a term ends for good.
    ending.add_permits(1);
    ensure!(selector.interrupt_leadership());
    ensure!(next(&mut rx).await?.0 == Seen::Cancelled(0));
    await_leading(&selector, false).await?;
    let more = timeout(QUIET, rx.recv()).await;
    ensure!(more.is_err(), "no turn without a requeue");
    ensure!(selector.requeue()?, "idle: requeue queues");
    ensure!(matches!(next(&mut rx).await?.0, Seen::Took(0)));
    ending.add_permits(1);
    selector.close().await?;
    Ok(())
}

/// Curator `testKillSessionThenCloseShouldElectNewLeader`: two selectors
/// on one session; the session expires, the leader's `take_leadership` is
/// cancelled; after requeueing exactly one leads, and closing it hands
/// leadership to the other.
async fn a_killed_session_then_close_elects_the_other(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/one/two/me");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let leading = Arc::new(AtomicUsize::new(0));
    let make = |tag: usize| {
        let (tx, leading) = (tx.clone(), leading.clone());
        LeaderSelector::new(&s, &path, move |term: Leadership| {
            let (tx, leading) = (tx.clone(), leading.clone());
            async move {
                leading.fetch_add(1, Ordering::SeqCst);
                let _ = tx.send((Seen::Took(tag), term.clone()));
                term.cancelled().await;
                leading.fetch_sub(1, Ordering::SeqCst);
                let _ = tx.send((Seen::Cancelled(tag), term));
            }
        })
        .map(|s| s.with_cancel_grace(WITHIN))
    };
    let selectors = [make(0)?, make(1)?];
    for sel in &selectors {
        sel.start()?;
    }
    let (Seen::Took(first), old) = next(&mut rx).await? else {
        bail!("took first")
    };
    s.faults().context("faults")?.expire().await?;
    // The leader is cancelled. The other one never left the queue: it
    // re-entered it in the new session by itself, and may lead already.
    let mut took = None;
    loop {
        match next(&mut rx).await? {
            (Seen::Cancelled(i), _) if i == first => break,
            (Seen::Took(i), term) if took.is_none() => took = Some((i, term)),
            other => bail!("unexpected {other:?}"),
        }
    }
    await_leading(&selectors[first], false).await?;
    ensure!(
        selectors[first].requeue()?,
        "the former leader requeues (CURATOR-671)"
    );
    let (second, term) = match took {
        Some(took) => took,
        None => match next(&mut rx).await? {
            (Seen::Took(i), term) => (i, term),
            other => bail!("unexpected {other:?}"),
        },
    };
    ensure!(term.session_id() != old.session_id() && term.epoch() > old.epoch());
    ensure!(leading.load(Ordering::SeqCst) == 1);
    ensure!(selectors.iter().filter(|s| s.has_leadership()).count() == 1);
    selectors[second].close().await?;
    let (Seen::Cancelled(closed), _) = next(&mut rx).await? else {
        bail!("closing cancels")
    };
    ensure!(closed == second);
    let (Seen::Took(third), _) = next(&mut rx).await? else {
        bail!("the other leads")
    };
    ensure!(third != second && leading.load(Ordering::SeqCst) == 1);
    selectors[third].close().await?;
    Ok(())
}

/// Curator `testClosing`: closing the follower leaves the leader leading;
/// closing the leader ends its leadership.
async fn closing_a_follower_leaves_the_leader(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/one/two/me");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let selectors = [
        LeaderSelector::new(&s, &path, lead_until_cancelled(0, tx.clone()))?,
        LeaderSelector::new(&s, &path, lead_until_cancelled(1, tx))?,
    ];
    for sel in &selectors {
        sel.start()?;
    }
    let (Seen::Took(leader), _) = next(&mut rx).await? else {
        bail!("a leader")
    };
    let follower = 1 - leader;
    await_children(&s, &path, 2, WITHIN).await?;
    ensure!(selectors[leader].has_leadership() && !selectors[follower].has_leadership());
    selectors[follower].close().await?;
    await_children(&s, &path, 1, WITHIN).await?;
    ensure!(selectors[leader].has_leadership() && !selectors[follower].has_leadership());
    selectors[leader].close().await?;
    ensure!(!selectors[leader].has_leadership());
    await_children(&s, &path, 0, WITHIN).await?;
    Ok(())
}

/// Curator `testRotatingLeadership`: five selectors whose `take_leadership`
/// returns at once; three rounds of start/requeue: in every round each one
/// leads exactly once (fairness).
async fn leadership_rotates_fairly(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/one/two/me");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut selectors = Vec::new();
    for i in 0..5 {
        let tx = tx.clone();
        selectors.push(LeaderSelector::new(&s, &path, move |_| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(i);
            }
        })?);
    }
    for round in 0..3 {
        for sel in &selectors {
            match round {
                0 => sel.start()?,
                _ => ensure!(sel.requeue()?, "requeued"),
            }
        }
        let mut led = HashSet::new();
        for _ in 0..selectors.len() {
            let i = timeout(WITHIN, rx.recv()).await?.context("a term")?;
            ensure!(led.insert(i), "round {round}: {i} led twice");
        }
        for sel in &selectors {
            await_leading(sel, false).await?;
        }
        await_children(&s, &path, 0, WITHIN).await?;
    }
    for sel in &selectors {
        sel.close().await?;
    }
    Ok(())
}

/// Curator `testId` and TestLeaderSelectorParticipants `testBasic`: ids
/// are listed by every candidate alike, in queue order, one leader.
async fn ids_are_listed_alike_by_all(h: &Harness) -> Result<()> {
    let path = h.path("/one/two/me");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut selectors = Vec::new();
    let observer = h.session().await;
    for i in 0..10 {
        let sel = LeaderSelector::new(
            &h.session().await,
            &path,
            lead_until_cancelled(i, tx.clone()),
        )?
        .with_id(if i == 0 {
            "A is A".to_string()
        } else {
            i.to_string()
        });
        sel.start()?;
        await_children(&observer, &path, i + 1, WITHIN).await?;
        selectors.push(sel);
    }
    let (Seen::Took(0), _) = next(&mut rx).await? else {
        bail!("the first leads")
    };
    let leader = selectors[5].leader().await?.context("a leader")?;
    ensure!(leader.id == "A is A" && leader.is_leader);
    let lists = futures::future::try_join_all(selectors.iter().map(|s| s.participants())).await?;
    ensure!(
        lists.iter().all(|l| *l == lists[0]),
        "everybody sees the same"
    );
    let ids: Vec<&str> = lists[0].iter().map(|p| p.id.as_str()).collect();
    ensure!(
        ids == ["A is A", "1", "2", "3", "4", "5", "6", "7", "8", "9"],
        "{ids:?}"
    );
    ensure!(lists[0].iter().filter(|p| p.is_leader).count() == 1 && lists[0][0].is_leader);
    for sel in &selectors {
        sel.close().await?;
    }
    Ok(())
}

/// Curator `testErrorPolicies` (selector): `Standard` cancels the leader
/// when the connection is suspended, before the session is lost;
/// `Session` only when it is lost.
async fn error_policies_decide_when_the_leader_is_cancelled(h: &Harness) -> Result<()> {
    for policy in [ErrorPolicy::Standard, ErrorPolicy::Session] {
        let options = |sel: LeaderSelector| sel.with_error_policy(policy).with_cancel_grace(WITHIN);
        let (_s, selector, mut rx) = reporting_selector(h, &h.path("/test"), options).await?;
        selector.start()?;
        let (Seen::Took(0), _) = next(&mut rx).await? else {
            bail!("leads")
        };
        let term_ended = async {
            ensure!(next(&mut rx).await?.0 == Seen::Cancelled(0));
            Ok(())
        };
        the_policy_ends_the_term(&selector, policy, h.timeout(), WITHIN, term_ended).await?;
    }
    Ok(())
}

/// Curator `testLeaderNodeDeleteOnInterrupt`: a leader interrupted while the
/// connection is down releases its node once the connection is back.
async fn an_interrupt_during_an_outage_still_releases(h: &Harness) -> Result<()> {
    let path = h.path("/leader");
    let session_policy = |sel: LeaderSelector| sel.with_error_policy(ErrorPolicy::Session);
    let (s, selector, mut rx) = reporting_selector(h, &path, session_policy).await?;
    selector.start()?;
    let (_, term) = next(&mut rx).await?;
    s.faults().context("faults")?.suspend(h.timeout() / 2);
    await_state(&s, SessionState::Suspended, WITHIN).await?;
    ensure!(selector.interrupt_leadership());
    await_leading(&selector, false).await?;
    await_state(&s, SessionState::Reconnected, WITHIN).await?;
    s.background_idle().await;
    await_children(&s, &path, 0, WITHIN).await?;
    ensure!(term.is_cancelled());
    selector.close().await?;
    Ok(())
}

/// A leader whose session expires unnoticed (cut off, and keeping its lead
/// through suspensions) is cancelled when the loss shows; another candidate
/// leads within the session timeout plus a second, with a larger epoch, and
/// the old term's fenced writes are refused.
async fn a_silent_leader_is_replaced_within_the_timeout(h: &Harness) -> Result<()> {
    let path = h.path("/one/two/me");
    let (s0, s1) = (h.session().await, h.session().await);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let first = LeaderSelector::new(&s0, &path, lead_until_cancelled(0, tx.clone()))?
        .with_error_policy(ErrorPolicy::Session);
    let second = LeaderSelector::new(&s1, &path, lead_until_cancelled(1, tx))?;
    a_silent_leader_is_replaced(&first, &second, h.timeout(), WITHIN).await?;
    ensure!(next(&mut rx).await?.0 == Seen::Took(0), "first leads");
    Ok(())
}

/// The grace: a cancelled `take_leadership` may finish its cleanup; one that
/// ignores the cancellation is dropped when the grace is over — and either
/// way the lock goes only afterwards.
async fn the_grace_bounds_a_cancelled_leader(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/leader");
    let calls = Calls::default();
    let ignores_cancellation = counted(&calls, |_| std::future::pending::<()>());
    let stubborn = LeaderSelector::new(&s, &path, ignores_cancellation)?
        .with_cancel_grace(Duration::from_millis(100));
    stubborn.start()?;
    await_leading(&stubborn, true).await?;
    let started = Instant::now();
    stubborn.close().await?;
    ensure!(
        started.elapsed() >= Duration::from_millis(100),
        "the grace was given"
    );
    ensure!(
        calls.ended.load(Ordering::SeqCst) == 0,
        "dropped, not finished"
    );
    await_children(&s, &path, 0, WITHIN).await?;
    Ok(())
}

/// A panicking `take_leadership` gives leadership up like one that returns.
async fn a_panicking_leader_gives_up(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/leader");
    let calls = Calls::default();
    let panics_first = counted(&calls, |before| async move {
        if before == 0 {
            panic!("take_leadership failed");
        }
    });
    let selector = LeaderSelector::new(&s, &path, panics_first)?.with_auto_requeue();
    selector.start()?;
    timeout(WITHIN, async {
        while calls.began.load(Ordering::SeqCst) < 2 {
            selector.watch_leadership().changed().await.ok();
        }
    })
    .await?;
    selector.close().await?;
    ensure!(matches!(selector.requeue(), Err(Error::Closed)));

    // A panic before the future is even made (in the closure itself) ends
    // the term alike: the task stayed dead, "leading" for good, before.
    let calls = Calls::default();
    let panics_at_once = counted(&calls, |before| {
        assert!(before > 0, "take_leadership failed before its future");
        std::future::ready(())
    });
    let selector = LeaderSelector::new(&s, &h.path("/sync-panic"), panics_at_once)?;
    let selector = selector.with_auto_requeue();
    selector.start()?;
    timeout(WITHIN, async {
        while calls.began.load(Ordering::SeqCst) < 2 {
            selector.watch_leadership().changed().await.ok();
        }
    })
    .await
    .context("led again after the panic")?;
    selector.close().await?;
    Ok(())
}

// Every case on every backend.
per_backend!(every_backend {
    a_leader_whose_node_is_deleted_is_cancelled,
    a_finished_term_guards_no_more_writes,
    layout_is_a_mutex_with_the_id,
    an_interrupted_leader_stops_and_releases,
    auto_requeue_leads_again,
    interrupts_do_not_break_auto_requeue,
    requeue_right_after_an_interrupt,
    a_killed_session_then_close_elects_the_other,
    closing_a_follower_leaves_the_leader,
    leadership_rotates_fairly,
    ids_are_listed_alike_by_all,
    error_policies_decide_when_the_leader_is_cancelled,
    an_interrupt_during_an_outage_still_releases,
    a_silent_leader_is_replaced_within_the_timeout,
    the_grace_bounds_a_cancelled_leader,
    a_panicking_leader_gives_up,
});
