//! The etcd client's gRPC channel for plain-text endpoints: the calling
//! task writes a request's frames onto the HTTP/2 connection (`h2`) itself.
//!
//! tonic's own channel hands every request to a `Buffer` worker task, which
//! hands it to hyper's dispatch task, which sends its body from a task of
//! its own, before the connection's task writes it; the answer comes back
//! the same way. On a multi-threaded runtime each hand-off can wake
//! another thread, and an uncontended lock cycle is two requests whose
//! server work is a fraction of a millisecond, so the wake-ups are a
//! measurable part of the cycle (BENCHMARKS.md, "Session 12"). Here a
//! request whose body is ready (every unary call) is queued with its
//! headers and end of stream in one go, and only the connection's task
//! is left in between, as Go's client has its reader and writer. A
//! streaming body (a watch, lease keep-alives) is sent on by a task of
//! its own as its messages come.
//!
//! It keeps one connection to one member at a time. It closes it and
//! goes to the next member (trying them in turn, from the one after):
//! - when the connection fails, or a ping goes unanswered;
//! - when a caller gives up on a request, or on a stream it sent a
//!   message on, that has had no answer for [`stalled_after`]: a frozen member
//!   (a paused process, a stuck disk) keeps its connections open and
//!   answers nothing, not even pings, and the lease's renewals, which give
//!   up after a third of its TTL, must reach another member before the
//!   TTL runs out. etcd answers in milliseconds: a caller that waited this
//!   long and gave up was not merely cancelling.
//!
//! Then the failed request is `UNAVAILABLE` (a lost connection to the
//! store contract) and its retry goes to the next member; the streams on
//! the closed connection (the watch stream, lease keep-alives) end, and
//! their owners open them again there. And when a member answers
//! `UNAVAILABLE` (cut off from the others, it still answers pings but
//! refuses every request: "no leader", "request timed out"), new requests
//! go to the next member, while what is open on it finishes there. TLS
//! endpoints keep tonic's channel.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use etcd_client::Channel;
use futures::FutureExt;
use h2::client::SendRequest;
use http::uri::{Authority, Scheme};
use http::{Request, Response, Uri};
use http_body::Frame;
use http_body_util::BodyExt;
use tonic::body::Body;
use tonic::Status;
use tower::BoxError;

/// How long a connection attempt to one member may take (tonic's channel,
/// with TLS, is given the same).
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often an HTTP/2 ping checks a connection, and how long its answer
/// may take.
pub(super) const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
pub(super) const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Flow-control windows, as hyper (under tonic) sets them: large watch
/// answers and listings arrive without waiting for window updates.
const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 5 * 1024 * 1024;
/// How long a request may go unanswered before a caller that gives up on
/// it closes its connection (see the module docs), at most.
const STALLED: Duration = Duration::from_secs(1);

/// How long a request may go unanswered before a caller that gives up on
/// it closes its connection, for leases of `ttl`: [`STALLED`], or less
/// for a TTL under 4 s — a renewal waits at most a third of the TTL, and
/// its giving up must count, or a frozen member is never left and the
/// lease runs out.
pub(super) fn stalled_after(ttl: Duration) -> Duration {
    STALLED.min(ttl / 4)
}

/// A channel over the members at `urls` (`http://host:port`), or `None`
/// if any of them is not plain HTTP: then tonic's channel is used.
/// Connections run on `runtime` (the store's); a request unanswered for
/// `stalled` closes its connection when its caller gives up.
pub(super) fn direct(
    urls: &[String],
    runtime: &tokio::runtime::Handle,
    stalled: Duration,
) -> Option<Channel> {
    let members = urls
        .iter()
        .map(|url| {
            url.strip_prefix("http://")?
                .trim_end_matches('/')
                .parse()
                .ok()
        })
        .collect::<Option<Vec<Authority>>>()?;
    let service = Direct {
        shared: Arc::new(Shared {
            members,
            runtime: runtime.clone(),
            next: AtomicUsize::new(0),
            current: StdMutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            stalled,
        }),
    };
    let service = tower::util::BoxCloneSyncService::new(service);
    Some(Channel::Custom(service))
}

#[derive(Clone)]
struct Direct {
    shared: Arc<Shared>,
}

struct Shared {
    members: Vec<Authority>,
    runtime: tokio::runtime::Handle,
    /// The member to try first when connecting again.
    next: AtomicUsize,
    current: StdMutex<Option<Connection>>,
    /// Held while connecting, so that concurrent requests on a broken
    /// connection make one new connection, not one each.
    connecting: tokio::sync::Mutex<()>,
    /// See [`stalled_after`].
    stalled: Duration,
}

#[derive(Clone)]
struct Connection {
    sender: SendRequest<Bytes>,
    member: Authority,
    /// The connection's task: finished when the connection ends; aborting
    /// it ends every stream on it. Its id tells connections apart.
    task: tokio::task::AbortHandle,
}

impl Shared {
    /// The connection in use, if it is still open.
    fn open(&self) -> Option<Connection> {
        let current = self.current.lock().expect("connection slot poisoned");
        let open = current.as_ref().filter(|c| !c.task.is_finished());
        open.cloned()
    }

    /// Closes `connection`, failing everything still open on it: the next
    /// request connects to the member after it.
    fn leave(&self, connection: &Connection) {
        connection.task.abort();
        self.retire(connection);
    }

    /// Sends no new request on `connection` (if it is still the one in
    /// use): the next one connects to the member after it. What is open on
    /// it finishes there; the connection closes with its last stream.
    fn retire(&self, connection: &Connection) {
        let mut current = self.current.lock().expect("connection slot poisoned");
        if current
            .as_ref()
            .is_some_and(|c| c.task.id() == connection.task.id())
        {
            *current = None;
        }
    }

    /// The open connection, or a new one to the first member that answers.
    async fn connection(&self) -> Result<Connection, Status> {
        if let Some(open) = self.open() {
            return Ok(open);
        }
        let _only_one = self.connecting.lock().await;
        if let Some(open) = self.open() {
            return Ok(open);
        }
        let mut failures = Vec::new();
        for _ in 0..self.members.len() {
            let i = self.next.fetch_add(1, Ordering::Relaxed) % self.members.len();
            let member = self.members[i].clone();
            // On the store's runtime: the connection's socket and task
            // must outlive the caller's.
            let connecting = self.runtime.spawn(connect(member.clone()));
            match connecting.await.map_err(|e| e.to_string()).and_then(|c| c) {
                Ok((sender, task)) => {
                    let connection = Connection {
                        sender,
                        member,
                        task,
                    };
                    // If this one fails, the next connection starts after it.
                    self.next.store(i + 1, Ordering::Relaxed);
                    *self.current.lock().expect("connection slot poisoned") =
                        Some(connection.clone());
                    return Ok(connection);
                }
                Err(why) => failures.push(format!("{member}: {why}")),
            }
        }
        let failures = failures.join("; ");
        Err(Status::unavailable(format!(
            "no etcd member answered: {failures}"
        )))
    }
}

/// Opens an HTTP/2 connection (prior knowledge, as gRPC over plain text
/// does) to `member`. Its task, spawned here, also pings it: an answer
/// missing for [`KEEP_ALIVE_TIMEOUT`] ends the connection, failing every
/// request and stream on it.
async fn connect(
    member: Authority,
) -> Result<(SendRequest<Bytes>, tokio::task::AbortHandle), String> {
    let address = member.as_str();
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(address))
        .await
        .map_err(|_| format!("no connection within {CONNECT_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let (sender, mut connection) = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .enable_push(false)
        .handshake(stream)
        .await
        .map_err(|e| e.to_string())?;
    let mut pings = connection
        .ping_pong()
        .expect("the ping handle is taken once");
    let task = tokio::spawn(async move {
        let keep_alive = async {
            loop {
                tokio::time::sleep(KEEP_ALIVE_INTERVAL).await;
                let pong = pings.ping(h2::Ping::opaque());
                if !matches!(
                    tokio::time::timeout(KEEP_ALIVE_TIMEOUT, pong).await,
                    Ok(Ok(_))
                ) {
                    return;
                }
            }
        };
        // Its end is seen by the requests on it: nothing to report here.
        tokio::select! {
            _ = connection => {}
            _ = keep_alive => {}
        }
    });
    Ok((sender, task.abort_handle()))
}

impl Shared {
    /// Whether a wait that began at `since` (if one did) lasted
    /// [`stalled_after`] the TTL.
    fn stalled(&self, since: Option<tokio::time::Instant>) -> bool {
        since.is_some_and(|t| t.elapsed() >= self.stalled)
    }
}

/// A request's wait for its answer: if the caller gives up on it (drops
/// it) after [`stalled_after`] without one, the connection is closed.
struct Unanswered<'a> {
    shared: &'a Shared,
    connection: &'a Connection,
    /// `None` once answered.
    since: Option<tokio::time::Instant>,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if self.shared.stalled(self.since) {
            self.shared.leave(self.connection);
        }
    }
}

/// Since when a stream's latest message has been waiting for an answer
/// (`None`: not waiting). If the stream's owner drops it after
/// [`stalled_after`] without one, the connection is closed.
#[derive(Clone)]
struct Waiting {
    shared: Arc<Shared>,
    connection: Connection,
    since: Arc<StdMutex<Option<tokio::time::Instant>>>,
}

impl Waiting {
    /// Something was sent: waiting, if not already.
    fn sent(&self) {
        let mut since = self.since.lock().expect("waiting clock poisoned");
        since.get_or_insert_with(tokio::time::Instant::now);
    }

    /// Something came back: not waiting.
    fn answered(&self) {
        *self.since.lock().expect("waiting clock poisoned") = None;
    }

    /// The stream's owner gives up on it.
    fn give_up(&self) {
        if self
            .shared
            .stalled(*self.since.lock().expect("waiting clock poisoned"))
        {
            self.shared.leave(&self.connection);
        }
    }
}

/// The ready sender of the connection in use. A connection found dead
/// before anything was sent on it (a `GOAWAY` while it drains) is left,
/// and the next one tried once.
async fn ready_sender(shared: &Shared) -> Result<(Connection, SendRequest<Bytes>), Status> {
    let mut tries = 2;
    loop {
        let connection = shared.connection().await?;
        match connection.sender.clone().ready().await {
            Ok(sender) => return Ok((connection, sender)),
            Err(e) => {
                shared.leave(&connection);
                tries -= 1;
                if tries == 0 {
                    return Err(unavailable(&connection.member, e));
                }
            }
        }
    }
}

/// A failure on `member`, as gRPC's `UNAVAILABLE`: to the store, a lost
/// connection (the request may or may not have been applied).
fn unavailable(member: &Authority, e: impl std::fmt::Display) -> Status {
    Status::unavailable(format!("etcd member {member}: {e}"))
}

/// The frames of `body` that are ready now, and whether they are all of it.
fn ready_frames(body: &mut Body) -> Result<(Vec<Bytes>, bool), Status> {
    let mut chunks = Vec::new();
    loop {
        match body.frame().now_or_never() {
            Some(Some(Ok(frame))) => chunks.extend(frame.into_data().ok()),
            Some(Some(Err(status))) => return Err(status),
            Some(None) => return Ok((chunks, true)),
            None => return Ok((chunks, false)),
        }
    }
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

impl tower::Service<Request<Body>> for Direct {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // A connection is made (or found broken) per request, in `call`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Answer {
        let shared = self.shared.clone();
        Box::pin(async move {
            let (connection, mut sender) = ready_sender(&shared).await?;
            // Only the connection's own failures close it; a refused
            // stream fails this request alone.
            let lost = |e: h2::Error| -> BoxError {
                if e.is_io() || e.is_go_away() {
                    shared.leave(&connection);
                }
                Box::new(unavailable(&connection.member, e))
            };
            let mut unanswered = Unanswered {
                shared: &shared,
                connection: &connection,
                since: Some(tokio::time::Instant::now()),
            };
            let (head, mut body) = request.into_parts();
            let mut head = Request::from_parts(head, ());
            // tonic's requests carry the path only; HTTP/2 needs the
            // scheme and authority too.
            let mut uri = head.uri().clone().into_parts();
            uri.scheme = Some(Scheme::HTTP);
            uri.authority = Some(connection.member.clone());
            *head.uri_mut() = Uri::from_parts(uri)?;
            let (chunks, ended) = ready_frames(&mut body)?;
            if !ended {
                // A body still open is a stream (the watch stream, lease
                // keep-alives). etcd then ends it when its member has no
                // leader (refuses it at once, if it has none now: a status
                // that retires the member), as Go's client asks for its
                // watches: else a member cut off from the others, which
                // still answers pings, keeps it open and silent.
                head.headers_mut()
                    .insert("hasleader", http::HeaderValue::from_static("true"));
            }
            let (response, mut stream) = sender.send_request(head, false).map_err(lost)?;
            let count = chunks.len();
            for (i, chunk) in chunks.into_iter().enumerate() {
                stream
                    .send_data(chunk, ended && i + 1 == count)
                    .map_err(lost)?;
            }
            // A stream's later messages wait for answers too.
            let waiting = (!ended).then(|| Waiting {
                shared: shared.clone(),
                connection: connection.clone(),
                since: Arc::default(),
            });
            match (&waiting, count) {
                (None, 0) => stream.send_data(Bytes::new(), true).map_err(lost)?,
                (None, _) => {}
                (Some(waiting), _) => {
                    let rest = send_rest(body, stream, waiting.clone());
                    drop(shared.runtime.spawn(rest));
                }
            }
            let response = response.await;
            // Answered, if only by an error: the caller did not give up.
            unanswered.since = None;
            let response = response.map_err(lost)?;
            // A trailers-only answer carries its status in the headers: a
            // member that cannot serve (no leader) gets no new requests.
            if response
                .headers()
                .get("grpc-status")
                .is_some_and(|s| s == "14")
            {
                shared.retire(&connection);
            }
            let member = connection.member.clone();
            Ok(response.map(|received| {
                Body::new(Received {
                    received,
                    data_done: false,
                    waiting,
                    member,
                })
            }))
        })
    }
}

/// Sends the rest of a streaming request body as its messages come; each
/// one waits for an answer (see [`Waiting`]).
async fn send_rest(mut body: Body, mut stream: h2::SendStream<Bytes>, waiting: Waiting) {
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            stream.send_reset(h2::Reason::CANCEL);
            return;
        };
        if let Ok(data) = frame.into_data() {
            if stream.send_data(data, false).is_err() {
                return;
            }
            waiting.sent();
        }
    }
    let _ = stream.send_data(Bytes::new(), true);
}

/// An answer's body: its data, then its trailers (gRPC's status). A
/// stream's body tells its [`Waiting`] when messages come, and gives up
/// when dropped.
struct Received {
    received: h2::RecvStream,
    data_done: bool,
    waiting: Option<Waiting>,
    member: Authority,
}

impl http_body::Body for Received {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        // Whatever breaks an answer, the store sees a lost connection.
        let failed =
            |e: h2::Error, member: &Authority| Poll::Ready(Some(Err(unavailable(member, e))));
        if !self.data_done {
            match ready!(self.received.poll_data(cx)) {
                Some(Ok(data)) => {
                    // Read: the server may send as much again.
                    let _ = self.received.flow_control().release_capacity(data.len());
                    if let Some(waiting) = &self.waiting {
                        waiting.answered();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) => return failed(e, &self.member),
                None => self.data_done = true,
            }
        }
        match ready!(self.received.poll_trailers(cx)) {
            Ok(trailers) => Poll::Ready(trailers.map(|t| Ok(Frame::trailers(t)))),
            Err(e) => failed(e, &self.member),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.received.is_end_stream()
    }
}

impl Drop for Received {
    fn drop(&mut self) {
        if let Some(waiting) = &self.waiting {
            waiting.give_up();
        }
    }
}
