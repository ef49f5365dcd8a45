//! The etcd client's gRPC channel for plain-text endpoints: requests go
//! from the calling task to hyper's HTTP/2 connection.
//!
//! tonic's own channel puts a `Buffer` in front of its connections: every
//! request is first handed to the buffer's worker task. On a
//! multi-threaded runtime each hand-off can wake another thread, and an
//! uncontended lock cycle is two requests whose server work is a fraction
//! of a millisecond, so the wake-ups are a measurable part of the cycle
//! (BENCHMARKS.md, "Session 12"). Here that hop is gone; hyper's own
//! connection tasks are left, as Go's client has its reader and writer.
//!
//! It keeps one connection to one member at a time. It moves on to the
//! next member (trying them in turn, from the one after) when the
//! connection fails, and also when a member answers `UNAVAILABLE`: a
//! member cut off from the others still answers pings but refuses every
//! request ("no leader", "request timed out"), and staying on it would
//! fail every retry. The request itself fails with `UNAVAILABLE` (a lost
//! connection to the store contract) and its retry goes to the next
//! member. TLS endpoints keep tonic's channel.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use etcd_client::Channel;
use hyper::client::conn::http2::{Builder, SendRequest};
use hyper::http::uri::{Authority, Scheme};
use hyper::{Request, Response, Uri};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
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

/// A channel over the members at `urls` (`http://host:port`), or `None`
/// if any of them is not plain HTTP: then tonic's channel is used.
/// Connections run on `runtime` (the store's).
pub(super) fn direct(urls: &[String], runtime: &tokio::runtime::Handle) -> Option<Channel> {
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
            made: Default::default(),
            connecting: tokio::sync::Mutex::new(()),
        }),
    };
    Some(Channel::Custom(tower::util::BoxCloneSyncService::new(
        service,
    )))
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
    /// Connections made so far.
    made: std::sync::atomic::AtomicU64,
    /// Held while connecting, so that concurrent requests on a broken
    /// connection make one new connection, not one each.
    connecting: tokio::sync::Mutex<()>,
}

#[derive(Clone)]
struct Connection {
    sender: SendRequest<Body>,
    member: Authority,
    /// Which connection this is (they are numbered as they are made).
    generation: u64,
}

impl Shared {
    /// The open connection, if it still is.
    fn open(&self) -> Option<Connection> {
        let current = self.current.lock().expect("connection slot poisoned");
        current.as_ref().filter(|c| !c.sender.is_closed()).cloned()
    }

    /// Stops using `connection` (if it is still the one in use): the next
    /// request connects to the member after it.
    fn leave(&self, connection: &Connection) {
        let mut current = self.current.lock().expect("connection slot poisoned");
        if current
            .as_ref()
            .is_some_and(|c| c.generation == connection.generation)
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
            let member = &self.members[i];
            // On the store's runtime: the connection's socket and task
            // must outlive the caller's.
            let connecting = self.runtime.spawn(connect(member.clone()));
            let connected = connecting.await.map_err(|e| e.to_string());
            match connected.and_then(|c| c) {
                Ok(sender) => {
                    let connection = Connection {
                        sender,
                        member: member.clone(),
                        generation: self.made.fetch_add(1, Ordering::Relaxed),
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
        Err(Status::unavailable(format!(
            "no etcd member answered: {}",
            failures.join("; ")
        )))
    }
}

/// Opens an HTTP/2 connection (prior knowledge, as gRPC over plain text
/// does) to `member`, its task running on the current runtime.
async fn connect(member: Authority) -> Result<SendRequest<Body>, String> {
    let address = member.as_str();
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(address))
        .await
        .map_err(|_| format!("no connection within {CONNECT_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let (sender, connection) = Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        // Its end is seen by the sender (closed): nothing to report here.
        let _ = connection.await;
    });
    Ok(sender)
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

impl tower::Service<Request<Body>> for Direct {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Answer;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        // A connection is made (or found broken) per request, in `call`.
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Body>) -> Answer {
        let shared = self.shared.clone();
        Box::pin(async move {
            let connection = shared.connection().await?;
            let (mut sender, member) = (connection.sender.clone(), &connection.member);
            // tonic's requests carry the path only; HTTP/2 needs the
            // scheme and authority too.
            let mut uri = request.uri().clone().into_parts();
            uri.scheme = Some(Scheme::HTTP);
            uri.authority = Some(member.clone());
            *request.uri_mut() = Uri::from_parts(uri)?;
            let lost = |e: hyper::Error| -> BoxError {
                Box::new(Status::unavailable(format!("etcd member {member}: {e}")))
            };
            sender.ready().await.map_err(lost)?;
            let response = sender.send_request(request).await.map_err(lost)?;
            // A trailers-only answer carries its status in the headers.
            if response
                .headers()
                .get("grpc-status")
                .is_some_and(|s| s == "14")
            {
                shared.leave(&connection);
            }
            Ok(response.map(Body::new))
        })
    }
}
