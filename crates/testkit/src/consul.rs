//! Private Consul agents: a dev agent and clusters of servers.
//!
//! Consul is not packaged where the tests run, so the binary comes from a
//! per-user cache that `scripts/consul.sh get` fills. A dev agent keeps its
//! store in memory: [`ConsulServer::restart`] gives an empty one, so tests
//! about durable state use a [`ConsulCluster`].

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::process::is_executable;
use crate::server::{
    expect_shared, not_installed, server_handle, shared, Flavor, Launcher, Layout, Member,
};
use crate::util::{consul_leader, consul_node_healthy, http_request};

/// The Debian build `scripts/consul.sh get` fetches.
const CONSUL_VERSION: &str = "1.8.7+dfsg1-2+b3";

/// Settings for a private Consul agent or cluster.
#[derive(Debug, Clone)]
pub struct ConsulOptions {
    /// HTTP port for a dev agent; `None` (default) picks one with
    /// [`free_port`](crate::free_port). Ignored by [`ConsulCluster`].
    pub port: Option<u16>,
    /// `performance { raft_multiplier }` (default 1: the fastest timings,
    /// right for loopback; Consul's own default is 5).
    pub raft_multiplier: u32,
    /// More command-line flags, placed after the defaults.
    pub extra_args: Vec<String>,
    /// A client agent that knows no server, instead of a dev agent (a
    /// single server): it answers every request that needs a server with
    /// HTTP 500 ("No known Consul servers"), as a client agent cut off from
    /// its servers does. Ready once its HTTP API answers. Single agents
    /// only.
    pub client_without_servers: bool,
    /// How long to wait until the agent (every member) knows a leader and
    /// is registered (default 30 s).
    pub startup_timeout: Duration,
}

impl Default for ConsulOptions {
    fn default() -> Self {
        ConsulOptions {
            port: None,
            raft_multiplier: 1,
            extra_args: Vec::new(),
            client_without_servers: false,
            startup_timeout: Duration::from_secs(30),
        }
    }
}

/// The `consul` binary: `$DLOCK_CONSUL`, else the cache where
/// `scripts/consul.sh get` puts it (tests run `consul lock` with it).
pub fn consul_binary() -> Result<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(p) = var("DLOCK_CONSUL").map(PathBuf::from) {
        if is_executable(&p) {
            return Ok(p);
        }
        let looked = format!("$DLOCK_CONSUL={}", p.display());
        return Err(not_installed::<Consul>("the `consul` binary", &looked));
    }
    let cache = var("DLOCK_CACHE").map(PathBuf::from).or_else(|| {
        var("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| var("HOME").map(|h| Path::new(&h).join(".cache")))
            .map(|c| c.join("dlock"))
    });
    let Some(cache) = cache else {
        let looked = "$DLOCK_CONSUL, $DLOCK_CACHE, $XDG_CACHE_HOME, $HOME: none is set";
        return Err(not_installed::<Consul>("the `consul` binary", looked));
    };
    let p = cache.join("consul").join(CONSUL_VERSION).join("consul");
    if is_executable(&p) {
        return Ok(p);
    }
    let looked = format!("$DLOCK_CONSUL, {}", p.display());
    Err(not_installed::<Consul>("the `consul` binary", &looked))
}

/// Consul's part of the [`Launcher`]. Member ports are HTTP, serf LAN, serf
/// WAN and server (RPC/raft); DNS and gRPC are off.
#[derive(Debug)]
struct Consul {
    bin: PathBuf,
    opts: ConsulOptions,
}

/// A member's `-node` name: its HTTP port (never handed out twice by this
/// process) makes it unique, and lets the probe know it.
fn node_name(http_port: u16) -> String {
    format!("dlock-{}-{http_port}", std::process::id())
}

/// `"127.0.0.1:PORT"` of a member's server port: how Consul names a leader.
fn raft_address(ports: &[u16]) -> String {
    format!("127.0.0.1:{}", ports[3])
}

impl Flavor for Consul {
    const NAME: &'static str = "Consul";
    const GROUP: &'static str = "cluster";
    const DIR: &'static str = "consul";
    const INSTALL_HINT: &'static str =
        "get it with `scripts/consul.sh get` (or `scripts/test.sh`, \
        which gets every test server); or point $DLOCK_CONSUL at a consul binary";

    type Options = ConsulOptions;

    fn new(opts: ConsulOptions) -> Result<Self> {
        let bin = consul_binary()?;
        Ok(Consul { bin, opts })
    }

    fn port_roles(&self, _cluster: bool) -> Vec<&'static str> {
        vec!["http", "serf-lan", "serf-wan", "server"]
    }

    fn program(&self) -> &Path {
        &self.bin
    }

    fn args(&self, layout: &Layout, dir: &Path) -> Result<Vec<OsString>> {
        let p = layout.ports();
        let mut args: Vec<String> = vec!["agent".into()];
        match layout.me {
            None if self.opts.client_without_servers => {}
            None => args.push("-dev".into()),
            Some(me) => {
                args.extend(["-server".into(), "-bootstrap-expect".into()]);
                args.push(layout.all.len().to_string());
                for (i, other) in layout.all.iter().enumerate() {
                    if i != me {
                        args.push("-retry-join".into());
                        args.push(format!("127.0.0.1:{}", other[1]));
                    }
                }
                // Members start one after another: the first one's joins
                // fail, and the default retry is 30 s away.
                args.extend(["-retry-interval".into(), "1s".into()]);
            }
        }
        let data = dir.join("data");
        std::fs::create_dir_all(&data).context("cannot create the Consul data directory")?;
        let ports = [
            ("-http-port", p[0].to_string()),
            ("-serf-lan-port", p[1].to_string()),
            ("-serf-wan-port", p[2].to_string()),
            ("-server-port", p[3].to_string()),
            ("-dns-port", "-1".to_string()),
            ("-grpc-port", "-1".to_string()),
        ];
        for (flag, value) in ports {
            args.push(flag.into());
            args.push(value);
        }
        args.extend([
            "-bind".into(),
            "127.0.0.1".into(),
            "-client".into(),
            "127.0.0.1".into(),
            "-data-dir".into(),
            data.display().to_string(),
            "-node".into(),
            node_name(p[0]),
            "-hcl".into(),
            "disable_update_check = true".into(),
            "-hcl".into(),
            format!(
                "performance {{ raft_multiplier = {} }}",
                self.opts.raft_multiplier
            ),
        ]);
        args.extend(self.opts.extra_args.iter().cloned());
        Ok(args.into_iter().map(OsString::from).collect())
    }

    fn ready(&self, m: &Member) -> bool {
        if self.opts.client_without_servers {
            let answer = http_request(m.port(), "GET", "/v1/agent/self", None);
            return matches!(answer, Ok((200, _)));
        }
        consul_leader(m.port()).is_some() && consul_node_healthy(m.port(), &node_name(m.port()))
    }

    fn not_ready(&self, m: &Member) -> String {
        let port = m.port();
        let node = node_name(port);
        let mut what = format!(
            "GET http://127.0.0.1:{port}/v1/status/leader never named a leader, or \
             /v1/health/node/{node} never showed a passing serfHealth"
        );
        if m.is_running() {
            let leader = http_request(port, "GET", "/v1/status/leader", None);
            let health = http_request(port, "GET", &format!("/v1/health/node/{node}"), None);
            for answer in [leader, health] {
                match answer {
                    Ok((code, body)) => {
                        let flat: String = body.split_whitespace().collect();
                        let _ = write!(what, " (last answer: {code} {flat})");
                    }
                    Err(e) => {
                        let _ = write!(what, " (last answer: {e})");
                    }
                }
            }
        }
        what
    }

    fn is_leader(&self, m: &Member) -> bool {
        consul_leader(m.port()) == Some(raft_address(m.ports()))
    }

    /// Every member names the same leader, and it is one of them.
    fn agreed(&self, members: &[Member]) -> bool {
        let first = consul_leader(members[0].port());
        first.as_ref().is_some_and(|l| {
            members.iter().any(|m| raft_address(m.ports()) == *l)
                && members[1..]
                    .iter()
                    .all(|m| consul_leader(m.port()) == first)
        })
    }
}

server_handle! {
    /// A private Consul dev agent (a single server, store in memory) on free
    /// loopback ports, with its log in a temporary directory. Its
    /// [`endpoint`](Self::endpoint) is the HTTP API's.
    ///
    /// Dropping it kills the agent (`SIGKILL`), waits for it and removes the
    /// directory; if the test process dies first, a watchdog does the same.
    pub struct ConsulServer(Consul, ConsulOptions, "Consul"): single;
    /// Starts a dev agent with [`ConsulOptions::default`] and waits until
    /// it knows a leader (itself) and its node is in the catalog.
    fn start;
    /// Starts a dev agent with `opts` and waits (at most
    /// `opts.startup_timeout`) until `GET /v1/status/leader` names a leader
    /// and the agent's node is registered with a passing `serfHealth` check
    /// (so sessions can be created at once).
    /// Retries with other ports if a chosen one turns out to be taken.
    ///
    /// # Errors
    ///
    /// If the `consul` binary is missing (the message says how to get it) or
    /// the agent does not come up; the message names the binary and ports
    /// and shows the end of its log.
    fn start_with;
}

impl ConsulServer {
    /// The HTTP URL, `"http://127.0.0.1:PORT"`.
    pub fn url(&self) -> String {
        format!("http://{}", self.endpoint())
    }

    /// Sends one HTTP request to the agent's API and returns the status code
    /// and the body, e.g. `http("GET", "/v1/kv/app/?recurse", None)` or
    /// `http("PUT", "/v1/session/destroy/<id>", None)`. Connect, read and
    /// write each time out after 2 s (no long blocking queries).
    pub fn http(&self, method: &str, path: &str, body: Option<&str>) -> Result<(u16, String)> {
        consul_http(&self.inner, 0, method, path, body)
    }
}

fn consul_http(
    inner: &Launcher<Consul>,
    i: usize,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<(u16, String)> {
    http_request(inner.port(i), method, path, body)
        .with_context(|| format!("{method} http://{}{path}", inner.endpoint(i)))
}

server_handle! {
    /// A private cluster of `n` Consul servers on loopback (non-dev agents with
    /// `-bootstrap-expect n`), each with its own ports and temporary directory.
    /// Members are numbered `0..n`; their endpoints are the HTTP API's.
    ///
    /// Dropping it kills every member and removes their directories.
    pub struct ConsulCluster(Consul, ConsulOptions, "Consul"): group;
    /// Starts `n` servers with [`ConsulOptions::default`] and waits until
    /// every one names the same leader and has its node registered.
    fn start;
    /// Like [`ConsulCluster::start`] with `opts` (`opts.port` is ignored).
    ///
    /// # Errors
    ///
    /// As [`ConsulServer::start_with`]; the message names the member that
    /// did not come up and shows the end of its log (or, if the members
    /// disagree on the leader, the end of every log).
    fn start_with;
}

impl ConsulCluster {
    /// As [`ConsulServer::http`], to member `i`.
    pub fn http(
        &self,
        i: usize,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<(u16, String)> {
        consul_http(&self.inner, i, method, path, body)
    }
}

static SHARED_CONSUL: OnceLock<Result<ConsulServer, String>> = OnceLock::new();

/// Like [`shared_consul`] but returns the start-up error instead of
/// panicking. A failed start is remembered: later calls fail at once with
/// the same message.
pub fn try_shared_consul() -> Result<&'static ConsulServer> {
    shared(&SHARED_CONSUL, ConsulServer::start)
}

/// One Consul dev agent per test process, started on first use with
/// [`ConsulOptions::default`] and shared by every test in the process (give
/// each test its own key prefix). It is never dropped; the watchdog kills it
/// and removes its directory when the process exits. Don't pause or restart
/// it; start a private [`ConsulServer`] for that.
///
/// # Panics
///
/// If the agent cannot be started (the message says why, as
/// [`ConsulServer::start`]'s error does).
pub fn shared_consul() -> &'static ConsulServer {
    expect_shared(try_shared_consul(), "Consul")
}
