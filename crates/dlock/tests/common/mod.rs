//! Shared test harness: one suite, run against every backend.
//!
//! Each test gets a fresh root path and, at the end, [`Harness::finish`]
//! asserts that nothing is left under it (no ephemeral node, no data) and
//! removes the empty container skeleton.
#![allow(dead_code)]

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use dlock::store::embedded::{EmbeddedOptions, EmbeddedServer};
use dlock::store::{Child, CreateMode, CreateOptions, Created, WatchEvent};
use dlock::{Session, SessionOptions};

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

/// Nodes under `root` that a finished test must not leave: ephemeral nodes
/// and nodes holding data.
pub async fn collect_leftovers(session: &Session, root: &str) -> Result<Vec<String>> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_string()];
    while let Some(path) = stack.pop() {
        let (data, stat) = match session.get_data(&path).await {
            Ok(x) => x,
            Err(dlock::Error::NoNode { .. }) => continue,
            Err(e) => return Err(e).context(path),
        };
        if stat.ephemeral_owner != 0 || !data.is_empty() {
            found.push(format!(
                "{path} (owner {:#x}, {} bytes)",
                stat.ephemeral_owner,
                data.len()
            ));
        }
        match session.children(&path).await {
            Ok(children) => {
                stack.extend(children.into_iter().map(|c| format!("{path}/{}", c.name)))
            }
            Err(dlock::Error::NoNode { .. }) => {}
            Err(e) => return Err(e).context(path),
        }
    }
    Ok(found)
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

/// Persistent node options with parents.
pub fn persistent() -> CreateOptions {
    CreateOptions::new(CreateMode::Persistent).with_parents()
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
