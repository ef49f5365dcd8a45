//! A thin HTTP/1.1 client for Consul's API, on `hyper` (and `rustls` for
//! `consuls://`).
//!
//! Why not `reqwest`: it would add a few dozen crates, while `hyper`,
//! `rustls` and `serde_json` are already in the build (the etcd client
//! uses them). Consul's API needs little: JSON bodies, one header for the
//! ACL token, one response header (`X-Consul-Index`), keep-alive
//! connections. Connections are pooled per client; a blocking query holds
//! one connection for its whole wait, so each request takes an idle one or
//! opens another.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::endpoint::{Endpoint, TlsFiles};
use crate::error::{Error, Result};

/// How long opening a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// At most this many idle connections are kept.
const MAX_IDLE: usize = 16;

/// An answer from Consul.
#[derive(Debug)]
pub(super) struct Response {
    pub status: u16,
    /// `X-Consul-Index` (0 if absent): for blocking queries.
    pub index: u64,
    pub body: Bytes,
}

impl Response {
    /// The body as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self, what: &str) -> Result<T> {
        serde_json::from_slice(&self.body).map_err(|e| {
            Error::Backend(format!(
                "Consul answered {what} with a body that is not what its API documents: {e}"
            ))
        })
    }

    /// The body as text, for error messages.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).trim().to_string()
    }
}

/// The client: the agents to talk to, the token, a pool of connections.
pub(super) struct Http {
    hosts: Vec<String>,
    tls: Option<(tokio_rustls::TlsConnector, Option<String>)>,
    token: Option<String>,
    /// The agent that answered last: requests go there first.
    current: AtomicUsize,
    idle: StdMutex<Vec<(usize, SendRequest<Full<Bytes>>)>>,
    /// The endpoint (token masked), for messages.
    pub endpoint: String,
}

impl std::fmt::Debug for Http {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.endpoint)
    }
}

impl Http {
    /// A client of the agents of `endpoint` (an [`Endpoint::Consul`]); the
    /// token is the endpoint's, else `CONSUL_HTTP_TOKEN`.
    pub fn new(endpoint: &Endpoint) -> Result<Arc<Http>> {
        let Endpoint::Consul {
            hosts, token, tls, ..
        } = endpoint
        else {
            return Err(Error::InvalidEndpoint {
                url: endpoint.to_string(),
                reason: "not a Consul endpoint".into(),
            });
        };
        let token = token.clone().or_else(|| {
            std::env::var("CONSUL_HTTP_TOKEN")
                .ok()
                .filter(|t| !t.is_empty())
        });
        // Else every request would fail to be built, and read as an agent
        // that cannot be reached.
        if token
            .as_deref()
            .is_some_and(|t| !crate::endpoint::fits_a_header(t))
        {
            return Err(Error::InvalidEndpoint {
                url: endpoint.to_string(),
                reason: "the ACL token (the endpoint's, or CONSUL_HTTP_TOKEN) holds a character \
                         an HTTP header cannot carry, such as a newline"
                    .into(),
            });
        }
        let tls = match tls {
            Some(files) => Some((tls_connector(endpoint, files)?, files.domain.clone())),
            None => None,
        };
        Ok(Arc::new(Http {
            hosts: hosts.clone(),
            tls,
            token,
            current: AtomicUsize::new(0),
            idle: StdMutex::new(Vec::new()),
            endpoint: endpoint.to_string(),
        }))
    }

    /// Sends a request to the current agent (on a connection failure, to
    /// the next, until each was tried once) and reads the whole answer
    /// within `timeout` — per agent tried, so that a blocking query still
    /// gets its whole wait from the next agent when the first took its
    /// connect timeout to fail. `Err(ConnectionLoss)` if no agent answered:
    /// the request may or may not have been applied.
    pub async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Response> {
        let body = Bytes::from(body.unwrap_or_default());
        let start = self.current.load(Ordering::Relaxed);
        let mut last = String::new();
        for attempt in 0..self.hosts.len() {
            let host = (start + attempt) % self.hosts.len();
            let once = self.send_to(host, method.clone(), path_and_query, body.clone());
            match tokio::time::timeout(timeout, once).await {
                Ok(Ok(resp)) => {
                    self.current.store(host, Ordering::Relaxed);
                    // An agent that answers but cannot serve (a client
                    // agent that lost its servers: "No known Consul
                    // servers"; a server cut off from the quorum: "No
                    // cluster leader", after its hold) is left as a silent
                    // one is: its caller's retry, and the renewals, go to
                    // the next agent.
                    if resp.status >= 500 || resp.status == 429 {
                        self.move_on_from(host);
                    }
                    return Ok(resp);
                }
                Ok(Err(Failed::Connect(why))) => last = why,
                // Sent: it may have been applied, so it is not sent again.
                Ok(Err(Failed::Exchange(why))) => {
                    tracing::debug!(endpoint = %self.endpoint, "Consul request failed: {why}");
                    self.move_on_from(host);
                    return Err(Error::ConnectionLoss);
                }
                Err(_) => {
                    tracing::debug!(endpoint = %self.endpoint, "no answer from Consul within {timeout:?}");
                    self.move_on_from(host);
                    return Err(Error::ConnectionLoss);
                }
            }
        }
        tracing::debug!(endpoint = %self.endpoint, "no Consul agent reachable: {last}");
        Err(Error::ConnectionLoss)
    }

    /// The agent `host` failed a request sent to it: the next request goes
    /// to the next agent. An agent that hangs (stopped, overloaded) still
    /// accepts connections, so only its silence tells; kept as the current
    /// one, it would get every request — the session's renewals too — and
    /// lose the session while the other agents are well.
    fn move_on_from(&self, host: usize) {
        let next = (host + 1) % self.hosts.len();
        let _ = (self.current).compare_exchange(host, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// How many agents the endpoint names.
    pub fn agents(&self) -> usize {
        self.hosts.len()
    }

    /// What [`send`](Self::send) failing with `e` means when opening a
    /// session: no agent answering within `timeout` is
    /// [`Error::Unreachable`] naming the endpoint.
    pub fn unreachable(&self, e: Error, timeout: Duration) -> Error {
        match e {
            Error::ConnectionLoss => Error::Unreachable(format!(
                "cannot reach Consul at {}: no agent answered within {timeout:?}",
                self.endpoint
            )),
            e => e,
        }
    }

    async fn send_to(
        &self,
        host: usize,
        method: Method,
        path_and_query: &str,
        body: Bytes,
    ) -> std::result::Result<Response, Failed> {
        // An idle connection the agent closed meanwhile is not ready:
        // another one is opened then, and nothing was sent on it.
        let mut pooled = self.take_idle(host);
        if let Some(sender) = pooled.as_mut() {
            if sender.ready().await.is_err() {
                pooled = None;
            }
        }
        let mut sender = match pooled {
            Some(sender) => sender,
            None => self.connect(host).await?,
        };
        sender
            .ready()
            .await
            .map_err(|e| Failed::Connect(format!("{}: {e}", self.hosts[host])))?;
        let mut request = Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(hyper::header::HOST, self.hosts[host].as_str())
            .header(hyper::header::CONTENT_TYPE, "application/json");
        if let Some(token) = &self.token {
            request = request.header("X-Consul-Token", token.as_str());
        }
        let request = request
            .body(Full::new(body))
            .map_err(|e| Failed::Exchange(format!("bad request: {e}")))?;
        let resp = sender
            .send_request(request)
            .await
            .map_err(|e| Failed::Exchange(e.to_string()))?;
        let status = resp.status().as_u16();
        let index = resp
            .headers()
            .get("X-Consul-Index")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| Failed::Exchange(e.to_string()))?
            .to_bytes();
        self.put_idle(host, sender);
        Ok(Response {
            status,
            index,
            body,
        })
    }

    fn take_idle(&self, host: usize) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(i) = idle.iter().rposition(|(h, _)| *h == host) {
            let (_, sender) = idle.swap_remove(i);
            if !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    fn put_idle(&self, host: usize, sender: SendRequest<Full<Bytes>>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push((host, sender));
        }
    }

    /// Drops every idle connection (closing the store).
    pub fn clear(&self) {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    async fn connect(&self, host: usize) -> std::result::Result<SendRequest<Full<Bytes>>, Failed> {
        let addr = &self.hosts[host];
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr.as_str()))
            .await
            .map_err(|_| {
                Failed::Connect(format!("{addr}: no connection within {CONNECT_TIMEOUT:?}"))
            })?
            .map_err(|e| Failed::Connect(format!("{addr}: {e}")))?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            None => handshake(TokioIo::new(tcp), addr).await,
            Some((connector, domain)) => {
                let name = domain
                    .clone()
                    .unwrap_or_else(|| host_name(addr).to_string());
                let name = rustls::pki_types::ServerName::try_from(name.clone())
                    .map_err(|e| Failed::Connect(format!("{addr}: bad TLS name {name:?}: {e}")))?;
                let stream = tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name, tcp))
                    .await
                    .map_err(|_| {
                        Failed::Connect(format!(
                            "{addr}: no TLS handshake within {CONNECT_TIMEOUT:?}"
                        ))
                    })?
                    .map_err(|e| Failed::Connect(format!("{addr}: TLS: {e}")))?;
                handshake(TokioIo::new(stream), addr).await
            }
        }
    }
}

/// Why one request to one agent failed.
enum Failed {
    /// Before anything was sent: another agent may be tried.
    Connect(String),
    /// After sending: it may have been applied.
    Exchange(String),
}

async fn handshake<T>(io: T, addr: &str) -> std::result::Result<SendRequest<Full<Bytes>>, Failed>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| Failed::Connect(format!("{addr}: {e}")))?;
    tokio::spawn(async move {
        // Ends with the connection; its errors reach the requests on it.
        let _ = conn.await;
    });
    Ok(sender)
}

/// The host part of `host:port` (brackets of an IPv6 address removed).
fn host_name(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// The TLS client settings of `files`: its CA bundle (else the system's
/// roots) and client certificate.
fn tls_connector(endpoint: &Endpoint, files: &TlsFiles) -> Result<tokio_rustls::TlsConnector> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |reason: String| Error::InvalidEndpoint {
        url: endpoint.to_string(),
        reason,
    };
    let mut roots = rustls::RootCertStore::empty();
    match &files.ca_file {
        Some(ca) => {
            for cert in CertificateDer::pem_file_iter(ca).map_err(|e| {
                bad(format!(
                    "cannot read the CA certificate (cacert) {}: {e}",
                    ca.display()
                ))
            })? {
                let cert =
                    cert.map_err(|e| bad(format!("bad CA certificate in {}: {e}", ca.display())))?;
                roots
                    .add(cert)
                    .map_err(|e| bad(format!("bad CA certificate in {}: {e}", ca.display())))?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(format!("TLS: {e}")))?
        .with_root_certificates(roots);
    let config = match (&files.cert_file, &files.key_file) {
        (Some(cert), Some(key)) => {
            let certs = CertificateDer::pem_file_iter(cert)
                .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
                .map_err(|e| {
                    bad(format!(
                        "cannot read the client certificate (cert) {}: {e}",
                        cert.display()
                    ))
                })?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                bad(format!(
                    "cannot read the client key (key) {}: {e}",
                    key.display()
                ))
            })?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| bad(format!("TLS client certificate: {e}")))?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// `s` percent-encoded for a URL path (Consul keys may hold any byte but
/// `/` separates nothing special for Consul: it is kept).
pub(super) fn encode_key(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_percent_encoded_but_slashes() {
        assert_eq!(encode_key("a/b c/ä?"), "a/b%20c/%C3%A4%3F");
        assert_eq!(host_name("[::1]:8500"), "::1");
        assert_eq!(host_name("h:8500"), "h");
    }
}
