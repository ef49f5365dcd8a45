//! The session side of the Consul backend: a Consul session, renewed by
//! the shared keep-alive loop (`store::keepalive`), and Curator's
//! connection states on the one status machine.
//!
//! - The first session is `Connected`.
//! - A renewal that fails or goes unanswered (within a third of the TTL)
//!   makes it `Suspended`; the next answered one, `Reconnected`.
//! - A renewal answered 404 (Consul no longer has the session), or no
//!   answered renewal for a whole TTL (counted from when the last answered
//!   one was sent), makes it `Lost`; in the second case the session is
//!   destroyed in the background, as it may still live on the server (Consul
//!   keeps a session up to twice its TTL).
//! - After `Lost` the next operation creates a new session: `Reconnected`,
//!   with the new session's id.

use std::sync::Arc;
use std::time::Duration;

use hyper::Method;
use serde::Deserialize;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::http::{Http, Response};
use super::keys::session_id;
use crate::error::{Error, Result};
use crate::store::keepalive::{keep_alive, Cadence, Renewed, Renewer};
use crate::store::status::{GrantedTimeout, StatusMachine};
use crate::store::SessionId;

/// Consul refuses session TTLs below this.
pub(super) const MIN_TTL: Duration = Duration::from_secs(10);
/// ... and above this.
pub(super) const MAX_TTL: Duration = Duration::from_secs(86_400);

/// The TTL asked for: the session timeout rounded up to whole seconds,
/// within Consul's bounds (10 s to 24 h).
pub(super) fn ttl_for(timeout: Duration) -> Duration {
    let secs = timeout.as_millis().div_ceil(1000).min(u64::MAX as u128) as u64;
    Duration::from_secs(secs).clamp(MIN_TTL, MAX_TTL)
}

/// What the backend keeps per session, in the status machine's slot.
pub(super) struct SessionSlot {
    /// The session's UUID (empty once closed).
    pub uuid: String,
    /// Its TTL (Consul grants the one asked for).
    ttl: Duration,
    /// When the create that made it was sent: Consul counts its TTL from
    /// no earlier than this, so renewals count from it too (not from the
    /// create's answer, which could let the client believe in the session
    /// past its TTL).
    sent: Instant,
}

impl GrantedTimeout for SessionSlot {
    fn granted_timeout(&self) -> Duration {
        self.ttl
    }
}

/// The session state shared by the store, its renewal loop and its fault
/// timers.
pub(super) struct Keeper {
    pub http: Arc<Http>,
    pub machine: StatusMachine<SessionSlot>,
    pub ttl: Duration,
    pub lock_delay: Duration,
    runtime: tokio::runtime::Handle,
    /// Wakes the renewal loop (the end of a suspension, a close).
    kick: Notify,
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.machine
            .fmt_store(f, "ConsulStore", &self.http.endpoint)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct NewSession {
    #[serde(rename = "ID")]
    id: String,
}

impl Keeper {
    /// Creates the first session (status `Connected`) and starts renewing it.
    pub async fn open(http: Arc<Http>, ttl: Duration, lock_delay: Duration) -> Result<Arc<Keeper>> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::Backend("the Consul backend needs a tokio runtime".into()))?;
        let (uuid, sent) = create_first(&http, ttl, lock_delay).await?;
        let id = session_id(&uuid);
        let keeper = Arc::new(Keeper {
            http,
            machine: StatusMachine::new(
                id,
                SessionSlot {
                    uuid: uuid.clone(),
                    ttl,
                    sent,
                },
            ),
            ttl,
            lock_delay,
            runtime,
            kick: Notify::new(),
        });
        keeper.spawn_renewals(id);
        Ok(keeper)
    }

    /// How long one ordinary request may take before it counts as a lost
    /// connection.
    pub fn op_timeout(&self) -> Duration {
        (self.ttl / 2).max(Duration::from_secs(5))
    }

    /// The session to run an operation in (its id and UUID): waits out a
    /// suspension, creates a new session after a loss, fails once closed.
    pub async fn current(self: &Arc<Self>) -> Result<(SessionId, String)> {
        self.machine
            .ready(
                |slot, id| Some((id, slot.uuid.clone())),
                |lost| self.renew_after_loss(lost),
            )
            .await
    }

    /// Destroys the session `uuid`: Consul deletes its keys at once.
    pub async fn destroy(&self, uuid: &str) -> Result<()> {
        let resp = self
            .http
            .send(
                Method::PUT,
                &format!("/v1/session/destroy/{uuid}"),
                None,
                self.op_timeout(),
            )
            .await?;
        match resp.status {
            200 => Ok(()),
            403 => Err(Error::NoAuth {
                path: format!("session {uuid}"),
            }),
            _ => Err(Error::Backend(format!(
                "Consul refused to destroy session {uuid}: {} {}",
                resp.status,
                resp.text()
            ))),
        }
    }

    /// Closes: `Closed` at once, then destroys the session (its keys go).
    pub async fn close(&self) {
        self.close_session().await;
        self.http.clear();
    }

    /// One renewal: `Ok(true)` if Consul still has the session.
    async fn renew_session(&self, uuid: &str, timeout: Duration) -> Result<bool> {
        let path = format!("/v1/session/renew/{uuid}");
        // `Http::send`'s timeout is per agent; a renewal may take no longer
        // than `timeout` in all (the session may have no more left). A
        // renewal dropped unanswered is harmless: it is sent again.
        let sent = self.http.send(Method::PUT, &path, None, timeout);
        let resp = match tokio::time::timeout(timeout, sent).await {
            Ok(resp) => resp?,
            Err(_) => return Err(Error::ConnectionLoss),
        };
        match resp.status {
            200 => Ok(true),
            404 => Ok(false),
            _ => Err(Error::Backend(format!(
                "session renewal answered {} {}",
                resp.status,
                resp.text()
            ))),
        }
    }
}

/// How long opening a store may keep trying to create its first session
/// while the servers have no leader.
const FIRST_SESSION_WITHIN: Duration = Duration::from_secs(15);
/// How long one session create may take.
const CREATE_TIMEOUT: Duration = Duration::from_secs(10);

/// Creates the first session of a store. A server cluster that is electing
/// a leader (its leader just died) answers 500 ("No cluster leader", or the
/// forwarded call's broken pipe) for a second or two: such an answer is
/// tried again, with a growing pause, for up to [`FIRST_SESSION_WITHIN`]
/// (an agent that is down is skipped by [`Http::send`] already). An agent
/// that accepts the connection but does not answer is left for the next
/// one, each given an equal share of the time; no agent answering at all
/// is [`Error::Unreachable`].
/// Answers the new session's UUID and when the create that made it was
/// sent.
async fn create_first(
    http: &Http,
    ttl: Duration,
    lock_delay: Duration,
) -> Result<(String, Instant)> {
    let deadline = Instant::now() + FIRST_SESSION_WITHIN;
    let share = FIRST_SESSION_WITHIN / http.agents().max(1) as u32;
    let mut silent = 0;
    let mut pause = Duration::from_millis(50);
    loop {
        let timeout = deadline
            .saturating_duration_since(Instant::now())
            .min(CREATE_TIMEOUT)
            .min(share);
        let body = Some(create_body(ttl, lock_delay));
        let sent_at = Instant::now();
        let sent = http
            .send(Method::PUT, "/v1/session/create", body, timeout)
            .await;
        let resp = match sent {
            // A session that this create made, unanswered, expires by its
            // TTL unused.
            Err(Error::ConnectionLoss) if silent + 1 < http.agents() => {
                silent += 1;
                continue;
            }
            sent => sent.map_err(|e| http.unreachable(e, timeout))?,
        };
        match created(http, resp) {
            Err(Created::ServerError(why)) if Instant::now() + pause < deadline => {
                tracing::debug!(endpoint = %http.endpoint, %why, "no Consul session yet; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(1000));
            }
            Err(Created::ServerError(why)) => {
                return Err(Error::Unreachable(format!(
                    "Consul at {} created no session within {FIRST_SESSION_WITHIN:?}: {why}",
                    http.endpoint
                )))
            }
            Err(Created::Refused(e)) => return Err(e),
            Ok(uuid) => return Ok((uuid, sent_at)),
        }
    }
}

/// Creates a session after a loss; a server error (no leader, a failed
/// forward) is `ConnectionLoss`, as another try may work. Answers as
/// [`create_first`].
async fn create(http: &Http, ttl: Duration, lock_delay: Duration) -> Result<(String, Instant)> {
    let body = Some(create_body(ttl, lock_delay));
    let sent = Instant::now();
    let resp = http
        .send(Method::PUT, "/v1/session/create", body, CREATE_TIMEOUT)
        .await?;
    let uuid = created(http, resp).map_err(|e| match e {
        Created::ServerError(why) => {
            tracing::debug!(endpoint = %http.endpoint, %why, "no new Consul session");
            Error::ConnectionLoss
        }
        Created::Refused(e) => e,
    })?;
    Ok((uuid, sent))
}

/// The name dlock gives its Consul sessions: what tells its keys from those
/// of Consul's own clients (`consul lock`, the Go `api` package), which
/// name theirs otherwise.
pub(super) const SESSION_NAME: &str = "dlock";

/// A session create's body: TTL, delete its keys when it ends, the lock
/// delay, no health checks (only the TTL decides).
fn create_body(ttl: Duration, lock_delay: Duration) -> Vec<u8> {
    serde_json::json!({
        "Name": SESSION_NAME,
        "TTL": format!("{}s", ttl.as_secs()),
        "Behavior": "delete",
        "LockDelay": format!("{}s", lock_delay.as_secs()),
        "Checks": [],
    })
    .to_string()
    .into_bytes()
}

/// Why a session create made no session.
enum Created {
    /// A 5xx answer: the servers could not serve it now.
    ServerError(String),
    /// Any other refusal, as the error to report.
    Refused(Error),
}

/// The new session's UUID from a session create's answer.
fn created(http: &Http, resp: Response) -> std::result::Result<String, Created> {
    match resp.status {
        200 => resp
            .json::<NewSession>("a session create")
            .map(|s| s.id)
            .map_err(Created::Refused),
        403 => Err(Created::Refused(Error::AuthFailed(format!(
            "Consul at {} refused to create a session (ACL token lacks session:write?): {}",
            http.endpoint,
            resp.text()
        )))),
        500..=599 => Err(Created::ServerError(format!(
            "{} {}",
            resp.status,
            resp.text()
        ))),
        _ => Err(Created::Refused(Error::Unreachable(format!(
            "Consul at {} created no session: {} {}",
            http.endpoint,
            resp.status,
            resp.text()
        )))),
    }
}

#[async_trait::async_trait]
impl Renewer for Keeper {
    type Slot = SessionSlot;
    /// The session's UUID.
    type Loop = String;
    /// The session's UUID.
    type Name = String;

    fn machine(&self) -> &StatusMachine<SessionSlot> {
        &self.machine
    }

    fn kick(&self) -> &Notify {
        &self.kick
    }

    fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }

    fn name_in(slot: &mut SessionSlot) -> &mut String {
        &mut slot.uuid
    }

    async fn open_session(&self) -> Result<(SessionId, SessionSlot)> {
        let (uuid, sent) = create(&self.http, self.ttl, self.lock_delay).await?;
        Ok((
            session_id(&uuid),
            SessionSlot {
                uuid,
                ttl: self.ttl,
                sent,
            },
        ))
    }

    /// Renews session `id` every third of the TTL until it is lost,
    /// replaced or closed, or the store is dropped.
    fn spawn_renewals(self: &Arc<Self>, id: SessionId) {
        let (uuid, sent) = {
            let slot = self.machine.lock();
            (slot.backend.uuid.clone(), slot.backend.sent)
        };
        let this = Arc::downgrade(self);
        let cadence = Cadence {
            ttl: self.ttl,
            interval: self.ttl / 3,
            retry: (self.ttl / 10).max(Duration::from_millis(200)),
        };
        self.runtime.spawn(async move {
            keep_alive(move || this.upgrade(), id, uuid, cadence, sent).await;
        });
    }

    async fn end(&self, uuid: &String) -> Result<()> {
        self.destroy(uuid).await
    }

    async fn renew_once(&self, _id: SessionId, uuid: &mut String, timeout: Duration) -> Renewed {
        match self.renew_session(uuid, timeout).await {
            Ok(true) => Renewed::Alive,
            Ok(false) => Renewed::Gone,
            Err(e) => Renewed::Failed(format!("Consul session {uuid}: renewal failed: {e}")),
        }
    }

    fn expired(self: &Arc<Self>, id: SessionId, uuid: String) {
        if self.machine.lose(id) {
            self.end_in_background(uuid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_are_whole_seconds_within_consuls_bounds() {
        assert_eq!(ttl_for(Duration::from_millis(500)), MIN_TTL);
        assert_eq!(
            ttl_for(Duration::from_millis(10_001)),
            Duration::from_secs(11)
        );
        assert_eq!(ttl_for(Duration::from_secs(30)), Duration::from_secs(30));
        assert_eq!(ttl_for(Duration::from_secs(100_000)), MAX_TTL);
    }
}
