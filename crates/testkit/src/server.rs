//! The one supervisor behind every server kind.
//!
//! ZooKeeper, etcd and Consul differ only in their command lines and in how
//! to ask them whether they serve; picking ports, retrying on a port clash,
//! waiting with a deadline, pausing, restarting and reporting failures with
//! the log's tail are the same for all, so they live here once and a
//! [`Flavor`] supplies the rest.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use crate::port::{free_port, is_port_conflict, port_is_free, IN_USE};
use crate::process::Node;

const LOG_LINES: usize = 40;
const START_ATTEMPTS: usize = 3;

static LAUNCH_ID: AtomicU64 = AtomicU64::new(0);

/// The ports of every member of one start attempt, as a flavor sees them
/// when it builds a member's command line.
pub(crate) struct Layout<'a> {
    /// Each member's ports, in [`Flavor::port_roles`] order.
    pub all: &'a [Vec<u16>],
    /// The member being built; `None` for a single server.
    pub me: Option<usize>,
    /// Unique within this process per start attempt (cluster tokens, node
    /// names).
    pub id: u64,
}

impl Layout<'_> {
    /// The ports of the member being built.
    pub fn ports(&self) -> &[u16] {
        &self.all[self.me.unwrap_or(0)]
    }
}

/// What is particular to one kind of server.
pub(crate) trait Flavor {
    /// The server's name in messages.
    const NAME: &'static str;
    /// What several of them together are called ("ensemble", "cluster").
    const GROUP: &'static str;
    /// Temporary directories are `dlock-<DIR>-…` (`dlock-<DIR><i>-…` for
    /// members).
    const DIR: &'static str;
    /// How to get the server when it is missing.
    const INSTALL_HINT: &'static str;

    /// The settings a test passes (`ZkOptions`, `EtcdOptions`, ...). Each
    /// has a `port` (`Option<u16>`) and a `startup_timeout` (`Duration`)
    /// field, which the handles read.
    type Options: Default;

    /// The flavor for `opts`, once its binaries are found (else the error
    /// of [`not_installed`]).
    fn new(opts: Self::Options) -> Result<Self>
    where
        Self: Sized;

    /// What each port of a member is for; the first is the port clients
    /// use, and the count is how many ports a member gets.
    fn port_roles(&self, cluster: bool) -> Vec<&'static str>;

    /// The executable.
    fn program(&self) -> &Path;

    /// The command as shown in messages.
    fn shown_program(&self) -> String {
        self.program().display().to_string()
    }

    /// Extra environment for the server process.
    fn env(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// The member's command-line arguments; `dir` is its fresh directory
    /// (configuration files may be written there).
    fn args(&self, layout: &Layout, dir: &Path) -> Result<Vec<OsString>>;

    /// True once the member serves (and is provably ours).
    fn ready(&self, m: &Member) -> bool;

    /// What [`Flavor::ready`] waited for and what it last saw, for an error.
    fn not_ready(&self, m: &Member) -> String;

    /// True if the member is its group's leader right now.
    fn is_leader(&self, m: &Member) -> bool;

    /// Once every member of a new group is ready: true when the group as a
    /// whole counts as started.
    fn agreed(&self, _members: &[Member]) -> bool {
        true
    }
}

/// The error for a missing binary: what was not found, where it was looked
/// for, and how to get it. Never a silent skip.
pub(crate) fn not_installed<F: Flavor>(what: &str, looked_at: &str) -> anyhow::Error {
    anyhow!(
        "cannot start {}: {what} was not found (looked at {looked_at}); {}",
        F::NAME,
        F::INSTALL_HINT
    )
}

/// One server process (a single server or a group member) and its ports.
#[derive(Debug)]
pub(crate) struct Member {
    node: Node,
    index: Option<usize>,
    ports: Vec<u16>,
    roles: Vec<&'static str>,
}

impl Member {
    /// The port clients use.
    pub fn port(&self) -> u16 {
        self.ports[0]
    }

    /// All ports, in [`Flavor::port_roles`] order.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    pub fn dir(&self) -> &Path {
        self.node.dir()
    }

    pub fn is_running(&self) -> bool {
        self.node.is_running()
    }
}

/// A single server or a group of members of one flavor.
#[derive(Debug)]
pub(crate) struct Launcher<F> {
    flavor: F,
    members: Vec<Member>,
    startup_timeout: Duration,
}

impl<F: Flavor> Launcher<F> {
    /// Starts one server (on `port` if given, else on free ports, retried
    /// on a clash) and waits until it is ready.
    pub fn single(flavor: F, port: Option<u16>, startup_timeout: Duration) -> Result<Self> {
        Self::start(flavor, None, port, startup_timeout)
    }

    /// Starts `n` members that know each other and waits until each is
    /// ready and the flavor agrees the group is up.
    pub fn group(flavor: F, n: usize, startup_timeout: Duration) -> Result<Self> {
        if n == 0 {
            bail!("a {} {} needs at least one member", F::NAME, F::GROUP);
        }
        Self::start(flavor, Some(n), None, startup_timeout)
    }

    fn start(
        flavor: F,
        n: Option<usize>,
        fixed_port: Option<u16>,
        startup_timeout: Duration,
    ) -> Result<Self> {
        let roles = flavor.port_roles(n.is_some());
        let mut this = Launcher {
            flavor,
            members: Vec::new(),
            startup_timeout,
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            // Old members (from a failed attempt) are killed here.
            this.members.clear();
            let all: Vec<Vec<u16>> = (0..n.unwrap_or(1))
                .map(|_| {
                    (0..roles.len())
                        .map(|k| match fixed_port {
                            Some(p) if k == 0 => p,
                            _ => free_port(),
                        })
                        .collect()
                })
                .collect();
            let id = LAUNCH_ID.fetch_add(1, Ordering::Relaxed);
            for i in 0..all.len() {
                let me = n.map(|_| i);
                let layout = Layout { all: &all, me, id };
                let prefix = match me {
                    None => F::DIR.to_string(),
                    Some(i) => format!("{}{i}", F::DIR),
                };
                let node = Node::new(
                    &prefix,
                    this.flavor.program().to_path_buf(),
                    this.flavor.env(),
                    |dir| this.flavor.args(&layout, dir),
                )?;
                this.members.push(Member {
                    node,
                    index: me,
                    ports: all[i].clone(),
                    roles: roles.clone(),
                });
            }
            match this.launch_all() {
                Ok(()) => return Ok(this),
                Err(e)
                    if fixed_port.is_none()
                        && attempt < START_ATTEMPTS
                        && is_port_conflict(
                            &e,
                            this.members
                                .iter()
                                .any(|m| m.node.log_says_address_in_use()),
                        ) =>
                {
                    continue
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn launch_all(&mut self) -> Result<()> {
        for i in 0..self.members.len() {
            self.launch(i)?;
        }
        let deadline = Instant::now() + self.startup_timeout;
        for m in &self.members {
            self.wait_ready(m, deadline)?;
        }
        if self.members[0].index.is_some() {
            self.wait_until(deadline, |l| l.flavor.agreed(&l.members))
                .map_err(|why| {
                    self.group_error(&format!("did not agree on a leader: {why}"), 15)
                })?;
        }
        Ok(())
    }

    fn launch(&mut self, i: usize) -> Result<()> {
        self.members[i].node.stop();
        let m = &self.members[i];
        let desc = self.describe(m);
        if let Some(p) = m.ports.iter().copied().find(|&p| !port_is_free(p)) {
            bail!("cannot start {desc}: 127.0.0.1:{p} {IN_USE}");
        }
        self.members[i]
            .node
            .launch()
            .with_context(|| format!("cannot start {desc}"))
    }

    fn wait_ready(&self, m: &Member, deadline: Instant) -> Result<()> {
        m.node
            .wait_until(deadline, || self.flavor.ready(m))
            .map_err(|why| self.error(m, &format!("{why}: {}", self.flavor.not_ready(m))))
    }

    /// Polls `done` every 50 ms until it holds or `deadline` passes.
    fn wait_until(&self, deadline: Instant, done: impl Fn(&Self) -> bool) -> Result<(), String> {
        loop {
            if done(self) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err("not before the deadline".to_string());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn describe(&self, m: &Member) -> String {
        let mut s = match m.index {
            None => F::NAME.to_string(),
            Some(i) => format!("{} {} member {i}", F::NAME, F::GROUP),
        };
        let _ = write!(s, " ({}", self.flavor.shown_program());
        for (role, port) in m.roles.iter().zip(&m.ports) {
            let _ = write!(s, ", {role} 127.0.0.1:{port}");
        }
        let _ = write!(s, ", dir {})", m.dir().display());
        s
    }

    fn error(&self, m: &Member, what: &str) -> anyhow::Error {
        anyhow!(
            "{} {what}\n--- last {LOG_LINES} lines of {} ---\n{}",
            self.describe(m),
            m.node.log().display(),
            m.node.log_tail(LOG_LINES)
        )
    }

    fn group_error(&self, what: &str, lines: usize) -> anyhow::Error {
        let mut msg = format!(
            "{} {} ({}) {what}",
            F::NAME,
            F::GROUP,
            self.endpoints().join(",")
        );
        for m in &self.members {
            let _ = write!(
                msg,
                "\n--- member {} (127.0.0.1:{}), last {lines} lines of {} ---\n{}",
                m.index.unwrap_or(0),
                m.port(),
                m.node.log().display(),
                m.node.log_tail(lines)
            );
        }
        anyhow!(msg)
    }

    pub fn flavor(&self) -> &F {
        &self.flavor
    }

    pub fn member(&self, i: usize) -> &Member {
        &self.members[i]
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn port(&self, i: usize) -> u16 {
        self.members[i].port()
    }

    /// `"127.0.0.1:PORT"` of member `i`'s client port.
    pub fn endpoint(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.port(i))
    }

    pub fn endpoints(&self) -> Vec<String> {
        (0..self.len()).map(|i| self.endpoint(i)).collect()
    }

    /// Kills member `i` (`SIGKILL`) and waits for it; keeps its directory.
    pub fn kill(&mut self, i: usize) {
        self.members[i].node.stop();
    }

    /// Starts member `i` again with the same ports and directory (killing
    /// it first if it runs) and waits until it is ready.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        self.launch(i)?;
        self.wait_ready(&self.members[i], Instant::now() + self.startup_timeout)
    }

    /// `SIGSTOP`s member `i`; panics if it does not run.
    pub fn pause(&self, i: usize) {
        self.signal(i, libc::SIGSTOP, "pause");
    }

    /// `SIGCONT`s member `i`; panics if it does not run.
    pub fn resume(&self, i: usize) {
        self.signal(i, libc::SIGCONT, "resume");
    }

    fn signal(&self, i: usize, sig: libc::c_int, what: &str) {
        let m = &self.members[i];
        if let Err(e) = m.node.signal(sig) {
            panic!("dlock-testkit: cannot {what} {}: {e}", self.describe(m));
        }
    }

    pub fn is_running(&self, i: usize) -> bool {
        self.members[i].is_running()
    }

    /// Member `i` runs and its readiness probe holds right now.
    pub fn is_ready(&self, i: usize) -> bool {
        let m = &self.members[i];
        m.is_running() && self.flavor.ready(m)
    }

    pub fn leader_index(&self) -> Option<usize> {
        (0..self.len()).find(|&i| {
            let m = &self.members[i];
            m.is_running() && self.flavor.is_leader(m)
        })
    }

    /// Waits until a majority of members are ready and one leads.
    pub fn wait_for_quorum(&self, timeout: Duration) -> Result<()> {
        let majority = self.len() / 2 + 1;
        let ready = |l: &Self| (0..l.len()).filter(|&i| l.is_ready(i)).count();
        self.wait_until(Instant::now() + timeout, |l| {
            ready(l) >= majority && l.leader_index().is_some()
        })
        .map_err(|_| {
            let what = format!(
                "has no quorum after {timeout:?}: {} of {} ready, leader {:?}",
                ready(self),
                self.len(),
                self.leader_index()
            );
            self.group_error(&what, 15)
        })
    }

    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].node.pid()
    }

    pub fn dir(&self, i: usize) -> &Path {
        self.members[i].dir()
    }

    pub fn log_path(&self, i: usize) -> &Path {
        self.members[i].node.log()
    }

    pub fn log_tail(&self, i: usize, n: usize) -> String {
        self.members[i].node.log_tail(n)
    }
}

/// The server behind a `shared_*` function: started on first use; a failed
/// start is remembered and reported again to every later caller.
pub(crate) fn shared<T>(
    cell: &'static OnceLock<Result<T, String>>,
    start: impl FnOnce() -> Result<T>,
) -> Result<&'static T> {
    match cell.get_or_init(|| start().map_err(|e| format!("{e:#}"))) {
        Ok(s) => Ok(s),
        Err(e) => Err(anyhow!("{e}")),
    }
}

/// [`shared`] for callers that cannot go on without the server.
pub(crate) fn expect_shared<T>(server: Result<&'static T>, name: &str) -> &'static T {
    server.unwrap_or_else(|e| panic!("dlock-testkit: cannot start the shared {name} server: {e:#}"))
}

/// Defines a server handle, single server or group (ensemble, cluster): a
/// struct around a [`Launcher`] of one flavor, its `start` and `start_with`,
/// and the methods every single server or every group has, written once.
/// The caller gives the handle's docs and those of its two constructors;
/// `$name` names the server in the other docs. A group's `start_with`
/// ignores `opts.port`.
///
/// ```text
/// server_handle! {
///     /// A private standalone ZooKeeper server ...
///     pub struct ZkServer(Zk, ZkOptions, "ZooKeeper"): single;
///     /// Starts a server with [`ZkOptions::default`] ...
///     fn start;
///     /// Starts a server with `opts` ...
///     fn start_with;
/// }
/// ```
macro_rules! server_handle {
    (
        $(#[$doc:meta])*
        pub struct $handle:ident($flavor:ty, $opts:ty, $name:literal): $kind:ident;
        $(#[$start_doc:meta])*
        fn start;
        $(#[$start_with_doc:meta])*
        fn start_with;
    ) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $handle {
            inner: $crate::server::Launcher<$flavor>,
        }

        server_handle!(@$kind $handle, $flavor, $opts, $name,
            [$(#[$start_doc])*], [$(#[$start_with_doc])*]);
    };
    (
        @single $handle:ident, $flavor:ty, $opts:ty, $name:literal,
        [$(#[$start_doc:meta])*], [$(#[$start_with_doc:meta])*]
    ) => {
        impl $handle {
            $(#[$start_doc])*
            pub fn start() -> anyhow::Result<$handle> {
                $handle::start_with(<$opts>::default())
            }

            $(#[$start_with_doc])*
            pub fn start_with(opts: $opts) -> anyhow::Result<$handle> {
                let (port, timeout) = (opts.port, opts.startup_timeout);
                let flavor = <$flavor as $crate::server::Flavor>::new(opts)?;
                let inner = $crate::server::Launcher::single(flavor, port, timeout)?;
                Ok($handle { inner })
            }

            /// The port clients connect to.
            pub fn port(&self) -> u16 {
                self.inner.port(0)
            }

            /// The client endpoint, `"127.0.0.1:PORT"` (no scheme).
            pub fn endpoint(&self) -> String {
                self.inner.endpoint(0)
            }

            #[doc = concat!("Kills ", $name, " (`SIGKILL`, like a crash) and waits for it to exit. ")]
            /// The directory is kept, so [`restart`](Self::restart) finds the
            /// data again. Does nothing if it is already stopped.
            pub fn stop(&mut self) {
                self.inner.kill(0);
            }

            #[doc = concat!("Starts ", $name, " again on the same ports with the same directory ")]
            /// (stopping it first if it runs) and waits until it serves.
            pub fn restart(&mut self) -> anyhow::Result<()> {
                self.inner.restart(0)
            }

            #[doc = concat!("Freezes ", $name, " with `SIGSTOP`: connections stay open but ")]
            /// nothing is answered (as in a long GC pause or a partition).
            ///
            /// # Panics
            ///
            /// If the server is not running.
            pub fn pause(&self) {
                self.inner.pause(0);
            }

            /// Lets a [`pause`](Self::pause)d server run again with `SIGCONT`.
            ///
            /// # Panics
            ///
            /// If the server is not running.
            pub fn resume(&self) {
                self.inner.resume(0);
            }

            /// True while the server process exists and has not exited (a
            /// paused server counts as running).
            pub fn is_running(&self) -> bool {
                self.inner.is_running(0)
            }

            /// True if the server runs and serves right now: the probe
            /// [`start`](Self::start) waits for holds.
            pub fn is_serving(&self) -> bool {
                self.inner.is_ready(0)
            }

            /// The server process's pid while it runs (not the watchdog's).
            pub fn pid(&self) -> Option<u32> {
                self.inner.pid(0)
            }

            /// The server's temporary directory (holds its data and
            /// `server.log`); removed on drop.
            pub fn dir(&self) -> &std::path::Path {
                self.inner.dir(0)
            }

            /// The server log file.
            pub fn log_path(&self) -> &std::path::Path {
                self.inner.log_path(0)
            }

            /// The last `n` lines of the server log.
            pub fn log_tail(&self, n: usize) -> String {
                self.inner.log_tail(0, n)
            }
        }
    };
    (
        @group $handle:ident, $flavor:ty, $opts:ty, $name:literal,
        [$(#[$start_doc:meta])*], [$(#[$start_with_doc:meta])*]
    ) => {
        impl $handle {
            $(#[$start_doc])*
            pub fn start(n: usize) -> anyhow::Result<$handle> {
                $handle::start_with(n, <$opts>::default())
            }

            $(#[$start_with_doc])*
            pub fn start_with(n: usize, opts: $opts) -> anyhow::Result<$handle> {
                let timeout = opts.startup_timeout;
                let flavor = <$flavor as $crate::server::Flavor>::new(opts)?;
                let inner = $crate::server::Launcher::group(flavor, n, timeout)?;
                Ok($handle { inner })
            }

            /// Number of members.
            pub fn len(&self) -> usize {
                self.inner.len()
            }

            /// True if there are no members (never, for a started one).
            pub fn is_empty(&self) -> bool {
                self.inner.len() == 0
            }

            /// Member `i`'s client port.
            pub fn port(&self, i: usize) -> u16 {
                self.inner.port(i)
            }

            /// Kills member `i` (`SIGKILL`) and waits for it to exit; its data
            /// is kept for [`restart`](Self::restart).
            pub fn kill(&mut self, i: usize) {
                self.inner.kill(i);
            }

            /// Starts member `i` again (killing it first if it runs), same ports
            /// and data, and waits until it serves again.
            pub fn restart(&mut self, i: usize) -> anyhow::Result<()> {
                self.inner.restart(i)
            }

            /// Freezes member `i` with `SIGSTOP`. Panics if it is not running.
            pub fn pause(&self, i: usize) {
                self.inner.pause(i);
            }

            /// Resumes member `i` with `SIGCONT`. Panics if it is not running.
            pub fn resume(&self, i: usize) {
                self.inner.resume(i);
            }

            /// True while member `i`'s process runs (paused counts).
            pub fn is_running(&self, i: usize) -> bool {
                self.inner.is_running(i)
            }

            /// True if member `i` runs and serves right now: the probe
            /// [`start`](Self::start) waits for holds.
            pub fn is_serving(&self, i: usize) -> bool {
                self.inner.is_ready(i)
            }

            /// The index of the member that is the leader right now.
            pub fn leader_index(&self) -> Option<usize> {
                self.inner.leader_index()
            }

            #[doc = concat!("Waits until a majority of the ", $name, " members serve and one of ")]
            /// them leads, e.g. after [`kill`](Self::kill) of the leader.
            pub fn wait_for_quorum(&self, timeout: std::time::Duration) -> anyhow::Result<()> {
                self.inner.wait_for_quorum(timeout)
            }

            /// Member `i`'s temporary directory.
            pub fn dir(&self, i: usize) -> &std::path::Path {
                self.inner.dir(i)
            }

            /// Member `i`'s pid while it runs.
            pub fn pid(&self, i: usize) -> Option<u32> {
                self.inner.pid(i)
            }

            /// The last `n` lines of member `i`'s log.
            pub fn log_tail(&self, i: usize, n: usize) -> String {
                self.inner.log_tail(i, n)
            }

            /// Member `i`'s client endpoint, `"127.0.0.1:PORT"`.
            pub fn endpoint(&self, i: usize) -> String {
                self.inner.endpoint(i)
            }

            /// Every member's client endpoint, `"127.0.0.1:PORT"`.
            pub fn endpoints(&self) -> Vec<String> {
                self.inner.endpoints()
            }

            /// All members' client endpoints in one string:
            /// `"127.0.0.1:P1,127.0.0.1:P2,..."`.
            pub fn connect_string(&self) -> String {
                self.inner.endpoints().join(",")
            }
        }
    };
}

pub(crate) use server_handle;
