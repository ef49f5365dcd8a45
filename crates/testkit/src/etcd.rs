//! Private etcd servers: single member and clusters.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

use crate::process::find_executable;
use crate::server::{expect_shared, not_installed, server_handle, shared, Flavor, Layout, Member};
use crate::util::{etcd_healthy, etcd_is_leader, http_get};

/// Settings for a private etcd server or cluster.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// Client port for a single server; `None` (default) picks one with
    /// [`free_port`](crate::free_port). Ignored by [`EtcdCluster`].
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
    find_executable(
        "DLOCK_ETCD",
        "etcd",
        &[
            PathBuf::from("/usr/bin/etcd"),
            PathBuf::from("/usr/local/bin/etcd"),
        ],
    )
    .ok_or_else(|| not_installed::<Etcd>("the `etcd` binary", "$DLOCK_ETCD, PATH, /usr/bin/etcd"))
}

/// etcd's part of the [`Launcher`](crate::server::Launcher): flags and the `/health` and `/metrics`
/// probes. Member ports are client, peer and, under TLS, a plain-HTTP port
/// for the probes.
#[derive(Debug)]
struct Etcd {
    bin: PathBuf,
    opts: EtcdOptions,
}

/// Where `/health` and `/metrics` answer in plain HTTP.
fn probe_port(m: &Member) -> u16 {
    m.ports().get(2).copied().unwrap_or(m.port())
}

impl Flavor for Etcd {
    const NAME: &'static str = "etcd";
    const GROUP: &'static str = "cluster";
    const DIR: &'static str = "etcd";
    const INSTALL_HINT: &'static str = "install it with `scripts/test.sh` (installs the test \
        servers) or `apt-get install -y etcd-server`; or point $DLOCK_ETCD at an etcd binary";

    type Options = EtcdOptions;

    fn new(opts: EtcdOptions) -> Result<Self> {
        let bin = etcd_binary()?;
        Ok(Etcd { bin, opts })
    }

    fn port_roles(&self, _cluster: bool) -> Vec<&'static str> {
        let mut roles = vec!["client", "peer"];
        if self.opts.tls.is_some() {
            roles.push("metrics");
        }
        roles
    }

    fn program(&self) -> &Path {
        &self.bin
    }

    fn env(&self) -> Vec<(String, String)> {
        let mut env = Vec::new();
        if cfg!(target_arch = "aarch64") {
            env.push(("ETCD_UNSUPPORTED_ARCH".to_string(), "arm64".to_string()));
        }
        env
    }

    fn args(&self, layout: &Layout, dir: &Path) -> Result<Vec<OsString>> {
        let opts = &self.opts;
        let ports = layout.ports();
        let scheme = if opts.tls.is_some() { "https" } else { "http" };
        let initial_cluster = layout
            .all
            .iter()
            .enumerate()
            .map(|(i, p)| format!("m{i}=http://127.0.0.1:{}", p[1]))
            .collect::<Vec<_>>()
            .join(",");
        let client = format!("{scheme}://127.0.0.1:{}", ports[0]);
        let peer = format!("http://127.0.0.1:{}", ports[1]);
        let mut args: Vec<String> = vec![
            "--name".into(),
            format!("m{}", layout.me.unwrap_or(0)),
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
            format!("dlock-testkit-{}-{}", std::process::id(), layout.id),
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
            args.push(format!("http://127.0.0.1:{}", ports[2]));
        }
        if let Some(r) = &opts.auto_compaction_retention {
            args.push("--auto-compaction-retention".into());
            args.push(r.clone());
        }
        args.extend(opts.extra_args.iter().cloned());
        Ok(args.into_iter().map(OsString::from).collect())
    }

    fn ready(&self, m: &Member) -> bool {
        etcd_healthy(probe_port(m))
    }

    fn not_ready(&self, m: &Member) -> String {
        let port = probe_port(m);
        let mut what =
            format!("GET http://127.0.0.1:{port}/health never said {{\"health\":\"true\"}}");
        if m.is_running() {
            match http_get(port, "/health") {
                Ok((code, body)) => {
                    let _ = write!(what, " (last answer: {code} {})", body.trim());
                }
                Err(e) => {
                    let _ = write!(what, " (last answer: {e})");
                }
            }
        }
        what
    }

    fn is_leader(&self, m: &Member) -> bool {
        etcd_is_leader(probe_port(m))
    }
}

server_handle! {
    /// A private single-member etcd on free loopback ports (client and peer),
    /// with its data and log in a temporary directory.
    ///
    /// Dropping it kills etcd (`SIGKILL`), waits for it and removes the
    /// directory; if the test process dies first, a watchdog does the same.
    pub struct EtcdServer(Etcd, EtcdOptions, "etcd"): single;
    /// Starts etcd with [`EtcdOptions::default`] and waits until `/health`
    /// says `true`.
    fn start;
    /// Starts etcd with `opts` and waits (at most `opts.startup_timeout`)
    /// until `GET /health` answers `{"health":"true"}`. Retries with other
    /// ports if a chosen port turns out to be taken (3 attempts).
    ///
    /// # Errors
    ///
    /// If the `etcd` binary is missing (the message says how to install it)
    /// or etcd does not come up; the message names the binary and ports and
    /// shows the end of its log.
    fn start_with;
}

impl EtcdServer {
    /// The client URL, `"http://127.0.0.1:PORT"` (`https://` with TLS).
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme(), self.endpoint())
    }

    fn scheme(&self) -> &'static str {
        if self.inner.flavor().opts.tls.is_some() {
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

    /// The peer (raft) port.
    pub fn peer_port(&self) -> u16 {
        self.inner.member(0).ports()[1]
    }
}

server_handle! {
    /// A private etcd cluster of `n` members on loopback, each with its own
    /// client and peer port and temporary directory. Members are numbered `0..n`.
    ///
    /// Dropping it kills every member and removes their directories.
    pub struct EtcdCluster(Etcd, EtcdOptions, "etcd"): group;
    /// Starts an `n`-member cluster with [`EtcdOptions::default`] and waits
    /// until every member's `/health` says `true`.
    fn start;
    /// Like [`EtcdCluster::start`] with `opts` (`opts.port` is ignored).
    ///
    /// # Errors
    ///
    /// As [`EtcdServer::start_with`]; the message names the member that did
    /// not become healthy and shows the end of its log.
    fn start_with;
}

static SHARED_ETCD: OnceLock<Result<EtcdServer, String>> = OnceLock::new();

/// Like [`shared_etcd`] but returns the start-up error instead of panicking.
/// A failed start is remembered: later calls fail at once with the same
/// message.
pub fn try_shared_etcd() -> Result<&'static EtcdServer> {
    shared(&SHARED_ETCD, EtcdServer::start)
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
    expect_shared(try_shared_etcd(), "etcd")
}
