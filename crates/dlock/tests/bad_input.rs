//! Bad input: property and edge-case tests. Every bad path, endpoint URL,
//! stored value, quantity or late call gets a typed [`dlock::Error`] with a
//! message naming the problem — never a panic — and leaves nothing behind.
//!
//! The parsing properties need no store; everything that touches one runs
//! on every backend (embedded, ZooKeeper, etcd, Consul) through `per_backend!`.

mod common;

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use common::tests1::{remove, started_count};
use common::{await_children, persistent, Harness};
use dlock::recipes::kv_semaphore::{Record, RECORD};
use dlock::recipes::shared_count::{decode, encode, SharedCount};
use dlock::store::{BackendKind, Op};
use dlock::{
    Endpoint, Error, KvSemaphore, LatchState, LeaderLatch, LeaderSelector, MultiLock, Mutex,
    ReadWriteLock, Semaphore, SemaphoreMutex, Session,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

const WITHIN: Duration = Duration::from_secs(20);

/// Pure parsing properties: many cases, no regression files written into
/// the source tree.
fn parsing() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// `n` values of `strategy`, for the store-backed cases (a handful each: a
/// failing value is printed by the assertion that rejects it).
fn sample<S: Strategy>(strategy: S, n: usize) -> Vec<S::Value> {
    let mut runner = TestRunner::default();
    (0..n)
        .map(|_| {
            strategy
                .new_tree(&mut runner)
                .expect("generate a value")
                .current()
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Paths
// ---------------------------------------------------------------------------

/// ZooKeeper's character rule, restated independently of `dlock::path`:
/// what the ZooKeeper client refuses (bounds included) and, beyond U+FFFF,
/// what the server refuses (a surrogate pair in Java's UTF-16).
fn zk_forbids(c: char) -> bool {
    matches!(c as u32, 0..=0x1f | 0x7f..=0x9f | 0xd800..=0xf8ff | 0xfff0..=0xffff | 0x10000..)
}

/// ZooKeeper's path rules, restated as an oracle.
fn zk_accepts(path: &str) -> bool {
    if path == "/" {
        return true;
    }
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    rest.split('/')
        .all(|segment| !segment.is_empty() && segment != "." && segment != "..")
        && !path.chars().any(zk_forbids)
}

/// A character ZooKeeper allows in a node name (never `/`).
fn name_char() -> impl Strategy<Value = char> {
    prop_oneof![
        6 => proptest::char::range(' ', '~').prop_filter("no slash", |c| *c != '/'),
        1 => Just('.'),
        1 => proptest::char::range('\u{a0}', '\u{d7ff}'),
        1 => proptest::char::range('\u{f900}', '\u{ffef}'),
    ]
}

/// A character ZooKeeper forbids, edges of each range included.
fn forbidden_char() -> impl Strategy<Value = char> {
    prop_oneof![
        proptest::char::range('\u{0}', '\u{1f}'),
        proptest::char::range('\u{7f}', '\u{9f}'),
        proptest::char::range('\u{e000}', '\u{f8ff}'),
        proptest::char::range('\u{fff0}', '\u{ffff}'),
        proptest::char::range('\u{10000}', char::MAX),
        Just('\u{1f}'),
        Just('\u{9f}'),
        Just('\u{f8ff}'),
        Just('\u{ffff}'),
        Just('\u{10000}'),
    ]
}

/// A valid node name: not `.` or `..`.
fn segment() -> impl Strategy<Value = String> {
    proptest::collection::vec(name_char(), 1..8)
        .prop_map(String::from_iter)
        .prop_filter("not a relative segment", |s| s != "." && s != "..")
}

/// A valid path (the root included).
fn valid_path() -> impl Strategy<Value = String> {
    proptest::collection::vec(segment(), 0..5).prop_map(|segments| {
        if segments.is_empty() {
            "/".to_string()
        } else {
            format!("/{}", segments.join("/"))
        }
    })
}

/// A valid path other than the root.
fn node_path() -> impl Strategy<Value = String> {
    proptest::collection::vec(segment(), 1..4).prop_map(|s| format!("/{}", s.join("/")))
}

/// Strings close to paths: slashes, dots and characters on both sides of
/// every forbidden range, so that the rules, not luck, decide.
fn near_path() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => Just("/".to_string()),
        3 => Just(".".to_string()),
        4 => Just("a".to_string()),
        1 => Just("é".to_string()),
        4 => forbidden_char().prop_map(String::from),
        2 => name_char().prop_map(String::from),
        1 => prop_oneof![
            Just(' '), Just('~'), Just('\u{a0}'), Just('\u{d7ff}'), Just('\u{f900}'),
            Just('\u{ffef}')
        ]
        .prop_map(String::from),
    ];
    proptest::collection::vec(piece, 0..12).prop_map(|pieces| pieces.concat())
}

/// One way to break a valid, non-root path, with the path it makes.
fn broken_path() -> impl Strategy<Value = String> {
    (
        node_path(),
        0usize..6,
        forbidden_char(),
        any::<prop::sample::Index>(),
    )
        .prop_map(|(path, how, bad, at)| {
            let cut = {
                // A char boundary inside the path, after its leading slash.
                let bounds: Vec<usize> = path.char_indices().map(|(i, _)| i).skip(1).collect();
                if bounds.is_empty() {
                    path.len()
                } else {
                    bounds[at.index(bounds.len())]
                }
            };
            match how {
                0 => String::new(),
                1 => path[1..].to_string(),
                2 => format!("{path}/"),
                3 => format!("{}//{}", &path[..cut], &path[cut..]),
                4 => format!("{path}/{}", if at.index(2) == 0 { "." } else { ".." }),
                _ => format!("{}{bad}{}", &path[..cut], &path[cut..]),
            }
        })
        .prop_filter("broken", |p| !zk_accepts(p))
}

/// Whether `err` is `InvalidPath` for exactly `path`, with a message naming it.
fn is_invalid_path(err: &Error, path: &str) -> bool {
    matches!(err, Error::InvalidPath { path: p, reason } if p == path && !reason.is_empty())
        && err.to_string().contains(&format!("{path:?}"))
}

proptest! {
    #![proptest_config(parsing())]

    /// Every generated valid path is accepted, and the path helpers agree
    /// with it.
    #[test]
    fn valid_paths_are_accepted(path in valid_path(), child in segment()) {
        prop_assert!(dlock::path::validate(&path).is_ok(), "{path:?} refused");
        let joined = dlock::path::join(&path, &child);
        prop_assert!(dlock::path::validate(&joined).is_ok(), "{joined:?} refused");
        prop_assert_eq!(dlock::path::parent(&joined), path.as_str());
        prop_assert_eq!(dlock::path::node_name(&joined), child.as_str());
    }

    /// Arbitrary strings and near-paths: never a panic; accepted exactly
    /// when ZooKeeper's rules accept; every refusal is `InvalidPath` naming
    /// the path.
    #[test]
    fn any_string_is_judged_by_zookeepers_rules(
        path in prop_oneof![any::<String>(), near_path()]
    ) {
        match dlock::path::validate(&path) {
            Ok(()) => prop_assert!(zk_accepts(&path), "{path:?} accepted"),
            Err(err) => {
                prop_assert!(!zk_accepts(&path), "{path:?} refused: {err}");
                prop_assert!(is_invalid_path(&err, &path), "{path:?} gave {err:?}");
            }
        }
    }

    /// Each way of breaking a valid path is refused with `InvalidPath`.
    #[test]
    fn broken_paths_are_refused(path in broken_path()) {
        let err = dlock::path::validate(&path).unwrap_err();
        prop_assert!(is_invalid_path(&err, &path), "{path:?} gave {err:?}");
    }

    /// A forbidden character anywhere is refused, and the message names it.
    #[test]
    fn forbidden_characters_are_named(
        path in node_path(),
        bad in forbidden_char(),
        at in any::<prop::sample::Index>(),
    ) {
        let bounds: Vec<usize> = path.char_indices().map(|(i, _)| i).skip(1).collect();
        let cut = bounds[at.index(bounds.len())];
        let bad_path = format!("{}{bad}{}", &path[..cut], &path[cut..]);
        let err = dlock::path::validate(&bad_path).unwrap_err();
        prop_assert!(is_invalid_path(&err, &bad_path), "{bad_path:?} gave {err:?}");
        let code = format!("U+{:04X}", bad as u32);
        prop_assert!(err.to_string().contains(&code), "{err} does not name {code}");
    }
}

/// The structural rules, one by one, with the reason each gives.
#[test]
fn each_path_rule_gives_its_reason() {
    for (path, reason) in [
        ("", "empty"),
        ("a/b", "start with /"),
        ("/a/", "end with /"),
        ("//", "end with /"),
        ("/a//b", "double slash"),
        ("/.", "relative"),
        ("/a/..", "relative"),
        ("/a/./b", "relative"),
        ("/a\u{0}b", "U+0000"),
        ("/\u{1f}", "U+001F"),
        ("/\u{7f}", "U+007F"),
        ("/\u{9f}", "U+009F"),
        ("/\u{e000}", "U+E000"),
        ("/\u{f8ff}", "U+F8FF"),
        ("/\u{fff0}", "U+FFF0"),
        ("/\u{ffff}", "U+FFFF"),
        ("/😀", "U+1F600"),
    ] {
        let err = dlock::path::validate(path).unwrap_err();
        assert!(is_invalid_path(&err, path), "{path:?} gave {err:?}");
        assert!(err.to_string().contains(reason), "{path:?}: {err}");
    }
    for path in [
        "/",
        "/a",
        "/a/..b",
        "/...",
        "/.a",
        "/a b",
        "/\u{a0}",
        "/\u{d7ff}",
        "/\u{f900}",
        "/\u{ffef}",
        "/~",
    ] {
        assert!(dlock::path::validate(path).is_ok(), "{path:?} refused");
    }
}

/// Valid paths (unicode, spaces and dots included) round-trip through
/// every backend; characters at the edges of the forbidden ranges are
/// refused before reaching the store, so no backend holds a path another
/// could not (ZooKeeper's client and server refuse them).
async fn paths_dlock_accepts_every_backend_holds(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let mut paths = sample(node_path(), 12);
    paths.extend(
        [
            "/a b",
            "/...",
            "/..x",
            "/\u{a0}",
            "/\u{d7ff}",
            "/\u{f900}",
            "/\u{ffef}",
            "/~",
        ]
        .map(String::from),
    );
    for (i, p) in paths.iter().enumerate() {
        // One subtree per path, so that generated paths do not collide.
        let path = format!("{}/{i}{p}", h.root);
        match s.create(&path, path.as_bytes(), persistent()).await {
            Ok(_) => {}
            // Consul's key URLs refuse characters Go does not count as
            // printable (U+00A0, U+FFEF, ... among these): a typed refusal
            // naming the path — or the ancestor that holds the character,
            // which is read first — before anything is written (`finish`
            // checks).
            Err(dlock::Error::InvalidPath { path: named, .. })
                if s.backend() == BackendKind::Consul && !p.is_ascii() =>
            {
                let names_it_or_an_ancestor = named == path
                    || path
                        .strip_prefix(named.as_str())
                        .is_some_and(|rest| rest.starts_with('/'));
                ensure!(
                    names_it_or_an_ancestor && !named.is_ascii(),
                    "{path:?} refused as {named:?}"
                );
                continue;
            }
            Err(e) => return Err(e).with_context(|| format!("create {path:?}")),
        }
        let (data, _) = s.get_data(&path).await?;
        ensure!(data == path.as_bytes(), "{path:?} read back {data:?}");
        let children = s.children(dlock::path::parent(&path)).await?;
        let name = dlock::path::node_name(&path);
        ensure!(
            children.iter().any(|c| c.name == name),
            "{path:?}: {name:?} not among {children:?}"
        );
        s.delete(&path, None).await?;
    }
    let mut bad = sample(broken_path(), 12);
    bad.extend(
        [
            '\u{0}', '\u{1f}', '\u{7f}', '\u{9f}', '\u{e000}', '\u{f8ff}', '\u{fff0}', '\u{ffff}',
            '😀',
        ]
        .map(|c| format!("/x{c}")),
    );
    for b in bad {
        // Relative or empty paths stay as they are; the others go under
        // the test's root.
        let path = if b.starts_with('/') {
            format!("{}{b}", h.root)
        } else {
            b
        };
        let err = s
            .create(&path, b"x", persistent())
            .await
            .err()
            .with_context(|| format!("{path:?} was created"))?;
        ensure!(is_invalid_path(&err, &path), "{path:?} gave {err:?}");
        let err = s.get_data(&path).await.unwrap_err();
        ensure!(is_invalid_path(&err, &path), "{path:?} gave {err:?}");
    }
    common::remove_tree(&s, &h.root).await
}

/// Every recipe refuses a bad path (and the root) in its constructor, with
/// `InvalidPath` naming the path, before touching the store.
async fn recipes_refuse_bad_paths(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let count = SharedCount::new(&s, &h.path("/count"), 1)?;
    let mut bad = sample(broken_path(), 8);
    bad.extend(
        [
            "", "locks", "/", "/a/", "//", "/a//b", "/a/./b", "/a/..", "/a\u{0}", "/a\u{1f}", "/😀",
        ]
        .map(String::from),
    );
    for path in &bad {
        let path = path.as_str();
        let check = |what: &str, err: Error| -> Result<()> {
            ensure!(is_invalid_path(&err, path), "{what} at {path:?}: {err:?}");
            Ok(())
        };
        check("Mutex", Mutex::new(&s, path).unwrap_err())?;
        check("SemaphoreMutex", SemaphoreMutex::new(&s, path).unwrap_err())?;
        check("ReadWriteLock", ReadWriteLock::new(&s, path).unwrap_err())?;
        check("Semaphore", Semaphore::new(&s, path, 2).unwrap_err())?;
        check(
            "Semaphore::with_count",
            Semaphore::with_count(&s, path, count.clone()).unwrap_err(),
        )?;
        check("KvSemaphore", KvSemaphore::new(&s, path, 2).unwrap_err())?;
        check("LeaderLatch", LeaderLatch::new(&s, path).unwrap_err())?;
        check(
            "LeaderSelector",
            LeaderSelector::new(&s, path, |_| async {}).unwrap_err(),
        )?;
        check("SharedCount", SharedCount::new(&s, path, 0).unwrap_err())?;
    }
    ensure!(s.exists(&h.root).await?.is_none(), "nothing was created");
    Ok(())
}

// ---------------------------------------------------------------------------
// Endpoint URLs
// ---------------------------------------------------------------------------

/// A host name, an IPv4 address or a bracketed IPv6 address.
fn host_name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z][a-z0-9-]{0,10}(\\.[a-z][a-z0-9-]{0,6}){0,2}",
        (any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>())
            .prop_map(|(a, b, c, d)| format!("{a}.{b}.{c}.{d}")),
        Just("[::1]".to_string()),
        "\\[[0-9a-f]{1,4}(:[0-9a-f]{1,4}){2,7}\\]",
    ]
}

/// `host:port`, any valid port (1-65535).
fn host_port() -> impl Strategy<Value = String> {
    (host_name(), 1..=u16::MAX).prop_map(|(h, p)| format!("{h}:{p}"))
}

/// A chroot without the characters the URL grammar itself uses (`@`, `?`).
fn url_chroot() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(
        node_path().prop_filter("no URL delimiters", |p| !p.contains(['@', '?', '#'])),
    )
}

/// Credentials: a user without `:`, a password that may contain `:`.
fn credentials() -> impl Strategy<Value = Option<(String, String)>> {
    proptest::option::of(("[a-zA-Z0-9_.~-]{1,12}", "[a-zA-Z0-9_.~!$*+,;=:-]{0,16}"))
}

/// Whether `err` is `InvalidEndpoint` for `url`, with a reason that contains
/// every one of `words`, and quotes the URL in its message.
fn is_invalid_endpoint(err: &Error, url: &str, words: &[&str]) -> bool {
    let Error::InvalidEndpoint { url: u, reason } = err else {
        return false;
    };
    // Errors quote the URL as given, but with a password masked (pinned by
    // the endpoint module's own tests), so a URL with credentials is only
    // checked to be quoted as the error holds it.
    (*u == url || url.contains('@'))
        && !reason.is_empty()
        && words.iter().all(|w| reason.contains(w))
        && err.to_string().contains(&format!("{u:?}"))
}

/// `url` does not parse: the error is [`is_invalid_endpoint`] with `words`.
fn refused_naming(url: &str, words: &[&str]) -> Result<Error, TestCaseError> {
    let err = url.parse::<Endpoint>().unwrap_err();
    prop_assert!(
        is_invalid_endpoint(&err, url, words),
        "{url:?} gave {err:?}"
    );
    Ok(err)
}

/// URL-shaped strings: a known or unknown scheme, then characters the
/// grammar cares about.
fn url_like() -> impl Strategy<Value = String> {
    let scheme = prop_oneof![
        Just(""),
        Just("zk://"),
        Just("zookeeper://"),
        Just("etcd://"),
        Just("etcds://"),
        Just("embedded"),
        Just("redis://"),
        Just("zk:/"),
    ];
    let piece = prop_oneof![
        Just(":"),
        Just("@"),
        Just("/"),
        Just(","),
        Just("?"),
        Just("&"),
        Just("="),
        Just("h"),
        Just("[::1]"),
        Just("2181"),
        Just("99999"),
        Just("-1"),
        Just(""),
        Just("é"),
        Just("\u{0}"),
    ];
    (scheme, proptest::collection::vec(piece, 0..10))
        .prop_map(|(scheme, pieces)| format!("{scheme}{}", pieces.concat()))
}

proptest! {
    #![proptest_config(parsing())]

    /// Any string: never a panic; every refusal is `InvalidEndpoint` for
    /// that URL. A ZooKeeper endpoint that parses has hosts with a name and
    /// a port each, and a valid chroot other than the root.
    #[test]
    fn any_string_parses_or_is_refused_by_name(url in prop_oneof![any::<String>(), url_like()]) {
        match url.parse::<Endpoint>() {
            Err(err) => prop_assert!(is_invalid_endpoint(&err, &url, &[]), "{url:?} gave {err:?}"),
            Ok(Endpoint::ZooKeeper { hosts, chroot, .. }) => {
                prop_assert!(!hosts.is_empty());
                for host in &hosts {
                    let (name, port) = host.rsplit_once(':').expect("host:port");
                    prop_assert!(!name.is_empty() && port.parse::<u16>().is_ok(), "{url:?}: {host:?}");
                }
                if let Some(c) = chroot {
                    prop_assert!(c != "/" && dlock::path::validate(&c).is_ok(), "{url:?}: {c:?}");
                }
            }
            Ok(_) => {}
        }
    }

    /// Generated `zk://[user:pw@]host:port[,host:port...][/chroot]` URLs
    /// parse to exactly those hosts, chroot and credentials.
    #[test]
    fn zookeeper_urls_parse_to_their_parts(
        scheme in prop_oneof![Just("zk"), Just("zookeeper")],
        creds in credentials(),
        hosts in proptest::collection::vec(host_port(), 1..5),
        chroot in url_chroot(),
        trailing_root in any::<bool>(),
    ) {
        let userinfo = creds.as_ref().map(|(u, p)| format!("{u}:{p}@")).unwrap_or_default();
        let path = match (&chroot, trailing_root) {
            (Some(c), _) => c.clone(),
            (None, true) => "/".to_string(),
            (None, false) => String::new(),
        };
        let url = format!("{scheme}://{userinfo}{}{path}", hosts.join(","));
        let endpoint = url.parse::<Endpoint>();
        let Ok(Endpoint::ZooKeeper { hosts: h, chroot: c, credentials: k }) = endpoint else {
            return Err(TestCaseError::fail(format!("{url:?} gave {endpoint:?}")));
        };
        prop_assert_eq!(h, hosts);
        prop_assert_eq!(c, chroot, "{}", url);
        prop_assert_eq!(k.map(|k| (k.user, k.password)), creds);
    }

    /// A bad port — not a number, beyond 65535, negative, empty — is
    /// refused, naming the host it belongs to.
    #[test]
    fn bad_ports_are_refused(
        scheme in prop_oneof![Just("zk"), Just("etcd")],
        name in host_name(),
        port in prop_oneof![
            "[a-z][a-z0-9]{0,5}",
            (65536u64..).prop_map(|p| p.to_string()),
            (1u32..).prop_map(|p| format!("-{p}")),
            Just(String::new()),
            "[0-9]{1,3}[a-z.]{1,3}",
        ],
        before in proptest::collection::vec(host_port(), 0..3),
    ) {
        let bad = format!("{name}:{port}");
        let mut hosts = before;
        hosts.push(bad.clone());
        let url = format!("{scheme}://{}", hosts.join(","));
        refused_naming(&url, &["port", &format!("{bad:?}")])?;
    }

    /// A host without a port, or with an empty name, is refused naming it.
    #[test]
    fn hosts_need_a_name_and_a_port(
        scheme in prop_oneof![Just("zk"), Just("etcd")],
        name in "[a-z][a-z0-9.-]{0,10}",
        port in 1..=u16::MAX,
        missing_port in any::<bool>(),
    ) {
        let (host, words) = if missing_port {
            (name.clone(), ["needs a port"])
        } else {
            (format!(":{port}"), ["has no name"])
        };
        let err = refused_naming(&format!("{scheme}://{host}"), &words)?;
        prop_assert!(err.to_string().contains(&format!("{host:?}")), "{err}");
    }

    /// An unknown scheme is refused, naming it.
    #[test]
    fn unknown_schemes_are_refused(scheme in "[a-z][a-z0-9+.-]{0,8}", host in host_port()) {
        prop_assume!(!matches!(scheme.as_str(), "zk" | "zookeeper" | "etcd" | "etcds" | "embedded"));
        let url = format!("{scheme}://{host}");
        refused_naming(&url, &["unknown scheme", &format!("{scheme:?}")])?;
    }

    /// A chroot that is not a valid path is refused, with the path rule it
    /// breaks.
    #[test]
    fn bad_chroots_are_refused(
        hosts in proptest::collection::vec(host_port(), 1..3),
        chroot in broken_path().prop_filter("a URL path", |p| {
            p.starts_with('/') && p != "/" && !p.contains(['@', '?', '#'])
        }),
    ) {
        let url = format!("zk://{}{chroot}", hosts.join(","));
        refused_naming(&url, &["bad chroot", &format!("{chroot:?}")])?;
    }
}

/// Credentials without a password separator or with an empty user are
/// refused; the error does not need the password to say so.
#[test]
fn bad_credentials_are_refused() {
    for (url, words) in [
        ("zk://alice@h:2181", "user:password"),
        ("zk://:secret@h:2181", "empty user"),
        ("etcd://alice@h:2379", "user:password"),
        ("etcd://:secret@h:2379", "empty user"),
    ] {
        let err = url.parse::<Endpoint>().unwrap_err();
        assert!(
            is_invalid_endpoint(&err, url, &[words]),
            "{url:?} gave {err:?}"
        );
        assert!(!err.to_string().contains("secret"), "{err}");
    }
    for url in [
        "",
        "zk://",
        "zk://,",
        "zk://h:1,",
        "zk://h:1,,h:2",
        "zk:h:1",
        "://h:1",
    ] {
        let err = url.parse::<Endpoint>().unwrap_err();
        assert!(is_invalid_endpoint(&err, url, &[]), "{url:?} gave {err:?}");
    }
}

/// Session timeouts no server would grant (none, or "forever") are
/// refused before connecting, naming the bound; before, `Duration::MAX`
/// panicked while connecting to ZooKeeper.
#[tokio::test]
async fn session_timeouts_out_of_range_are_refused() {
    for (timeout, words) in [
        (Duration::ZERO, "positive"),
        (Duration::MAX, "at most 86400s"),
        (Duration::from_secs(24 * 60 * 60 + 1), "at most 86400s"),
    ] {
        let options = dlock::SessionOptions::default().with_session_timeout(timeout);
        for url in ["embedded", "zk://127.0.0.1:1"] {
            let err = dlock::connect_with(url, options.clone()).await.unwrap_err();
            assert!(
                matches!(&err, Error::InvalidArgument(m) if m.contains(words)),
                "{url} with {timeout:?}: {err:?}"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Malformed stored data
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(parsing())]

    /// A shared count is exactly 4 bytes; anything else is `MalformedData`
    /// naming the node and the size found.
    #[test]
    fn shared_count_decoding_is_total(data in proptest::collection::vec(any::<u8>(), 0..12)) {
        match decode("/c", &data) {
            Ok(v) => {
                prop_assert_eq!(data.len(), 4);
                prop_assert_eq!(encode(v).to_vec(), data);
            }
            Err(Error::MalformedData { path, reason }) => {
                prop_assert!(data.len() != 4);
                prop_assert_eq!(path, "/c");
                let found = format!("found {} bytes", data.len());
                prop_assert!(reason.contains("4 bytes") && reason.contains(&found), "{}", reason);
            }
            Err(e) => prop_assert!(false, "{e:?}"),
        }
    }

    /// Any bytes as a semaphore record: never a panic; a refusal is
    /// `MalformedData` for the record's path.
    #[test]
    fn kv_records_are_parsed_or_refused(
        data in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..64),
            json_like().prop_map(String::into_bytes),
        ]
    ) {
        match Record::parse("/s/.lock", &data) {
            Ok(record) => {
                prop_assert!(record.limit >= 1);
                // What parses, re-encodes to a record that parses the same.
                prop_assert_eq!(Record::parse("/s/.lock", record.to_json().as_bytes()).ok(), Some(record));
            }
            Err(Error::MalformedData { path, reason }) => {
                prop_assert_eq!(path, "/s/.lock");
                prop_assert!(!reason.is_empty());
            }
            Err(e) => prop_assert!(false, "{e:?}"),
        }
    }

    /// Every record round-trips, whatever its holder ids contain.
    #[test]
    fn kv_records_round_trip(
        limit in 1u32..,
        holders in proptest::collection::vec(any::<String>(), 0..6),
    ) {
        let mut unique: Vec<String> = Vec::new();
        for h in holders {
            if !unique.contains(&h) {
                unique.push(h);
            }
        }
        let record = Record { limit, holders: unique };
        prop_assert_eq!(Record::parse("/s/.lock", record.to_json().as_bytes()).ok(), Some(record));
    }
}

/// JSON-shaped text: the record's keys, values of every kind, and broken
/// bits of syntax.
fn json_like() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("null".to_string()),
        Just("true".to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|n| n.to_string()),
        Just("1e999".to_string()),
        Just("-0".to_string()),
        Just("4294967296".to_string()),
        "\"[a-z0-9\\\\u\"]{0,8}\"",
        Just("\"\\ud800\"".to_string()),
        Just("\"\\u+041\"".to_string()),
    ];
    let value = leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4)
                .prop_map(|v| format!("[{}]", v.join(","))),
            proptest::collection::vec(
                (
                    prop_oneof![Just("limit"), Just("holders"), Just("x")],
                    inner
                ),
                0..4
            )
            .prop_map(|kv| {
                let fields: Vec<String> = kv.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                format!("{{{}}}", fields.join(","))
            }),
        ]
    });
    let junk = prop_oneof![
        Just(""),
        Just(""),
        Just(" "),
        Just(","),
        Just("}"),
        Just("]"),
        Just("x")
    ];
    (junk.clone(), value, junk).prop_map(|(a, v, b)| format!("{a}{v}{b}"))
}

/// Records that are not the expected JSON, with what the error must say.
fn bad_records() -> Vec<(Vec<u8>, &'static str)> {
    let deep = format!("{}{}", "[".repeat(1000), "]".repeat(1000));
    vec![
        (vec![], "not JSON"),
        (vec![0xff, 0xfe, 0x00], "not UTF-8"),
        (b"garbage".to_vec(), "not JSON"),
        (b"null".to_vec(), "not a JSON object"),
        (b"[1,2]".to_vec(), "not a JSON object"),
        // A struct's fields in order: serde would read it, Go would not.
        (br#"[3,["a"]]"#.to_vec(), "not a JSON object"),
        (br#"{"limit":3}"#.to_vec(), "missing field `holders`"),
        (br#"{"holders":[]}"#.to_vec(), "missing field `limit`"),
        (br#"{"limit":0,"holders":[]}"#.to_vec(), "positive integer"),
        (br#"{"limit":-2,"holders":[]}"#.to_vec(), "positive integer"),
        (
            br#"{"limit":1.5,"holders":[]}"#.to_vec(),
            "positive integer",
        ),
        (
            br#"{"limit":4294967296,"holders":[]}"#.to_vec(),
            "positive integer",
        ),
        (
            br#"{"limit":1e999,"holders":[]}"#.to_vec(),
            "number out of range",
        ),
        (
            br#"{"limit":"3","holders":[]}"#.to_vec(),
            "expected a JSON number",
        ),
        (
            br#"{"limit":3,"holders":"a"}"#.to_vec(),
            "expected a sequence",
        ),
        (
            br#"{"limit":3,"holders":[7]}"#.to_vec(),
            "expected a string",
        ),
        (
            br#"{"limit":3,"holders":["\u+041"]}"#.to_vec(),
            "invalid escape",
        ),
        (
            br#"{"limit":3,"holders":["\ud800"]}"#.to_vec(),
            "hex escape",
        ),
        (
            br#"{"limit":3,"holders":[]} x"#.to_vec(),
            "trailing characters",
        ),
        (deep.into_bytes(), "recursion limit exceeded"),
    ]
}

/// Whether `err` is `MalformedData` at `path`, naming it and saying `what`.
fn is_malformed(err: &Error, path: &str, what: &str) -> bool {
    matches!(err, Error::MalformedData { path: p, reason } if p == path && reason.contains(what))
        && err.to_string().contains(path)
}

#[test]
fn each_bad_record_gives_its_reason() {
    for (data, what) in bad_records() {
        let err = Record::parse("/s/.lock", &data).unwrap_err();
        assert!(
            is_malformed(&err, "/s/.lock", what),
            "{:?} gave {err:?}",
            String::from_utf8_lossy(&data)
        );
    }
}

/// Deletes a node if it is there.
/// Waits (by the count's own notifications) until it shows `value`.
async fn await_value(count: &SharedCount, value: i32) -> Result<()> {
    let mut rx = count.subscribe();
    tokio::time::timeout(WITHIN, rx.wait_for(|v| v.value == value))
        .await
        .with_context(|| format!("{} never showed {value}", count.path()))?
        .context("count closed")?;
    Ok(())
}

/// A shared count node of 0, 1, 3, 5, 8 or 64 bytes: `start` fails with
/// `MalformedData` naming the node and the size, leaves the node as it was
/// and the count unstarted; a started count whose node turns malformed
/// keeps its last good value, reports the bad data on `read` and on a
/// failed `try_set`, and `set` repairs it.
async fn malformed_shared_counts_are_typed_errors(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/count");
    for len in [0usize, 1, 3, 5, 8, 64] {
        let bad = vec![0xa5; len];
        s.create(&path, &bad, persistent()).await?;
        let count = SharedCount::new(&s, &path, 11)?;
        let err = count.start().await.unwrap_err();
        ensure!(
            is_malformed(&err, &path, &format!("found {len} bytes"))
                && err.to_string().contains("4 bytes"),
            "{len} bytes gave {err:?}"
        );
        ensure!(
            s.get_data(&path).await?.0 == bad,
            "start left the data alone"
        );
        ensure!(
            count.get() == 11 && count.versioned().version == -1,
            "{count:?}"
        );
        let err = count.set(1).await.unwrap_err();
        ensure!(
            matches!(err, Error::InvalidArgument(_)),
            "not started: {err:?}"
        );
        let err = count.read().await.unwrap_err();
        ensure!(is_malformed(&err, &path, "4 bytes"), "{err:?}");
        count.close().await;
        s.delete(&path, None).await?;
    }

    s.create(&path, &7i32.to_be_bytes(), persistent()).await?;
    let count = SharedCount::new(&s, &path, 0)?;
    count.start().await?;
    let good = count.versioned();
    ensure!(good.value == 7, "{good:?}");
    let other = h.session().await;
    for len in [0usize, 3, 5] {
        other.set_data(&path, &vec![1; len], None).await?;
        let err = count.read().await.unwrap_err();
        ensure!(
            is_malformed(&err, &path, &format!("found {len} bytes")),
            "{err:?}"
        );
        ensure!(count.versioned() == good, "the last good value stays");
    }
    // The stale version fails the write; the refresh then finds bad data.
    let err = count.try_set(&good, 8).await.unwrap_err();
    ensure!(is_malformed(&err, &path, "4 bytes"), "{err:?}");
    count.set(9).await?;
    await_value(&count, 9).await?;
    ensure!(s.get_data(&path).await?.0 == 9i32.to_be_bytes(), "repaired");
    count.close().await;
    remove(&s, &path).await
}

/// A semaphore whose limit is a shared count keeps the last good limit when
/// the count's node turns malformed, and follows it again once repaired.
async fn a_semaphore_keeps_the_last_good_count(h: &Harness) -> Result<()> {
    let (s, count_path, count) = started_count(h, "/count", 2).await?;
    let sem = Semaphore::with_count(&s, &h.path("/sem"), count.clone())?;
    let other = h.session().await;
    other.set_data(&count_path, &[0, 0, 9], None).await?;
    let err = count.read().await.unwrap_err();
    ensure!(is_malformed(&err, &count_path, "found 3 bytes"), "{err:?}");
    ensure!(sem.max_leases() == 2, "{}", sem.max_leases());
    let leases = sem.acquire(2).await?;
    ensure!(sem.try_acquire(1).await?.is_none(), "full at 2");
    let err = sem.acquire(3).await.unwrap_err();
    ensure!(
        matches!(&err, Error::InvalidArgument(m) if m.contains("maximum is 2")),
        "{err:?}"
    );
    count.set(3).await?;
    let third = sem.acquire_timeout(1, WITHIN).await?;
    for lease in leases.into_iter().chain(third) {
        lease.release().await?;
    }
    count.close().await;
    remove(&s, &count_path).await
}

/// A malformed `.lock` record: every way to use the semaphore —
/// `try_acquire`, a waiting `acquire_timeout`, `holders` — fails at once
/// with `MalformedData` naming the record; the record is left as it was and
/// the contender's entry is removed. A holder whose record turns malformed
/// can still leave.
async fn malformed_kv_records_are_typed_errors(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/lot");
    let record_path = format!("{path}/{RECORD}");
    for (data, what) in bad_records() {
        let shown = String::from_utf8_lossy(&data)
            .chars()
            .take(40)
            .collect::<String>();
        s.create(&record_path, &data, persistent()).await?;
        let sem = KvSemaphore::new(&s, &path, 3)?;
        let err = sem.try_acquire().await.unwrap_err();
        ensure!(is_malformed(&err, &record_path, what), "{shown:?}: {err:?}");
        let err = sem.acquire_timeout(WITHIN).await.unwrap_err();
        ensure!(is_malformed(&err, &record_path, what), "{shown:?}: {err:?}");
        let err = sem.holders().await.unwrap_err();
        ensure!(is_malformed(&err, &record_path, what), "{shown:?}: {err:?}");
        // The entry went before the error was returned: only the record.
        let left = s.children(&path).await?;
        ensure!(
            left.len() == 1 && left[0].name == RECORD,
            "{shown:?}: {left:?}"
        );
        ensure!(
            s.get_data(&record_path).await?.0 == data,
            "{shown:?}: record changed"
        );
        s.delete(&record_path, None).await?;
    }

    let holder = h.session().await;
    let lease = KvSemaphore::new(&holder, &path, 2)?.acquire().await?;
    s.set_data(&record_path, b"{oops", None).await?;
    lease.release().await?;
    let left = s.children(&path).await?;
    ensure!(
        left.len() == 1 && left[0].name == RECORD,
        "entry gone: {left:?}"
    );
    ensure!(s.get_data(&record_path).await?.0 == b"{oops", "left alone");
    s.delete(&record_path, None).await?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Quantities and zero timeouts
// ---------------------------------------------------------------------------

/// How many lease nodes a semaphore at `path` has.
async fn lease_nodes(s: &Session, path: &str) -> Result<usize> {
    match s.children(&format!("{path}/leases")).await {
        Ok(c) => Ok(c.len()),
        Err(Error::NoNode { .. }) => Ok(0),
        Err(e) => Err(e.into()),
    }
}

fn is_invalid_argument(err: &Error, words: &[&str]) -> bool {
    matches!(err, Error::InvalidArgument(m) if words.iter().all(|w| m.contains(w)))
}

/// Semaphore quantities: a limit of 0, 0 leases, more than the limit,
/// u32::MAX, a non-positive shared limit — each `InvalidArgument` saying
/// why, before anything is created; a zero timeout tries once: it takes
/// free leases and times out on a full semaphore without leaving a node.
async fn semaphore_quantities(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/sem");
    let err = Semaphore::new(&s, &path, 0).unwrap_err();
    ensure!(is_invalid_argument(&err, &["at least 1", &path]), "{err:?}");
    let sem = Semaphore::new(&s, &path, 2)?;
    for qty in [0, 3, 1000, u32::MAX] {
        let words: &[&str] = if qty == 0 {
            &["qty cannot be 0"]
        } else {
            &["maximum is 2", &path]
        };
        for err in [
            sem.acquire(qty).await.unwrap_err(),
            sem.try_acquire(qty).await.unwrap_err(),
            sem.acquire_timeout(qty, WITHIN).await.unwrap_err(),
        ] {
            ensure!(is_invalid_argument(&err, words), "qty {qty}: {err:?}");
        }
    }
    let count_path = h.path("/count");
    for limit in [0, -1, i32::MIN] {
        let count = SharedCount::new(&s, &count_path, limit)?;
        count.start().await?;
        let counted = Semaphore::with_count(&s, &path, count.clone())?;
        let err = counted.acquire_one().await.unwrap_err();
        ensure!(
            is_invalid_argument(&err, &[&format!("maximum of {limit} leases")]),
            "{err:?}"
        );
        count.close().await;
        s.delete(&count_path, None).await?;
    }
    ensure!(s.exists(&path).await?.is_none(), "nothing was created");

    // Zero timeouts: free leases are taken, a full semaphore times out.
    let leases = sem.acquire_timeout(2, Duration::ZERO).await?;
    ensure!(leases.len() == 2);
    let other = Semaphore::new(&h.session().await, &path, 2)?;
    let err = other.acquire_timeout(1, Duration::ZERO).await.unwrap_err();
    ensure!(matches!(err, Error::Timeout(d) if d.is_zero()), "{err:?}");
    ensure!(other.try_acquire(1).await?.is_none());
    ensure!(lease_nodes(&s, &path).await? == 2, "no waiting node left");
    await_children(&s, &format!("{path}/locks"), 0, WITHIN).await?;
    for lease in leases {
        lease.release().await?;
    }

    // The largest maximum is fine.
    let wide = Semaphore::new(&s, &path, u32::MAX)?;
    ensure!(wide.max_leases() == i64::from(u32::MAX));
    wide.acquire_one().await?.release().await?;
    Ok(())
}

/// A huge quantity under a huge limit is taken lease by lease (no
/// allocation for all of them up front); when the limit drops meanwhile, the
/// acquisition times out and gives back every lease it took.
async fn a_huge_quantity_is_given_back_on_timeout(h: &Harness) -> Result<()> {
    let (s, count_path, count) = started_count(h, "/count", i32::MAX).await?;
    let path = h.path("/sem");
    let sem = Semaphore::with_count(&s, &path, count.clone())?;
    let err = sem.try_acquire(u32::MAX).await.unwrap_err();
    ensure!(
        is_invalid_argument(&err, &[&format!("maximum is {}", i32::MAX)]),
        "{err:?}"
    );
    let huge = i32::MAX as u32;
    let acquiring = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire_timeout(huge, Duration::from_millis(200)).await }
    });
    // Once leases are coming, lower the limit: the acquirer then waits, and
    // its deadline has passed or soon will.
    let watcher = h.session().await;
    tokio::time::timeout(WITHIN, async {
        loop {
            match watcher.children_watch(&format!("{path}/leases")).await {
                Ok((children, _)) if !children.is_empty() => return Ok(()),
                Ok((_, watch)) => {
                    watch.changed().await;
                }
                Err(Error::NoNode { .. }) => {
                    let (stat, watch) = watcher.exists_watch(&format!("{path}/leases")).await?;
                    if stat.is_none() {
                        watch.changed().await;
                    }
                }
                Err(e) => return Err(anyhow::Error::from(e)),
            }
        }
    })
    .await
    .context("no lease appeared")??;
    count.set(1).await?;
    let result = tokio::time::timeout(WITHIN, acquiring).await??;
    match result {
        Err(Error::Timeout(_)) => {}
        Err(e) => bail!("expected a timeout, got {e:?}"),
        Ok(leases) => bail!("got {} leases", leases.len()),
    }
    ensure!(
        lease_nodes(&watcher, &path).await? == 0,
        "every lease given back"
    );
    count.close().await;
    remove(&s, &count_path).await
}

/// KvSemaphore quantities: a limit of 0 is `InvalidArgument`; the largest
/// limit round-trips through the record; a zero timeout takes a free slot
/// and times out on a full one, leaving no entry.
async fn kv_semaphore_quantities(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/lot");
    let err = KvSemaphore::new(&s, &path, 0).unwrap_err();
    ensure!(is_invalid_argument(&err, &["at least 1", &path]), "{err:?}");

    let wide = KvSemaphore::new(&s, &path, u32::MAX)?;
    let lease = wide.acquire_timeout(Duration::ZERO).await?;
    let (data, _) = s.get_data(&format!("{path}/{RECORD}")).await?;
    let record = Record::parse("", &data)?;
    ensure!(
        record.limit == u32::MAX && record.holders == [lease.holder()],
        "{record:?}"
    );
    lease.release().await?;
    // Release removed the entry; nobody is left in the record it keeps.
    await_children(&s, &path, 1, WITHIN).await?;
    let (data, _) = s.get_data(&format!("{path}/{RECORD}")).await?;
    ensure!(Record::parse("", &data)?.holders.is_empty());

    let one = KvSemaphore::new(&s, &path, 1)?;
    let held = one.acquire_timeout(Duration::ZERO).await?;
    let other = KvSemaphore::new(&h.session().await, &path, 1)?;
    let err = other.acquire_timeout(Duration::ZERO).await.unwrap_err();
    ensure!(matches!(err, Error::Timeout(d) if d.is_zero()), "{err:?}");
    let left = s.children(&path).await?;
    ensure!(
        left.len() == 2,
        "only the holder's entry and the record: {left:?}"
    );
    held.release().await?;
    Ok(())
}

/// A multi-lock of no locks is refused; a zero timeout on a multi-lock
/// whose second lock is held times out and rolls the first one back; a
/// mutex's zero timeout takes a free lock and leaves no node on a held one.
async fn multi_lock_and_zero_timeouts(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let empty = MultiLock::new(Vec::new());
    for err in [
        empty.acquire().await.unwrap_err(),
        empty.acquire_timeout(Duration::ZERO).await.unwrap_err(),
    ] {
        ensure!(is_invalid_argument(&err, &["no locks"]), "{err:?}");
    }

    let (a, b) = (h.path("/a"), h.path("/b"));
    let other = h.session().await;
    let held_b = Mutex::new(&other, &b)?
        .acquire_timeout(Duration::ZERO)
        .await?;
    let both = MultiLock::new(vec![
        Box::new(Mutex::new(&s, &a)?),
        Box::new(Mutex::new(&s, &b)?),
    ]);
    let err = both.acquire_timeout(Duration::ZERO).await.unwrap_err();
    ensure!(matches!(err, Error::Timeout(d) if d.is_zero()), "{err:?}");
    await_children(&s, &a, 0, WITHIN).await?;
    let err = Mutex::new(&s, &b)?
        .acquire_timeout(Duration::ZERO)
        .await
        .unwrap_err();
    ensure!(matches!(err, Error::Timeout(d) if d.is_zero()), "{err:?}");
    await_children(&s, &b, 1, WITHIN).await?;
    held_b.release().await?;
    let guard = both.acquire_timeout(Duration::ZERO).await?;
    ensure!(guard.tokens().len() == 2);
    guard.release().await?;

    // A latch that does not lead times out at once; the leader does not.
    let leader = LeaderLatch::new(&s, &h.path("/latch"))?;
    leader.start()?;
    leader.await_leadership_timeout(WITHIN).await?;
    let follower = LeaderLatch::new(&other, &h.path("/latch"))?;
    follower.start()?;
    let err = follower
        .await_leadership_timeout(Duration::ZERO)
        .await
        .unwrap_err();
    ensure!(matches!(err, Error::Timeout(d) if d.is_zero()), "{err:?}");
    leader.await_leadership_timeout(Duration::ZERO).await?;
    // The follower may still be creating its node: closed meanwhile, the
    // create is finished and its node deleted all the same.
    follower.close().await?;
    leader.close().await?;
    await_children(&s, &h.path("/latch"), 0, WITHIN).await
}

/// A timeout or a hold limit of `Duration::MAX` waits or holds for ever
/// (it panicked, overflowing the clock).
async fn durations_too_long_to_count_mean_for_ever(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/forever");
    let mutex = Mutex::new(&s, &path)?.with_max_hold(Duration::MAX);
    let guard = mutex.acquire_timeout(Duration::MAX).await?;
    ensure!(!guard.is_lost(), "held");
    let sem = dlock::Semaphore::new(&s, &h.path("/forever-sem"), 1)?;
    let lease = sem.acquire_timeout(1, Duration::MAX).await?;
    lease
        .into_iter()
        .next()
        .context("a lease")?
        .release()
        .await?;
    guard.release().await?;
    await_children(&s, &path, 0, WITHIN).await
}

// ---------------------------------------------------------------------------
// Twice, and after close
// ---------------------------------------------------------------------------

/// Every recipe used through a closed session fails with `Error::Closed`
/// and leaves no node.
async fn recipes_on_a_closed_session_fail_closed(h: &Harness) -> Result<()> {
    let s = h.session().await;
    s.close().await;
    let closed = |what: &str, err: Error| -> Result<()> {
        ensure!(matches!(err, Error::Closed), "{what}: {err:?}");
        Ok(())
    };
    let mutex = Mutex::new(&s, &h.path("/mutex"))?;
    closed("mutex acquire", mutex.acquire().await.unwrap_err())?;
    closed("mutex try_acquire", mutex.try_acquire().await.unwrap_err())?;
    closed(
        "mutex acquire_timeout",
        mutex.acquire_timeout(WITHIN).await.unwrap_err(),
    )?;
    let sem = Semaphore::new(&s, &h.path("/sem"), 2)?;
    closed("semaphore acquire", sem.acquire_one().await.unwrap_err())?;
    closed(
        "semaphore try_acquire",
        sem.try_acquire(1).await.unwrap_err(),
    )?;
    let sem_mutex = SemaphoreMutex::new(&s, &h.path("/sem-mutex"))?;
    closed("semaphore mutex", sem_mutex.acquire().await.unwrap_err())?;
    let rw = ReadWriteLock::new(&s, &h.path("/rw"))?;
    closed("read", rw.read().await.unwrap_err())?;
    closed("write", rw.write().await.unwrap_err())?;
    let kv = KvSemaphore::new(&s, &h.path("/lot"), 2)?;
    closed("kv acquire", kv.acquire().await.unwrap_err())?;
    closed("kv holders", kv.holders().await.unwrap_err())?;
    let multi = MultiLock::new(vec![Box::new(Mutex::new(&s, &h.path("/m"))?)]);
    closed("multi-lock", multi.acquire().await.unwrap_err())?;
    let count = SharedCount::new(&s, &h.path("/count"), 1)?;
    closed("count start", count.start().await.unwrap_err())?;
    closed("count read", count.read().await.unwrap_err())?;
    let latch = LeaderLatch::new(&s, &h.path("/latch"))?;
    latch.start()?;
    closed("latch", latch.await_leadership().await.unwrap_err())?;
    ensure!(latch.state() == LatchState::Closed, "{:?}", latch.state());
    closed("latch close", latch.close().await.unwrap_err())?;
    tokio::time::timeout(WITHIN, s.background_idle()).await?;
    let checker = h.session().await;
    ensure!(checker.exists(&h.root).await?.is_none(), "nothing created");
    Ok(())
}

/// What was held when its session was closed: guards, leases and slots
/// know they are lost, guarded writes are refused with `Lost`, releasing
/// reports `Closed` (the session's own state), a started count fails
/// `Closed` — and no node is left (another session prunes the dead slot).
async fn holds_of_a_closed_session(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let guard = Mutex::new(&s, &h.path("/mutex"))?.acquire().await?;
    let lease = Semaphore::new(&s, &h.path("/sem"), 2)?
        .acquire_one()
        .await?;
    let slot = KvSemaphore::new(&s, &h.path("/lot"), 1)?.acquire().await?;
    let count = SharedCount::new(&s, &h.path("/count"), 5)?;
    count.start().await?;
    s.close().await;
    ensure!(guard.is_lost() && lease.is_lost() && slot.is_lost(), "lost");
    tokio::time::timeout(WITHIN, guard.lost()).await?;
    tokio::time::timeout(WITHIN, lease.lost()).await?;
    tokio::time::timeout(WITHIN, slot.lost()).await?;
    let write = [Op::SetData {
        path: h.path("/count"),
        data: encode(6).to_vec(),
        version: None,
    }];
    for err in [
        guard.guarded(&write).await.unwrap_err(),
        lease.guarded(&write).await.unwrap_err(),
        slot.guarded(&write).await.unwrap_err(),
    ] {
        ensure!(matches!(err, Error::Lost { .. }), "{err:?}");
    }
    for (what, released) in [
        ("guard", guard.release().await),
        ("lease", lease.release().await),
        ("slot", slot.release().await),
    ] {
        ensure!(
            matches!(released, Err(Error::Closed)),
            "{what}: {released:?}"
        );
    }
    ensure!(
        matches!(count.set(6).await, Err(Error::Closed)),
        "count set"
    );
    ensure!(
        matches!(count.read().await, Err(Error::Closed)),
        "count read"
    );
    ensure!(count.get() == 5, "the count kept its value");
    count.close().await;

    // Another session sees none of the closed session's nodes, prunes the
    // dead slot from the record and, leaving, removes the record.
    let other = h.session().await;
    for dir in ["/mutex", "/sem/leases"] {
        await_children(&other, &h.path(dir), 0, WITHIN).await?;
    }
    ensure!(
        other.exists(&h.path("/count")).await?.is_some(),
        "persistent"
    );
    let slot = KvSemaphore::new(&other, &h.path("/lot"), 1)?
        .acquire_timeout(WITHIN)
        .await?;
    slot.release().await?;
    remove(&other, &h.path("/count")).await
}

/// A leading latch whose session is closed: the term ends, the latch turns
/// `Closed` (`await_leadership` and `close` say `Closed`) and its node goes.
async fn a_leading_latch_ends_with_its_session(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let latch = LeaderLatch::new(&s, &h.path("/latch"))?;
    latch.start()?;
    let term = latch.await_leadership_timeout(WITHIN).await?;
    s.close().await;
    tokio::time::timeout(WITHIN, term.cancelled()).await?;
    let err = tokio::time::timeout(WITHIN, latch.await_leadership())
        .await?
        .unwrap_err();
    ensure!(matches!(err, Error::Closed), "latch: {err:?}");
    ensure!(latch.state() == LatchState::Closed && !latch.has_leadership());
    ensure!(
        matches!(latch.close().await, Err(Error::Closed)),
        "latch close"
    );
    let other = h.session().await;
    await_children(&other, &h.path("/latch"), 0, WITHIN).await
}

/// A re-entered guard releases once per hold, the node going with the last;
/// a node deleted behind the holder's back releases leaving nothing, and
/// says the hold was lost (Curator's release ignores the missing node, so
/// its caller never learns); a latch and a count closed twice say so
/// (`Closed`) or are idempotent.
async fn releasing_twice_and_closing_twice(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let mutex = Mutex::new(&s, &h.path("/mutex"))?;
    let guard = mutex.acquire().await?;
    let again = guard.reenter()?;
    let node = guard.node().to_string();
    guard.release().await?;
    ensure!(s.exists(&node).await?.is_some(), "one hold left");
    again.release().await?;
    ensure!(s.exists(&node).await?.is_none(), "the last hold deletes");

    let guard = mutex.acquire().await?;
    let admin = h.session().await;
    admin.delete(guard.node(), None).await?;
    let released = guard.release().await;
    ensure!(matches!(released, Err(Error::Lost { .. })), "{released:?}");
    let lease = Semaphore::new(&s, &h.path("/sem"), 1)?
        .acquire_one()
        .await?;
    admin.delete(lease.node(), None).await?;
    let released = lease.release().await;
    ensure!(matches!(released, Err(Error::Lost { .. })), "{released:?}");
    let next = mutex.acquire_timeout(WITHIN).await?;
    next.release().await?;

    let latch = LeaderLatch::new(&s, &h.path("/latch"))?;
    let err = latch.close().await.unwrap_err();
    ensure!(is_invalid_argument(&err, &["not started"]), "{err:?}");
    latch.start()?;
    let err = latch.start().unwrap_err();
    ensure!(is_invalid_argument(&err, &["more than once"]), "{err:?}");
    // Leading, so its node is there (see multi_lock_and_zero_timeouts).
    latch.await_leadership_timeout(WITHIN).await?;
    latch.close().await?;
    ensure!(
        matches!(latch.close().await, Err(Error::Closed)),
        "second close"
    );
    ensure!(
        matches!(latch.reset(), Err(Error::Closed)),
        "reset after close"
    );

    let count = SharedCount::new(&s, &h.path("/count"), 1)?;
    count.start().await?;
    count.close().await;
    count.close().await;
    ensure!(
        matches!(count.set(2).await, Err(Error::Closed)),
        "set after close"
    );
    remove(&s, &h.path("/count")).await?;
    for dir in ["/mutex", "/sem/leases", "/latch"] {
        await_children(&s, &h.path(dir), 0, WITHIN).await?;
    }
    Ok(())
}

// Every case on every backend.
/// Version -1 is refused alike everywhere, and nothing is written:
/// ZooKeeper took it for "any version" (an unconditional write), the other
/// stores for a version no node has. Other negative versions are versions
/// (ZooKeeper's wrap past 2^31 writes): one the node does not have is
/// `BadVersion`, as any other (before, they were refused, and a counter
/// whose version had wrapped could never be written again).
async fn negative_versions_are_refused(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let node = h.path("/versions/n");
    s.create(&node, b"kept", persistent()).await?;
    let refused = |r: dlock::Result<()>, what: &str| match r {
        Err(Error::InvalidArgument(m)) if m.contains("-1") => Ok(()),
        other => Err(anyhow::anyhow!("{what}: {other:?}")),
    };
    refused(
        s.set_data(&node, b"x", Some(-1)).await.map(drop),
        "set_data",
    )?;
    refused(s.delete(&node, Some(-1)).await, "delete")?;
    let check = Op::Check {
        path: node.clone(),
        version: Some(-1),
    };
    refused(s.multi(&[check]).await.map(drop), "multi")?;
    let wrapped = s.set_data(&node, b"x", Some(-2)).await.map(drop);
    ensure!(
        matches!(wrapped, Err(Error::BadVersion { .. })),
        "set_data at -2: {wrapped:?}"
    );
    ensure!(
        s.get_data(&node).await?.0 == b"kept",
        "the node was written"
    );
    s.delete(&node, None).await?;
    Ok(())
}

per_backend!(every_backend {
    negative_versions_are_refused,
    paths_dlock_accepts_every_backend_holds,
    recipes_refuse_bad_paths,
    malformed_shared_counts_are_typed_errors,
    a_semaphore_keeps_the_last_good_count,
    malformed_kv_records_are_typed_errors,
    semaphore_quantities,
    a_huge_quantity_is_given_back_on_timeout,
    kv_semaphore_quantities,
    multi_lock_and_zero_timeouts,
    durations_too_long_to_count_mean_for_ever,
    recipes_on_a_closed_session_fail_closed,
    holds_of_a_closed_session,
    a_leading_latch_ends_with_its_session,
    releasing_twice_and_closing_twice,
});
