//! Private ZooKeeper servers: standalone and ensembles.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::process::{find_executable, is_executable};
use crate::server::{expect_shared, not_installed, server_handle, shared, Flavor, Layout, Member};
use crate::util::{zk_conf_contains, zk_four_letter, zk_mode, zk_serving};

const MAIN_CLASS: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";

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
    /// [`free_port`](crate::free_port). Ignored by [`ZkEnsemble`].
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
        return Err(not_installed::<Zk>(
            "`java`",
            "$DLOCK_JAVA, $JAVA_HOME/bin/java, PATH, /usr/bin/java",
        ));
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
    Err(not_installed::<Zk>(
        "the ZooKeeper jars",
        "$DLOCK_ZK_CLASSPATH, /usr/share/java/zookeeper.jar, $ZOOKEEPER_HOME/lib",
    ))
}

/// ZooKeeper's part of the [`Launcher`](crate::server::Launcher): `zoo.cfg`, the JVM command line and
/// the four-letter-word probes.
#[derive(Debug)]
struct Zk {
    install: ZkInstall,
    opts: ZkOptions,
}

impl Flavor for Zk {
    const NAME: &'static str = "ZooKeeper";
    const GROUP: &'static str = "ensemble";
    const DIR: &'static str = "zk";
    const INSTALL_HINT: &'static str = "install it with `scripts/test.sh` (installs the test \
        servers) or `apt-get install -y zookeeper` (Java and the ZooKeeper jars); or point \
        $DLOCK_JAVA / $DLOCK_ZK_CLASSPATH at an existing installation";

    type Options = ZkOptions;

    fn new(opts: ZkOptions) -> Result<Self> {
        let install = zk_install()?;
        Ok(Zk { install, opts })
    }

    fn port_roles(&self, cluster: bool) -> Vec<&'static str> {
        if cluster {
            vec!["client", "quorum", "election"]
        } else {
            vec!["client"]
        }
    }

    fn program(&self) -> &Path {
        &self.install.java
    }

    fn shown_program(&self) -> String {
        format!("{} ... {MAIN_CLASS}", self.install.java.display())
    }

    fn args(&self, layout: &Layout, dir: &Path) -> Result<Vec<OsString>> {
        let opts = &self.opts;
        let data = dir.join("data");
        std::fs::create_dir_all(&data)?;
        let mut cfg = String::new();
        let _ = writeln!(cfg, "tickTime={}", opts.tick_time_ms);
        let _ = writeln!(cfg, "initLimit={}", opts.init_limit);
        let _ = writeln!(cfg, "syncLimit={}", opts.sync_limit);
        let _ = writeln!(cfg, "dataDir={}", data.display());
        let _ = writeln!(cfg, "clientPort={}", layout.ports()[0]);
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
        if let Some(me) = layout.me {
            // myid is 1-based; member i is server.(i+1).
            let _ = writeln!(cfg, "reconfigEnabled=false");
            for (i, p) in layout.all.iter().enumerate() {
                let _ = writeln!(cfg, "server.{}=127.0.0.1:{}:{}", i + 1, p[1], p[2]);
            }
            std::fs::write(data.join("myid"), format!("{}\n", me + 1))?;
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
        args.push(self.install.classpath.clone());
        args.push(MAIN_CLASS.into());
        args.push(cfg_path.into_os_string());
        Ok(args)
    }

    fn ready(&self, m: &Member) -> bool {
        // `conf` naming our data directory proves the answer is ours.
        let ours = format!("dataDir={}", m.dir().join("data").display());
        zk_serving(m.port()) && zk_conf_contains(m.port(), &ours)
    }

    fn not_ready(&self, m: &Member) -> String {
        let port = m.port();
        let mut what = format!("`ruok`/`srvr` on 127.0.0.1:{port} never showed a serving server");
        if let Some(mode) = m.is_running().then(|| zk_mode(port)).flatten() {
            let _ = write!(what, " (last mode: {mode})");
        }
        what
    }

    fn is_leader(&self, m: &Member) -> bool {
        zk_mode(m.port()).as_deref() == Some("leader")
    }
}

server_handle! {
    /// A private standalone ZooKeeper server on a free loopback port, with its
    /// data and log in a temporary directory.
    ///
    /// Dropping it kills the server (`SIGKILL`), waits for it and removes the
    /// directory; if the test process dies first, a watchdog does the same.
    pub struct ZkServer(Zk, ZkOptions, "ZooKeeper"): single;
    /// Starts a server with [`ZkOptions::default`] and waits until it serves.
    fn start;
    /// Starts a server with `opts` and waits (at most `opts.startup_timeout`)
    /// until `ruok` answers `imok` and `srvr` shows `Mode: standalone`.
    ///
    /// If a port chosen by [`free_port`](crate::free_port) turns out to be taken, it retries
    /// with another one (3 attempts).
    ///
    /// # Errors
    ///
    /// If Java or the ZooKeeper jars are missing (the message says how to
    /// install them), or the server does not come up; the message names the
    /// binary and port and shows the end of the server log.
    fn start_with;
}

impl ZkServer {
    /// `"127.0.0.1:PORT"`, the client connect string.
    pub fn connect_string(&self) -> String {
        self.endpoint()
    }

    /// Sends a four-letter word (`ruok`, `srvr`, `mntr`, `cons`, ...) and
    /// returns the answer.
    pub fn four_letter(&self, word: &str) -> std::io::Result<String> {
        zk_four_letter(self.port(), word)
    }
}

server_handle! {
    /// A private ZooKeeper ensemble: `n` members on loopback, each with its own
    /// client, quorum and election port (all from [`free_port`](crate::free_port)) and its own
    /// temporary directory. Members are numbered `0..n` (their ZooKeeper `myid`
    /// is `i + 1`).
    ///
    /// Dropping it kills every member and removes their directories.
    pub struct ZkEnsemble(Zk, ZkOptions, "ZooKeeper"): group;
    /// Starts an `n`-member ensemble with [`ZkOptions::default`] and waits
    /// until every member serves (one leader, the others followers).
    fn start;
    /// Like [`ZkEnsemble::start`] with `opts` (`opts.port` is ignored).
    ///
    /// # Errors
    ///
    /// As [`ZkServer::start_with`]; the message names the member that did not
    /// come up and shows the end of its log.
    fn start_with;
}

impl ZkEnsemble {
    /// Member `i`'s client address, `"127.0.0.1:PORT"` (as
    /// [`endpoint`](Self::endpoint)).
    pub fn address(&self, i: usize) -> String {
        self.endpoint(i)
    }

    /// Member `i`'s mode from `srvr` (`"leader"`, `"follower"`, ...), `None`
    /// if it does not serve.
    pub fn mode(&self, i: usize) -> Option<String> {
        self.is_running(i).then(|| zk_mode(self.port(i))).flatten()
    }

    /// Sends a four-letter word to member `i`.
    pub fn four_letter(&self, i: usize, word: &str) -> std::io::Result<String> {
        zk_four_letter(self.port(i), word)
    }
}

static SHARED_ZK: OnceLock<Result<ZkServer, String>> = OnceLock::new();

/// Like [`shared_zk`] but returns the start-up error instead of panicking.
/// A failed start is remembered: later calls fail at once with the same
/// message.
pub fn try_shared_zk() -> Result<&'static ZkServer> {
    shared(&SHARED_ZK, ZkServer::start)
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
    expect_shared(try_shared_zk(), "ZooKeeper")
}
