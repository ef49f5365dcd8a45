//! A TCP proxy between a client and its server that tests control: count
//! round trips, pause traffic, cut connections.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;

use anyhow::{Context, Result};

/// Forwards `127.0.0.1:port()` to an upstream address.
///
/// Counts *flights*: a flight starts when the client sends after the
/// server has answered (or first); requests the client pipelines before any
/// answer share one flight, so flights are sequential round trips.
pub struct TcpProxy {
    port: u16,
    shared: Arc<Shared>,
}

struct Shared {
    upstream: String,
    flights: AtomicU64,
    /// Set by server→client traffic, cleared when a flight starts.
    answered: AtomicBool,
    paused: Mutex<bool>,
    resumed: Condvar,
    connections: Mutex<Vec<TcpStream>>,
    refusing: AtomicBool,
    stopped: AtomicBool,
    /// Held back before each server→client chunk, in microseconds.
    reply_delay_us: AtomicU64,
}

impl TcpProxy {
    /// Starts a proxy to `upstream` (`host:port`) on a free loopback port.
    pub fn start(upstream: &str) -> Result<TcpProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").context("bind the proxy")?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            upstream: upstream.to_string(),
            flights: AtomicU64::new(0),
            answered: AtomicBool::new(true),
            paused: Mutex::new(false),
            resumed: Condvar::new(),
            connections: Mutex::new(Vec::new()),
            refusing: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            reply_delay_us: AtomicU64::new(0),
        });
        let accept = shared.clone();
        thread::Builder::new()
            .name("testkit-proxy".into())
            .spawn(move || {
                for client in listener.incoming() {
                    if accept.stopped.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(client) = client else { continue };
                    if accept.refusing.load(Ordering::SeqCst) {
                        let _ = client.shutdown(Shutdown::Both);
                        continue;
                    }
                    let Ok(server) = TcpStream::connect(&accept.upstream) else {
                        let _ = client.shutdown(Shutdown::Both);
                        continue;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    {
                        let mut conns = accept.connections.lock().unwrap();
                        // Cut while this pair was being set up (after the
                        // check above): it is cut too, not left live.
                        if accept.refusing.load(Ordering::SeqCst) {
                            let _ = client.shutdown(Shutdown::Both);
                            let _ = server.shutdown(Shutdown::Both);
                            continue;
                        }
                        conns.push(client.try_clone().expect("clone socket"));
                        conns.push(server.try_clone().expect("clone socket"));
                    }
                    pump(
                        accept.clone(),
                        client.try_clone().unwrap(),
                        server.try_clone().unwrap(),
                        true,
                    );
                    pump(accept.clone(), server, client, false);
                }
            })
            .context("spawn the proxy")?;
        Ok(TcpProxy { port, shared })
    }

    /// The proxy's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Sequential round trips the clients made so far.
    pub fn flights(&self) -> u64 {
        self.shared.flights.load(Ordering::SeqCst)
    }

    /// Holds every server reply back for `delay` before the client sees it.
    /// With a delay much longer than the client's own scheduling jitter,
    /// [`flights`](Self::flights) counts exactly the sends the client made
    /// after *waiting* for an answer: requests it pipelines always leave
    /// before the first answer is let through.
    pub fn delay_replies(&self, delay: std::time::Duration) {
        self.shared
            .reply_delay_us
            .store(delay.as_micros() as u64, Ordering::SeqCst);
    }

    /// Stops forwarding in both directions (bytes wait, connections stay
    /// open), as a stalled network does.
    pub fn pause(&self) {
        *self.shared.paused.lock().unwrap() = true;
    }

    /// Forwards again.
    pub fn resume(&self) {
        *self.shared.paused.lock().unwrap() = false;
        self.shared.resumed.notify_all();
    }

    /// Closes every connection and refuses new ones until [`restore`](Self::restore).
    pub fn cut(&self) {
        // Set under the lock the accept loop registers pairs under: a pair
        // registered after this sees it.
        let mut connections = self.shared.connections.lock().unwrap();
        self.shared.refusing.store(true, Ordering::SeqCst);
        for c in connections.drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    /// Accepts connections again after [`cut`](Self::cut).
    pub fn restore(&self) {
        self.shared.refusing.store(false, Ordering::SeqCst);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.resume();
        self.cut();
        // Wake the accept loop so it sees `stopped`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn pump(shared: Arc<Shared>, mut from: TcpStream, mut to: TcpStream, client_to_server: bool) {
    thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if client_to_server {
                if shared.answered.swap(false, Ordering::SeqCst) {
                    shared.flights.fetch_add(1, Ordering::SeqCst);
                }
            } else {
                let delay = shared.reply_delay_us.load(Ordering::SeqCst);
                if delay > 0 {
                    thread::sleep(std::time::Duration::from_micros(delay));
                }
                shared.answered.store(true, Ordering::SeqCst);
            }
            // Checked last, right before the write (after a reply's delay):
            // nothing read before a pause goes through after it.
            let paused = shared.paused.lock().unwrap();
            let paused = shared.resumed.wait_while(paused, |paused| *paused).unwrap();
            drop(paused);
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}
