//! Private ZooKeeper servers: standalone and ensembles.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use crate::port::{free_port, is_port_conflict, port_is_free, IN_USE};
use crate::process::{find_executable, is_executable, Node};
use crate::util::{zk_conf_contains, zk_four_letter, zk_mode, zk_serving};

const INSTALL_HINT: &str = "install it with `scripts/test.sh` (installs the test servers) or \
     `apt-get install -y zookeeper` (Java and the ZooKeeper jars); or point $DLOCK_JAVA / \
     $DLOCK_ZK_CLASSPATH at an existing installation";
const MAIN_CLASS: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";
const LOG_LINES: usize = 40;
const START_ATTEMPTS: usize = 3;

/// Settings for a private ZooKeeper server or ensemble.
///
/// [`ZkOptions::default`] gives the settings tests want: `tickTime=500`
/// (so the minimum session timeout is 1 s), `maxSessionTimeout=60000`,
/// container nodes checked every 100 ms, `forceSync=yes`.
#[derive(Debug, Clone)]
pub struct ZkOptions {
    /// `tickTime` in milliseconds (default 500). ZooKeeper's default minimum
    /// session timeout is 2 ticks, its default maximum 20 ticks.
    pub tick_time_ms: u32,
    /// `initLimit` in ticks (default 10).
    pub init_limit: u32,
    /// `syncLimit` in ticks (default 5).
    pub sync_limit: u32,
    /// `minSessionTimeout` in ms; `None` leaves ZooKeeper's default (2 ticks).
    pub min_session_timeout_ms: Option<u32>,
    /// `maxSessionTimeout` in ms (default `Some(60_000)`); `None` leaves
    /// ZooKeeper's default (20 ticks, i.e. 10 s with the default tick).
    pub max_session_timeout_ms: Option<u32>,
    /// JVM property `znode.container.checkIntervalMs`: how often empty
    /// container nodes are deleted (default 100; ZooKeeper's own is 60000).
    pub container_check_interval_ms: u64,
    /// `forceSync` (default `true`: fsync the transaction log).
    pub force_sync: bool,
    /// Client port for a standalone server; `None` (default) picks one with
    /// [`free_port`]. Ignored by [`ZkEnsemble`].
    pub port: Option<u16>,
    /// More `key=value` lines for `zoo.cfg` (written after the defaults, so
    /// they win).
    pub extra_cfg: Vec<(String, String)>,
    /// More JVM arguments (e.g. `-Dzookeeper.snapCount=100`), placed after
    /// the defaults.
    pub extra_jvm_args: Vec<String>,
    /// How long to wait for the server (or every ensemble member) to serve
    /// (default 30 s).
    pub startup_timeout: Duration,
}

impl Default for ZkOptions {
    fn default() -> Self {
        ZkOptions {
            tick_time_ms: 500,
            init_limit: 10,
            sync_limit: 5,
            min_session_timeout_ms: None,
            max_session_timeout_ms: Some(60_000),
            container_check_interval_ms: 100,
            force_sync: true,
            port: None,
            extra_cfg: Vec::new(),
            extra_jvm_args: Vec::new(),
            startup_timeout: Duration::from_secs(30),
        }
    }
}

/// Where Java and the ZooKeeper jars are.
#[derive(Debug, Clone)]
struct ZkInstall {
    java: PathBuf,
    classpath: OsString,
}

fn zk_install() -> Result<ZkInstall> {
    let java = match std::env::var_os("JAVA_HOME").map(|h| Path::new(&h).join("bin/java")) {
        Some(p) if std::env::var_os("DLOCK_JAVA").is_none() && is_executable(&p) => Some(p),
        _ => find_executable("DLOCK_JAVA", "java", &[PathBuf::from("/usr/bin/java")]),
    };
    let Some(java) = java else {
        bail!(
            "cannot start ZooKeeper: `java` not found (looked at $DLOCK_JAVA, $JAVA_HOME/bin/java, PATH, \
             /usr/bin/java); {INSTALL_HINT}"
        );
    };
    if let Some(cp) = std::env::var_os("DLOCK_ZK_CLASSPATH").filter(|v| !v.is_empty()) {
        return Ok(ZkInstall {
            java,
            classpath: cp,
        });
    }
    let debian = Path::new("/usr/share/java/zookeeper.jar");
    if debian.is_file() {
        // The jar's manifest Class-Path names its dependencies; add a logger.
        let mut cp = OsString::from(debian);
        for binding in [
            "/usr/share/java/slf4j-simple.jar",
            "/usr/share/java/slf4j-nop.jar",
        ] {
            if Path::new(binding).is_file() {
                cp.push(":");
                cp.push(binding);
                break;
            }
        }
        return Ok(ZkInstall {
            java,
            classpath: cp,
        });
    }
    if let Some(home) = std::env::var_os("ZOOKEEPER_HOME").map(PathBuf::from) {
        if home.join("lib").is_dir() {
            let mut cp = OsString::from(home.join("lib/*"));
            cp.push(":");
            cp.push(home.join("conf"));
            return Ok(ZkInstall {
                java,
                classpath: cp,
            });
        }
    }
    bail!(
        "cannot start ZooKeeper: the ZooKeeper jars were not found (looked at $DLOCK_ZK_CLASSPATH, \
         /usr/share/java/zookeeper.jar, $ZOOKEEPER_HOME/lib); {INSTALL_HINT}"
    )
}

/// One ZooKeeper process (standalone server or ensemble member).
#[derive(Debug)]
struct ZkNode {
    node: Node,
    /// `myid` (0 for standalone).
    id: u32,
    port: u16,
    /// This member's quorum and election ports (empty for standalone).
    peer_ports: Vec<u16>,
    /// `dataDir=...` as `conf` reports it: proves the answering server is ours.
    conf_data_dir: String,
}

impl ZkNode {
    /// Writes `zoo.cfg` (+ `myid`) into a fresh directory. `servers` is the
    /// ensemble as `(id, quorum port, election port)`, empty for standalone.
    fn new(
        install: &ZkInstall,
        opts: &ZkOptions,
        id: u32,
        port: u16,
        servers: &[(u32, u16, u16)],
    ) -> Result<ZkNode> {
        let prefix = if servers.is_empty() {
            "zk".to_string()
        } else {
            format!("zk{id}")
        };
        let node = Node::new(&prefix, install.java.clone(), Vec::new(), |dir| {
            let data = dir.join("data");
            std::fs::create_dir_all(&data)?;
            let mut cfg = String::new();
            let _ = writeln!(cfg, "tickTime={}", opts.tick_time_ms);
            let _ = writeln!(cfg, "initLimit={}", opts.init_limit);
            let _ = writeln!(cfg, "syncLimit={}", opts.sync_limit);
            let _ = writeln!(cfg, "dataDir={}", data.display());
            let _ = writeln!(cfg, "clientPort={port}");
            let _ = writeln!(cfg, "clientPortAddress=127.0.0.1");
            let _ = writeln!(cfg, "maxClientCnxns=0");
            let _ = writeln!(cfg, "4lw.commands.whitelist=*");
            let _ = writeln!(cfg, "admin.enableServer=false");
            let _ = writeln!(cfg, "extendedTypesEnabled=true");
            let _ = writeln!(
                cfg,
                "forceSync={}",
                if opts.force_sync { "yes" } else { "no" }
            );
            let _ = writeln!(cfg, "autopurge.purgeInterval=0");
            if let Some(v) = opts.min_session_timeout_ms {
                let _ = writeln!(cfg, "minSessionTimeout={v}");
            }
            if let Some(v) = opts.max_session_timeout_ms {
                let _ = writeln!(cfg, "maxSessionTimeout={v}");
            }
            if !servers.is_empty() {
                let _ = writeln!(cfg, "reconfigEnabled=false");
                for (sid, q, e) in servers {
                    let _ = writeln!(cfg, "server.{sid}=127.0.0.1:{q}:{e}");
                }
                std::fs::write(data.join("myid"), format!("{id}\n"))?;
            }
            for (k, v) in &opts.extra_cfg {
                let _ = writeln!(cfg, "{k}={v}");
            }
            let cfg_path = dir.join("zoo.cfg");
            std::fs::write(&cfg_path, cfg).context("cannot write zoo.cfg")?;

            let mut args: Vec<OsString> = [
                "-Xmx256m",
                "-Xms32m",
                "-Xss512k",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-Xshare:auto",
                "-XX:-UsePerfData",
                "-XX:+ExitOnOutOfMemoryError",
                "-Djava.awt.headless=true",
                "-Djava.net.preferIPv4Stack=true",
                "-Dzookeeper.extendedTypesEnabled=true",
                "-Dzookeeper.4lw.commands.whitelist=*",
                "-Dzookeeper.admin.enableServer=false",
                "-Dzookeeper.jmx.log4j.disable=true",
                "-Dzookeeper.preAllocSize=4096",
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
                "-Dorg.slf4j.simpleLogger.showDateTime=true",
                "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
            ]
            .iter()
            .map(OsString::from)
            .collect();
            args.push(format!("-XX:ErrorFile={}/hs_err_%p.log", dir.display()).into());
            args.push(
                format!(
                    "-Dznode.container.checkIntervalMs={}",
                    opts.container_check_interval_ms
                )
                .into(),
            );
            args.extend(opts.extra_jvm_args.iter().map(OsString::from));
            args.push("-cp".into());
            args.push(install.classpath.clone());
            args.push(MAIN_CLASS.into());
            args.push(cfg_path.into_os_string());
            Ok(args)
        })?;
        let peer_ports = servers
            .iter()
            .filter(|(sid, _, _)| *sid == id)
            .flat_map(|&(_, q, e)| [q, e])
            .collect();
        let conf_data_dir = format!("dataDir={}", node.dir().join("data").display());
        Ok(ZkNode {
            node,
            id,
            port,
            peer_ports,
            conf_data_dir,
        })
    }

    fn describe(&self) -> String {
        let who = if self.id == 0 {
            "ZooKeeper".to_string()
        } else {
            format!(
                "ZooKeeper ensemble member {} (myid {})",
                self.id - 1,
                self.id
            )
        };
        format!(
            "{who} ({} ... {MAIN_CLASS}, client port 127.0.0.1:{}, dir {})",
            self.node.program().display(),
            self.port,
            self.node.dir().display()
        )
    }

    fn error(&self, what: &str) -> anyhow::Error {
        anyhow!(
            "{} {what}\n--- last {LOG_LINES} lines of {} ---\n{}",
            self.describe(),
            self.node.log().display(),
            self.node.log_tail(LOG_LINES)
        )
    }

    fn launch(&mut self) -> Result<()> {
        self.node.stop();
        let desc = self.describe();
        if let Some(p) = std::iter::once(self.port)
            .chain(self.peer_ports.iter().copied())
            .find(|&p| !port_is_free(p))
        {
            bail!("cannot start {desc}: 127.0.0.1:{p} {IN_USE}");
        }
        self.node
            .launch()
            .with_context(|| format!("cannot start {desc}"))
    }

    fn wait_serving(&self, deadline: Instant) -> Result<()> {
        let port = self.port;
        self.node
            .wait_until(deadline, || {
                zk_serving(port) && zk_conf_contains(port, &self.conf_data_dir)
            })
            .map_err(|why| {
                let mut what = format!(
                    "{why}: `ruok`/`srvr` on 127.0.0.1:{port} never showed a serving server"
                );
                if let Some(mode) = self.node.is_running().then(|| zk_mode(port)).flatten() {
                    let _ = write!(what, " (last mode: {mode})");
                }
                self.error(&what)
            })
    }

    fn pause(&self) {
        if let Err(e) = self.node.signal(libc::SIGSTOP) {
            panic!("dlock-testkit: cannot pause {}: {e}", self.describe());
        }
    }

    fn resume(&self) {
        if let Err(e) = self.node.signal(libc::SIGCONT) {
            panic!("dlock-testkit: cannot resume {}: {e}", self.describe());
        }
    }
}

/// A private standalone ZooKeeper server on a free loopback port, with its
/// data and log in a temporary directory.
///
/// Dropping it kills the server (`SIGKILL`), waits for it and removes the
/// directory; if the test process dies first, a watchdog does the same.
#[derive(Debug)]
pub struct ZkServer {
    node: ZkNode,
    startup_timeout: Duration,
}

impl ZkServer {
    /// Starts a server with [`ZkOptions::default`] and waits until it serves.
    pub fn start() -> Result<ZkServer> {
        ZkServer::start_with(ZkOptions::default())
    }

    /// Starts a server with `opts` and waits (at most `opts.startup_timeout`)
    /// until `ruok` answers `imok` and `srvr` shows `Mode: standalone`.
    ///
    /// If a port chosen by [`free_port`] turns out to be taken, it retries
    /// with another one (3 attempts).
    ///
    /// # Errors
    ///
    /// If Java or the ZooKeeper jars are missing (the message says how to
    /// install them), or the server does not come up; the message names the
    /// binary and port and shows the end of the server log.
    pub fn start_with(opts: ZkOptions) -> Result<ZkServer> {
        let install = zk_install()?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = opts.port.unwrap_or_else(free_port);
            let mut node = ZkNode::new(&install, &opts, 0, port, &[])?;
            let result = node
                .launch()
                .and_then(|()| node.wait_serving(Instant::now() + opts.startup_timeout));
            match result {
                Ok(()) => {
                    return Ok(ZkServer {
                        node,
                        startup_timeout: opts.startup_timeout,
                    })
                }
                Err(e)
                    if opts.port.is_none()
                        && attempt < START_ATTEMPTS
                        && is_port_conflict(&e, node.node.log_says_address_in_use()) =>
                {
                    continue
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// `"127.0.0.1:PORT"`, the client connect string.
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.node.port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.node.port
    }

    /// Kills the server (`SIGKILL`, like a crash) and waits for it to exit.
    /// The data directory is kept, so [`ZkServer::restart`] recovers the
    /// data. Does nothing if it is already stopped.
    pub fn stop(&mut self) {
        self.node.node.stop();
    }

    /// Starts the server again on the same port with the same data directory
    /// (stopping it first if it is running) and waits until it serves.
    pub fn restart(&mut self) -> Result<()> {
        self.node.launch()?;
        self.node
            .wait_serving(Instant::now() + self.startup_timeout)
    }

    /// Freezes the server's Java process with `SIGSTOP`: connections stay
    /// open but nothing is answered (as in a long GC pause or a partition).
    ///
    /// # Panics
    ///
    /// If the server is not running.
    pub fn pause(&self) {
        self.node.pause();
    }

    /// Lets a [`ZkServer::pause`]d server run again with `SIGCONT`.
    ///
    /// # Panics
    ///
    /// If the server is not running.
    pub fn resume(&self) {
        self.node.resume();
    }

    /// True while the Java process exists and has not exited (a paused
    /// server counts as running).
    pub fn is_running(&self) -> bool {
        self.node.node.is_running()
    }

    /// The Java process's pid while it runs (not the watchdog's).
    pub fn pid(&self) -> Option<u32> {
        self.node.node.pid()
    }

    /// The server's temporary directory (holds `zoo.cfg`, `data/` and
    /// `server.log`); removed on drop.
    pub fn dir(&self) -> &Path {
        self.node.node.dir()
    }

    /// The server log file.
    pub fn log_path(&self) -> &Path {
        self.node.node.log()
    }

    /// The last `n` lines of the server log.
    pub fn log_tail(&self, n: usize) -> String {
        self.node.node.log_tail(n)
    }

    /// Sends a four-letter word (`ruok`, `srvr`, `mntr`, `cons`, ...) and
    /// returns the answer.
    pub fn four_letter(&self, word: &str) -> std::io::Result<String> {
        zk_four_letter(self.node.port, word)
    }

    /// True if the server answers `ruok` and `srvr` shows it serving.
    pub fn is_serving(&self) -> bool {
        zk_serving(self.node.port)
    }
}

/// A private ZooKeeper ensemble: `n` members on loopback, each with its own
/// client, quorum and election port (all from [`free_port`]) and its own
/// temporary directory. Members are numbered `0..n` (their ZooKeeper `myid`
/// is `i + 1`).
///
/// Dropping it kills every member and removes their directories.
#[derive(Debug)]
pub struct ZkEnsemble {
    nodes: Vec<ZkNode>,
    startup_timeout: Duration,
}

impl ZkEnsemble {
    /// Starts an `n`-member ensemble with [`ZkOptions::default`] and waits
    /// until every member serves (one leader, the others followers).
    pub fn start(n: usize) -> Result<ZkEnsemble> {
        ZkEnsemble::start_with(n, ZkOptions::default())
    }

    /// Like [`ZkEnsemble::start`] with `opts` (`opts.port` is ignored).
    ///
    /// # Errors
    ///
    /// As [`ZkServer::start_with`]; the message names the member that did not
    /// come up and shows the end of its log.
    pub fn start_with(n: usize, opts: ZkOptions) -> Result<ZkEnsemble> {
        if n == 0 {
            bail!("a ZooKeeper ensemble needs at least one member");
        }
        let install = zk_install()?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let servers: Vec<(u32, u16, u16)> = (1..=n as u32)
                .map(|id| (id, free_port(), free_port()))
                .collect();
            let mut nodes = Vec::with_capacity(n);
            for &(id, _, _) in &servers {
                nodes.push(ZkNode::new(&install, &opts, id, free_port(), &servers)?);
            }
            let launched = nodes.iter_mut().try_for_each(|n| n.launch());
            let ens = ZkEnsemble {
                nodes,
                startup_timeout: opts.startup_timeout,
            };
            let deadline = Instant::now() + opts.startup_timeout;
            let result =
                launched.and_then(|()| ens.nodes.iter().try_for_each(|n| n.wait_serving(deadline)));
            match result {
                Ok(()) => return Ok(ens),
                Err(e)
                    if attempt < START_ATTEMPTS
                        && is_port_conflict(
                            &e,
                            ens.nodes.iter().any(|n| n.node.log_says_address_in_use()),
                        ) =>
                {
                    continue
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True if the ensemble has no members (never, for a started one).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// All members' client addresses: `"127.0.0.1:P1,127.0.0.1:P2,..."`.
    pub fn connect_string(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Member `i`'s client address, `"127.0.0.1:PORT"`.
    pub fn address(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.nodes[i].port)
    }

    /// Member `i`'s client port.
    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].port
    }

    /// Kills member `i` (`SIGKILL`) and waits for it to exit; its data is
    /// kept for [`ZkEnsemble::restart`].
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].node.stop();
    }

    /// Starts member `i` again (killing it first if it runs), same ports and
    /// data, and waits until it serves again (rejoined the quorum).
    pub fn restart(&mut self, i: usize) -> Result<()> {
        let timeout = self.startup_timeout;
        let node = &mut self.nodes[i];
        node.launch()?;
        node.wait_serving(Instant::now() + timeout)
    }

    /// Freezes member `i` with `SIGSTOP`. Panics if it is not running.
    pub fn pause(&self, i: usize) {
        self.nodes[i].pause();
    }

    /// Resumes member `i` with `SIGCONT`. Panics if it is not running.
    pub fn resume(&self, i: usize) {
        self.nodes[i].resume();
    }

    /// True while member `i`'s Java process runs (paused counts).
    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].node.is_running()
    }

    /// True if member `i` answers `ruok` and `srvr` shows it serving.
    pub fn is_serving(&self, i: usize) -> bool {
        self.nodes[i].node.is_running() && zk_serving(self.nodes[i].port)
    }

    /// Member `i`'s mode from `srvr` (`"leader"`, `"follower"`, ...), `None`
    /// if it does not serve.
    pub fn mode(&self, i: usize) -> Option<String> {
        if !self.nodes[i].node.is_running() {
            return None;
        }
        zk_mode(self.nodes[i].port)
    }

    /// The index of the member that currently reports `Mode: leader`.
    pub fn leader_index(&self) -> Option<usize> {
        (0..self.nodes.len()).find(|&i| self.mode(i).as_deref() == Some("leader"))
    }

    /// Sends a four-letter word to member `i`.
    pub fn four_letter(&self, i: usize, word: &str) -> std::io::Result<String> {
        zk_four_letter(self.nodes[i].port, word)
    }

    /// Waits until a majority of members serve and one of them is the
    /// leader, e.g. after [`ZkEnsemble::kill`] of the leader.
    pub fn wait_for_quorum(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let majority = self.nodes.len() / 2 + 1;
        loop {
            let serving = (0..self.nodes.len())
                .filter(|&i| self.is_serving(i))
                .count();
            if serving >= majority && self.leader_index().is_some() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let mut msg = format!(
                    "ZooKeeper ensemble ({}) has no serving quorum after {timeout:?}: {serving} of {} serving",
                    self.connect_string(),
                    self.nodes.len()
                );
                for n in &self.nodes {
                    let _ = write!(
                        msg,
                        "\n--- member {} (127.0.0.1:{}), last 15 lines of {} ---\n{}",
                        n.id - 1,
                        n.port,
                        n.node.log().display(),
                        n.node.log_tail(15)
                    );
                }
                bail!(msg);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Member `i`'s temporary directory.
    pub fn dir(&self, i: usize) -> &Path {
        self.nodes[i].node.dir()
    }

    /// Member `i`'s Java pid while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].node.pid()
    }

    /// The last `n` lines of member `i`'s log.
    pub fn log_tail(&self, i: usize, n: usize) -> String {
        self.nodes[i].node.log_tail(n)
    }
}

static SHARED_ZK: OnceLock<Result<ZkServer, String>> = OnceLock::new();

/// Like [`shared_zk`] but returns the start-up error instead of panicking.
/// A failed start is remembered: later calls fail at once with the same
/// message.
pub fn try_shared_zk() -> Result<&'static ZkServer> {
    match SHARED_ZK.get_or_init(|| ZkServer::start().map_err(|e| format!("{e:#}"))) {
        Ok(s) => Ok(s),
        Err(e) => Err(anyhow!("{e}")),
    }
}

/// One standalone ZooKeeper server per test process, started on first use
/// with [`ZkOptions::default`] and shared by every test in the process (give
/// each test its own znode paths). It is never dropped; the watchdog kills it
/// and removes its directory when the process exits. Don't pause it; start a
/// private [`ZkServer`] for tests that stop, restart or pause servers.
///
/// # Panics
///
/// If the server cannot be started (the message says why, as
/// [`ZkServer::start`]'s error does).
pub fn shared_zk() -> &'static ZkServer {
    try_shared_zk().unwrap_or_else(|e| {
        panic!("dlock-testkit: cannot start the shared ZooKeeper server: {e:#}")
    })
}
