//! Turns Nagle's algorithm off on the connections to ZooKeeper.
//!
//! `zookeeper-client` does not set `TCP_NODELAY`, so when we pipeline a
//! create and a listing, the kernel holds the listing back until the
//! create's bytes are acknowledged — on a real network that acknowledgement
//! rides on the reply, and the "one round trip" acquire silently takes two
//! (measured with the round-trip proxy test: two flights instead of one).
//! The crate gives no access to its socket, so after every (re)connection we
//! find the process's TCP sockets whose peer is one of the ensemble's
//! servers and set the option on them. Setting it on another ZooKeeper
//! client's socket in the same process is harmless (it only helps).

use std::net::SocketAddr;

/// Resolves `host:port`s to the addresses sockets would peer with, without
/// blocking the runtime (a slow resolver would stall every task on it).
pub async fn resolve(hosts: &[String]) -> Vec<SocketAddr> {
    let mut peers = Vec::new();
    for host in hosts {
        if let Ok(addrs) = tokio::net::lookup_host(host.as_str()).await {
            peers.extend(addrs);
        }
    }
    peers
}

/// Sets `TCP_NODELAY` on every socket of this process connected to one of
/// `peers`. Linux only; elsewhere it does nothing.
#[cfg(target_os = "linux")]
pub fn disable_nagle(peers: &[SocketAddr]) {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    for entry in fds.flatten() {
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<libc::c_int>() else {
            continue;
        };
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
        if is_socket && peer_of(fd).is_some_and(|peer| peers.contains(&peer)) {
            let on: libc::c_int = 1;
            // SAFETY: `fd` is an open socket of this process (checked above);
            // the option value is a properly sized c_int.
            unsafe {
                libc::setsockopt(
                    fd,
                    libc::IPPROTO_TCP,
                    libc::TCP_NODELAY,
                    (&on as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
pub fn disable_nagle(_peers: &[SocketAddr]) {}

/// The peer address of socket `fd`, for IPv4 and IPv6 sockets.
#[cfg(target_os = "linux")]
fn peer_of(fd: libc::c_int) -> Option<SocketAddr> {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
    // SAFETY: sockaddr_storage is plain data, valid when zeroed.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: the pointer and length describe `storage`, which outlives the call.
    let rc = unsafe {
        libc::getpeername(
            fd,
            (&mut storage as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return None;
    }
    match storage.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let a: &libc::sockaddr_in =
                unsafe { &*(&storage as *const libc::sockaddr_storage).cast() };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let a: &libc::sockaddr_in6 =
                unsafe { &*(&storage as *const libc::sockaddr_storage).cast() };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}
