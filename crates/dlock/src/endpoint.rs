//! Endpoint URLs: which store to connect to.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::session::{Session, SessionOptions};

/// Where a session connects, parsed from a URL:
/// - `embedded` — the process-wide in-process store;
/// - `zk://host:port[,host:port...][/chroot]`, optionally with digest
///   credentials `zk://user:password@host:port/...`;
/// - `etcd://host:port[,host:port...]`, optionally `etcd://user:password@...`.
///
/// ```
/// use dlock::Endpoint;
/// let e: Endpoint = "zk://alice:secret@127.0.0.1:2181,127.0.0.1:2182/app".parse().unwrap();
/// match &e {
///     Endpoint::ZooKeeper { hosts, chroot, credentials } => {
///         assert_eq!(hosts, &["127.0.0.1:2181", "127.0.0.1:2182"]);
///         assert_eq!(chroot.as_deref(), Some("/app"));
///         assert_eq!(credentials.as_ref().unwrap().user, "alice");
///     }
///     _ => unreachable!(),
/// }
/// assert!("redis://x".parse::<Endpoint>().is_err());
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Endpoint {
    /// The process-wide embedded store.
    Embedded,
    /// A ZooKeeper ensemble.
    ZooKeeper {
        /// `host:port` of each server.
        hosts: Vec<String>,
        /// A path every other path is relative to.
        chroot: Option<String>,
        /// Digest credentials.
        credentials: Option<Credentials>,
    },
    /// An etcd cluster.
    Etcd {
        /// `host:port` of each member.
        hosts: Vec<String>,
        /// User and password.
        credentials: Option<Credentials>,
    },
}

/// A user name and password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user.
    pub user: String,
    /// The password.
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"***")
            .finish()
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for Endpoint {
    /// The URL, with any password masked.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let user = |c: &Option<Credentials>| match c {
            Some(c) => format!("{}:***@", c.user),
            None => String::new(),
        };
        match self {
            Endpoint::Embedded => f.write_str("embedded"),
            Endpoint::ZooKeeper {
                hosts,
                chroot,
                credentials,
            } => write!(
                f,
                "zk://{}{}{}",
                user(credentials),
                hosts.join(","),
                chroot.as_deref().unwrap_or("")
            ),
            Endpoint::Etcd { hosts, credentials } => {
                write!(f, "etcd://{}{}", user(credentials), hosts.join(","))
            }
        }
    }
}

impl FromStr for Endpoint {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        let fail = |reason: String| Error::InvalidEndpoint {
            url: url.to_string(),
            reason,
        };
        if url == "embedded" || url == "embedded://" {
            return Ok(Endpoint::Embedded);
        }
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| fail("expected embedded, zk://host:port or etcd://host:port".into()))?;
        if !matches!(scheme, "zk" | "zookeeper" | "etcd") {
            return Err(fail(format!(
                "unknown scheme {scheme:?}: use embedded, zk:// or etcd://"
            )));
        }
        let (credentials, rest) = match rest.rsplit_once('@') {
            Some((userinfo, rest)) => {
                let (user, password) = userinfo
                    .split_once(':')
                    .ok_or_else(|| fail("credentials must be user:password".into()))?;
                if user.is_empty() {
                    return Err(fail("empty user name".into()));
                }
                let creds = Credentials {
                    user: user.to_string(),
                    password: password.to_string(),
                };
                (Some(creds), rest)
            }
            None => (None, rest),
        };
        let (hosts, chroot) = match rest.find('/') {
            Some(i) => (&rest[..i], Some(&rest[i..])),
            None => (rest, None),
        };
        let hosts: Vec<String> = hosts.split(',').map(str::to_string).collect();
        for host in &hosts {
            let (name, port) = host
                .rsplit_once(':')
                .ok_or_else(|| fail(format!("host {host:?} needs a port (host:port)")))?;
            if name.is_empty() {
                return Err(fail(format!("host {host:?} has no name")));
            }
            port.parse::<u16>()
                .map_err(|_| fail(format!("port {port:?} of {host:?} is not a number 0-65535")))?;
        }
        match scheme {
            "zk" | "zookeeper" => {
                let chroot = match chroot {
                    None | Some("/") => None,
                    Some(c) => {
                        crate::path::validate(c).map_err(|e| fail(format!("bad chroot: {e}")))?;
                        Some(c.to_string())
                    }
                };
                Ok(Endpoint::ZooKeeper {
                    hosts,
                    chroot,
                    credentials,
                })
            }
            "etcd" => {
                if chroot.is_some_and(|c| c != "/") {
                    return Err(fail("etcd endpoints take no path".into()));
                }
                Ok(Endpoint::Etcd { hosts, credentials })
            }
            _ => unreachable!("scheme checked above"),
        }
    }
}

/// Connects a new session to the store at `endpoint` (see [`Endpoint`]),
/// with default options.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// let session = dlock::connect("embedded").await?;
/// assert_eq!(session.backend(), dlock::store::BackendKind::Embedded);
/// # Ok(()) }
/// ```
pub async fn connect(endpoint: &str) -> Result<Session> {
    connect_with(endpoint, SessionOptions::default()).await
}

/// Connects a new session to the store at `endpoint` with `options`.
pub async fn connect_with(endpoint: &str, options: SessionOptions) -> Result<Session> {
    let endpoint: Endpoint = endpoint.parse()?;
    connect_endpoint(&endpoint, options).await
}

/// Connects a new session to a parsed endpoint.
pub async fn connect_endpoint(endpoint: &Endpoint, options: SessionOptions) -> Result<Session> {
    options.validate()?;
    match endpoint {
        Endpoint::Embedded => {
            crate::store::embedded::EmbeddedServer::global()
                .connect(options)
                .await
        }
        #[cfg(feature = "zookeeper")]
        Endpoint::ZooKeeper { .. } => crate::store::zookeeper::connect(endpoint, options).await,
        #[cfg(not(feature = "zookeeper"))]
        Endpoint::ZooKeeper { .. } => Err(Error::InvalidEndpoint {
            url: endpoint.to_string(),
            reason: "dlock was built without the zookeeper feature".into(),
        }),
        #[cfg(feature = "etcd")]
        Endpoint::Etcd { .. } => crate::store::etcd::connect(endpoint, options).await,
        #[cfg(not(feature = "etcd"))]
        Endpoint::Etcd { .. } => Err(Error::InvalidEndpoint {
            url: endpoint.to_string(),
            reason: "dlock was built without the etcd feature (cargo build --features etcd; needs protoc)".into(),
        }),
    }
}
