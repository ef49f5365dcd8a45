//! Tiny wire helpers: ZooKeeper four-letter words and plain HTTP/1.0.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Shorter timeout for readiness probes, so polling stays responsive.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// Sends `request`, then reads until the peer closes, `complete` says the
/// answer is whole, or a read times out after some data arrived (ZooKeeper
/// sometimes fails to close a four-letter-word socket during startup).
fn exchange(
    port: u16,
    request: &[u8],
    timeout: Duration,
    complete: impl Fn(&[u8]) -> bool,
) -> std::io::Result<String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(request)?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if complete(&buf) {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e)
                if !buf.is_empty()
                    && matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
            {
                break
            }
            Err(e) => return Err(e),
        }
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn four_letter(port: u16, word: &str, timeout: Duration) -> std::io::Result<String> {
    exchange(port, word.as_bytes(), timeout, |b| {
        word == "ruok" && b == b"imok"
    })
}

/// One HTTP request; returns the status code and the body. HTTP/1.0, so the
/// server closes the connection after answering and never chunks the body.
fn request(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&str>,
    timeout: Duration,
) -> std::io::Result<(u16, String)> {
    let mut req = format!("{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n");
    if let Some(b) = body {
        req.push_str(&format!("Content-Length: {}\r\n", b.len()));
    }
    req.push_str("Connection: close\r\n\r\n");
    req.push_str(body.unwrap_or(""));
    let resp = exchange(port, req.as_bytes(), timeout, |_| false)?;
    let status = resp
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("not an HTTP response: {resp:?}"),
            )
        })?;
    let body = match resp.find("\r\n\r\n") {
        Some(i) => resp[i + 4..].to_string(),
        None => String::new(),
    };
    Ok((status, body))
}

fn get(port: u16, path: &str, timeout: Duration) -> std::io::Result<(u16, String)> {
    request(port, "GET", path, None, timeout)
}

/// Sends a ZooKeeper four-letter word (`ruok`, `srvr`, `mntr`, `stat`, `cons`,
/// ...) to the server listening on `127.0.0.1:port` and returns its whole
/// answer. Servers started by this crate allow every four-letter word.
///
/// Connect, read and write each time out after 2 s.
pub fn zk_four_letter(port: u16, word: &str) -> std::io::Result<String> {
    four_letter(port, word, IO_TIMEOUT)
}

/// `GET path` over plain HTTP/1.0 from `127.0.0.1:port`; returns the status
/// code and the body. Meant for etcd's `/health`, `/version` and `/metrics`.
///
/// Connect, read and write each time out after 2 s.
pub fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    get(port, path, IO_TIMEOUT)
}

/// The mode a ZooKeeper server reports in `srvr` (`standalone`, `leader`,
/// `follower`, `observer`), or `None` if it is not serving.
pub(crate) fn zk_mode(port: u16) -> Option<String> {
    let out = four_letter(port, "srvr", PROBE_TIMEOUT).ok()?;
    out.lines()
        .find_map(|l| l.strip_prefix("Mode: ").map(|m| m.trim().to_string()))
}

/// True when `ruok` answers `imok` and `srvr` shows a serving mode.
pub(crate) fn zk_serving(port: u16) -> bool {
    matches!(four_letter(port, "ruok", PROBE_TIMEOUT), Ok(ref s) if s.trim() == "imok")
        && matches!(
            zk_mode(port).as_deref(),
            Some("standalone" | "leader" | "follower" | "observer")
        )
}

/// True when the `conf` four-letter word's answer contains `needle`.
pub(crate) fn zk_conf_contains(port: u16, needle: &str) -> bool {
    four_letter(port, "conf", PROBE_TIMEOUT).is_ok_and(|c| c.contains(needle))
}

/// True when etcd's `/health` says `"health":"true"`.
pub(crate) fn etcd_healthy(port: u16) -> bool {
    matches!(get(port, "/health", PROBE_TIMEOUT), Ok((200, ref body)) if body.contains("\"health\":\"true\""))
}

/// True when etcd's `/metrics` says this member is the raft leader.
pub(crate) fn etcd_is_leader(port: u16) -> bool {
    match get(port, "/metrics", PROBE_TIMEOUT) {
        Ok((200, body)) => body.lines().any(|l| l.trim() == "etcd_server_is_leader 1"),
        _ => false,
    }
}

/// Any HTTP request to `127.0.0.1:port` (Consul's API); status and body.
/// Connect, read and write each time out after 2 s.
pub(crate) fn http_request(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> std::io::Result<(u16, String)> {
    request(port, method, path, body, IO_TIMEOUT)
}

/// The leader a Consul agent knows of (`"127.0.0.1:PORT"` of its server
/// port), or `None` if it knows none or does not answer.
pub(crate) fn consul_leader(port: u16) -> Option<String> {
    match get(port, "/v1/status/leader", PROBE_TIMEOUT) {
        Ok((200, body)) => {
            let leader = body.trim().trim_matches('"');
            (!leader.is_empty()).then(|| leader.to_string())
        }
        _ => None,
    }
}

/// True when the catalog has Consul node `node` with a passing `serfHealth`
/// check: before that, creating a session on its agent fails ("Missing node
/// registration").
pub(crate) fn consul_node_healthy(port: u16, node: &str) -> bool {
    match get(port, &format!("/v1/health/node/{node}"), PROBE_TIMEOUT) {
        Ok((200, body)) => {
            let flat: String = body.split_whitespace().collect();
            flat.contains(r#""CheckID":"serfHealth""#) && flat.contains(r#""Status":"passing""#)
        }
        _ => false,
    }
}
