//! [`SessionOptions`]: what a session asks of its store (timeout, retries,
//! default node data). Below both the session and the backends, which
//! read it when they open a store.

use std::sync::OnceLock;
use std::time::Duration;

use crate::error::{Error, Result};

/// How operations that failed with a lost connection are retried:
/// exponential backoff with jitter, bounded (Curator's
/// `BoundedExponentialBackoffRetry`).
///
/// ```
/// use std::time::Duration;
/// use dlock::RetryPolicy;
/// let p = RetryPolicy { base_sleep: Duration::from_millis(10), max_sleep: Duration::from_millis(80), max_retries: 5 };
/// assert!(p.sleep_for(0) <= Duration::from_millis(20));
/// assert!(p.sleep_for(10) <= Duration::from_millis(80));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The first sleep (before jitter).
    pub base_sleep: Duration,
    /// No sleep is longer than this.
    pub max_sleep: Duration,
    /// How many times an operation is retried before its error is returned.
    pub max_retries: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base_sleep: Duration::from_millis(50),
            max_sleep: Duration::from_secs(2),
            max_retries: 10,
        }
    }
}

impl RetryPolicy {
    /// The sleep before retry number `retry` (from 0): `base × random(1 ..=
    /// 2^(retry+1))`, at most `max_sleep`.
    pub fn sleep_for(&self, retry: u32) -> Duration {
        let span = 1u64 << (retry + 1).min(30);
        let factor = 1 + (uuid::Uuid::new_v4().as_u128() as u64) % span;
        self.base_sleep
            .saturating_mul(factor.min(u32::MAX as u64) as u32)
            .min(self.max_sleep)
    }
}

/// Settings of a session.
///
/// ```
/// use std::time::Duration;
/// use dlock::SessionOptions;
/// let opts = SessionOptions::default().with_session_timeout(Duration::from_secs(5));
/// assert_eq!(opts.session_timeout, Duration::from_secs(5));
/// assert!(SessionOptions::default().with_session_timeout(Duration::ZERO).validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionOptions {
    /// How long the server keeps the session (and its ephemeral nodes) alive
    /// without hearing from the client. Default 10 s.
    pub session_timeout: Duration,
    /// Retries of operations that lost their connection.
    pub retry: RetryPolicy,
    /// Data stored in lock and lease nodes when a recipe is given none.
    /// Default: this host's IP address as text, as Curator stores.
    pub default_data: Vec<u8>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            session_timeout: Duration::from_secs(10),
            retry: RetryPolicy::default(),
            default_data: local_address().to_vec(),
        }
    }
}

impl SessionOptions {
    /// Sets the session timeout.
    pub fn with_session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// Sets the default node data.
    pub fn with_default_data(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.default_data = data.into();
        self
    }

    /// Sets the retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<()> {
        if self.session_timeout < Duration::from_millis(1) {
            return Err(Error::InvalidArgument(format!(
                "session timeout must be positive, got {:?}",
                self.session_timeout
            )));
        }
        if self.session_timeout > MAX_SESSION_TIMEOUT {
            return Err(Error::InvalidArgument(format!(
                "session timeout must be at most {MAX_SESSION_TIMEOUT:?} (Consul's longest \
                 session; ZooKeeper's servers allow far less), got {:?}",
                self.session_timeout
            )));
        }
        if self.retry.base_sleep.is_zero() && self.retry.max_retries > 0 {
            return Err(Error::InvalidArgument(
                "retry base sleep must be positive".into(),
            ));
        }
        Ok(())
    }
}

/// The longest session timeout a session may ask for: Consul's longest
/// session TTL (24 h); ZooKeeper's servers cap it far lower by default.
pub(crate) const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// This host's address as Curator writes it into lock nodes by default
/// (`InetAddress.getLocalHost().getHostAddress()`), or empty if unknown.
fn local_address() -> &'static [u8] {
    static ADDRESS: OnceLock<Vec<u8>> = OnceLock::new();
    ADDRESS.get_or_init(|| {
        use std::net::ToSocketAddrs;
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .or_else(|_| std::fs::read_to_string("/etc/hostname"))
            .unwrap_or_default();
        let host = host.trim();
        if host.is_empty() {
            return Vec::new();
        }
        (host, 0)
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.find(|a| a.is_ipv4()).or_else(|| addrs.next()))
            .map(|a| a.ip().to_string().into_bytes())
            .unwrap_or_default()
    })
}
