//! Shared test harness: one suite, run against every backend.
//!
//! Each test gets a fresh root path and, at the end, [`Harness::finish`]
//! asserts that nothing is left under it (no ephemeral node, no data) and
//! removes the empty container skeleton.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use dlock::store::embedded::{EmbeddedOptions, EmbeddedServer};
use dlock::store::{
    Child, CreateMode, CreateOptions, Created, SessionId, SessionState, WatchEvent,
};
use dlock::{ErrorPolicy, Lockable, Mutex, MutexGuard, Session, SessionOptions};
use dlock_testkit::LineProbe;
use tokio::task::JoinHandle;

/// Which store a test runs against.
#[derive(Clone)]
pub enum Backend {
    /// A fresh in-process store per test.
    Embedded(EmbeddedServer),
    /// A real ZooKeeper server shared by the test binary.
    ZooKeeper(String),
    /// A real etcd server shared by the test binary (`host:port`, and a
    /// namespace path if any).
    Etcd(String),
    /// A real Consul dev agent shared by the test binary (`host:port`).
    Consul(String),
}

/// A test's view of its backend.
pub struct Harness {
    pub backend: Backend,
    pub root: String,
    sessions: std::sync::Mutex<Vec<Session>>,
}

/// A fresh embedded store with a fast container reaper.
pub fn embedded() -> Harness {
    let server = EmbeddedServer::with_options(EmbeddedOptions {
        container_check_interval: Duration::from_millis(20),
    });
    Harness::new(Backend::Embedded(server))
}

/// The test binary's private ZooKeeper server.
pub fn zookeeper() -> Harness {
    let server = dlock_testkit::shared_zk();
    Harness::new(Backend::ZooKeeper(server.connect_string()))
}

/// The test binary's private etcd server.
pub fn etcd() -> Harness {
    let server = dlock_testkit::shared_etcd();
    Harness::new(Backend::Etcd(server.endpoint()))
}

/// The test binary's private etcd server, every key below a namespace of
/// the test's own (`etcd://host:port/ns-...`).
pub fn etcd_namespaced() -> Harness {
    let server = dlock_testkit::shared_etcd();
    let namespace = format!("/ns-{}", uuid::Uuid::new_v4().simple());
    Harness::new(Backend::Etcd(format!("{}{namespace}", server.endpoint())))
}

/// The test binary's private Consul dev agent.
pub fn consul() -> Harness {
    let server = dlock_testkit::shared_consul();
    Harness::new(Backend::Consul(server.endpoint()))
}

impl Harness {
    fn new(backend: Backend) -> Self {
        Harness {
            backend,
            root: format!("/t-{}", uuid::Uuid::new_v4().simple()),
            sessions: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// A path under this test's root.
    pub fn path(&self, rest: &str) -> String {
        format!("{}{}", self.root, rest)
    }

    /// The session timeout tests use: short, so expiry tests are quick.
    pub fn timeout(&self) -> Duration {
        match self.backend {
            Backend::Embedded(_) => Duration::from_millis(500),
            // ZooKeeper grants at least 2 ticks (tickTime 500 ms in tests).
            Backend::ZooKeeper(_) => Duration::from_secs(2),
            // Lease TTLs are whole seconds; etcd 3.4's minimum is 2 s.
            Backend::Etcd(_) => Duration::from_secs(2),
            // Consul refuses session TTLs below 10 s.
            Backend::Consul(_) => Duration::from_secs(10),
        }
    }

    /// A new session, as a separate process would open.
    pub async fn session(&self) -> Session {
        self.session_with(SessionOptions::default().with_session_timeout(self.timeout()))
            .await
    }

    /// A new session whose requests give up after two quick retries (some
    /// 50 ms): for what a request failing through every retry leaves.
    pub async fn impatient_session(&self) -> Session {
        let quick = dlock::RetryPolicy {
            base_sleep: Duration::from_millis(10),
            max_sleep: Duration::from_millis(40),
            max_retries: 2,
        };
        let options = SessionOptions::default().with_session_timeout(self.timeout());
        self.session_with(options.with_retry(quick)).await
    }

    /// A new session with options.
    pub async fn session_with(&self, options: SessionOptions) -> Session {
        let session = match &self.backend {
            Backend::Embedded(server) => server.connect(options).await,
            Backend::ZooKeeper(hosts) => {
                dlock::connect_with(&format!("zk://{hosts}"), options).await
            }
            Backend::Etcd(hosts) => dlock::connect_with(&format!("etcd://{hosts}"), options).await,
            Backend::Consul(hosts) => {
                dlock::connect_with(&format!("consul://{hosts}"), options).await
            }
        }
        .expect("connect a session");
        self.sessions.lock().unwrap().push(session.clone());
        session
    }

    /// Whether the backend can inject faults.
    pub fn has_faults(&self) -> bool {
        matches!(self.backend, Backend::Embedded(_))
    }

    /// Ends the test: every session's background work settles, nothing but
    /// empty directories may remain under the root, and those are removed.
    pub async fn finish(self) {
        let sessions: Vec<Session> = std::mem::take(&mut *self.sessions.lock().unwrap());
        for s in &sessions {
            tokio::time::timeout(Duration::from_secs(30), s.background_idle())
                .await
                .expect("background tasks settle");
        }
        let checker = self.session().await;
        let leftovers = collect_leftovers(&checker, &self.root)
            .await
            .expect("walk the tree");
        assert!(
            leftovers.is_empty(),
            "left behind under {}: {leftovers:#?}",
            self.root
        );
        remove_tree(&checker, &self.root)
            .await
            .expect("remove the empty skeleton");
        for s in sessions {
            s.close().await;
        }
        checker.close().await;
    }
}

/// Nodes under `root` that a finished test must not leave: ephemeral nodes,
/// nodes holding data, and on etcd and Consul any key (there a directory is
/// only the keys below it, so a node without children is a key someone
/// wrote; elsewhere it may be an empty container not yet reaped). A KV
/// semaphore's record without holders stays by design.
pub async fn collect_leftovers(session: &Session, root: &str) -> Result<Vec<String>> {
    let keyed = matches!(
        session.backend(),
        dlock::store::BackendKind::Etcd | dlock::store::BackendKind::Consul
    );
    let mut found = Vec::new();
    let mut stack = vec![root.to_string()];
    while let Some(path) = stack.pop() {
        let (data, stat) = match session.get_data(&path).await {
            Ok(x) => x,
            Err(dlock::Error::NoNode { .. }) => continue,
            Err(e) => return Err(e).context(path),
        };
        let children = match session.children(&path).await {
            Ok(children) => children,
            Err(dlock::Error::NoNode { .. }) => Vec::new(),
            Err(e) => return Err(e).context(path),
        };
        let idle_record = is_idle_record(&path, &data);
        let a_key = keyed && children.is_empty() && path != root && !idle_record;
        if stat.ephemeral_owner != 0 || !(data.is_empty() || idle_record) || a_key {
            found.push(format!(
                "{path} (owner {:#x}, {} bytes)",
                stat.ephemeral_owner,
                data.len()
            ));
        }
        stack.extend(children.into_iter().map(|c| format!("{path}/{}", c.name)));
    }
    Ok(found)
}

/// A guarded write through `held`, whose hold is over (`what` names it),
/// is refused with `Lost`, and `resource` keeps its `v0`.
pub async fn late_guarded_write_is_refused(
    held: &dlock::Acquisition,
    session: &Session,
    resource: &str,
    what: &str,
) -> Result<()> {
    let set = dlock::store::Op::SetData {
        path: resource.to_string(),
        data: b"late".to_vec(),
        version: None,
    };
    let refused = held.guarded(&[set]).await;
    ensure!(
        matches!(refused, Err(dlock::Error::Lost { .. })),
        "{what}'s guarded write: {refused:?}"
    );
    ensure!(
        session.get_data(resource).await?.0 == b"v0",
        "the write landed"
    );
    Ok(())
}

/// Whether `path` is a KV semaphore's record without holders, in either
/// layout: what its last holder leaves (it is never deleted), skeleton as
/// an empty directory is.
pub fn is_idle_record(path: &str, data: &[u8]) -> bool {
    use dlock::recipes::kv_semaphore::{Record, RECORD};
    path.ends_with(&format!("/{RECORD}"))
        && [dlock::Layout::Curator, dlock::Layout::Consul]
            .into_iter()
            .any(|layout| Record::decode(layout, path, data).is_ok_and(|r| r.holders.is_empty()))
}

/// Deletes the tree under and including `root`, deepest first.
pub async fn remove_tree(session: &Session, root: &str) -> Result<()> {
    let mut order = Vec::new();
    let mut stack = vec![root.to_string()];
    while let Some(path) = stack.pop() {
        match session.children(&path).await {
            Ok(children) => {
                stack.extend(children.into_iter().map(|c| format!("{path}/{}", c.name)));
                order.push(path);
            }
            Err(dlock::Error::NoNode { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    for path in order.into_iter().rev() {
        match session.delete(&path, None).await {
            Ok(()) | Err(dlock::Error::NoNode { .. }) => {}
            Err(e) => bail!("delete {path}: {e}"),
        }
    }
    Ok(())
}

/// Waits (by watch, not by sleeping) until `path` exists.
pub async fn await_exists(session: &Session, path: &str, within: Duration) -> Result<()> {
    tokio::time::timeout(within, async {
        loop {
            let (stat, watch) = session.exists_watch(path).await?;
            if stat.is_some() {
                return Ok(());
            }
            watch.changed().await;
        }
    })
    .await
    .with_context(|| format!("{path} does not exist after {within:?}"))?
}

/// Waits (by watch, not by sleeping) until `path` does not exist.
pub async fn await_gone(session: &Session, path: &str, within: Duration) -> Result<()> {
    tokio::time::timeout(within, async {
        loop {
            let (stat, watch) = session.exists_watch(path).await?;
            if stat.is_none() {
                return Ok(());
            }
            watch.changed().await;
        }
    })
    .await
    .with_context(|| format!("{path} still exists after {within:?}"))?
}

/// Waits (by watch) until `path` has `n` children.
pub async fn await_children(
    session: &Session,
    path: &str,
    n: usize,
    within: Duration,
) -> Result<()> {
    tokio::time::timeout(within, async {
        loop {
            match session.children_watch(path).await {
                Ok((children, watch)) => {
                    if children.len() == n {
                        return Ok(());
                    }
                    watch.changed().await;
                }
                Err(dlock::Error::NoNode { .. }) if n == 0 => return Ok(()),
                Err(dlock::Error::NoNode { .. }) => {
                    // Not there yet: wait for it to appear.
                    let (stat, watch) = session.exists_watch(path).await?;
                    if stat.is_none() {
                        watch.changed().await;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    })
    .await
    .with_context(|| format!("{path} did not reach {n} children within {within:?}"))?
}

/// Waits (on the session's status channel) until `session` is in `state`.
pub async fn await_state(session: &Session, state: SessionState, within: Duration) -> Result<()> {
    tokio::time::timeout(
        within,
        session.watch_status().wait_for(|s| s.state == state),
    )
    .await
    .with_context(|| format!("no {state:?} within {within:?}; now {:?}", session.status()))??;
    Ok(())
}

/// The names of `path`'s children, sorted.
pub async fn sorted_names(session: &Session, path: &str) -> Result<Vec<String>> {
    let mut names: Vec<String> = session
        .children(path)
        .await?
        .into_iter()
        .map(|c| c.name)
        .collect();
    names.sort();
    Ok(names)
}

/// Curator's error policies, once a term ended while `session` (whose id
/// was `id`) is suspended for longer than its timeout: under `Standard` it
/// ended with the suspension, the same session still suspended; under
/// `Session` only with the session's loss. Then waits for that loss.
pub async fn ended_as_the_policy_says(
    session: &Session,
    id: SessionId,
    policy: ErrorPolicy,
    within: Duration,
) -> Result<()> {
    let (state, same) = (session.state(), session.session_id() == id);
    match policy {
        ErrorPolicy::Standard => ensure!(
            state == SessionState::Suspended && same,
            "Standard: the term ends with the suspension, before the loss ({state:?})"
        ),
        ErrorPolicy::Session => ensure!(
            state != SessionState::Suspended || !same,
            "Session: the term lasts until the session is lost ({state:?})"
        ),
    }
    tokio::time::timeout(within, session.lost(id))
        .await
        .context("the session was never lost")?;
    Ok(())
}

/// The ZooKeeper hosts of a harness the peer interop tests run on.
pub fn zk_hosts(h: &Harness) -> String {
    match &h.backend {
        Backend::ZooKeeper(hosts) => hosts.clone(),
        _ => unreachable!("ZooKeeper peers run on ZooKeeper"),
    }
}

/// A `peer` holds the lock at `path`: `mutex` (a dlock `Mutex` on it) can
/// have it neither by a try nor within a short timeout, and queues behind
/// it. Returns the waiting acquire once both nodes are listed.
pub async fn peer_excludes_dlock(
    s: &Session,
    mutex: &Mutex,
    path: &str,
    peer: &str,
    within: Duration,
) -> Result<JoinHandle<dlock::Result<MutexGuard>>> {
    ensure!(
        mutex.try_acquire().await?.is_none(),
        "dlock got a lock {peer} holds"
    );
    let err = mutex
        .acquire_timeout(Duration::from_millis(300))
        .await
        .unwrap_err();
    ensure!(matches!(err, dlock::Error::Timeout(_)), "{err}");
    let waiting = tokio::spawn({
        let mutex = mutex.clone();
        async move { mutex.acquire().await }
    });
    await_children(s, path, 2, within).await?;
    Ok(waiting)
}

/// dlock holds the lock at `path` (`held`): a peer's lock command
/// (`lock(timeout_ms)`) times out after 300 ms; one that waits (`-1`)
/// queues behind and acquires once `held` is released.
pub async fn dlock_excludes_peer(
    s: &Session,
    held: MutexGuard,
    peer: &mut LineProbe,
    lock: impl Fn(&str) -> String,
    path: &str,
    within: Duration,
) -> Result<()> {
    ensure!(peer.ask(&lock("300"))? == "timeout");
    peer.send(&lock("-1"))?;
    await_children(s, path, 2, within).await?;
    held.release().await?;
    let answer = peer.next_line(within)?;
    ensure!(answer.starts_with("acquired"), "{answer}");
    Ok(())
}

/// The end of a mixed sale: dlock's sellers (`dlock_sold`) and the
/// `peer`'s (`peer_sold`) sold exactly the `total` stock, each side some
/// of it; the emptied stock node is removed.
pub async fn sold_exactly_the_stock(
    admin: &Session,
    stock: &str,
    total: u64,
    dlock_sold: u64,
    peer: &str,
    peer_sold: u64,
) -> Result<()> {
    ensure!(
        dlock_sold + peer_sold == total,
        "dlock sold {dlock_sold}, {peer} {peer_sold}, of {total}"
    );
    ensure!(
        dlock_sold > 0 && peer_sold > 0,
        "both sides sold: dlock {dlock_sold}, {peer} {peer_sold}"
    );
    ensure!(admin.get_data(stock).await?.0 == b"0");
    admin.delete(stock, None).await?;
    Ok(())
}

/// Starts `acquire` in the background and returns its task once `queue`
/// lists `nodes` nodes: the acquirer queued (behind a holder, say).
pub async fn queued<T: Send + 'static>(
    observer: &Session,
    queue: &str,
    nodes: usize,
    within: Duration,
    acquire: impl Future<Output = dlock::Result<T>> + Send + 'static,
) -> Result<JoinHandle<dlock::Result<T>>> {
    let waiting = tokio::spawn(acquire);
    await_children(observer, queue, nodes, within).await?;
    Ok(waiting)
}

/// Curator's `testContainerCleanup`: `clients` fresh locks (made by
/// `lock`, each in its own task) are acquired and released three times
/// each; then the directory `dir` is reaped.
pub async fn reaped_after_lock_rounds<L: Lockable + 'static>(
    s: &Session,
    clients: usize,
    lock: impl Fn() -> dlock::Result<L>,
    dir: &str,
    within: Duration,
) -> Result<()> {
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let lock = lock()?;
        tasks.push(tokio::spawn(async move {
            for _ in 0..3 {
                let hold = lock
                    .lock_for(None)
                    .await?
                    .context("held, without a timeout")?;
                hold.release().await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    await_gone(s, dir, within).await
}

/// Persistent node options with parents.
pub fn persistent() -> CreateOptions {
    CreateOptions::new(CreateMode::Persistent).with_parents()
}

/// Persistent node options without parents: the parent must exist.
pub fn persistent_only() -> CreateOptions {
    CreateOptions::new(CreateMode::Persistent)
}

/// Ephemeral node options with parents.
pub fn ephemeral() -> CreateOptions {
    CreateOptions::new(CreateMode::Ephemeral).with_parents()
}

/// Ephemeral sequential node options with parents: a queue's nodes.
pub fn sequential() -> CreateOptions {
    CreateOptions::new(CreateMode::EphemeralSequential).with_parents()
}

/// True for node events (not session events).
pub fn is_node_event(e: WatchEvent) -> bool {
    !matches!(e, WatchEvent::Session(_))
}

/// A handoff seen through the store, as the wait queue sees one.
pub struct Handoff {
    /// The waiter's node.
    pub ours: Created,
    /// The node that was ahead of it, as listed.
    pub ahead: Child,
    /// The waiter's listing once woken (`children_seen`).
    pub seen: Vec<Child>,
}

/// `a` queues a node in `dir`, `b` queues behind it (create and list),
/// watches it (`watch_child`), `a` deletes it, and once the watch fired
/// for that, `b` lists again (`children_seen`).
pub async fn hand_over(a: &Session, b: &Session, dir: &str) -> Result<Handoff> {
    // Names of their own: two etcd clients can draw the same digits for
    // one name, and the retry would count as a request.
    let seq = sequential();
    let theirs = a.create(&format!("{dir}/a-"), b"", seq).await?;
    let (ours, listed) = b
        .store()
        .create_and_list(&format!("{dir}/b-"), b"", seq, dir)
        .await?;
    let ahead = listed
        .into_iter()
        .find(|c| c.name == theirs.name())
        .context("the node ahead is listed")?;
    let watch = b
        .store()
        .watch_child(dir, &ahead)
        .await?
        .context("the node ahead is there")?;
    a.delete(&theirs.path, None).await?;
    let event = watch.changed().await;
    ensure!(event == WatchEvent::NodeDeleted, "{event:?}");
    let seen = b.store().children_seen(dir, ours.stat.czxid).await?;
    Ok(Handoff { ours, ahead, seen })
}

/// Instantiates each listed case as a `#[tokio::test]` per backend: one
/// backend and its cases (`per_backend!(zookeeper => harness; a, b)`), or
/// several backends sharing one list of cases
/// (`per_backend!({ embedded => h1, #[cfg(..)] etcd => h2 } { a, b })`),
/// or every backend (`per_backend!(every_backend { a, b })`).
#[macro_export]
macro_rules! per_backend {
    (every_backend $cases:tt) => {
        $crate::per_backend!({
            embedded => $crate::common::embedded(),
            zookeeper => $crate::common::zookeeper(),
            #[cfg(feature = "etcd")]
            etcd => $crate::common::etcd(),
            #[cfg(feature = "consul")]
            consul => $crate::common::consul(),
        } $cases);
    };
    ({ $($(#[$attr:meta])* $backend:ident => $harness:expr),+ $(,)? } $cases:tt) => {
        $( $(#[$attr])* $crate::per_backend!($backend => $harness; $cases); )+
    };
    ($backend:ident => $harness:expr; { $($case:ident),+ $(,)? }) => {
        $crate::per_backend!($backend => $harness; $($case),+);
    };
    ($backend:ident => $harness:expr; $($case:ident),+ $(,)?) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let h = $harness;
                    super::$case(&h).await.expect(stringify!($case));
                    h.finish().await;
                }
            )+
        }
    };
}

pub mod tests1;
pub mod tests2;
