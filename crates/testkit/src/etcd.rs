//! Private etcd servers: single member and clusters.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use crate::port::{free_port, is_port_conflict, port_is_free, IN_USE};
use crate::process::{find_executable, Node};
use crate::util::{etcd_healthy, etcd_is_leader, http_get};

const INSTALL_HINT: &str = "install it with `scripts/test.sh` (installs the test servers) or \
     `apt-get install -y etcd-server`; or point $DLOCK_ETCD at an etcd binary";
const LOG_LINES: usize = 40;
const START_ATTEMPTS: usize = 3;

static TOKEN: AtomicU64 = AtomicU64::new(0);

/// Settings for a private etcd server or cluster.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// Client port for a single server; `None` (default) picks one with
    /// [`free_port`]. Ignored by [`EtcdCluster`].
    pub port: Option<u16>,
    /// `--heartbeat-interval` in ms (default 100, etcd's default).
    pub heartbeat_interval_ms: u32,
    /// `--election-timeout` in ms (default 1000, etcd's default).
    pub election_timeout_ms: u32,
    /// `--auto-compaction-retention` (e.g. `"1"` hour, or `"100"` revisions
    /// with `--auto-compaction-mode=revision` in `extra_args`); `None`
    /// (default) disables auto compaction.
    pub auto_compaction_retention: Option<String>,
    /// More command-line flags, placed after the defaults.
    pub extra_args: Vec<String>,
    /// How long to wait for `/health` (of every member) to say `true`
    /// (default 30 s).
    pub startup_timeout: Duration,
    /// Serve clients over TLS only (`https://`); `/health` and `/metrics`
    /// then move to a plain-HTTP port of their own. `None` (default): plain
    /// HTTP.
    pub tls: Option<EtcdTls>,
}

/// The server side of TLS for a private etcd: PEM files (see
/// [`TestCerts`](crate::TestCerts) to make them).
#[derive(Debug, Clone)]
pub struct EtcdTls {
    /// The server certificate (`--cert-file`).
    pub cert_file: PathBuf,
    /// Its private key (`--key-file`).
    pub key_file: PathBuf,
    /// If set, clients must present a certificate signed by this CA
    /// (`--client-cert-auth --trusted-ca-file`).
    pub client_ca_file: Option<PathBuf>,
}

impl EtcdTls {
    /// TLS with `certs`' server certificate; with `client_auth`, clients
    /// must also present a certificate of `certs`' CA.
    pub fn from_certs(certs: &crate::TestCerts, client_auth: bool) -> EtcdTls {
        EtcdTls {
            cert_file: certs.server_cert.clone(),
            key_file: certs.server_key.clone(),
            client_ca_file: client_auth.then(|| certs.ca.clone()),
        }
    }
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            port: None,
            heartbeat_interval_ms: 100,
            election_timeout_ms: 1000,
            auto_compaction_retention: None,
            extra_args: Vec::new(),
            startup_timeout: Duration::from_secs(30),
            tls: None,
        }
    }
}

fn etcd_binary() -> Result<PathBuf> {
    find_executable("DLOCK_ETCD", "etcd", &[PathBuf::from("/usr/bin/etcd"), PathBuf::from("/usr/local/bin/etcd")])
        .ok_or_else(|| {
            anyhow!("cannot start etcd: the `etcd` binary was not found (looked at $DLOCK_ETCD, PATH, /usr/bin/etcd); {INSTALL_HINT}")
        })
}

/// One etcd process (single server or cluster member).
#[derive(Debug)]
struct EtcdNode {
    node: Node,
    /// Member index (0-based); `None` for a single server.
    index: Option<usize>,
    client_port: u16,
    peer_port: u16,
    /// Where `/health` and `/metrics` answer in plain HTTP: the client
    /// port, or a port of their own under TLS.
    probe_port: u16,
    /// Clients are served over TLS only.
    tls: bool,
}

impl EtcdNode {
    /// `members` is the whole cluster as `(client port, peer port)`; this
    /// node is `members[index]`.
    fn new(
        bin: &Path,
        opts: &EtcdOptions,
        members: &[(u16, u16)],
        index: usize,
        single: bool,
        token: &str,
    ) -> Result<EtcdNode> {
        let (client_port, peer_port) = members[index];
        let probe_port = if opts.tls.is_some() {
            free_port()
        } else {
            client_port
        };
        let scheme = if opts.tls.is_some() { "https" } else { "http" };
        let name = |i: usize| format!("m{i}");
        let initial_cluster = members
            .iter()
            .enumerate()
            .map(|(i, (_, p))| format!("{}=http://127.0.0.1:{p}", name(i)))
            .collect::<Vec<_>>()
            .join(",");
        let prefix = if single {
            "etcd".to_string()
        } else {
            format!("etcd{index}")
        };
        let mut env = Vec::new();
        if cfg!(target_arch = "aarch64") {
            env.push(("ETCD_UNSUPPORTED_ARCH".to_string(), "arm64".to_string()));
        }
        let node = Node::new(&prefix, bin.to_path_buf(), env, |dir| {
            let client = format!("{scheme}://127.0.0.1:{client_port}");
            let peer = format!("http://127.0.0.1:{peer_port}");
            let mut args: Vec<String> = vec![
                "--name".into(),
                name(index),
                "--data-dir".into(),
                dir.join("data").display().to_string(),
                "--listen-client-urls".into(),
                client.clone(),
                "--advertise-client-urls".into(),
                client,
                "--listen-peer-urls".into(),
                peer.clone(),
                "--initial-advertise-peer-urls".into(),
                peer,
                "--initial-cluster".into(),
                initial_cluster,
                "--initial-cluster-state".into(),
                "new".into(),
                "--initial-cluster-token".into(),
                token.to_string(),
                "--heartbeat-interval".into(),
                opts.heartbeat_interval_ms.to_string(),
                "--election-timeout".into(),
                opts.election_timeout_ms.to_string(),
                "--logger".into(),
                "zap".into(),
                "--log-outputs".into(),
                "stderr".into(),
            ];
            if let Some(tls) = &opts.tls {
                args.push("--cert-file".into());
                args.push(tls.cert_file.display().to_string());
                args.push("--key-file".into());
                args.push(tls.key_file.display().to_string());
                if let Some(ca) = &tls.client_ca_file {
                    args.push("--client-cert-auth".into());
                    args.push("--trusted-ca-file".into());
                    args.push(ca.display().to_string());
                }
                args.push("--listen-metrics-urls".into());
                args.push(format!("http://127.0.0.1:{probe_port}"));
            }
            if let Some(r) = &opts.auto_compaction_retention {
                args.push("--auto-compaction-retention".into());
                args.push(r.clone());
            }
            args.extend(opts.extra_args.iter().cloned());
            Ok(args.into_iter().map(OsString::from).collect())
        })?;
        Ok(EtcdNode {
            node,
            index: if single { None } else { Some(index) },
            client_port,
            peer_port,
            probe_port,
            tls: opts.tls.is_some(),
        })
    }

    fn describe(&self) -> String {
        let who = match self.index {
            None => "etcd".to_string(),
            Some(i) => format!("etcd cluster member {i}"),
        };
        format!(
            "{who} ({}, client 127.0.0.1:{}, peer 127.0.0.1:{}, dir {})",
            self.node.program().display(),
            self.client_port,
            self.peer_port,
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
        if let Some(p) = [self.client_port, self.peer_port, self.probe_port]
            .into_iter()
            .find(|&p| !port_is_free(p))
        {
            bail!("cannot start {desc}: 127.0.0.1:{p} {IN_USE}");
        }
        self.node
            .launch()
            .with_context(|| format!("cannot start {desc}"))
    }

    fn wait_healthy(&self, deadline: Instant) -> Result<()> {
        let port = self.probe_port;
        self.node
            .wait_until(deadline, || etcd_healthy(port))
            .map_err(|why| {
                let mut what = format!(
                    "{why}: GET http://127.0.0.1:{port}/health never said {{\"health\":\"true\"}}"
                );
                if self.node.is_running() {
                    match http_get(port, "/health") {
                        Ok((code, body)) => {
                            what.push_str(&format!(" (last answer: {code} {})", body.trim()))
                        }
                        Err(e) => what.push_str(&format!(" (last answer: {e})")),
                    }
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

fn new_token() -> String {
    format!(
        "dlock-testkit-{}-{}",
        std::process::id(),
        TOKEN.fetch_add(1, Ordering::Relaxed)
    )
}

/// A private single-member etcd on free loopback ports (client and peer),
/// with its data and log in a temporary directory.
///
/// Dropping it kills etcd (`SIGKILL`), waits for it and removes the
/// directory; if the test process dies first, a watchdog does the same.
#[derive(Debug)]
pub struct EtcdServer {
    node: EtcdNode,
    startup_timeout: Duration,
}

impl EtcdServer {
    /// Starts etcd with [`EtcdOptions::default`] and waits until `/health`
    /// says `true`.
    pub fn start() -> Result<EtcdServer> {
        EtcdServer::start_with(EtcdOptions::default())
    }

    /// Starts etcd with `opts` and waits (at most `opts.startup_timeout`)
    /// until `GET /health` answers `{"health":"true"}`. Retries with other
    /// ports if a chosen port turns out to be taken (3 attempts).
    ///
    /// # Errors
    ///
    /// If the `etcd` binary is missing (the message says how to install it)
    /// or etcd does not come up; the message names the binary and ports and
    /// shows the end of its log.
    pub fn start_with(opts: EtcdOptions) -> Result<EtcdServer> {
        let bin = etcd_binary()?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let members = [(opts.port.unwrap_or_else(free_port), free_port())];
            let mut node = EtcdNode::new(&bin, &opts, &members, 0, true, &new_token())?;
            let result = node
                .launch()
                .and_then(|()| node.wait_healthy(Instant::now() + opts.startup_timeout));
            match result {
                Ok(()) => {
                    return Ok(EtcdServer {
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

    /// The client endpoint as `"127.0.0.1:PORT"` (host:port, no scheme).
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.node.client_port)
    }

    /// The client URL, `"http://127.0.0.1:PORT"` (`https://` with TLS).
    pub fn url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme(), self.node.client_port)
    }

    fn scheme(&self) -> &'static str {
        if self.node.tls {
            "https"
        } else {
            "http"
        }
    }

    /// Runs `etcdctl` (API v3) against this server with `args` and returns
    /// its standard output; an error carries its exit status and standard
    /// error. Plain-HTTP servers only.
    ///
    /// ```no_run
    /// let etcd = dlock_testkit::EtcdServer::start()?;
    /// etcd.etcdctl(&["put", "/a", "1"])?;
    /// assert_eq!(etcd.etcdctl(&["get", "--print-value-only", "/a"])?.trim(), "1");
    /// # Ok::<(), anyhow::Error>(())
    /// ```
    pub fn etcdctl(&self, args: &[&str]) -> Result<String> {
        if self.scheme() == "https" {
            bail!("EtcdServer::etcdctl speaks plain HTTP; this server serves TLS");
        }
        let bin = find_executable(
            "DLOCK_ETCDCTL",
            "etcdctl",
            &[PathBuf::from("/usr/bin/etcdctl")],
        )
        .ok_or_else(|| {
            anyhow!(
                "`etcdctl` was not found (looked at $DLOCK_ETCDCTL, PATH, /usr/bin/etcdctl); \
                 install it with `scripts/test.sh` or `apt-get install -y etcd-client`"
            )
        })?;
        let out = std::process::Command::new(&bin)
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.url()))
            .args(args)
            .output()
            .with_context(|| format!("cannot run {}", bin.display()))?;
        if !out.status.success() {
            bail!(
                "etcdctl {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.node.client_port
    }

    /// The peer (raft) port.
    pub fn peer_port(&self) -> u16 {
        self.node.peer_port
    }

    /// Kills etcd (`SIGKILL`) and waits for it to exit; the data directory
    /// is kept for [`EtcdServer::restart`]. Does nothing if already stopped.
    pub fn stop(&mut self) {
        self.node.node.stop();
    }

    /// Starts etcd again on the same ports with the same data (stopping it
    /// first if it runs) and waits until it is healthy.
    pub fn restart(&mut self) -> Result<()> {
        self.node.launch()?;
        self.node
            .wait_healthy(Instant::now() + self.startup_timeout)
    }

    /// Freezes etcd with `SIGSTOP`. Panics if it is not running.
    pub fn pause(&self) {
        self.node.pause();
    }

    /// Resumes a paused etcd with `SIGCONT`. Panics if it is not running.
    pub fn resume(&self) {
        self.node.resume();
    }

    /// True while the etcd process exists and has not exited (paused counts).
    pub fn is_running(&self) -> bool {
        self.node.node.is_running()
    }

    /// True if `/health` says `true` right now.
    pub fn is_healthy(&self) -> bool {
        etcd_healthy(self.node.probe_port)
    }

    /// The etcd pid while it runs (not the watchdog's).
    pub fn pid(&self) -> Option<u32> {
        self.node.node.pid()
    }

    /// The temporary directory (holds `data/` and `server.log`); removed on
    /// drop.
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
}

/// A private etcd cluster of `n` members on loopback, each with its own
/// client and peer port and temporary directory. Members are numbered `0..n`.
///
/// Dropping it kills every member and removes their directories.
#[derive(Debug)]
pub struct EtcdCluster {
    nodes: Vec<EtcdNode>,
    startup_timeout: Duration,
}

impl EtcdCluster {
    /// Starts an `n`-member cluster with [`EtcdOptions::default`] and waits
    /// until every member's `/health` says `true`.
    pub fn start(n: usize) -> Result<EtcdCluster> {
        EtcdCluster::start_with(n, EtcdOptions::default())
    }

    /// Like [`EtcdCluster::start`] with `opts` (`opts.port` is ignored).
    ///
    /// # Errors
    ///
    /// As [`EtcdServer::start_with`]; the message names the member that did
    /// not become healthy and shows the end of its log.
    pub fn start_with(n: usize, opts: EtcdOptions) -> Result<EtcdCluster> {
        if n == 0 {
            bail!("an etcd cluster needs at least one member");
        }
        let bin = etcd_binary()?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let members: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
            let token = new_token();
            let mut nodes = Vec::with_capacity(n);
            for i in 0..n {
                nodes.push(EtcdNode::new(&bin, &opts, &members, i, false, &token)?);
            }
            let launched = nodes.iter_mut().try_for_each(|n| n.launch());
            let cluster = EtcdCluster {
                nodes,
                startup_timeout: opts.startup_timeout,
            };
            let deadline = Instant::now() + opts.startup_timeout;
            let result = launched.and_then(|()| {
                cluster
                    .nodes
                    .iter()
                    .try_for_each(|n| n.wait_healthy(deadline))
            });
            match result {
                Ok(()) => return Ok(cluster),
                Err(e)
                    if attempt < START_ATTEMPTS
                        && is_port_conflict(
                            &e,
                            cluster
                                .nodes
                                .iter()
                                .any(|n| n.node.log_says_address_in_use()),
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

    /// True if the cluster has no members (never, for a started one).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Every member's client endpoint, `"127.0.0.1:PORT"`.
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.client_port))
            .collect()
    }

    /// Member `i`'s client endpoint, `"127.0.0.1:PORT"`.
    pub fn endpoint(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.nodes[i].client_port)
    }

    /// Member `i`'s client port.
    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].client_port
    }

    /// Kills member `i` (`SIGKILL`) and waits for it to exit; its data is
    /// kept for [`EtcdCluster::restart`].
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].node.stop();
    }

    /// Starts member `i` again (killing it first if it runs), same ports and
    /// data, and waits until it is healthy.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        let timeout = self.startup_timeout;
        let node = &mut self.nodes[i];
        node.launch()?;
        node.wait_healthy(Instant::now() + timeout)
    }

    /// Freezes member `i` with `SIGSTOP`. Panics if it is not running.
    pub fn pause(&self, i: usize) {
        self.nodes[i].pause();
    }

    /// Resumes member `i` with `SIGCONT`. Panics if it is not running.
    pub fn resume(&self, i: usize) {
        self.nodes[i].resume();
    }

    /// True while member `i`'s process runs (paused counts).
    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].node.is_running()
    }

    /// True if member `i`'s `/health` says `true` right now.
    pub fn is_healthy(&self, i: usize) -> bool {
        self.nodes[i].node.is_running() && etcd_healthy(self.nodes[i].probe_port)
    }

    /// The index of the member whose `/metrics` says
    /// `etcd_server_is_leader 1`.
    pub fn leader_index(&self) -> Option<usize> {
        (0..self.nodes.len())
            .find(|&i| self.nodes[i].node.is_running() && etcd_is_leader(self.nodes[i].probe_port))
    }

    /// Waits until a majority of members are healthy and one is the leader,
    /// e.g. after [`EtcdCluster::kill`] of the leader.
    pub fn wait_for_quorum(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let majority = self.nodes.len() / 2 + 1;
        loop {
            let healthy = (0..self.nodes.len())
                .filter(|&i| self.is_healthy(i))
                .count();
            if healthy >= majority && self.leader_index().is_some() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let mut msg = format!(
                    "etcd cluster ({}) has no healthy quorum after {timeout:?}: {healthy} of {} healthy",
                    self.endpoints().join(","),
                    self.nodes.len()
                );
                for n in &self.nodes {
                    let _ = write!(
                        msg,
                        "\n--- member {} (127.0.0.1:{}), last 10 lines of {} ---\n{}",
                        n.index.unwrap_or(0),
                        n.client_port,
                        n.node.log().display(),
                        n.node.log_tail(10)
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

    /// Member `i`'s pid while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].node.pid()
    }

    /// The last `n` lines of member `i`'s log.
    pub fn log_tail(&self, i: usize, n: usize) -> String {
        self.nodes[i].node.log_tail(n)
    }
}

static SHARED_ETCD: OnceLock<Result<EtcdServer, String>> = OnceLock::new();

/// Like [`shared_etcd`] but returns the start-up error instead of panicking.
/// A failed start is remembered: later calls fail at once with the same
/// message.
pub fn try_shared_etcd() -> Result<&'static EtcdServer> {
    match SHARED_ETCD.get_or_init(|| EtcdServer::start().map_err(|e| format!("{e:#}"))) {
        Ok(s) => Ok(s),
        Err(e) => Err(anyhow!("{e}")),
    }
}

/// One etcd per test process, started on first use with
/// [`EtcdOptions::default`] and shared by every test in the process (give
/// each test its own key prefix). It is never dropped; the watchdog kills it
/// and removes its directory when the process exits. Don't pause it; start a
/// private [`EtcdServer`] for tests that stop, restart or pause servers.
///
/// # Panics
///
/// If etcd cannot be started (the message says why, as
/// [`EtcdServer::start`]'s error does).
pub fn shared_etcd() -> &'static EtcdServer {
    try_shared_etcd()
        .unwrap_or_else(|e| panic!("dlock-testkit: cannot start the shared etcd server: {e:#}"))
}
