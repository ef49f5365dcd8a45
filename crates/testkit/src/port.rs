//! Free loopback ports.

use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// Ports already handed out by this process; never handed out twice.
static USED: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
/// State of a tiny xorshift generator (0 = not seeded yet).
static RNG: AtomicU64 = AtomicU64::new(0);

/// Returns a TCP port on `127.0.0.1` that is free right now and that this
/// process has not handed out before.
///
/// Ports are drawn at random from *below* the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`, usually 32768–60999), i.e. from
/// 10000 up to its start. The kernel never picks those for the local end of
/// outgoing connections, so a port handed out here cannot be stolen by some
/// client's `connect` before the server binds it, and the random draw makes
/// two test processes running side by side unlikely to pick the same one.
/// A port counts as free when `127.0.0.1:port` can be bound; the socket is
/// released again before returning. If no such range exists the kernel picks
/// (`bind 127.0.0.1:0`).
///
/// # Panics
///
/// If no free port can be found at all (the machine is out of ports).
pub fn free_port() -> u16 {
    let mut guard = USED.lock().unwrap_or_else(|e| e.into_inner());
    let used = guard.get_or_insert_with(HashSet::new);
    let (lo, hi) = candidate_range();
    if hi > lo {
        for _ in 0..2000 {
            let p = lo + (next_random() % u64::from(hi - lo)) as u16;
            if used.contains(&p) {
                continue;
            }
            if TcpListener::bind(("127.0.0.1", p)).is_ok() {
                used.insert(p);
                return p;
            }
        }
    }
    for _ in 0..1000 {
        let l =
            TcpListener::bind(("127.0.0.1", 0)).expect("dlock-testkit: cannot bind 127.0.0.1:0");
        let p = l.local_addr().expect("local_addr").port();
        if used.insert(p) {
            return p;
        }
    }
    panic!("dlock-testkit: no free loopback TCP port found");
}

/// How a launch error says that a port was taken (a retry with other ports
/// may help).
pub(crate) const IN_USE: &str = "is already in use by another process";

/// True if an error (or the server log, via `log_says`) tells of a port
/// conflict.
pub(crate) fn is_port_conflict(err: &anyhow::Error, log_says: bool) -> bool {
    log_says || format!("{err:#}").contains(IN_USE)
}

/// True if `127.0.0.1:port` can be bound right now (no one listens there).
pub(crate) fn port_is_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// The half-open range `[lo, hi)` of ports to draw from.
fn candidate_range() -> (u16, u16) {
    let eph_lo = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .next()
                .and_then(|x| x.parse::<u32>().ok())
        })
        .unwrap_or(32768);
    let lo = 10000u32;
    if eph_lo >= lo + 2000 {
        (lo as u16, eph_lo.min(65535) as u16)
    } else {
        (0, 0)
    }
}

fn next_random() -> u64 {
    let mut x = RNG.load(Ordering::Relaxed);
    if x == 0 {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        x = t ^ (u64::from(std::process::id()) << 32) ^ 0x9E37_79B9_7F4A_7C15;
        if x == 0 {
            x = 1;
        }
    }
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    RNG.store(x, Ordering::Relaxed);
    x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_bindable() {
        let mut seen = HashSet::new();
        for _ in 0..200 {
            let p = free_port();
            assert!(seen.insert(p), "port {p} handed out twice");
            assert!(p >= 1024);
        }
        let p = free_port();
        TcpListener::bind(("127.0.0.1", p)).expect("free port is bindable");
    }
}
