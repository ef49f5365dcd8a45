//! Endpoint URLs: which store to connect to.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::error::{Error, Result};

/// Where a session connects, parsed from a URL:
/// - `embedded` — the process-wide in-process store;
/// - `zk://host:port[,host:port...][/chroot]`, optionally with digest
///   credentials `zk://user:password@host:port/...`;
/// - `etcd://host:port[,host:port...][/namespace]`, optionally
///   `etcd://user:password@...`; every key lives below `namespace` (as a
///   ZooKeeper chroot: the store path `/shop/stock` is the etcd key
///   `/namespace/shop/stock`). TLS with `etcds://` or any TLS option, given
///   as query parameters named after etcdctl's flags: `cacert` (the CA
///   bundle that signed the members' certificates; the system's roots if
///   absent), `cert` and `key` (a client certificate, both or neither), and
///   `domain` (the name the members' certificates carry, if not the host).
///   File paths are taken literally (no percent-decoding).
/// - `consul://host:port[,host:port...][/prefix][?token=...]` — Consul's
///   HTTP API; every key lives below `prefix` (the store path `/shop/stock`
///   is the Consul key `prefix/shop/stock`, or `shop/stock` without a
///   prefix). `token` is the ACL token (else `CONSUL_HTTP_TOKEN` at connect
///   time); it is never shown (`Display` masks it). `lock-delay` (`0s`,
///   `15s`: whole seconds) is the lock delay of the sessions (default `0s`,
///   see `dlock::store::consul`). TLS with `consuls://` or any of `cacert`,
///   `cert`, `key`, `domain`, as for etcd.
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
///
/// let e: Endpoint = "etcds://10.0.0.1:2379/app?cacert=/etc/etcd/ca.pem".parse().unwrap();
/// match &e {
///     Endpoint::Etcd { hosts, namespace, tls, .. } => {
///         assert_eq!(hosts, &["10.0.0.1:2379"]);
///         assert_eq!(namespace.as_deref(), Some("/app"));
///         let ca = tls.as_ref().unwrap().ca_file.as_ref().unwrap();
///         assert_eq!(ca, std::path::Path::new("/etc/etcd/ca.pem"));
///     }
///     _ => unreachable!(),
/// }
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
        /// A path every key lives below (`None`: keys are the paths).
        namespace: Option<String>,
        /// TLS to every member (`None`: plain HTTP/2).
        tls: Option<TlsFiles>,
    },
    /// A Consul datacenter, through the HTTP API of its agents or servers.
    Consul {
        /// `host:port` of each agent.
        hosts: Vec<String>,
        /// A path every key lives below (`None`: keys are the paths without
        /// their leading `/`).
        prefix: Option<String>,
        /// The ACL token (`None`: `CONSUL_HTTP_TOKEN`, if set, at connect
        /// time).
        token: Option<String>,
        /// TLS to every agent (`None`: plain HTTP).
        tls: Option<TlsFiles>,
        /// The sessions' lock delay (`None`: 0 s).
        lock_delay: Option<std::time::Duration>,
    },
}

/// TLS settings of an etcd endpoint: PEM files, read when a session
/// connects.
///
/// ```
/// use dlock::Endpoint;
/// let e: Endpoint = "etcd://127.0.0.1:2379?cacert=ca.pem&cert=me.pem&key=me-key.pem&domain=etcd.local"
///     .parse()
///     .unwrap();
/// let Endpoint::Etcd { tls: Some(tls), .. } = &e else { unreachable!() };
/// assert_eq!(tls.domain.as_deref(), Some("etcd.local"));
/// assert!(tls.cert_file.is_some() && tls.key_file.is_some());
/// // A certificate without its key is refused, naming the problem.
/// let err = "etcd://127.0.0.1:2379?cert=me.pem".parse::<Endpoint>().unwrap_err();
/// assert!(err.to_string().contains("cert and key"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsFiles {
    /// The CA bundle that signed the members' certificates (`cacert`);
    /// `None`: the system's trusted roots.
    pub ca_file: Option<PathBuf>,
    /// This client's certificate (`cert`), for members that require one.
    pub cert_file: Option<PathBuf>,
    /// The private key of `cert_file` (`key`).
    pub key_file: Option<PathBuf>,
    /// The server name to verify (`domain`), if not the host name.
    pub domain: Option<String>,
}

impl TlsFiles {
    fn query(&self) -> String {
        let mut params = Vec::new();
        let mut add = |name: &str, value: Option<String>| {
            if let Some(v) = value {
                params.push(format!("{name}={v}"));
            }
        };
        add(
            "cacert",
            self.ca_file.as_ref().map(|p| p.display().to_string()),
        );
        add(
            "cert",
            self.cert_file.as_ref().map(|p| p.display().to_string()),
        );
        add(
            "key",
            self.key_file.as_ref().map(|p| p.display().to_string()),
        );
        add("domain", self.domain.clone());
        if params.is_empty() {
            String::new()
        } else {
            format!("?{}", params.join("&"))
        }
    }
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
            Endpoint::Etcd {
                hosts,
                credentials,
                namespace,
                tls,
            } => write!(
                f,
                "{}://{}{}{}{}",
                if tls.is_some() { "etcds" } else { "etcd" },
                user(credentials),
                hosts.join(","),
                namespace.as_deref().unwrap_or(""),
                tls.as_ref().map(TlsFiles::query).unwrap_or_default()
            ),
            Endpoint::Consul {
                hosts,
                prefix,
                token,
                tls,
                lock_delay,
            } => {
                let mut query = tls.as_ref().map(TlsFiles::query).unwrap_or_default();
                let mut add = |param: String| {
                    query.push(if query.is_empty() { '?' } else { '&' });
                    query.push_str(&param);
                };
                if token.is_some() {
                    add("token=***".into());
                }
                if let Some(delay) = lock_delay {
                    add(format!("lock-delay={}s", delay.as_secs()));
                }
                write!(
                    f,
                    "{}://{}{}{query}",
                    if tls.is_some() { "consuls" } else { "consul" },
                    hosts.join(","),
                    prefix.as_deref().unwrap_or(""),
                )
            }
        }
    }
}

impl Endpoint {
    /// The same endpoint without user and password: what may be shown or
    /// handed to another program (the display only masks the password; this
    /// drops the user too, so the URL names no account at all).
    ///
    /// ```
    /// let e: dlock::Endpoint = "etcd://alice:s3cret@127.0.0.1:2379/app".parse().unwrap();
    /// assert_eq!(e.without_credentials().to_string(), "etcd://127.0.0.1:2379/app");
    /// let z: dlock::Endpoint = "zk://bob:pw@h1:2181,h2:2181/chroot".parse().unwrap();
    /// assert_eq!(z.without_credentials().to_string(), "zk://h1:2181,h2:2181/chroot");
    /// let c: dlock::Endpoint = "consul://127.0.0.1:8500/app?token=s3cret".parse().unwrap();
    /// assert!(!c.without_credentials().to_string().contains("token"));
    /// ```
    pub fn without_credentials(&self) -> Endpoint {
        let mut bare = self.clone();
        match &mut bare {
            Endpoint::ZooKeeper { credentials, .. } | Endpoint::Etcd { credentials, .. } => {
                *credentials = None;
            }
            // The ACL token is Consul's credential.
            Endpoint::Consul { token, .. } => *token = None,
            Endpoint::Embedded => {}
        }
        bare
    }
}

impl FromStr for Endpoint {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self> {
        let fail = |reason: String| Error::InvalidEndpoint {
            url: mask_token(&mask_password(url)),
            reason,
        };
        if url == "embedded" || url == "embedded://" {
            return Ok(Endpoint::Embedded);
        }
        let (scheme, rest) = url.split_once("://").ok_or_else(|| {
            fail("expected embedded, zk://host:port, etcd://host:port or consul://host:port".into())
        })?;
        // As in any URL, the scheme's case does not matter.
        let scheme = scheme.to_ascii_lowercase();
        let scheme = scheme.as_str();
        if !matches!(
            scheme,
            "zk" | "zookeeper" | "etcd" | "etcds" | "consul" | "consuls"
        ) {
            return Err(fail(format!(
                "unknown scheme {scheme:?}: use embedded, zk://, etcd://, etcds://, consul:// or consuls://"
            )));
        }
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        // As in any URL, the authority (credentials and hosts) ends at the
        // first '/'; a '/', '?' or '@' in a password is percent-encoded.
        let (authority, chroot) = match rest.find('/') {
            Some(i) => (&rest[..i], Some(&rest[i..])),
            None => (rest, None),
        };
        // No credentials before the '/' or '?', and hosts after a later
        // '@': a password holding a raw '/' or '?', which would otherwise
        // parse as a host and a path (and show in both).
        if raw_credentials(url).is_some() {
            return Err(fail(
                "an '@' after the hosts, with no credentials before them: if a password holds \
                 '/', '?' or '@', percent-encode them (%2F, %3F, %40)"
                    .into(),
            ));
        }
        let (credentials, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => {
                let (user, password) = userinfo
                    .split_once(':')
                    .ok_or_else(|| fail("credentials must be user:password".into()))?;
                let user = percent_decode(user).map_err(&fail)?;
                if user.is_empty() {
                    return Err(fail("empty user name".into()));
                }
                let password = percent_decode(password).map_err(&fail)?;
                (Some(Credentials { user, password }), hosts)
            }
            None => (None, authority),
        };
        let hosts: Vec<String> = hosts.split(',').map(str::to_string).collect();
        for host in &hosts {
            let (name, port) = host
                .rsplit_once(':')
                .ok_or_else(|| fail(format!("host {host:?} needs a port (host:port)")))?;
            if name.is_empty() {
                return Err(fail(format!("host {host:?} has no name")));
            }
            // Else a failure to connect, later, that names no cause.
            if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(fail(format!(
                    "host {host:?} holds a space or a control character"
                )));
            }
            let bracketed = name.starts_with('[') && name.ends_with(']');
            if name.contains(':') && !bracketed {
                return Err(fail(format!(
                    "host {host:?}: an IPv6 address goes in brackets, as [::1]:2379"
                )));
            }
            let port_ok = !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && port.parse::<u16>().is_ok_and(|p| p != 0);
            if !port_ok {
                return Err(fail(format!(
                    "port {port:?} of {host:?} is not a number 1-65535"
                )));
            }
        }
        let below = |what: &str| match chroot {
            None | Some("/") => Ok(None),
            Some(c) => match crate::path::validate(c) {
                Ok(()) => Ok(Some(c.to_string())),
                Err(e) => Err(fail(format!("bad {what}: {e}"))),
            },
        };
        match scheme {
            "zk" | "zookeeper" => {
                if query.is_some() {
                    return Err(fail("zk:// endpoints take no ?options".into()));
                }
                let chroot = below("chroot")?;
                Ok(Endpoint::ZooKeeper {
                    hosts,
                    chroot,
                    credentials,
                })
            }
            "etcd" | "etcds" => {
                let namespace = below("namespace")?;
                let tls = match query {
                    None | Some("") => None,
                    Some(query) => Some(parse_tls(query).map_err(fail)?),
                };
                let tls = tls.or_else(|| (scheme == "etcds").then(TlsFiles::default));
                Ok(Endpoint::Etcd {
                    hosts,
                    credentials,
                    namespace,
                    tls,
                })
            }
            "consul" | "consuls" => {
                if credentials.is_some() {
                    return Err(fail(
                        "consul:// endpoints take an ACL token (?token=...), not user:password"
                            .into(),
                    ));
                }
                let prefix = below("prefix")?;
                let mut token = None;
                let mut lock_delay = None;
                let mut tls_params = Vec::new();
                for param in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
                    match param.split_once('=') {
                        Some(("token", value)) => {
                            if value.is_empty() {
                                return Err(fail("option \"token\" has an empty value".into()));
                            }
                            let value = percent_decode(value).map_err(&fail)?;
                            if !fits_a_header(&value) {
                                return Err(fail(
                                    "option \"token\" holds a character an HTTP header cannot \
                                     carry (a control character such as a newline, or non-ASCII)"
                                        .into(),
                                ));
                            }
                            if token.replace(value).is_some() {
                                return Err(fail("option \"token\" is given twice".into()));
                            }
                        }
                        Some(("lock-delay", value)) => {
                            let secs = value.strip_suffix('s').unwrap_or(value);
                            let secs: u64 = secs.parse().map_err(|_| {
                                fail(format!(
                                    "lock-delay {value:?} is not whole seconds (like 15s)"
                                ))
                            })?;
                            if lock_delay
                                .replace(std::time::Duration::from_secs(secs))
                                .is_some()
                            {
                                return Err(fail("option \"lock-delay\" is given twice".into()));
                            }
                        }
                        _ => tls_params.push(param),
                    }
                }
                let tls = match tls_params.is_empty() {
                    true => None,
                    false => Some(parse_tls(&tls_params.join("&")).map_err(|e| {
                        fail(e.replace(
                            "etcd endpoints take cacert, cert, key and domain",
                            "consul endpoints take token, lock-delay, cacert, cert, key and domain",
                        ))
                    })?),
                };
                let tls = tls.or_else(|| (scheme == "consuls").then(TlsFiles::default));
                Ok(Endpoint::Consul {
                    hosts,
                    prefix,
                    token,
                    tls,
                    lock_delay,
                })
            }
            _ => unreachable!("scheme checked above"),
        }
    }
}

/// `url` with the value of a `token=` option replaced by `***`.
fn mask_token(url: &str) -> String {
    let Some((head, query)) = url.split_once('?') else {
        return url.to_string();
    };
    let params: Vec<String> = query
        .split('&')
        .map(|p| match p.split_once('=') {
            Some(("token", _)) => "token=***".to_string(),
            _ => p.to_string(),
        })
        .collect();
    format!("{head}?{}", params.join("&"))
}

/// `url` with the password of its credentials, if any, replaced by `***`
/// (errors quote the URL).
fn mask_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    if let Some(after) = raw_credentials(url) {
        return format!("{scheme}://***@{after}");
    }
    match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{hosts}{tail}"),
            // No ':': the whole of it may be the secret (a token).
            None => format!("{scheme}://***@{hosts}{tail}"),
        },
        None => url.to_string(),
    }
}

/// Where `url` holds credentials with a raw '/' or '?' (so its authority,
/// which ends at the first of them, has no '@'): what follows the '@' that
/// ends them, which starts with hosts (`name:port`, comma-separated). An
/// '@' in a chroot or an option's value is followed by no such hosts.
fn raw_credentials(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
    if authority.contains('@') {
        return None;
    }
    let after = &rest[rest.rfind('@')? + 1..];
    let hosts = &after[..after.find(['/', '?']).unwrap_or(after.len())];
    let is_host = |h: &str| {
        h.rsplit_once(':').is_some_and(|(name, port)| {
            !name.is_empty() && !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())
        })
    };
    hosts.split(',').all(is_host).then_some(after)
}

/// Decodes `%XX` escapes (user names and passwords may hold any byte).
/// Whether `value` can be sent as an HTTP header's value: visible ASCII,
/// spaces and tabs (as `http::HeaderValue::from_str` takes them).
pub(crate) fn fits_a_header(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
}

fn percent_decode(s: &str) -> std::result::Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .filter(|_| bytes[i + 1].is_ascii_hexdigit() && bytes[i + 2].is_ascii_hexdigit())
                .ok_or_else(|| format!("bad percent-escape in credentials at byte {i}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "credentials are not UTF-8 once percent-decoded".to_string())
}

/// The TLS options of an etcd URL's query (`cacert=..&cert=..&key=..&domain=..`).
fn parse_tls(query: &str) -> std::result::Result<TlsFiles, String> {
    let mut tls = TlsFiles::default();
    for param in query.split('&') {
        let (name, value) = param
            .split_once('=')
            .ok_or_else(|| format!("option {param:?} needs a value (name=value)"))?;
        if value.is_empty() {
            return Err(format!("option {name:?} has an empty value"));
        }
        let slot = match name {
            "cacert" => &mut tls.ca_file,
            "cert" => &mut tls.cert_file,
            "key" => &mut tls.key_file,
            "domain" => {
                if tls.domain.replace(value.to_string()).is_some() {
                    return Err(format!("option {name:?} is given twice"));
                }
                continue;
            }
            _ => {
                return Err(format!(
                    "unknown option {name:?}: etcd endpoints take cacert, cert, key and domain"
                ))
            }
        };
        if slot.replace(PathBuf::from(value)).is_some() {
            return Err(format!("option {name:?} is given twice"));
        }
    }
    if tls.cert_file.is_some() != tls.key_file.is_some() {
        return Err("a client certificate needs both cert and key".into());
    }
    Ok(tls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn etcd(url: &str) -> (Vec<String>, Option<String>, Option<TlsFiles>) {
        match url.parse::<Endpoint>().unwrap() {
            Endpoint::Etcd {
                hosts,
                namespace,
                tls,
                ..
            } => (hosts, namespace, tls),
            other => panic!("{other} is not etcd"),
        }
    }

    fn refused(url: &str) -> String {
        match url.parse::<Endpoint>() {
            Err(Error::InvalidEndpoint { url: named, reason }) => {
                assert_eq!(named, url);
                reason
            }
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn etcd_namespaces_and_tls() {
        assert_eq!(etcd("etcd://h:1"), (vec!["h:1".into()], None, None));
        assert_eq!(etcd("etcd://h:1/").1, None);
        assert_eq!(etcd("etcd://h:1,g:2/app/x").1.as_deref(), Some("/app/x"));
        assert_eq!(etcd("etcds://h:1").2, Some(TlsFiles::default()));
        let (_, ns, tls) = etcd("etcd://u:p@h:1/app?cacert=/c.pem&domain=etcd.local");
        assert_eq!(ns.as_deref(), Some("/app"));
        let tls = tls.unwrap();
        assert_eq!(tls.ca_file, Some(PathBuf::from("/c.pem")));
        assert_eq!(tls.domain.as_deref(), Some("etcd.local"));
        assert_eq!(tls.cert_file, None);
    }

    #[test]
    fn display_round_trips_and_masks_the_password() {
        for url in [
            "etcd://h:1,g:2",
            "etcd://h:1/app",
            "etcds://h:1",
            "etcds://h:1/app?cacert=/c.pem&cert=/me.pem&key=/me.key&domain=d",
            "zk://h:1/chroot",
        ] {
            let e: Endpoint = url.parse().unwrap();
            assert_eq!(e.to_string(), url);
            assert_eq!(e.to_string().parse::<Endpoint>().unwrap(), e);
        }
        let e: Endpoint = "etcd://alice:secret@h:1/app".parse().unwrap();
        assert_eq!(e.to_string(), "etcd://alice:***@h:1/app");
    }

    #[test]
    fn bad_options_are_named() {
        assert!(refused("etcd://h:1?verify=no").contains("unknown option \"verify\""));
        assert!(refused("etcd://h:1?cacert=a&cacert=b").contains("given twice"));
        assert!(refused("etcd://h:1?cacert").contains("needs a value"));
        assert!(refused("etcd://h:1?cacert=").contains("empty value"));
        assert!(refused("etcd://h:1?key=k").contains("both cert and key"));
        assert!(refused("etcd://h:1/a//b").contains("bad namespace"));
        assert!(refused("zk://h:1?cacert=a").contains("no ?options"));
        assert!(refused("etcdx://h:1").contains("unknown scheme"));
        assert!(refused("zk://h:+2181").contains("not a number 1-65535"));
        assert!(refused("zk://h:0").contains("not a number 1-65535"));
        assert!(refused("zk://h1:2181, h2:2181").contains("a space"));
        assert!(refused("etcd://::1:2379").contains("in brackets"));
        assert!("etcd://[::1]:2379".parse::<Endpoint>().is_ok());
        assert_eq!(
            "ZK://h:1".parse::<Endpoint>().unwrap(),
            "zk://h:1".parse::<Endpoint>().unwrap()
        );
    }

    #[test]
    fn consul_prefixes_tokens_and_tls() {
        let e: Endpoint = "consul://h:8500,g:8500/app?token=s3cret&lock-delay=15s"
            .parse()
            .unwrap();
        let Endpoint::Consul {
            hosts,
            prefix,
            token,
            tls,
            lock_delay,
        } = &e
        else {
            unreachable!()
        };
        assert_eq!(hosts, &["h:8500", "g:8500"]);
        assert_eq!(prefix.as_deref(), Some("/app"));
        assert_eq!(token.as_deref(), Some("s3cret"));
        assert_eq!(tls, &None);
        assert_eq!(*lock_delay, Some(std::time::Duration::from_secs(15)));
        assert_eq!(
            e.to_string(),
            "consul://h:8500,g:8500/app?token=***&lock-delay=15s"
        );
        let e: Endpoint = "consuls://h:8501?cacert=/ca.pem".parse().unwrap();
        assert_eq!(e.to_string(), "consuls://h:8501?cacert=/ca.pem");
        assert_eq!(e.to_string().parse::<Endpoint>().unwrap(), e);
        let e: Endpoint = "consuls://h:8501".parse().unwrap();
        assert!(matches!(e, Endpoint::Consul { tls: Some(_), .. }));
        let err = "consul://h:1?token=s3cret&x=1"
            .parse::<Endpoint>()
            .unwrap_err();
        assert!(!err.to_string().contains("s3cret"), "{err}");
        assert!(err.to_string().contains("unknown option \"x\""), "{err}");
        let err = "consul://u:p@h:1".parse::<Endpoint>().unwrap_err();
        assert!(err.to_string().contains("ACL token"), "{err}");
        assert!(refused("consul://h:1?lock-delay=soon").contains("whole seconds"));
        // A token an HTTP header cannot carry is refused here, not taken
        // for an agent that cannot be reached.
        let err = "consul://h:1?token=s3cret%0A"
            .parse::<Endpoint>()
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot carry"), "{err}");
        assert!(!err.contains("s3cret"), "{err}");
    }

    #[test]
    fn credentials_and_chroots_split_like_urls() {
        let e: Endpoint = "zk://u:p%2F%40%3F@h:1/a@b".parse().unwrap();
        let Endpoint::ZooKeeper {
            hosts,
            chroot,
            credentials,
        } = e
        else {
            unreachable!()
        };
        assert_eq!(hosts, ["h:1"]);
        assert_eq!(chroot.as_deref(), Some("/a@b"));
        assert_eq!(credentials.unwrap().password, "p/@?");
        let err = "zk://u:%4@h:1".parse::<Endpoint>().unwrap_err();
        assert!(err.to_string().contains("percent-escape"), "{err}");
    }

    #[test]
    fn errors_never_show_the_password() {
        for url in ["zk://alice:s3cret@h:99999", "etcd://alice:s3cret@h:1?x=1"] {
            let err = url.parse::<Endpoint>().unwrap_err();
            assert!(!err.to_string().contains("s3cret"), "{err}");
            assert!(err.to_string().contains("alice:***@"), "{err}");
        }
        // Credentials without a ':' (a token where user:password belongs)
        // are refused, and hidden whole.
        let err = "etcd://S3CRET@h:2379".parse::<Endpoint>().unwrap_err();
        assert!(!err.to_string().contains("S3CRET"), "{err}");
        assert!(err.to_string().contains("***@h:2379"), "{err}");
        // A raw '/' or '?' in the password: refused (it would parse as a
        // host and a path), naming the escapes, never quoting the password.
        for url in [
            "etcd://alice:s3/cret@h:2379",
            "zk://alice:1234/s3cret@h:2181",
            "etcd://alice:s3?cret@h:2379",
        ] {
            let err = url.parse::<Endpoint>().unwrap_err();
            let shown = err.to_string();
            assert!(
                !shown.contains("cret") && !shown.contains("1234"),
                "{shown}"
            );
            assert!(shown.contains("%2F"), "{shown}");
        }
        // An '@' in a chroot or an option's value, with no hosts after it,
        // is no password.
        for url in [
            "zk://h:2181/svc@v2",
            "zk://h:2181/a@b/c",
            "consul://h:8500/a@b",
        ] {
            assert!(url.parse::<Endpoint>().is_ok(), "{url}");
        }
    }
}
