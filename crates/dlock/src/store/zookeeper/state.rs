//! The session side of the ZooKeeper backend: connecting, the Curator-style
//! state machine on top of the client's session states, renewal after a
//! loss, closing, and ending a session on the server for the fault hooks.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use zookeeper_client as zk;

use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::path;
use crate::store::status::{GrantedTimeout, Renewal, StatusMachine};
use crate::store::{SessionId, SessionState, Watch, WatchEvent};

/// How to reach the ensemble, kept for every new session.
pub(super) struct Config {
    /// `host:port,host:port` (no chroot: that is applied after connecting).
    pub hosts: String,
    /// The chroot, if any.
    pub chroot: Option<String>,
    /// `user:password` for the `digest` scheme.
    pub auth: Option<Vec<u8>>,
    /// The session timeout asked for.
    pub timeout: Duration,
    /// The endpoint URL with the password masked, for messages.
    pub endpoint: String,
    /// The servers' socket addresses (to tune our connections to them).
    pub peers: Vec<std::net::SocketAddr>,
}

impl Config {
    pub async fn from_endpoint(endpoint: &Endpoint, timeout: Duration) -> Result<Config> {
        match endpoint {
            Endpoint::ZooKeeper {
                hosts,
                chroot,
                credentials,
            } => Ok(Config {
                hosts: hosts.join(","),
                chroot: chroot.clone().filter(|c| c != "/"),
                auth: credentials
                    .as_ref()
                    .map(|c| format!("{}:{}", c.user, c.password).into_bytes()),
                timeout,
                endpoint: endpoint.to_string(),
                peers: super::nodelay::resolve(hosts).await,
            }),
            other => Err(Error::InvalidEndpoint {
                url: other.to_string(),
                reason: "not a ZooKeeper endpoint".into(),
            }),
        }
    }

    /// The ACL of every node this session creates: only its own user may
    /// touch them when it has credentials, everyone otherwise.
    pub fn acls(&self) -> zk::Acls<'static> {
        if self.auth.is_some() {
            zk::Acls::creator_all()
        } else {
            zk::Acls::anyone_all()
        }
    }

    /// How long a connection attempt may take before the ensemble counts as
    /// unreachable. The client gives up by itself after about the session
    /// timeout; this is only a backstop.
    fn connect_limit(&self) -> Duration {
        self.timeout
            .saturating_mul(2)
            .saturating_add(Duration::from_secs(1))
    }

    fn unreachable(&self, why: impl std::fmt::Display) -> Error {
        Error::Unreachable(format!(
            "cannot connect to ZooKeeper at {} within {:?}: {why}",
            self.hosts, self.timeout
        ))
    }
}

/// Opens a new session (with the credentials, in the chroot, which is
/// created if missing).
pub(super) async fn open(config: &Config) -> Result<zk::Client> {
    match tokio::time::timeout(config.connect_limit(), open_unbounded(config)).await {
        Ok(result) => result,
        Err(_) => Err(config.unreachable("timed out")),
    }
}

async fn open_unbounded(config: &Config) -> Result<zk::Client> {
    let mut connector = zk::Client::connector().with_session_timeout(config.timeout);
    if let Some(auth) = &config.auth {
        connector = connector.with_auth("digest", auth);
    }
    let client = connector
        .connect(&config.hosts)
        .await
        .map_err(|e| match e {
            zk::Error::AuthFailed => Error::AuthFailed(format!(
                "ZooKeeper at {} rejected the credentials",
                config.endpoint
            )),
            zk::Error::BadArguments(reason) => Error::InvalidEndpoint {
                url: config.endpoint.clone(),
                reason: reason.to_string(),
            },
            e => config.unreachable(e),
        })?;
    let Some(root) = &config.chroot else {
        return Ok(client);
    };
    // Like Curator's namespace, the chroot is made on first use (as a
    // persistent node: a container could be reaped under our feet).
    let chroot_error = |e: zk::Error| match e {
        zk::Error::NoAuth => Error::NoAuth { path: root.clone() },
        // The server just reached went away: as any server that cannot be
        // reached (after a loss, the next operation tries again).
        zk::Error::ConnectionLoss
        | zk::Error::Timeout
        | zk::Error::SessionExpired
        | zk::Error::ClientClosed
        | zk::Error::Custom(_) => config.unreachable(format!("the chroot {root}: {e}")),
        e => Error::Backend(format!("cannot create the chroot {root}: {e}")),
    };
    if client
        .check_stat(root)
        .await
        .map_err(chroot_error)?
        .is_none()
    {
        let options = zk::CreateMode::Persistent.with_acls(config.acls());
        client.mkdir(root, &options).await.map_err(chroot_error)?;
    }
    client
        .chroot(root.clone())
        .map_err(|_| Error::InvalidEndpoint {
            url: config.endpoint.clone(),
            reason: format!("bad chroot {root:?}"),
        })
}

/// Ends a session on the server by letting go of its client: once its last
/// handle is gone, the client's session task sends `closeSession`, and the
/// server deletes the session's ephemeral nodes in that one transaction
/// (exactly what it does when it expires a session; other sessions' watches
/// fire). Returns whether the server confirmed it within `bound` (handles
/// still held by operations in flight delay it until they finish).
async fn end_session(client: Arc<zk::Client>, bound: Duration) -> bool {
    let mut states = client.state_watcher();
    drop(client);
    tokio::time::timeout(bound, terminated(&mut states))
        .await
        .is_ok()
}

/// Waits until a client's session is over (closed, expired or failed).
async fn terminated(states: &mut zk::StateWatcher) {
    while !states.peek_state().is_terminated() {
        states.changed().await;
    }
}

/// What the ZooKeeper backend keeps per session, in the status machine's
/// slot.
pub(super) struct ZkSession {
    /// The client of the current session; `None` once it is lost or closed.
    client: Option<Arc<zk::Client>>,
    /// Its negotiated session timeout.
    timeout: Duration,
}

impl ZkSession {
    /// The client, if it belongs to `session`.
    fn take_client(&mut self, session: SessionId) -> Option<Arc<zk::Client>> {
        match &self.client {
            Some(c) if c.session_id().0 == session => self.client.take(),
            _ => None,
        }
    }
}

impl GrantedTimeout for ZkSession {
    fn granted_timeout(&self) -> Duration {
        self.timeout
    }
}

/// The state shared by the store, its state monitors and its fault timers.
pub(super) struct Inner {
    pub config: Config,
    runtime: tokio::runtime::Handle,
    pub machine: StatusMachine<ZkSession>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.machine
            .fmt_store(f, "ZooKeeperStore", &self.config.endpoint)
    }
}

impl Inner {
    /// Wraps the first session's client (status `Connected`).
    pub fn start(config: Config, client: zk::Client) -> Result<Arc<Inner>> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::Backend("the ZooKeeper backend needs a tokio runtime".into()))?;
        let client = Arc::new(client);
        let session = ZkSession {
            client: Some(client.clone()),
            timeout: client.session_timeout(),
        };
        let inner = Arc::new(Inner {
            config,
            runtime,
            machine: StatusMachine::new(client.session_id().0, session),
        });
        inner.spawn_monitor(&client);
        Ok(inner)
    }

    pub fn timeout(&self) -> Duration {
        self.machine.lock().backend.timeout
    }

    /// The client to run an operation with: waits out a suspension, opens a
    /// new session after a loss, fails once closed.
    pub async fn client(self: &Arc<Self>) -> Result<Arc<zk::Client>> {
        self.machine
            .ready(|slot, _| slot.client.clone(), |lost| self.renew(lost))
            .await
    }

    /// Replaces the lost session `lost` by a new one (new client, new
    /// session id, credentials applied again).
    async fn renew(self: &Arc<Self>, lost: SessionId) -> Result<()> {
        let open = || async {
            let client = Arc::new(open(&self.config).await?);
            let session = ZkSession {
                client: Some(client.clone()),
                timeout: client.session_timeout(),
            };
            Ok((client.session_id().0, session))
        };
        match self.machine.renew(lost, open).await? {
            Renewal::Installed(id) => {
                tracing::debug!(endpoint = %self.config.endpoint, session = format_args!("{id:#x}"), "new ZooKeeper session after a loss");
                let client = self.machine.lock().backend.client.clone();
                if let Some(client) = client {
                    self.spawn_monitor(&client);
                }
            }
            // Closed meanwhile: dropping the client closes its session.
            Renewal::Abandoned(_) | Renewal::NotNeeded => {}
        }
        Ok(())
    }

    /// Declares `session` lost (if it is the current one and not already
    /// lost or closed) and lets go of its client, which closes the session
    /// on the server if it can still reach it. Returns whether it changed
    /// anything.
    pub fn lose(&self, session: SessionId) -> bool {
        let (changed, client) = self
            .machine
            .lose_taking(session, |slot| slot.take_client(session));
        drop(client);
        changed
    }

    /// Follows one client's session states and maps them onto Curator's:
    /// `Disconnected` → `Suspended`, `SyncConnected` after it →
    /// `Reconnected`, `Expired` (or any other end) → `Lost`, and `Lost` too
    /// when `Suspended` lasts the negotiated session timeout (Curator's
    /// simulated expiry).
    fn spawn_monitor(self: &Arc<Self>, client: &zk::Client) {
        super::nodelay::disable_nagle(&self.config.peers);
        let weak = Arc::downgrade(self);
        let mut states = client.state_watcher();
        let session = client.session_id().0;
        let timeout = client.session_timeout();
        // Holds no client, so dropping the store still closes the session;
        // ends with the session (every session ends in a terminal state).
        // The watcher takes the state it was made in as seen: a connection
        // that dropped before (while the store was being set up) is acted on
        // first, or it would go unnoticed until the client gave up.
        let mut seen_first = match states.peek_state() {
            zk::SessionState::SyncConnected => None,
            state => Some(state),
        };
        self.runtime.spawn(async move {
            let mut expiry: Option<tokio::time::Instant> = None;
            loop {
                let state = match (seen_first.take(), expiry) {
                    (Some(state), _) => state,
                    (None, None) => states.changed().await,
                    (None, Some(deadline)) => tokio::select! {
                        state = states.changed() => state,
                        () = tokio::time::sleep_until(deadline) => {
                            // Connected again: the timer came due with the
                            // watcher's news of it (a busy runtime) and won.
                            let now = states.peek_state();
                            if matches!(now, zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly) {
                                expiry = None;
                                seen_first = Some(now);
                                continue;
                            }
                            if let Some(inner) = weak.upgrade() {
                                tracing::debug!("ZooKeeper connection down for the session timeout: simulated expiry");
                                inner.lose(session);
                            }
                            return;
                        }
                    },
                };
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                let current = match state {
                    zk::SessionState::Disconnected => {
                        expiry.get_or_insert_with(|| tokio::time::Instant::now() + timeout);
                        inner.machine.disconnected(session)
                    }
                    zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                        expiry = None;
                        // A reconnection is a new socket.
                        super::nodelay::disable_nagle(&inner.config.peers);
                        inner.machine.connected(session)
                    }
                    // Expired, AuthFailed, Closed: the client is dead.
                    _ => {
                        inner.lose(session);
                        false
                    }
                };
                if !current {
                    return;
                }
            }
        });
    }

    /// Maps a client error of an operation on `path`; a dead session is
    /// marked lost.
    pub fn error(&self, client: &zk::Client, e: zk::Error, path: &str) -> Error {
        let path = path.to_string();
        match e {
            zk::Error::NoNode => Error::NoNode { path },
            zk::Error::NodeExists => Error::NodeExists { path },
            zk::Error::BadVersion => Error::BadVersion { path },
            zk::Error::NotEmpty => Error::NotEmpty { path },
            zk::Error::NoChildrenForEphemerals => Error::NoChildrenForEphemerals { path },
            zk::Error::NoAuth => Error::NoAuth { path },
            zk::Error::ConnectionLoss | zk::Error::Timeout | zk::Error::NoHosts => {
                Error::ConnectionLoss
            }
            // The client's connection layer fails in-flight requests with
            // custom errors (an I/O error such as a reset, no response in
            // time): the request's fate is unknown, as after a connection
            // loss, and it must be retried the same way (seen when an
            // ensemble member dies under load).
            zk::Error::Custom(e) => {
                tracing::debug!(%path, error = %e, "connection failure: treated as a connection loss");
                Error::ConnectionLoss
            }
            // The client tears a connection down with whatever broke it,
            // failing every request in flight with that error: a reply it
            // could not read or place. Those requests' fate is unknown, as
            // after a connection loss (while connected, the same errors are
            // the request's own). A throttled request was not applied
            // (ZooKeeper's `throttled_op_wait_time`): it may go again.
            zk::Error::UnexpectedError(_) | zk::Error::UnmarshalError { .. }
                if client.state() != zk::SessionState::SyncConnected =>
            {
                tracing::debug!(%path, error = %e, "torn down with its connection: a connection loss");
                Error::ConnectionLoss
            }
            zk::Error::Throttled => Error::ConnectionLoss,
            zk::Error::SessionExpired | zk::Error::SessionMoved => {
                self.lose(client.session_id().0);
                Error::SessionExpired
            }
            zk::Error::AuthFailed => {
                self.lose(client.session_id().0);
                Error::AuthFailed(format!(
                    "ZooKeeper at {} failed the session's authentication",
                    self.config.endpoint
                ))
            }
            zk::Error::ClientClosed => {
                if self.machine.snapshot().state == SessionState::Closed {
                    Error::Closed
                } else {
                    self.lose(client.session_id().0);
                    Error::SessionExpired
                }
            }
            zk::Error::BadArguments(reason) => Error::InvalidArgument(format!("{reason} ({path})")),
            e => Error::Backend(format!("{e} ({path})")),
        }
    }

    /// Like [`error`](Self::error) for a create of `path`: a missing parent
    /// or an ephemeral parent is named by the parent's path.
    pub fn create_error(&self, client: &zk::Client, e: zk::Error, path: &str) -> Error {
        match e {
            zk::Error::NoNode | zk::Error::NoChildrenForEphemerals => {
                self.error(client, e, path::parent(path))
            }
            e => self.error(client, e, path),
        }
    }

    /// Turns the client's one-shot watcher into a [`Watch`], with the
    /// session's `status` as subscribed before the read that armed it. A
    /// small task forwards the event; it ends when the event comes or the
    /// `Watch` is dropped (then the client's watcher is dropped too).
    pub fn arm(
        &self,
        watcher: zk::OneshotWatcher,
        status: tokio::sync::watch::Receiver<crate::store::SessionStatus>,
    ) -> Watch {
        let (mut tx, rx) = oneshot::channel();
        let watch = Watch::since_read(rx, status.clone());
        self.runtime.spawn(async move {
            let changed = watcher.changed();
            tokio::pin!(changed);
            let event = tokio::select! {
                event = &mut changed => Some(event),
                () = tx.closed() => None,
            };
            if let Some(event) = event {
                let closed = status.borrow().state == SessionState::Closed;
                let _ = tx.send(watch_event(&event, closed));
            }
        });
        watch
    }

    /// Closes the session: status `Closed` at once (later operations fail
    /// with `Closed`), then waits (at most the session timeout) until the
    /// server has closed the session and deleted its ephemeral nodes.
    pub async fn close(&self) {
        let (client, timeout) = self.shut();
        if let Some(client) = client {
            end_session(client, timeout).await;
        }
    }

    /// Marks the store closed and hands out its client (to drop).
    pub fn shut(&self) -> (Option<Arc<zk::Client>>, Duration) {
        self.machine
            .shut(|slot| (slot.client.take(), slot.timeout))
            .1
    }

    /// `Faults::suspend`: publishes `Suspended`, holds new operations back
    /// for `duration`, then publishes `Reconnected` — or, if `duration`
    /// reaches the session timeout, ends the session after the timeout and
    /// publishes `Lost`.
    pub fn suspend(self: &Arc<Self>, duration: Duration) {
        let Some(suspension) = self.machine.begin_suspension() else {
            return;
        };
        let timeout = self.timeout();
        let expires = duration >= timeout;
        let weak = Arc::downgrade(self);
        self.runtime.spawn(async move {
            tokio::time::sleep(if expires { timeout } else { duration }).await;
            let Some(inner) = weak.upgrade() else {
                return;
            };
            if expires {
                if inner.machine.in_force(suspension) {
                    if let Err(e) = inner.end_for_expiry(suspension.session).await {
                        tracing::warn!("suspension past the session timeout: {e}");
                    }
                }
            } else if inner.machine.end_suspension(suspension) {
                // If the real connection is down too, its monitor reports
                // the reconnection.
                let session = suspension.session;
                let connected = inner
                    .machine
                    .lock()
                    .backend
                    .client
                    .as_ref()
                    .is_some_and(|c| {
                        c.session_id().0 == session && c.state() == zk::SessionState::SyncConnected
                    });
                if connected {
                    inner.machine.connected(session);
                }
            }
        });
    }

    /// `Faults::expire`: ends the current session on the server and returns
    /// once the server has deleted its ephemeral nodes, with the status
    /// `Lost`.
    pub async fn expire(&self) -> Result<()> {
        self.machine
            .expire_with(|session| self.end_for_expiry(session))
            .await
    }

    /// Ends `session` on the server as an expiry would, then declares it
    /// lost. Operations issued meanwhile wait for the outcome (and then run
    /// in a new session).
    ///
    /// Why not from a second connection joining the session (the classic
    /// way)? ZooKeeper drops a session's older connection whenever another
    /// one joins it, and this client reconnects at once, without a pause:
    /// it takes the session back before the second connection gets its
    /// `closeSession` through, over and over. Closing through the session's
    /// own client is deterministic and has the same effect on the server.
    async fn end_for_expiry(&self, session: SessionId) -> Result<()> {
        let timeout = self.timeout();
        let client = self
            .machine
            .begin_expiry(session, |slot| slot.take_client(session));
        let confirmed = match client {
            Some(client) => end_session(client, timeout.saturating_mul(2)).await,
            None => true,
        };
        self.lose(session);
        if confirmed {
            Ok(())
        } else {
            Err(self.config.unreachable(format!(
                "the server did not confirm ending session {session:#x}; it is lost to this client and expires on \
                 the server after its timeout"
            )))
        }
    }
}

/// Maps the client's watch event onto the contract's. The client reports
/// only the end of its session to one-shot watchers: that is `Closed` if the
/// store was closed, and `Lost` otherwise (expired, or ended by this store
/// after a loss).
fn watch_event(event: &zk::WatchedEvent, closed: bool) -> WatchEvent {
    match event.event_type {
        zk::EventType::NodeCreated => WatchEvent::NodeCreated,
        zk::EventType::NodeDeleted => WatchEvent::NodeDeleted,
        zk::EventType::NodeDataChanged => WatchEvent::DataChanged,
        zk::EventType::NodeChildrenChanged => WatchEvent::ChildrenChanged,
        zk::EventType::Session => WatchEvent::Session(match event.session_state {
            zk::SessionState::Disconnected => SessionState::Suspended,
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                SessionState::Reconnected
            }
            _ if closed => SessionState::Closed,
            _ => SessionState::Lost,
        }),
    }
}
