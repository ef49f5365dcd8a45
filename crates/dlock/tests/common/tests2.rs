//! Scenarios several test files ran each in their own words, written once.

use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use dlock::recipes::election::Candidate;
use dlock::recipes::leader_latch::{LeaderLatch, Leadership};
use dlock::recipes::leader_selector::LeaderSelector;
use dlock::store::{CreateOptions, Created, Faults, Stat, Watch};
use dlock::{ErrorPolicy, Hold, Session, SessionState};
use futures::stream::BoxStream;
use futures::StreamExt;
use tokio::task::JoinHandle;

use super::{await_children, await_state, ended_as_the_policy_says, ephemeral, persistent};

/// `result` is exactly the error `want` (the same kind, naming the same
/// node), not a success and not another error.
pub fn failed_with<T: Debug>(result: dlock::Result<T>, want: dlock::Error) -> Result<()> {
    match result {
        Ok(got) => bail!("expected {want}, got Ok({got:?})"),
        Err(err) => {
            ensure!(err == want, "expected {want}, got {err}");
            Ok(())
        }
    }
}

/// The next item of `events` within `within`; an ended stream is an error.
pub async fn next_within<T>(events: &mut BoxStream<'static, T>, within: Duration) -> Result<T> {
    tokio::time::timeout(within, events.next())
        .await
        .with_context(|| format!("nothing within {within:?}"))?
        .context("the stream ended")
}

/// The error for a missing node at `path`.
pub fn no_node(path: impl Into<String>) -> dlock::Error {
    dlock::Error::NoNode { path: path.into() }
}

/// The error for a node at `path` whose ACL refuses the session.
pub fn no_auth(path: impl Into<String>) -> dlock::Error {
    dlock::Error::NoAuth { path: path.into() }
}

/// Two sessions create `n` nodes in turn (`path_of(i)`, with `options`):
/// each node's czxid is above the one before, its fencing token is that
/// czxid, and a read of its stat agrees. Returns the nodes.
pub async fn tokens_grow_across_sessions(
    sessions: [&Session; 2],
    n: usize,
    path_of: impl Fn(usize) -> String,
    options: CreateOptions,
) -> Result<Vec<Created>> {
    let mut created: Vec<Created> = Vec::new();
    for i in 0..n {
        let s = sessions[i % 2];
        let c = s.create(&path_of(i), b"", options).await?;
        let last = created.last().map_or(0, |l| l.stat.czxid);
        ensure!(c.stat.czxid > last, "czxid {} after {last}", c.stat.czxid);
        ensure!(c.token().0 == c.stat.czxid);
        let (_, stat) = s.get_data(&c.path).await?;
        ensure!(stat.czxid == c.stat.czxid, "stat agrees with create");
        created.push(c);
    }
    Ok(created)
}

/// A node at `p` guards writes by version: created at version 0, set at
/// version 0 (now 1, a later mzxid), then a set and a delete at a stale
/// version are refused with `BadVersion` naming `p`. Returns the node as
/// created and its stat after the set.
pub async fn versions_guard_writes_at(s: &Session, p: &str) -> Result<(Created, Stat)> {
    let created = s.create(p, b"a", persistent()).await?;
    ensure!(created.stat.version == 0);
    let st = s.set_data(p, b"b", Some(0)).await?;
    ensure!(st.version == 1 && st.mzxid > created.stat.mzxid);
    let bad_version = dlock::Error::BadVersion { path: p.into() };
    failed_with(s.set_data(p, b"c", Some(0)).await, bad_version.clone())?;
    failed_with(s.delete(p, Some(7)).await, bad_version)?;
    Ok((created, st))
}

/// How a watcher watches a node: `exists_watch` or `get_data_watch`.
#[derive(Clone, Copy)]
pub enum WatchBy {
    Exists,
    Data,
}

/// `owner` creates an ephemeral node at `path` (with parents) and
/// `watcher` (the owner itself or another session) then watches it.
pub async fn watched_ephemeral(
    owner: &Session,
    watcher: &Session,
    path: &str,
    by: WatchBy,
) -> Result<(Created, Watch)> {
    let node = owner.create(path, b"", ephemeral()).await?;
    ensure!(node.stat.ephemeral_owner == owner.session_id());
    let watch = match by {
        WatchBy::Exists => watcher.exists_watch(&node.path).await?.1,
        WatchBy::Data => watcher.get_data_watch(&node.path).await?.2,
    };
    Ok((node, watch))
}

/// The holders let go in order (`held`); then each waiter in turn gets
/// its hold (the task ends with it) and lets go too.
pub async fn release_then_waiters<H: Hold + 'static>(
    held: Vec<Box<dyn Hold>>,
    waiting: Vec<JoinHandle<dlock::Result<H>>>,
) -> Result<()> {
    for hold in held {
        hold.release().await?;
    }
    for waiter in waiting {
        Box::new(waiter.await??).release().await?;
    }
    Ok(())
}

/// `waiting` still waits (else `early`, an error); once `let_go` is done,
/// it gets in within `within`. Returns what it got.
pub async fn gets_in_after<H, E>(
    waiting: JoinHandle<dlock::Result<H>>,
    let_go: impl std::future::Future<Output = std::result::Result<(), E>>,
    early: &str,
    within: Duration,
) -> Result<H>
where
    anyhow::Error: From<E>,
{
    ensure!(!waiting.is_finished(), "{early}");
    let_go.await?;
    Ok(tokio::time::timeout(within, waiting).await???)
}

/// What the election scenarios do to a `LeaderLatch` or a
/// `LeaderSelector` besides what their common [`Candidate`] offers: start
/// and close it.
pub trait Elector: std::ops::Deref<Target = Candidate> {
    fn start(&self) -> dlock::Result<()>;
    fn close(&self) -> impl std::future::Future<Output = dlock::Result<()>>;
}

impl Elector for LeaderLatch {
    fn start(&self) -> dlock::Result<()> {
        LeaderLatch::start(self)
    }
    fn close(&self) -> impl std::future::Future<Output = dlock::Result<()>> {
        LeaderLatch::close(self)
    }
}

impl Elector for LeaderSelector {
    fn start(&self) -> dlock::Result<()> {
        LeaderSelector::start(self)
    }
    fn close(&self) -> impl std::future::Future<Output = dlock::Result<()>> {
        LeaderSelector::close(self)
    }
}

/// The term `candidate` leads in, once it leads (within `within`).
pub async fn leading(candidate: &Candidate, within: Duration) -> Result<Leadership> {
    let mut leadership = candidate.watch_leadership();
    let term = tokio::time::timeout(within, leadership.wait_for(Option::is_some))
        .await
        .context("no leadership in time")??
        .clone();
    term.context("a term")
}

/// A leader that goes silent is replaced within the session timeout:
/// `first` (under [`ErrorPolicy::Session`], so it keeps leading through
/// suspensions) leads and `second` queues behind it; then `first`'s
/// session is cut off for three timeouts (`timeout`). `second` leads
/// within the timeout plus a second, yet not before the first's session
/// could expire (its last heartbeat was at most a third of the timeout
/// before the cut), with a larger epoch; the old term learns it lost and
/// its fenced writes are refused, the new term's pass. Both are closed.
pub async fn a_silent_leader_is_replaced<E: Elector>(
    first: &E,
    second: &E,
    timeout: Duration,
    within: Duration,
) -> Result<()> {
    first.start()?;
    let old = leading(first, within).await?;
    second.start()?;
    await_children(second.session(), second.path(), 2, within).await?;
    let started = tokio::time::Instant::now();
    first
        .session()
        .faults()
        .context("faults")?
        .suspend(timeout * 3);
    let new = leading(second, within).await?;
    let took = started.elapsed();
    ensure!(
        took >= timeout / 3,
        "not before the session could expire: {took:?}"
    );
    ensure!(took <= timeout + Duration::from_secs(1), "took {took:?}");
    tokio::time::timeout(within, old.cancelled())
        .await
        .context("the old leader learns it lost")?;
    ensure!(new.epoch() > old.epoch());
    let err = old.guarded(&[]).await.unwrap_err();
    ensure!(matches!(err, dlock::Error::Lost { .. }), "{err}");
    new.guarded(&[]).await?;
    second.close().await?;
    first.close().await?;
    Ok(())
}

/// Curator's `testErrorPolicies`, once `leader` leads under `policy`: its
/// session is suspended for twice its timeout (`timeout`); once suspended,
/// the candidate's own word that its term ended (`term_ended`) comes, when
/// the policy says it does ([`ended_as_the_policy_says`]). Then it is
/// closed.
pub async fn the_policy_ends_the_term<E: Elector>(
    leader: &E,
    policy: ErrorPolicy,
    timeout: Duration,
    within: Duration,
    term_ended: impl std::future::Future<Output = Result<()>>,
) -> Result<()> {
    let s = leader.session();
    let id = s.session_id();
    s.faults().context("faults")?.suspend(timeout * 2);
    await_state(s, SessionState::Suspended, within).await?;
    term_ended.await?;
    ended_as_the_policy_says(s, id, policy, within).await?;
    leader.close().await?;
    Ok(())
}

/// `name` is a Curator "protected" node name: `_c_<uuid>-<kind><10
/// digits>`, `kind` being the recipe's ("lock-", "latch-").
pub fn curators_protected_name(name: &str, kind: &str) -> Result<()> {
    ensure!(name.len() == 40 + kind.len() + 10, "{name}");
    ensure!(
        name.starts_with("_c_") && name.as_bytes()[39] == b'-',
        "{name}"
    );
    uuid::Uuid::parse_str(&name[3..39])?;
    let sequence = &name[40 + kind.len()..];
    ensure!(
        name[40..].starts_with(kind) && sequence.bytes().all(|b| b.is_ascii_digit()),
        "{name}"
    );
    Ok(())
}

/// `make` refuses each of the `bad` paths with `InvalidPath`.
pub fn bad_paths_refused<T: Debug>(
    bad: &[&str],
    make: impl Fn(&str) -> dlock::Result<T>,
) -> Result<()> {
    for bad in bad {
        let err = make(bad).unwrap_err();
        ensure!(
            matches!(err, dlock::Error::InvalidPath { .. }),
            "{bad:?}: {err}"
        );
    }
    Ok(())
}

/// A turn in a section that must be exclusive: nobody else is `inside`
/// (else `what`), for one yield to the scheduler.
pub async fn alone_inside(inside: &AtomicBool, what: &str) -> Result<()> {
    ensure!(!inside.swap(true, Ordering::SeqCst), "{what}");
    tokio::task::yield_now().await;
    inside.store(false, Ordering::SeqCst);
    Ok(())
}

/// Every task ended well.
pub async fn all_ended_well<T>(tasks: Vec<JoinHandle<Result<T>>>) -> Result<()> {
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// A reply lost on its way back (`lose` arms the store's hook for the next
/// one): `op` fails with `ConnectionLoss`, and the session's status
/// blipped `Suspended` → `Reconnected`, the same session. Whether the
/// server applied `op` anyway is the caller's to check.
pub async fn a_lost_reply<T: Debug>(
    s: &Session,
    lose: impl FnOnce(&dyn Faults),
    op: impl std::future::Future<Output = dlock::Result<T>>,
) -> Result<()> {
    let before = s.status();
    lose(s.faults().context("faults")?);
    failed_with(op.await, dlock::Error::ConnectionLoss)?;
    let after = s.status();
    ensure!(
        after.session_id == before.session_id
            && after.state == SessionState::Reconnected
            && after.changes == before.changes + 2,
        "a blip in the same session: {before:?} -> {after:?}"
    );
    Ok(())
}
