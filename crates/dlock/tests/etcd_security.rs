//! etcd as operators run it: a namespace per application, authentication
//! with a role limited to one prefix, and TLS with a CA made by the test.
#![cfg(feature = "etcd")]

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dlock::store::{CreateMode, CreateOptions};
use dlock::{Error, Mutex, Semaphore, Session, SessionOptions};
use dlock_testkit::{shared_etcd, EtcdOptions, EtcdServer, EtcdTls, TestCerts};

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

async fn connect(url: &str) -> dlock::Result<Session> {
    let options = SessionOptions::default().with_session_timeout(Duration::from_secs(2));
    dlock::connect_with(url, options).await
}

/// Every key below `path` as the bare cluster shows it.
async fn keys_below(session: &Session, path: &str) -> Result<Vec<String>> {
    let mut found = Vec::new();
    let mut stack = vec![path.to_string()];
    while let Some(p) = stack.pop() {
        match session.children(&p).await {
            Ok(children) => {
                for c in children {
                    let child = format!("{}/{}", p.trim_end_matches('/'), c.name);
                    found.push(child.clone());
                    stack.push(child);
                }
            }
            Err(Error::NoNode { .. }) => {}
            Err(e) => return Err(e).context(p),
        }
    }
    found.sort();
    Ok(found)
}

/// A lock, a semaphore and a plain node under a namespace are keys below
/// it, named relative to it in everything the caller sees; two namespaces
/// holding "the same" lock do not exclude each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_keeps_every_key_below_it() -> Result<()> {
    let etcd = shared_etcd().endpoint();
    let (ns_a, ns_b) = (unique("/ns"), unique("/ns"));
    let a = connect(&format!("etcd://{etcd}{ns_a}")).await?;
    let b = connect(&format!("etcd://{etcd}{ns_b}")).await?;
    let bare = connect(&format!("etcd://{etcd}")).await?;

    // The namespace is a root: it exists, and is listed empty.
    ensure!(a.exists("/").await?.is_some(), "the namespace root exists");
    ensure!(a.children("/").await?.is_empty());

    let guard_a = Mutex::new(&a, "/shop/lock")?.acquire().await?;
    let guard_b = Mutex::new(&b, "/shop/lock")?
        .try_acquire()
        .await?
        .context("another namespace's lock must not exclude this one")?;
    ensure!(
        guard_a.node().starts_with("/shop/lock/_c_"),
        "nodes are named relative to the namespace: {}",
        guard_a.node()
    );
    a.create(
        "/shop/stock",
        b"7",
        CreateOptions::new(CreateMode::Persistent).with_parents(),
    )
    .await?;
    let lease = Semaphore::new(&a, "/shop/sem", 2)?.acquire_one().await?;

    // The bare cluster sees the same keys below the namespace, and nothing
    // of them at the paths themselves.
    ensure!(bare.get_data(&format!("{ns_a}/shop/stock")).await?.0 == b"7");
    ensure!(bare.exists("/shop/stock").await?.is_none());
    let keys = keys_below(&bare, &ns_a).await?;
    let lock_node = format!("{ns_a}{}", guard_a.node());
    let lease_node = format!("{ns_a}{}", lease.node());
    for key in [&lock_node, &lease_node] {
        ensure!(keys.contains(key), "{key} missing from {keys:#?}");
    }
    let names: Vec<String> = a.children("/").await?.into_iter().map(|c| c.name).collect();
    ensure!(names == ["shop"], "the namespace's top level: {names:?}");

    // Errors name the caller's paths.
    let err = a.delete("/shop/missing", None).await.unwrap_err();
    ensure!(
        err == Error::NoNode {
            path: "/shop/missing".into()
        },
        "{err:?}"
    );
    let err = a.delete("/", None).await.unwrap_err();
    ensure!(matches!(err, Error::InvalidArgument(_)), "{err:?}");

    lease.release().await?;
    guard_a.release().await?;
    guard_b.release().await?;
    a.delete("/shop/stock", None).await?;
    for (session, ns) in [(&a, &ns_a), (&b, &ns_b)] {
        session.background_idle().await;
        let left = keys_below(&bare, ns).await?;
        ensure!(left.is_empty(), "left behind under {ns}: {left:#?}");
    }
    for s in [a, b, bare] {
        s.close().await;
    }
    Ok(())
}

/// A private etcd with authentication on: `root`, and `alice` whose only
/// role may read and write keys below `/app/`.
fn etcd_with_auth() -> Result<EtcdServer> {
    etcd_with_auth_by(EtcdOptions::default())
}

/// [`etcd_with_auth`], started with `options`.
fn etcd_with_auth_by(options: EtcdOptions) -> Result<EtcdServer> {
    let etcd = EtcdServer::start_with(options)?;
    for args in [
        &["user", "add", "root:rootpw"][..],
        &["user", "grant-role", "root", "root"],
        &["user", "add", "alice:alicepw"],
        &["role", "add", "app"],
        &[
            "role",
            "grant-permission",
            "app",
            "readwrite",
            "--prefix=true",
            "/app/",
        ],
        &["user", "grant-role", "alice", "app"],
        &["auth", "enable"],
    ] {
        etcd.etcdctl(args)?;
    }
    Ok(etcd)
}

/// dlock works inside a role's prefix (as a namespace), is refused with a
/// permission error naming the path outside it, and wrong or missing
/// credentials fail with an authentication error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_limited_to_a_prefix_works_inside_it_only() -> Result<()> {
    let etcd = etcd_with_auth()?;
    let host = etcd.endpoint();

    let inside = connect(&format!("etcd://alice:alicepw@{host}/app")).await?;
    let mutex = Mutex::new(&inside, "/orders/lock")?;
    let guard = mutex.acquire().await?;
    let waiter = connect(&format!("etcd://alice:alicepw@{host}/app")).await?;
    ensure!(
        Mutex::new(&waiter, "/orders/lock")?
            .try_acquire()
            .await?
            .is_none(),
        "a second session of the same user is excluded"
    );
    let semaphore = Semaphore::new(&inside, "/orders/slots", 1)?;
    semaphore.acquire_one().await?.release().await?;
    guard.release().await?;

    let outside = connect(&format!("etcd://alice:alicepw@{host}")).await?;
    let err = Mutex::new(&outside, "/other/lock")?
        .acquire_timeout(Duration::from_secs(5))
        .await
        .unwrap_err();
    ensure!(
        matches!(&err, Error::NoAuth { path } if path.starts_with("/other/lock")),
        "outside the prefix: {err:?}"
    );
    ensure!(err.to_string().contains("permission denied at /other/lock"));

    let err = connect(&format!("etcd://alice:wrong@{host}/app"))
        .await
        .unwrap_err();
    ensure!(
        matches!(err, Error::AuthFailed(_)),
        "wrong password: {err:?}"
    );

    // Nothing left: root sees no key at all.
    let root = connect(&format!("etcd://root:rootpw@{host}")).await?;
    for s in [&inside, &waiter, &outside] {
        s.background_idle().await;
    }
    let left = keys_below(&root, "/").await?;
    ensure!(left.is_empty(), "left behind: {left:#?}");
    for s in [inside, waiter, outside, root] {
        s.close().await;
    }
    Ok(())
}

/// A member serving TLS only, with client certificates required: dlock
/// connects with the test's CA and client certificate and locks; without
/// TLS, with another CA or without a client certificate it cannot connect,
/// and says it is unreachable; a missing file is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_test_ca_and_client_certificates() -> Result<()> {
    let certs = TestCerts::generate()?;
    let etcd = EtcdServer::start_with(EtcdOptions {
        tls: Some(EtcdTls::from_certs(&certs, true)),
        ..EtcdOptions::default()
    })?;
    let host = etcd.endpoint();
    let url = format!(
        "etcds://{host}?cacert={}&cert={}&key={}",
        certs.ca.display(),
        certs.client_cert.display(),
        certs.client_key.display()
    );

    let session = connect(&url).await?;
    let other = connect(&url).await?;
    let guard = Mutex::new(&session, "/tls/lock")?.acquire().await?;
    ensure!(Mutex::new(&other, "/tls/lock")?
        .try_acquire()
        .await?
        .is_none());
    guard.release().await?;
    session.background_idle().await;
    let left = keys_below(&other, "/").await?;
    ensure!(left.is_empty(), "left behind: {left:#?}");

    let plain = connect(&format!("etcd://{host}")).await.unwrap_err();
    ensure!(matches!(plain, Error::Unreachable(_)), "plain: {plain:?}");

    let stranger = TestCerts::generate()?;
    let wrong_ca = format!(
        "etcds://{host}?cacert={}&cert={}&key={}",
        stranger.ca.display(),
        certs.client_cert.display(),
        certs.client_key.display()
    );
    let err = connect(&wrong_ca).await.unwrap_err();
    ensure!(matches!(err, Error::Unreachable(_)), "another CA: {err:?}");

    let anonymous = format!("etcds://{host}?cacert={}", certs.ca.display());
    let err = connect(&anonymous).await.unwrap_err();
    ensure!(
        matches!(err, Error::Unreachable(_)),
        "no client certificate: {err:?}"
    );

    let missing = format!("etcds://{host}?cacert=/nonexistent/ca.pem");
    let err = connect(&missing).await.unwrap_err();
    ensure!(
        matches!(&err, Error::InvalidEndpoint { reason, .. } if reason.contains("/nonexistent/ca.pem")),
        "missing CA file: {err:?}"
    );

    session.close().await;
    other.close().await;
    Ok(())
}

/// The KV requests etcd at `port` has started so far.
fn kv_requests(port: u16) -> Result<u64> {
    let (_, body) = dlock_testkit::http_get(port, "/metrics")?;
    let started = body
        .lines()
        .filter(|l| l.starts_with("grpc_server_started_total{"))
        .filter(|l| l.contains("grpc_service=\"etcdserverpb.KV\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    Ok(started.sum::<f64>() as u64)
}

/// A waiter whose watch stream was opened with a token that expired since
/// (unused for `--auth-token-ttl`; its lease renewals do not use it) waits
/// again as any waiter: etcd refuses the new watch on that stream
/// (etcd#12385; 3.4.23 answers it as watch -1, not by the id asked for),
/// and the stream is opened again with a fresh token. Before, the refusal
/// went unheard and the waiter waited for ever after the lock came free;
/// nor may it turn into a wait that lists, arms, is refused and lists
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_refused_for_an_expired_token_is_armed_with_a_fresh_one() -> Result<()> {
    let etcd = EtcdServer::start_with(EtcdOptions {
        extra_args: vec!["--auth-token-ttl=2".into()],
        ..EtcdOptions::default()
    })?;
    for args in [
        &["user", "add", "root:rootpw"][..],
        &["user", "grant-role", "root", "root"],
        &["auth", "enable"],
    ] {
        etcd.etcdctl(args)?;
    }
    let url = format!("etcd://root:rootpw@{}", etcd.endpoint());
    let (a, b) = (connect(&url).await?, connect(&url).await?);
    let path = "/expiring/lock";
    let wait_behind = |holder: &Session| {
        let (holder, b) = (holder.clone(), b.clone());
        async move {
            let held = Mutex::new(&holder, path)?.acquire().await?;
            let waiter = tokio::spawn(async move { Mutex::new(&b, path)?.acquire().await });
            while holder.children(path).await?.len() < 2 {
                tokio::task::yield_now().await;
            }
            anyhow::Ok((held, waiter))
        }
    };
    // b's watch stream opens with its first token.
    let (held, waiter) = wait_behind(&a).await?;
    held.release().await?;
    waiter.await??.release().await?;
    // Unused for longer than its lifetime, b's token expires: only time
    // tells.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (held, waiter) = wait_behind(&a).await?;
    // The wait settles into one watch, which asks nothing more (the
    // window may still see the waiter's listing and its gap check after
    // the reopen); a watch refused and looked at again would ask dozens of
    // times per second.
    let settled = kv_requests(etcd.port())?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let asked = kv_requests(etcd.port())? - settled;
    ensure!(asked <= 10, "{asked} KV requests in one second of waiting");
    ensure!(!waiter.is_finished(), "still held by a");
    held.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(10), waiter).await???;
    got.release().await?;
    let left = keys_below(&a, "/expiring").await?;
    ensure!(left.is_empty(), "left behind: {left:#?}");
    a.close().await;
    b.close().await;
    Ok(())
}

/// With JWT tokens (which carry the auth store's revision they were issued
/// at), a change to users or roles makes etcd refuse every token issued
/// before it ("revision of auth store is old"): a session's next request
/// takes a fresh token and goes through, as with Go's client, instead of
/// failing for good as if its credentials were wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_to_users_leaves_sessions_working() -> Result<()> {
    // The test CA's key pair signs and checks the tokens.
    let keys = TestCerts::generate()?;
    let etcd = etcd_with_auth_by(EtcdOptions {
        extra_args: vec![format!(
            "--auth-token=jwt,pub-key={},priv-key={},sign-method=ES256",
            keys.server_cert.display(),
            keys.server_key.display()
        )],
        ..EtcdOptions::default()
    })?;
    let url = format!("etcd://alice:alicepw@{}/app", etcd.endpoint());
    let (session, other) = (connect(&url).await?, connect(&url).await?);
    let path = "/jobs/lock";
    // A wait behind `other`, through the session's watch stream.
    let wait_behind_other = || async {
        let held = Mutex::new(&other, path)?.acquire().await?;
        let waiting = Mutex::new(&session, path)?;
        let waiter = tokio::spawn(async move { waiting.acquire().await });
        while other.children(path).await?.len() < 2 {
            tokio::task::yield_now().await;
        }
        held.release().await?;
        let got = tokio::time::timeout(Duration::from_secs(10), waiter).await???;
        got.release().await?;
        anyhow::Ok(())
    };
    wait_behind_other().await?;
    etcd.etcdctl(&["--user", "root:rootpw", "user", "add", "bob:bobpw"])?;
    ensure!(
        session.exists(path).await?.is_none(),
        "read after the change"
    );
    // Its watch stream's token is stale too.
    wait_behind_other().await?;
    session.close().await;
    other.close().await;
    Ok(())
}
