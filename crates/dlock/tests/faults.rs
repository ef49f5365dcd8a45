//! Faults on real ZooKeeper, etcd and Consul servers: a cluster losing its
//! leader (kill -9) while clients contend on a fenced mutex, a semaphore and
//! a leader selector; connections cut within and past the session; a paused
//! holder with and without fencing.
//!
//! Each scenario is written once, over a [`Backend`], and runs on each:
//! `zookeeper::<scenario>`, `etcd::<scenario>` and `consul::<scenario>`.
//! Histories are checked afterwards (see `dlock_testkit::history`). Every
//! test ends with nothing left under its root (a listing, see [`finish`])
//! and its sessions closed.
//!
//! Timing bounds come from the session's own timeout
//! ([`Session::session_timeout`], what the server granted) and from how long
//! the server may keep a silent session ([`Backend::keeps_silent_session`]):
//! Consul's session TTL is at least 10 s and Consul may keep a session up
//! to twice its TTL, so the expiry scenarios take about 20 s there.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use dlock::store::{CreateMode, CreateOptions, Op, SessionState};
use dlock::{
    Error, LeaderSelector, LockGuard, Mutex, RetryPolicy, Semaphore, Session, SessionOptions,
};
use dlock_testkit::history::{check_fenced_log, Event, History};
use dlock_testkit::{ConsulCluster, EtcdCluster, TcpProxy, ZkEnsemble};
use tokio::sync::watch;

/// A session timeout the faults of the contention and short-cut scenarios
/// do not outlast: sessions ride them out.
const LONG: Duration = Duration::from_secs(6);
/// The session timeout of the expiry scenarios: ZooKeeper grants at least
/// 2 ticks (1 s with the testkit's tickTime), etcd 3.4 at least 2 s, Consul
/// at least 10 s (its minimum session TTL).
const SHORT: Duration = Duration::from_secs(2);
/// How long a scenario waits for an effect (progress, a state change)
/// before it fails.
const WITHIN: Duration = Duration::from_secs(60);

/// The store a scenario runs on.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(
    not(all(feature = "zookeeper", feature = "etcd", feature = "consul")),
    allow(dead_code)
)]
enum Backend {
    ZooKeeper,
    Etcd,
    Consul,
}

impl Backend {
    /// The endpoint URL of `hosts` (`host:port[,host:port...]`).
    fn url(self, hosts: &str) -> String {
        match self {
            Backend::ZooKeeper => format!("zk://{hosts}"),
            Backend::Etcd => format!("etcd://{hosts}"),
            Backend::Consul => format!("consul://{hosts}"),
        }
    }

    /// The test binary's shared single server, `host:port`.
    fn shared(self) -> String {
        match self {
            Backend::ZooKeeper => dlock_testkit::shared_zk().connect_string(),
            Backend::Etcd => dlock_testkit::shared_etcd().endpoint(),
            Backend::Consul => dlock_testkit::shared_consul().endpoint(),
        }
    }

    /// A fresh private 3-member cluster.
    fn start_cluster(self) -> Result<Cluster> {
        Ok(match self {
            Backend::ZooKeeper => Cluster::ZooKeeper(ZkEnsemble::start(3)?),
            Backend::Etcd => Cluster::Etcd(EtcdCluster::start(3)?),
            Backend::Consul => Cluster::Consul(ConsulCluster::start(3)?),
        })
    }

    /// How long the server may keep a session whose client went silent
    /// (no renewal, no keep-alive), for a session that was granted
    /// `timeout`: ZooKeeper and etcd expire it after the timeout; Consul
    /// only promises to invalidate it within twice its TTL.
    fn keeps_silent_session(self, timeout: Duration) -> Duration {
        match self {
            Backend::ZooKeeper | Backend::Etcd => timeout,
            Backend::Consul => timeout * 2,
        }
    }

    /// How long a waiter may take to get a lock whose holder went silent
    /// while holding a session granted `timeout`: the server's expiry
    /// ([`Self::keeps_silent_session`]), then as long again for the server's
    /// expiry timer, the delete and the waiter's watch to fire.
    fn hand_over_within(self, timeout: Duration) -> Duration {
        self.keeps_silent_session(timeout) + timeout.max(Duration::from_secs(2)) * 2
    }

    /// A new session to `hosts` with the session timeout `timeout`.
    async fn connect(self, hosts: &str, timeout: Duration) -> Result<Session> {
        self.connect_with(
            hosts,
            SessionOptions::default().with_session_timeout(timeout),
        )
        .await
    }

    async fn connect_with(self, hosts: &str, options: SessionOptions) -> Result<Session> {
        let url = self.url(hosts);
        dlock::connect_with(&url, options)
            .await
            .with_context(|| format!("connect to {url}"))
    }
}

/// A 3-member ZooKeeper ensemble, etcd cluster or Consul server cluster.
enum Cluster {
    ZooKeeper(ZkEnsemble),
    Etcd(EtcdCluster),
    Consul(ConsulCluster),
}

impl Cluster {
    /// Every member, `host:port,host:port,...`: clients know them all.
    fn hosts(&self) -> String {
        match self {
            Cluster::ZooKeeper(zk) => zk.connect_string(),
            Cluster::Etcd(etcd) => etcd.endpoints().join(","),
            Cluster::Consul(consul) => consul.connect_string(),
        }
    }

    /// Kills the current leader with `SIGKILL`; returns its index.
    fn kill_leader(&mut self) -> Result<usize> {
        let leader = match self {
            Cluster::ZooKeeper(zk) => zk.leader_index(),
            Cluster::Etcd(etcd) => etcd.leader_index(),
            Cluster::Consul(consul) => consul.leader_index(),
        }
        .context("the cluster has a leader")?;
        match self {
            Cluster::ZooKeeper(zk) => zk.kill(leader),
            Cluster::Etcd(etcd) => etcd.kill(leader),
            Cluster::Consul(consul) => consul.kill(leader),
        }
        Ok(leader)
    }

    /// Starts killed member `i` again (same data) and waits until every
    /// member serves and one leads.
    fn restart(&mut self, i: usize) -> Result<()> {
        match self {
            Cluster::ZooKeeper(zk) => {
                zk.restart(i)?;
                zk.wait_for_quorum(WITHIN)
            }
            Cluster::Etcd(etcd) => {
                etcd.restart(i)?;
                etcd.wait_for_quorum(WITHIN)
            }
            Cluster::Consul(consul) => {
                consul.restart(i)?;
                consul.wait_for_quorum(WITHIN)
            }
        }
    }
}

fn root() -> String {
    format!("/faults-{}", uuid::Uuid::new_v4().simple())
}

fn persistent() -> CreateOptions {
    CreateOptions::new(CreateMode::Persistent).with_parents()
}

/// Ends a test: waits until the background work of every session (releases
/// of dropped guards, deletes after a reconnection) has settled, lists the
/// tree under `root` and fails if any node holds data or belongs to a
/// session (an ephemeral node), removes the empty skeleton (ZooKeeper's
/// containers; etcd has none), checks that `root` is gone, and closes every
/// session, `checker` last.
/// Every node below `path`, with its owner and token: what a failed
/// scenario leaves behind, for its error message.
async fn describe_tree(session: &Session, path: &str) -> String {
    let mut out = String::new();
    let mut pending = vec![path.to_string()];
    while let Some(node) = pending.pop() {
        match session.exists(&node).await {
            Ok(Some(stat)) => out.push_str(&format!(
                "  {node} owner={:?} token={:?}\n",
                stat.ephemeral_owner,
                stat.token()
            )),
            Ok(None) => out.push_str(&format!("  {node} (no node)\n")),
            Err(e) => out.push_str(&format!("  {node} unreadable: {e}\n")),
        }
        if let Ok(children) = session.children(&node).await {
            pending.extend(children.into_iter().map(|c| format!("{node}/{}", c.name)));
        }
    }
    out
}

async fn finish(root: &str, checker: &Session, sessions: &[&Session]) -> Result<()> {
    for s in sessions.iter().chain([&checker]) {
        tokio::time::timeout(WITHIN, s.background_idle())
            .await
            .context("background work settles")?;
    }
    let mut listing = Vec::new();
    let mut stack = vec![root.to_string()];
    while let Some(path) = stack.pop() {
        let (data, stat) = match checker.get_data(&path).await {
            Ok(read) => read,
            Err(Error::NoNode { .. }) => continue,
            Err(e) => return Err(e).context(path),
        };
        match checker.children(&path).await {
            Ok(children) => {
                stack.extend(children.into_iter().map(|c| format!("{path}/{}", c.name)))
            }
            Err(Error::NoNode { .. }) => {}
            Err(e) => return Err(e).context(path),
        }
        listing.push((path, data.len(), stat.ephemeral_owner));
    }
    let left: Vec<String> = listing
        .iter()
        .filter(|(_, bytes, owner)| *bytes > 0 || *owner != 0)
        .map(|(path, bytes, owner)| format!("{path} (owner {owner:#x}, {bytes} bytes)"))
        .collect();
    ensure!(left.is_empty(), "left behind under {root}: {left:#?}");
    for (path, _, _) in listing.iter().rev() {
        if let Err(e) = remove(checker, path, true).await {
            // Something appeared after the listing: say what, and whose.
            let mut now = Vec::new();
            for c in checker.children(path).await.unwrap_or_default() {
                let child = format!("{path}/{}", c.name);
                let stat = checker.exists(&child).await.ok().flatten();
                now.push(format!(
                    "{child}: {:?}",
                    stat.map(|s| (s.ephemeral_owner, s.czxid))
                ));
            }
            let ours: Vec<String> = sessions
                .iter()
                .chain([&checker])
                .map(|s| format!("{:#x}", s.session_id()))
                .collect();
            return Err(e.context(format!(
                "after a clean listing {listing:?}, {path} has (owner, czxid) {now:#?}; \
                 the test's sessions are {ours:?}"
            )));
        }
    }
    ensure!(
        checker.exists(root).await?.is_none(),
        "{root} still exists after removing its empty skeleton"
    );
    for s in sessions {
        s.close().await;
    }
    checker.close().await;
    Ok(())
}

/// Deletes `path`, again after a lost connection (a write the session does
/// not retry itself); a retry that finds it gone is done, and so is a first
/// try if `may_be_gone` (an empty container the server may reap first).
async fn remove(session: &Session, path: &str, may_be_gone: bool) -> Result<()> {
    let mut retried = false;
    loop {
        match session.delete(path, None).await {
            Ok(()) => return Ok(()),
            Err(Error::NoNode { .. }) if retried || may_be_gone => return Ok(()),
            Err(e) if e.is_retryable() => retried = true,
            Err(e) => return Err(e).with_context(|| format!("delete {path}")),
        }
    }
}

/// Waits until `progress` has counted at least `n`.
async fn reach(progress: &mut watch::Receiver<usize>, n: usize) -> Result<()> {
    let reached = tokio::time::timeout(WITHIN, async {
        progress.wait_for(|&done| done >= n).await.map(|_| ())
    })
    .await;
    match reached {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => bail!("every worker stopped before {n} were done"),
        Err(_) => bail!("only {} of {n} done within {WITHIN:?}", *progress.borrow()),
    }
}

/// Lets `n` units of work complete, kills the cluster's leader (-9), then
/// waits for `n` more: progress resumes under the new leader. With more
/// than one round, the killed member is restarted (and the cluster back to
/// full strength) before the next round kills the leader again. Returns how
/// many were done when the last leader died.
///
/// Scenarios connect every session (the checker too) before the fault: the
/// scenarios are about sessions living through it. (On etcd, a *new*
/// session's first requests may go to the dead member and fail at once;
/// the lease grant is tried again, on the next member.)
async fn kill_the_leader_midway(
    cluster: &mut Cluster,
    progress: &mut watch::Receiver<usize>,
    n: usize,
    rounds: usize,
) -> Result<usize> {
    let mut before = 0;
    for round in 1..=rounds {
        let start = *progress.borrow();
        reach(progress, start + n)
            .await
            .with_context(|| format!("round {round}: no progress before the fault"))?;
        let leader = tokio::task::block_in_place(|| cluster.kill_leader())?;
        before = *progress.borrow();
        reach(progress, before + n).await.with_context(|| {
            format!("round {round}: no progress after member {leader}, the leader, was killed")
        })?;
        if round < rounds {
            tokio::task::block_in_place(|| cluster.restart(leader))
                .with_context(|| format!("round {round}: restart member {leader}"))?;
        }
    }
    Ok(before)
}

/// A contention run on a fresh 3-member cluster: an admin session, the
/// test's root, the clients' sessions (all knowing every member), and the
/// count of completed sections (`progress`, watched by `sections`).
struct ClusterRun {
    backend: Backend,
    cluster: Cluster,
    admin: Session,
    root: String,
    sessions: Vec<Session>,
    progress: Arc<watch::Sender<usize>>,
    sections: watch::Receiver<usize>,
}

impl ClusterRun {
    async fn start(backend: Backend) -> Result<Self> {
        let cluster = backend.start_cluster()?;
        let admin = backend.connect(&cluster.hosts(), LONG).await?;
        let (progress, sections) = watch::channel(0usize);
        Ok(ClusterRun {
            backend,
            cluster,
            admin,
            root: root(),
            sessions: Vec::new(),
            progress: Arc::new(progress),
            sections,
        })
    }

    /// A new client's session, checked and closed by [`Self::finish`].
    async fn client(&mut self) -> Result<Session> {
        let session = self.backend.connect(&self.cluster.hosts(), LONG).await?;
        self.sessions.push(session.clone());
        Ok(session)
    }

    /// [`kill_the_leader_midway`] of this run's cluster.
    async fn kill_the_leader_midway(&mut self, n: usize, rounds: usize) -> Result<usize> {
        kill_the_leader_midway(&mut self.cluster, &mut self.sections, n, rounds).await
    }

    /// [`finish`] with the admin session checking.
    async fn finish(self) -> Result<()> {
        finish(
            &self.root,
            &self.admin,
            &self.sessions.iter().collect::<Vec<_>>(),
        )
        .await
    }
}

/// A client behind a proxy the test can cut, and another connected
/// directly, both with the session timeout `timeout`; and a fresh root.
async fn one_behind_a_proxy(
    backend: Backend,
    timeout: Duration,
) -> Result<(TcpProxy, Session, Session, String)> {
    let proxy = TcpProxy::start(&backend.shared())?;
    let behind = backend.connect(&proxy.address(), timeout).await?;
    let direct = backend.connect(&backend.shared(), timeout).await?;
    Ok((proxy, behind, direct, root()))
}

/// Runs `attempt` again while it fails with a retryable error (a lost
/// connection); `Ok(None)` if it reports `Lost` (we no longer hold what it
/// is guarded by).
async fn retrying<T, F, Fut>(mut attempt: F) -> Result<Option<T>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = dlock::Result<T>>,
{
    loop {
        match attempt().await {
            Ok(done) => return Ok(Some(done)),
            Err(Error::Lost { .. }) => return Ok(None),
            Err(e) if e.is_retryable() => continue,
            Err(e) => return Err(e.into()),
        }
    }
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
            // The session ended under us (a failover slower than its
            // timeout, or a request that found it moved): so did the hold.
            Err(e) if e.is_session_lost() => return Ok(false),
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

fn parse_number(data: &[u8]) -> Result<i64> {
    Ok(std::str::from_utf8(data)?.parse()?)
}

/// Clients know every member of a 3-member cluster and contend for a fenced
/// mutex; the cluster's leader is killed (-9) mid-run. No two sections
/// interleave, tokens only grow, and sections keep completing after a new
/// leader is elected.
async fn the_ensemble_leader_dies_during_contention(backend: Backend, rounds: usize) -> Result<()> {
    let mut run = ClusterRun::start(backend).await?;
    let root = &run.root;
    let (lock, resource) = (format!("{root}/lock"), format!("{root}/resource"));
    run.admin.create(&resource, b"", persistent()).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let session = run.client().await?;
        let mutex = Mutex::new(&session, &lock)?;
        let (resource, progress, stop) = (resource.clone(), run.progress.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let guard = match mutex.acquire().await {
                    Ok(g) => g,
                    Err(e) if e.is_retryable() => continue,
                    Err(e) => return Err(anyhow::Error::from(e).context("acquire")),
                };
                if fenced_append(&session, &guard, &resource, true).await?
                    && fenced_append(&session, &guard, &resource, false).await?
                {
                    progress.send_modify(|n| *n += 1);
                }
                match guard.release().await {
                    Ok(()) | Err(Error::Lost { .. }) => {}
                    // Still unanswered after the session's retries: the node
                    // goes in the background (`finish` waits for that).
                    Err(e) if e.is_retryable() => {}
                    Err(e) => return Err(anyhow::Error::from(e).context("release")),
                }
            }
            anyhow::Ok(())
        }));
    }
    let before = run.kill_the_leader_midway(20, rounds).await?;
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await??;
    }
    let (data, _) = run.admin.get_data(&resource).await?;
    let checked = check_fenced_log(&parse_log(&data)).map_err(anyhow::Error::msg)?;
    ensure!(checked >= before + 20, "{checked} sections in the log");
    remove(&run.admin, &resource, false).await?;
    run.finish().await
}

/// Four clients contend on a semaphore of 2 leases on a 3-member cluster;
/// the leader is killed (-9) mid-run. Each client records entering and
/// leaving its section; inside, it makes round trips guarded by its lease
/// (each succeeds only while the lease exists) until it sees a second
/// holder inside, at most 10. Never more than two are inside at once, both
/// leases are used, and sections keep completing after the fault.
async fn a_semaphore_keeps_its_limit_when_the_leader_dies(
    backend: Backend,
    rounds: usize,
) -> Result<()> {
    let mut run = ClusterRun::start(backend).await?;
    let path = format!("{}/semaphore", run.root);
    let history = Arc::new(History::new());
    let stop = Arc::new(AtomicBool::new(false));
    let inside = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for client in 0..4 {
        let session = run.client().await?;
        let semaphore = Semaphore::new(&session, &path, 2)?;
        let (history, stop, inside) = (history.clone(), stop.clone(), inside.clone());
        let progress = run.progress.clone();
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                history.record(client, Event::Invoke("acquire"));
                let lease = match semaphore.acquire_one().await {
                    Ok(lease) => lease,
                    Err(e) if e.is_retryable() => {
                        history.record(client, Event::Fail("acquire", e.to_string()));
                        continue;
                    }
                    Err(e) => return Err(anyhow::Error::from(e).context("acquire")),
                };
                let token = lease.token().0;
                history.record(client, Event::Ok("acquire", token));
                history.record(client, Event::Enter(token));
                inside.fetch_add(1, Ordering::SeqCst);
                let mut held = true;
                for _ in 0..10 {
                    if retrying(|| lease.guarded(&[])).await?.is_none() {
                        held = false;
                        break;
                    }
                    if inside.load(Ordering::SeqCst) >= 2 {
                        break;
                    }
                }
                inside.fetch_sub(1, Ordering::SeqCst);
                history.record(client, Event::Exit(token));
                if held {
                    progress.send_modify(|n| *n += 1);
                } else {
                    history.record(client, Event::Fail("section", "lease lost".into()));
                }
                match lease.release().await {
                    Ok(()) | Err(Error::Lost { .. }) => {}
                    // Still unanswered after the session's retries: the node
                    // goes in the background (`finish` waits for that).
                    Err(e) if e.is_retryable() => {}
                    Err(e) => return Err(anyhow::Error::from(e).context("release")),
                }
            }
            anyhow::Ok(())
        }));
    }
    let before = match run.kill_the_leader_midway(30, rounds).await {
        Ok(before) => before,
        Err(e) => {
            let tail = history.entries();
            let tail = &tail[tail.len().saturating_sub(24)..];
            let tree = describe_tree(&run.admin, &path).await;
            let states: Vec<_> = run
                .sessions
                .iter()
                .map(|s| format!("{:?}", s.status()))
                .collect();
            return Err(e.context(format!(
                "sessions: {states:?}\nnodes:\n{tree}\nlast events:\n{}",
                tail.iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("\n")
            )));
        }
    };
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await??;
    }
    let most = history.check_at_most(2).map_err(anyhow::Error::msg)?;
    ensure!(
        most == 2,
        "at most {most} inside at once: the limit was never used"
    );
    let done = *run.sections.borrow();
    ensure!(done >= before + 30, "{done} sections");
    run.finish().await
}

/// Records the end of a leadership term when dropped: when
/// `take_leadership` returns, or when the selector drops it (a cancelled
/// term), which it does before releasing leadership.
struct TermEnds {
    history: Arc<History>,
    client: usize,
    epoch: i64,
}

impl Drop for TermEnds {
    fn drop(&mut self) {
        self.history.record(self.client, Event::Exit(self.epoch));
    }
}

/// Three leader selectors (auto-requeue: they take turns) on a 3-member
/// cluster; the leader is killed (-9) mid-run. Each term records its start
/// and end and makes one write guarded by its leadership: there is never
/// more than one leader, epochs only grow from term to term, and terms keep
/// completing after the fault.
async fn one_leader_at_a_time_when_the_leader_dies(backend: Backend, rounds: usize) -> Result<()> {
    let mut run = ClusterRun::start(backend).await?;
    let path = format!("{}/election", run.root);
    let history = Arc::new(History::new());
    let failures = Arc::new(StdMutex::new(Vec::<String>::new()));
    let mut selectors = Vec::new();
    for client in 0..3 {
        let session = run.client().await?;
        let (history, progress, failures) =
            (history.clone(), run.progress.clone(), failures.clone());
        let selector = LeaderSelector::new(&session, &path, move |term| {
            let (history, progress, failures) =
                (history.clone(), progress.clone(), failures.clone());
            async move {
                let epoch = term.epoch().0;
                history.record(client, Event::Enter(epoch));
                let _ends = TermEnds {
                    history: history.clone(),
                    client,
                    epoch,
                };
                match retrying(|| term.guarded(&[])).await {
                    Ok(Some(_)) => progress.send_modify(|n| *n += 1),
                    Ok(None) => history.record(client, Event::Fail("lead", "lost".into())),
                    Err(e) => failures
                        .lock()
                        .unwrap()
                        .push(format!("client {client}, epoch {epoch}: {e:#}")),
                }
            }
        })?
        .with_id(format!("client-{client}"))
        .with_auto_requeue();
        selector.start()?;
        selectors.push(selector);
    }
    // The run's sections are leadership terms here.
    let before = run.kill_the_leader_midway(20, rounds).await?;
    for s in &selectors {
        s.close().await?;
    }
    let failures = failures.lock().unwrap().clone();
    ensure!(
        failures.is_empty(),
        "a leader's write failed: {failures:#?}"
    );
    let checked = history.check_leaders().map_err(anyhow::Error::msg)?;
    ensure!(checked >= before + 20, "{checked} terms");
    run.finish().await
}

/// A connection cut shorter than the session: the holder is suspended,
/// reconnects to the same session (lease), and still holds the lock.
async fn a_short_cut_keeps_the_lock(backend: Backend) -> Result<()> {
    let (proxy, holder, observer, root) = one_behind_a_proxy(backend, LONG).await?;
    let lock = format!("{root}/lock");
    let guard = Mutex::new(&holder, &lock)?.acquire().await?;
    let session = holder.session_id();
    let mut status = holder.watch_status();
    proxy.cut();
    tokio::time::timeout(
        WITHIN,
        status.wait_for(|s| s.state == SessionState::Suspended),
    )
    .await
    .context("not suspended after the cut")??;
    ensure!(guard.is_suspended() && !guard.is_lost());
    proxy.restore();
    tokio::time::timeout(
        WITHIN,
        status.wait_for(|s| s.state != SessionState::Suspended),
    )
    .await
    .context("still suspended after the connection was restored")??;
    let now = holder.status();
    ensure!(
        now.state == SessionState::Reconnected && now.session_id == session,
        "reconnected to the same session {session:#x}: {now:?}"
    );
    ensure!(!guard.is_lost(), "still held");
    ensure!(
        observer.exists(guard.node()).await?.is_some(),
        "the lock node survived"
    );
    ensure!(
        Mutex::new(&observer, &lock)?.try_acquire().await?.is_none(),
        "nobody else can take the lock"
    );
    guard.release().await?;
    finish(&root, &observer, &[&holder]).await
}

/// A connection cut longer than the session: the server expires it, the
/// next client takes the lock, and the old holder learns it lost: its
/// guarded writes are rejected, so there is never a second accepted holder.
async fn a_long_cut_loses_the_lock_without_a_double_holder(backend: Backend) -> Result<()> {
    let (proxy, holder, other, root) = one_behind_a_proxy(backend, SHORT).await?;
    let (lock, resource) = (format!("{root}/lock"), format!("{root}/resource"));
    other.create(&resource, b"", persistent()).await?;
    let g1 = Mutex::new(&holder, &lock)?.acquire().await?;
    ensure!(fenced_append(&holder, &g1, &resource, true).await?);
    let m2 = Mutex::new(&other, &lock)?;
    let waiting = tokio::spawn(async move { m2.acquire().await });
    proxy.cut();
    let within = backend.hand_over_within(holder.session_timeout());
    let g2 = tokio::time::timeout(within, waiting)
        .await
        .context("the lock was not handed over after the holder's session ran out")???;
    ensure!(fenced_append(&other, &g2, &resource, true).await?);
    proxy.restore();
    tokio::time::timeout(WITHIN, g1.lost())
        .await
        .context("the old holder never learned it lost the lock")?;
    ensure!(
        !fenced_append(&holder, &g1, &resource, false).await?,
        "the old holder's write was rejected"
    );
    ensure!(fenced_append(&other, &g2, &resource, false).await?);
    let log = parse_log(&other.get_data(&resource).await?.0);
    ensure!(check_fenced_log(&log).map_err(anyhow::Error::msg)? == 2);
    let released = g1.release().await;
    ensure!(matches!(released, Err(Error::Lost { .. })), "{released:?}");
    g2.release().await?;
    other.delete(&resource, None).await?;
    finish(&root, &other, &[&holder]).await
}

/// The server out of reach past the session's timeout: the session is
/// lost, and the new one its next operation makes cannot be made either.
/// A timed acquire still ends with `Timeout`, and a non-blocking one with
/// `ConnectionLoss`, while the server is still out of reach (before, only
/// a suspended session cut a wait off at its deadline: a lost one held
/// it until the server was back). An untimed acquire made during the
/// outage succeeds once it ends, in the first new session: a session got
/// after trying for longer than its timeout is not given up at once (etcd
/// counted the lease from the first try, lost it and revoked it).
/// Nothing is left.
async fn timed_acquires_end_while_a_lost_session_cannot_reconnect(backend: Backend) -> Result<()> {
    let proxy = TcpProxy::start(&backend.shared())?;
    // Retries that outlast the rest of the outage (a session's timeout):
    // each try fails at once on the cut connection.
    let patient = RetryPolicy {
        max_retries: 100,
        ..RetryPolicy::default()
    };
    let options = SessionOptions::default()
        .with_session_timeout(SHORT)
        .with_retry(patient);
    let behind = backend.connect_with(&proxy.address(), options).await?;
    let direct = backend.connect(&backend.shared(), SHORT).await?;
    let root = root();
    let m = Mutex::new(&behind, &format!("{root}/lock"))?;
    let mut status = behind.watch_status();
    proxy.cut();
    let lost = status.wait_for(|s| s.state == SessionState::Lost);
    tokio::time::timeout(WITHIN, lost)
        .await
        .context("the session was not lost")??;
    let timeout = Duration::from_millis(100);
    let timed = tokio::time::timeout(WITHIN, m.acquire_timeout(timeout)).await;
    let now = tokio::time::timeout(WITHIN, m.try_acquire()).await;
    let state = behind.state();
    // An untimed acquire goes on trying to open a new session through the
    // rest of the outage, which outlasts a session: the session it gets
    // must be kept, not given up at once for the time spent getting it.
    let untimed = tokio::spawn({
        let m = m.clone();
        async move { m.acquire().await }
    });
    tokio::time::sleep(behind.session_timeout() + Duration::from_millis(500)).await;
    let before = behind.watch_status().borrow().changes;
    proxy.restore();
    let timed = timed.context("acquire_timeout waited for the server")?;
    ensure!(
        matches!(timed, Err(Error::Timeout(t)) if t == timeout),
        "{timed:?}"
    );
    let now = now.context("try_acquire waited for the server")?;
    ensure!(matches!(now, Err(Error::ConnectionLoss)), "{now:?}");
    ensure!(
        !state.is_connected(),
        "both answered only once the session was back ({state:?})"
    );
    let guard = tokio::time::timeout(WITHIN, untimed)
        .await
        .context("the untimed acquire did not end once the server was back")???;
    let after = *behind.watch_status().borrow();
    ensure!(
        after.changes == before + 1 && after.state == SessionState::Reconnected,
        "the session was renewed more than once (or not kept): {after:?}, {} changes",
        after.changes - before
    );
    guard.release().await?;
    finish(&root, &direct, &[&behind]).await
}

/// Kleppmann's scenario: a holder stalls (its traffic frozen) past its
/// session between reading and writing; another client takes the lock and
/// writes. The stalled holder's write is rejected with fencing, and shown to
/// corrupt the value without it.
async fn a_paused_holder_is_fenced_and_unfenced_writes_are_unsafe(backend: Backend) -> Result<()> {
    for fenced in [true, false] {
        let (proxy, stalled, other, root) = one_behind_a_proxy(backend, SHORT).await?;
        let (lock, counter) = (format!("{root}/lock"), format!("{root}/counter"));
        other.create(&counter, b"0", persistent()).await?;
        // Each client adds one to the counter under the lock: two increments.
        let g1 = Mutex::new(&stalled, &lock)?.acquire().await?;
        let seen = parse_number(&stalled.get_data(&counter).await?.0)?;
        proxy.pause();
        let g2 = Mutex::new(&other, &lock)?
            .acquire_timeout(backend.hand_over_within(stalled.session_timeout()))
            .await
            .context("the lock was not handed over while the holder stalled")?;
        let now = parse_number(&other.get_data(&counter).await?.0)?;
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
        let value = parse_number(&other.get_data(&counter).await?.0)?;
        if fenced {
            ensure!(matches!(result, Err(Error::Lost { .. })), "{result:?}");
            ensure!(
                value == 1,
                "fenced: the stale write was rejected, value {value}"
            );
        } else {
            result?;
            // Both clients incremented, but the value says 1: a lost update.
            ensure!(
                value == 1,
                "unfenced: the stale write landed over the other's ({value})"
            );
        }
        let released = g1.release().await;
        ensure!(matches!(released, Err(Error::Lost { .. })), "{released:?}");
        other.delete(&counter, None).await?;
        finish(&root, &other, &[&stalled]).await?;
    }
    Ok(())
}

/// With the leader of a 3-member cluster dead, new clients that know every
/// member still connect, every time, and lock and release. (etcd's client
/// may try the dead one first: the lease grant is tried again, on the next
/// member. Consul's followers answer a session create with 500 until they
/// know a new leader: the create is tried again.)
async fn new_sessions_connect_while_a_member_is_down(backend: Backend) -> Result<()> {
    let mut cluster = backend.start_cluster()?;
    let hosts = cluster.hosts();
    let root = root();
    let checker = backend.connect(&hosts, Duration::from_secs(6)).await?;
    cluster.kill_leader()?;
    let mut sessions = Vec::new();
    for i in 0..10 {
        let session = backend
            .connect(&hosts, Duration::from_secs(6))
            .await
            .with_context(|| format!("session {i} while a member is down"))?;
        let guard = Mutex::new(&session, &format!("{root}/lock"))?
            .acquire_timeout(WITHIN)
            .await
            .with_context(|| format!("session {i} locks"))?;
        guard.release().await?;
        sessions.push(session);
    }
    let refs: Vec<&Session> = sessions.iter().collect();
    finish(&root, &checker, &refs).await
}

/// A session keeps its lease, its lock and its use when the etcd member it
/// talks to freezes (`SIGSTOP`: its connections stay open and nothing is
/// answered, not even pings): the lease's renewal gives up within a third
/// of the TTL, and the client's channel then closes that connection and
/// goes to the next member, in time to renew before the TTL runs out.
#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_session_outlives_a_frozen_member() -> Result<()> {
    outlives_a_frozen_etcd_member(Duration::from_secs(6)).await
}

/// The same with etcd's shortest TTL, 2 s: a renewal gives up within
/// 0.67 s, sooner than requests that are merely slow, and its giving up
/// still leaves the frozen member (before, only after 1 s: the session was
/// lost). Long: its margin is a few hundred milliseconds, which a machine
/// busy with the default suite's other tests may not leave it.
#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: run by scripts/test.sh --long"]
async fn an_etcd_session_of_the_shortest_ttl_outlives_a_frozen_member() -> Result<()> {
    outlives_a_frozen_etcd_member(Duration::from_secs(2)).await
}

#[cfg(feature = "etcd")]
async fn outlives_a_frozen_etcd_member(ttl: Duration) -> Result<()> {
    let cluster = EtcdCluster::start(3)?;
    let hosts = cluster.endpoints().join(",");
    let root = root();
    // The session talks to the first member listed (the channel starts
    // there); the checker to the last, which stays up.
    let session = Backend::Etcd.connect(&hosts, ttl).await?;
    let last = cluster
        .endpoints()
        .last()
        .cloned()
        .context("three members")?;
    let checker = Backend::Etcd.connect(&last, ttl).await?;
    // Two TTLs: the lease would be gone by then without a renewal.
    let held = hold_through_a_freeze(&session, &checker, &root, ttl * 2, || cluster.pause(0)).await;
    cluster.resume(0);
    held?.held_on("a member").await?;
    finish(&root, &checker, &[&session]).await
}

/// What a session showed while a server it talks to was frozen.
struct Frozen {
    guard: LockGuard,
    lost: bool,
    after: dlock::Result<LockGuard>,
    taken: dlock::Result<Option<LockGuard>>,
}

/// Holds `{root}/held` through `session`, runs `freeze`, then looks,
/// before anything is resumed: whether the hold was lost within `within`,
/// a lock taken through `session` meanwhile, and `checker`'s try at the
/// held lock.
async fn hold_through_a_freeze(
    session: &Session,
    checker: &Session,
    root: &str,
    within: Duration,
    freeze: impl FnOnce(),
) -> Result<Frozen> {
    let guard = Mutex::new(session, &format!("{root}/held"))?
        .acquire()
        .await?;
    freeze();
    let lost = tokio::time::timeout(within, guard.lost()).await.is_ok();
    let after = Mutex::new(session, &format!("{root}/after"))?
        .acquire_timeout(WITHIN)
        .await;
    let taken = Mutex::new(checker, &format!("{root}/held"))?
        .try_acquire()
        .await;
    Ok(Frozen {
        guard,
        lost,
        after,
        taken,
    })
}

impl Frozen {
    /// The hold lasted through the freeze of `what`, the session stayed
    /// usable, and nobody else took the lock; both holds go.
    async fn held_on(self, what: &str) -> Result<()> {
        ensure!(!self.lost, "the lock was lost while {what} was frozen");
        self.after
            .with_context(|| format!("the session could not lock with {what} frozen"))?
            .release()
            .await?;
        ensure!(self.taken?.is_none(), "another session took the held lock");
        Ok(self.guard.release().await?)
    }
}

/// A session keeps its lock and its use when the Consul agent it talks to
/// freezes (`SIGSTOP`: connections are accepted and nothing is answered):
/// the renewal that goes unanswered moves the client to the next agent, in
/// time to renew before the TTL runs out. Before, every request stayed on
/// the silent agent and the session was lost while the others were well.
/// The frozen one is a follower, listed first: a frozen leader would also
/// stall the cluster until it elects another, which is no client's doing.
/// Autopilot's clean-up of dead servers is off: it would remove the frozen
/// server, and Consul invalidates the sessions of a node that is removed
/// (a session lives on the agent that made it) — Consul's rule, not a
/// client's failure. A store opened with that agent first in its endpoint
/// opens on the next.
#[cfg(feature = "consul")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consul_session_outlives_a_frozen_agent() -> Result<()> {
    let keep_dead_servers = ["-hcl", "autopilot { cleanup_dead_servers = false }"];
    let options = dlock_testkit::ConsulOptions {
        extra_args: keep_dead_servers.map(String::from).to_vec(),
        ..Default::default()
    };
    let cluster = ConsulCluster::start_with(3, options)?;
    let leader = cluster.leader_index().context("the cluster has a leader")?;
    let frozen = (leader + 1) % 3;
    let mut agents = cluster.endpoints();
    agents.rotate_left(frozen);
    let hosts = agents.join(",");
    let root = root();
    // Consul's shortest TTL.
    let ttl = Duration::from_secs(10);
    let session = Backend::Consul.connect(&hosts, ttl).await?;
    let checker = Backend::Consul.connect(&agents[1], ttl).await?;
    // Past a TTL: without a renewal the client counts its session lost by
    // then.
    let within = ttl + Duration::from_secs(2);
    let freeze = || cluster.pause(frozen);
    let held = hold_through_a_freeze(&session, &checker, &root, within, freeze).await;
    let opened = Backend::Consul.connect(&hosts, ttl).await;
    cluster.resume(frozen);
    held?.held_on("an agent").await?;
    let opened = opened.context("no store opened with the first agent frozen")?;
    finish(&root, &checker, &[&session, &opened]).await
}

/// One test: `name` runs `scenario(args)`.
macro_rules! test {
    ($(#[$attr:meta])* $name:ident => $scenario:ident($($arg:expr),*)) => {
        $(#[$attr])*
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() -> anyhow::Result<()> {
            super::$scenario($($arg),*).await
        }
    };
}

/// Every scenario on one backend, as `<module>::<test>`. The leader-kill
/// scenarios also run long (`#[ignore]`d, `scripts/test.sh --long`): the
/// leader is killed, its member restarted, 5 times over.
macro_rules! scenarios {
    ($(#[$attr:meta])* $module:ident => $backend:expr $(, semaphore_leader_kill: #[$sem:meta])?) => {
        $(#[$attr])*
        mod $module {
            test!(the_ensemble_leader_dies_during_contention =>
                the_ensemble_leader_dies_during_contention($backend, 1));
            test!($(#[$sem])? a_semaphore_keeps_its_limit_when_the_leader_dies =>
                a_semaphore_keeps_its_limit_when_the_leader_dies($backend, 1));
            test!(one_leader_at_a_time_when_the_leader_dies =>
                one_leader_at_a_time_when_the_leader_dies($backend, 1));
            test!(new_sessions_connect_while_a_member_is_down =>
                new_sessions_connect_while_a_member_is_down($backend));
            test!(a_short_cut_keeps_the_lock => a_short_cut_keeps_the_lock($backend));
            test!(timed_acquires_end_while_a_lost_session_cannot_reconnect =>
                timed_acquires_end_while_a_lost_session_cannot_reconnect($backend));
            test!(a_long_cut_loses_the_lock_without_a_double_holder =>
                a_long_cut_loses_the_lock_without_a_double_holder($backend));
            test!(a_paused_holder_is_fenced_and_unfenced_writes_are_unsafe =>
                a_paused_holder_is_fenced_and_unfenced_writes_are_unsafe($backend));
            test!(#[ignore = "long: run by scripts/test.sh --long"]
                leaders_die_again_and_again_during_contention =>
                the_ensemble_leader_dies_during_contention($backend, 5));
            test!(#[ignore = "long: run by scripts/test.sh --long"]
                a_semaphore_keeps_its_limit_through_many_leader_deaths =>
                a_semaphore_keeps_its_limit_when_the_leader_dies($backend, 5));
            test!(#[ignore = "long: run by scripts/test.sh --long"]
                one_leader_at_a_time_through_many_leader_deaths =>
                one_leader_at_a_time_when_the_leader_dies($backend, 5));
        }
    };
}

scenarios!(#[cfg(feature = "zookeeper")] zookeeper => super::Backend::ZooKeeper);
scenarios!(#[cfg(feature = "etcd")] etcd => super::Backend::Etcd);
scenarios!(#[cfg(feature = "consul")] consul => super::Backend::Consul);
