//! The session side of the etcd backend: a lease, kept alive by the shared
//! keep-alive loop (`store::keepalive`) over one keep-alive stream, and
//! Curator's connection states on top of them.
//!
//! - The first lease is `Connected`.
//! - A keep-alive that fails or goes unanswered (within a third of the TTL)
//!   makes it `Suspended`; the next answered one, `Reconnected`.
//! - A keep-alive answered with TTL 0 or "lease not found", or no answered
//!   keep-alive for a whole TTL (counted from when the last answered one was
//!   *sent*, so we give up no later than the server can expire the lease),
//!   makes it `Lost`.
//! - After `Lost` the next operation grants a new lease: `Reconnected`, with
//!   the new lease id as the session id.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, LeaseKeepAliveStream, LeaseKeeper};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::error::{map_error, Failure};
use crate::endpoint::{Endpoint, TlsFiles};
use crate::error::{Error, Result};
use crate::store::keepalive::{keep_alive, Cadence, Renewed, Renewer};
use crate::store::status::{GrantedTimeout, StatusMachine};
use crate::store::SessionId;

/// How to reach the cluster and what to ask for, kept for every new lease.
pub(super) struct Config {
    /// `http://host:port` (`https://` with TLS) of every member.
    pub urls: Vec<String>,
    /// `user`, `password` for etcd's authentication.
    pub credentials: Option<(String, String)>,
    /// The client's TLS settings, files already read.
    pub tls: Option<etcd_client::TlsOptions>,
    /// The path every key lives below (`/` for none).
    pub namespace: String,
    /// The TTL asked for, in whole seconds (the session timeout rounded up).
    pub ttl_secs: i64,
    /// The endpoint URL with the password masked, for messages.
    pub endpoint: String,
}

impl Config {
    pub fn from_endpoint(endpoint: &Endpoint, timeout: Duration) -> Result<Config> {
        match endpoint {
            Endpoint::Etcd {
                hosts,
                credentials,
                namespace,
                tls,
            } => {
                let scheme = if tls.is_some() { "https" } else { "http" };
                let tls = match tls {
                    Some(files) => Some(tls_options(endpoint, files)?),
                    None => None,
                };
                Ok(Config {
                    urls: hosts.iter().map(|h| format!("{scheme}://{h}")).collect(),
                    credentials: credentials
                        .as_ref()
                        .map(|c| (c.user.clone(), c.password.clone())),
                    tls,
                    namespace: namespace.clone().unwrap_or_else(|| "/".into()),
                    ttl_secs: ttl_secs(timeout),
                    endpoint: endpoint.to_string(),
                })
            }
            other => Err(Error::InvalidEndpoint {
                url: other.to_string(),
                reason: "not an etcd endpoint".into(),
            }),
        }
    }

    pub fn unreachable(&self, why: impl std::fmt::Display) -> Error {
        Error::Unreachable(format!("cannot reach etcd at {}: {why}", self.endpoint))
    }
}

/// Reads the PEM files of `files` into the client's TLS settings.
fn tls_options(endpoint: &Endpoint, files: &TlsFiles) -> Result<etcd_client::TlsOptions> {
    use etcd_client::{Certificate, Identity, TlsOptions};
    let read = |what: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| Error::InvalidEndpoint {
            url: endpoint.to_string(),
            reason: format!("cannot read the {what} {}: {e}", path.display()),
        })
    };
    let mut tls = TlsOptions::new();
    tls = match &files.ca_file {
        Some(ca) => tls.ca_certificate(Certificate::from_pem(read("CA certificate (cacert)", ca)?)),
        None => tls.with_native_roots(),
    };
    if let (Some(cert), Some(key)) = (&files.cert_file, &files.key_file) {
        tls = tls.identity(Identity::from_pem(
            read("client certificate (cert)", cert)?,
            read("client key (key)", key)?,
        ));
    }
    if let Some(domain) = &files.domain {
        tls = tls.domain_name(domain.clone());
    }
    Ok(tls)
}

/// A ZooKeeper-style millisecond timeout as a lease TTL: whole seconds,
/// rounded up, at least 1 (the server may still raise it to its minimum).
///
/// ```text
/// 1 ms → 1 s, 1000 ms → 1 s, 1001 ms → 2 s, 2500 ms → 3 s
/// ```
pub(super) fn ttl_secs(timeout: Duration) -> i64 {
    let ms = timeout.as_millis().max(1);
    ms.div_ceil(1000).min(i64::MAX as u128) as i64
}

/// What the etcd backend keeps per lease, in the status machine's slot.
pub(super) struct LeaseSlot {
    /// The current lease (0 once closed).
    lease: i64,
    /// Its granted TTL.
    ttl: Duration,
    /// When its grant was sent: the server's expiry is no earlier than this
    /// plus the TTL.
    granted: Instant,
}

impl GrantedTimeout for LeaseSlot {
    fn granted_timeout(&self) -> Duration {
        self.ttl
    }
}

/// The lease state shared by the store, its keep-alive loop and its fault
/// timers.
pub(super) struct Lease {
    pub config: Config,
    pub client: Client,
    pub runtime: tokio::runtime::Handle,
    pub machine: StatusMachine<LeaseSlot>,
    /// Wakes the keep-alive loop (the end of a suspension).
    kick: Notify,
    /// When the auth token was last renewed for a stale one.
    token_renewed: tokio::sync::Mutex<Option<std::time::Instant>>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.machine
            .fmt_store(f, "EtcdStore", &self.config.endpoint)
    }
}

/// Connects the client (authenticating, if there are credentials), its
/// connections running on `runtime`.
pub(super) async fn connect_client(
    config: &Config,
    runtime: &tokio::runtime::Handle,
) -> Result<Client> {
    use super::channel::{CONNECT_TIMEOUT, KEEP_ALIVE_INTERVAL, KEEP_ALIVE_TIMEOUT};
    let mut options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_keep_alive(KEEP_ALIVE_INTERVAL, KEEP_ALIVE_TIMEOUT);
    if let Some(tls) = &config.tls {
        options = options.with_tls(tls.clone());
    }
    if let Some((user, password)) = &config.credentials {
        options = options
            .with_user(user.clone(), password.clone())
            .with_auto_token_refresh(true);
    }
    let limit = Duration::from_secs(config.ttl_secs.clamp(5, 30) as u64);
    // Plain-text members get dlock's own channel (with the same connect
    // timeout and keep-alive); TLS keeps tonic's.
    let ttl = Duration::from_secs(config.ttl_secs.max(1) as u64);
    let stalled = super::channel::stalled_after(ttl);
    let connected = match super::channel::direct(&config.urls, runtime, stalled) {
        Some(channel) => tokio::time::timeout(limit, authenticated(channel, options)).await,
        None => tokio::time::timeout(limit, Client::connect(&config.urls, Some(options))).await,
    };
    match connected {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(match map_error(&e, &config.endpoint) {
            Failure::Auth(why) => Error::AuthFailed(format!(
                "etcd at {} rejected the credentials: {why}",
                config.endpoint
            )),
            other => config.unreachable(other.into_error("")),
        }),
        Err(_) => Err(config.unreachable(format!("no answer within {limit:?}"))),
    }
}

/// A client on dlock's own `channel`. With credentials it authenticates at
/// once; an attempt that fails on the connection, or gets no answer within
/// [`ATTEMPT`], is tried again (within the caller's limit), as tonic's
/// channel would wait for a member to come up.
async fn authenticated(
    channel: etcd_client::Channel,
    options: etcd_client::ConnectOptions,
) -> std::result::Result<Client, etcd_client::Error> {
    let mut pause = Duration::from_millis(20);
    loop {
        let attempt = Client::from_channel(channel.clone(), Some(options.clone()));
        match tokio::time::timeout(ATTEMPT, attempt).await {
            Ok(Err(e)) if matches!(map_error(&e, ""), Failure::Connection(_)) => {}
            Ok(answer) => return answer,
            // Given up after longer than the channel's stall limit: the
            // next attempt goes to another member.
            Err(_) => {}
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// How long one request of a session's setup (authenticating, granting
/// the lease) may take before it is tried again.
const ATTEMPT: Duration = Duration::from_millis(1500);

/// A lease the server granted.
struct Granted {
    id: i64,
    ttl: Duration,
    /// When the request that got it was sent: the server's expiry is no
    /// earlier than this plus `ttl`. Not when the grant began: a grant that
    /// retried through an outage may have begun more than a TTL before the
    /// server granted anything, and its lease would be given up at once.
    sent: Instant,
}

/// Grants a lease of the configured TTL.
/// A request that fails on the connection is tried again until `limit`:
/// another try can reach another member (tonic's channel, with TLS, may
/// still offer one that is down: it keeps a dead endpoint "ready" for a
/// while; dlock's own moves on to the next member).
async fn grant(config: &Config, client: &Client, limit: Duration) -> Result<Granted> {
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(20);
    loop {
        let mut leases = client.lease_client();
        // One attempt may hang on a member that lost its leader (until its
        // own request timeout): give each a slice, and try again. A grant
        // given up on leaves at most a lease with no keys, which expires.
        let left = deadline.saturating_duration_since(Instant::now());
        let attempt = left.min(ATTEMPT);
        let sent = Instant::now();
        let failure = match tokio::time::timeout(attempt, leases.grant(config.ttl_secs, None)).await
        {
            Ok(Ok(granted)) if granted.id() != 0 && granted.ttl() > 0 => {
                return Ok(Granted {
                    id: granted.id(),
                    ttl: Duration::from_secs(granted.ttl() as u64),
                    sent,
                })
            }
            Ok(Ok(granted)) => {
                return Err(Error::Backend(format!(
                    "etcd at {} granted no lease: {}",
                    config.endpoint,
                    granted.error()
                )))
            }
            Ok(Err(e)) => map_error(&e, &config.endpoint),
            Err(_) if Instant::now() < deadline => {
                Failure::Connection(format!("no answer within {attempt:?}"))
            }
            Err(_) => return Err(config.unreachable(format!("no lease granted within {limit:?}"))),
        };
        match failure {
            Failure::Connection(why) if Instant::now() + pause < deadline => {
                tracing::debug!(endpoint = %config.endpoint, %why, "lease grant failed; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            Failure::Auth(why) => return Err(Error::AuthFailed(why)),
            Failure::NoAuth(why) => return Err(Error::NoAuth { path: why }),
            other => return Err(config.unreachable(other.into_error(""))),
        }
    }
}

impl Lease {
    /// Connects and grants the first lease (status `Connected`), and starts
    /// its keep-alive loop.
    pub async fn open(config: Config) -> Result<Arc<Lease>> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::Backend("the etcd backend needs a tokio runtime".into()))?;
        let client = connect_client(&config, &runtime).await?;
        let limit = Duration::from_secs(config.ttl_secs.clamp(5, 30) as u64);
        let Granted { id, ttl, sent } = grant(&config, &client, limit).await?;
        let lease = Arc::new(Lease {
            config,
            client,
            runtime,
            machine: StatusMachine::new(
                id,
                LeaseSlot {
                    lease: id,
                    ttl,
                    granted: sent,
                },
            ),
            kick: Notify::new(),
            token_renewed: tokio::sync::Mutex::new(None),
        });
        lease.spawn_renewals(id);
        Ok(lease)
    }

    /// The granted TTL of the current lease.
    pub fn ttl(&self) -> Duration {
        self.machine.lock().backend.ttl
    }

    /// How long one request may take before it counts as a lost connection.
    pub fn op_timeout(&self) -> Duration {
        self.ttl().max(Duration::from_secs(5))
    }

    /// The lease to run an operation in: waits out a suspension, grants a
    /// new lease after a loss, fails once closed.
    pub async fn current(self: &Arc<Self>) -> Result<SessionId> {
        self.machine
            .ready_session(|lost| self.renew_after_loss(lost))
            .await
    }

    /// Revokes `lease`: the server deletes its keys at once. Returns whether
    /// the server confirmed it.
    pub async fn revoke(&self, lease: SessionId) -> Result<()> {
        let mut leases = self.client.lease_client();
        match tokio::time::timeout(self.op_timeout(), leases.revoke(lease)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => match map_error(&e, &self.config.endpoint) {
                // Already gone: what we wanted.
                Failure::LeaseGone => Ok(()),
                other => {
                    self.renew_stale_token(&other).await;
                    Err(other.into_error(""))
                }
            },
            Err(_) => Err(Error::ConnectionLoss),
        }
    }

    /// After a request failed with `failure`: if for a token older than a
    /// change to users or roles, takes a fresh one for the retry, as Go's
    /// client does (etcd-client renews only on `UNAUTHENTICATED`). Once
    /// for all the requests that failed together: each renewal is a write
    /// on the cluster.
    pub async fn renew_stale_token(&self, failure: &Failure) {
        if *failure != Failure::StaleToken {
            return;
        }
        let mut renewed = self.token_renewed.lock().await;
        if renewed.is_some_and(|at| at.elapsed() < Duration::from_secs(1)) {
            return;
        }
        let renewing = self.client.refresh_token();
        if let Ok(Ok(())) = tokio::time::timeout(self.op_timeout(), renewing).await {
            *renewed = Some(std::time::Instant::now());
        }
    }

    /// One keep-alive round trip; the TTL left, as the server says.
    async fn keep_alive_once(
        &self,
        lease: SessionId,
        channel: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    ) -> std::result::Result<i64, Failure> {
        let endpoint = &self.config.endpoint;
        match channel {
            None => {
                // Opening the stream sends the first keep-alive and reads its
                // answer (an error if the lease is gone).
                let opened = self
                    .client
                    .lease_client()
                    .keep_alive(lease)
                    .await
                    .map_err(|e| map_error(&e, endpoint))?;
                *channel = Some(opened);
                Ok(1)
            }
            Some((keeper, stream)) => {
                keeper
                    .keep_alive()
                    .await
                    .map_err(|e| map_error(&e, endpoint))?;
                match stream
                    .message()
                    .await
                    .map_err(|e| map_error(&e, endpoint))?
                {
                    Some(answer) => Ok(answer.ttl()),
                    None => Err(Failure::Connection("keep-alive stream ended".into())),
                }
            }
        }
    }
}

/// The keep-alive stream of a lease, opened by its first keep-alive and
/// dropped (to be opened again) after a failure.
type Channel = Option<(LeaseKeeper, LeaseKeepAliveStream)>;

#[async_trait::async_trait]
impl Renewer for Lease {
    type Slot = LeaseSlot;
    type Loop = Channel;
    type Name = SessionId;

    fn machine(&self) -> &StatusMachine<LeaseSlot> {
        &self.machine
    }

    fn kick(&self) -> &Notify {
        &self.kick
    }

    fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }

    fn name_in(slot: &mut LeaseSlot) -> &mut SessionId {
        &mut slot.lease
    }

    async fn open_session(&self) -> Result<(SessionId, LeaseSlot)> {
        let Granted { id, ttl, sent } =
            grant(&self.config, &self.client, self.op_timeout()).await?;
        Ok((
            id,
            LeaseSlot {
                lease: id,
                ttl,
                granted: sent,
            },
        ))
    }

    fn spawn_renewals(self: &Arc<Self>, lease: SessionId) {
        let (ttl, granted) = {
            let slot = self.machine.lock();
            (slot.backend.ttl, slot.backend.granted)
        };
        let interval = (ttl / 3).max(Duration::from_millis(100));
        let cadence = Cadence {
            ttl,
            interval,
            retry: interval.min(Duration::from_millis(200)),
        };
        let this = self.clone();
        self.runtime.spawn(async move {
            keep_alive(move || Some(this.clone()), lease, None, cadence, granted).await
        });
    }

    async fn end(&self, lease: &SessionId) -> Result<()> {
        self.revoke(*lease).await
    }

    fn unconfirmed_end(&self, lease: SessionId, e: Error) -> Error {
        self.config.unreachable(format!(
            "revoking lease {lease:#x} failed ({e}); it is lost to this client and expires on the server \
             after its TTL"
        ))
    }

    async fn renew_once(
        &self,
        lease: SessionId,
        channel: &mut Channel,
        timeout: Duration,
    ) -> Renewed {
        match tokio::time::timeout(timeout, self.keep_alive_once(lease, channel)).await {
            Ok(Ok(left)) if left > 0 => Renewed::Alive,
            Ok(Ok(_)) | Ok(Err(Failure::LeaseGone)) => Renewed::Gone,
            Ok(Err(e)) => {
                *channel = None;
                Renewed::Failed(format!("etcd keep-alive failed: {}", e.into_error("")))
            }
            Err(_) => {
                *channel = None;
                Renewed::Failed(format!("no keep-alive answer within {timeout:?}"))
            }
        }
    }

    fn expired(self: &Arc<Self>, lease: SessionId, _channel: Channel) {
        let faulted = self.machine.fault_suspended();
        if self.machine.lose(lease) && !faulted {
            // It may still live on the server (answers lost on the way
            // back): let its keys go now rather than later.
            self.end_in_background(lease);
        }
    }
}
