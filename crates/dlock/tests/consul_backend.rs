//! What only the Consul backend has, on real Consul agents started by the
//! tests: keys named like paths below the endpoint's prefix, sessions
//! destroyed from outside, sessions abandoned by a killed process and
//! expired by Consul's TTL, an agent that restarts empty, ACL tokens
//! limited to a prefix, and what Consul refuses to store. Cut connections,
//! paused holders and a server cluster losing its leader are the generic
//! scenarios of `tests/faults.rs` (`consul::*`).
#![cfg(feature = "consul")]

mod common;

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use base64::Engine as _;
use common::{ephemeral, persistent, Harness};
use dlock::store::{Op, SessionState};
use dlock::{Error, Mutex, Session, SessionOptions};
use dlock_testkit::{shared_consul, ConsulOptions, ConsulServer};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

const WITHIN: Duration = Duration::from_secs(20);

/// Consul's minimum session TTL, which the harness asks for.
const TTL: Duration = Duration::from_secs(10);

/// The entries `GET /v1/kv/<key>` answers (`None` for 404).
fn kv_get(server: &ConsulServer, key: &str, query: &str) -> Result<Option<Vec<Value>>> {
    let (status, body) = server.http("GET", &format!("/v1/kv/{key}{query}"), None)?;
    match status {
        200 => Ok(Some(serde_json::from_str(&body)?)),
        404 => Ok(None),
        _ => bail!("GET /v1/kv/{key}: {status} {body}"),
    }
}

/// The Consul session holding `key` (its `Session` field).
fn holder_of(server: &ConsulServer, key: &str) -> Result<String> {
    let entries = kv_get(server, key, "")?.with_context(|| format!("{key} is there"))?;
    entries[0]["Session"]
        .as_str()
        .map(String::from)
        .with_context(|| format!("{key} is held: {entries:?}"))
}

/// Waits (by the status channel) until `s` reaches one of `states`.
async fn await_state(s: &Session, states: &[SessionState], within: Duration) -> Result<()> {
    let mut rx = s.watch_status();
    tokio::time::timeout(within, rx.wait_for(|st| states.contains(&st.state)))
        .await
        .with_context(|| format!("no {states:?} within {within:?}: {:?}", s.status()))??;
    Ok(())
}

/// Paths become keys without the leading `/`, below the endpoint's prefix;
/// the data is the value, the version the `Flags`, and an ephemeral node's
/// key is held by the client's Consul session. Nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_land_where_the_module_doc_says() -> Result<()> {
    let server = shared_consul();
    let prefix = format!("p-{}", uuid::Uuid::new_v4().simple());
    let url = format!("consul://{}/{prefix}", server.endpoint());
    let s = dlock::connect_with(&url, SessionOptions::default().with_session_timeout(TTL)).await?;
    s.create("/shop/stock", b"12", persistent()).await?;
    s.set_data("/shop/stock", b"11", Some(0)).await?;
    s.create("/shop/holder", b"", ephemeral()).await?;

    let stock = kv_get(server, &format!("{prefix}/shop/stock"), "")?.context("stock")?;
    let value = base64::engine::general_purpose::STANDARD
        .decode(stock[0]["Value"].as_str().context("a value")?.as_bytes())?;
    ensure!(value == b"11", "{value:?}");
    ensure!(stock[0]["Flags"] == 1, "one set_data: {stock:?}");
    ensure!(stock[0]["Session"].is_null(), "persistent: {stock:?}");
    let holder = holder_of(server, &format!("{prefix}/shop/holder"))?;
    let (_, sessions) = server.http("GET", &format!("/v1/session/info/{holder}"), None)?;
    ensure!(sessions.contains(&holder), "{sessions}");
    // The implicit parent `/shop` writes no key; the prefix has none.
    ensure!(kv_get(server, &format!("{prefix}/shop"), "")?.is_none());
    ensure!(kv_get(server, &prefix, "")?.is_none());

    s.delete("/shop/stock", None).await?;
    s.delete("/shop/holder", None).await?;
    ensure!(
        kv_get(server, &prefix, "?recurse")?.is_none(),
        "left under {prefix}"
    );
    s.close().await;
    Ok(())
}

/// A session destroyed from outside (an operator's
/// `consul session destroy`): the hold's lost signal fires, its guarded
/// write is refused, and the next waiter gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_destroyed_from_outside_loses_the_hold() -> Result<()> {
    let h = common::consul();
    let server = shared_consul();
    let (s1, s2) = (h.session().await, h.session().await);
    let path = h.path("/lock");
    let held = Mutex::new(&s1, &path)?.acquire().await?;
    let waiter = {
        let (s2, path) = (s2.clone(), path.clone());
        tokio::spawn(async move { Mutex::new(&s2, &path)?.acquire_timeout(WITHIN).await })
    };
    common::await_children(&s1, &path, 2, WITHIN).await?;
    let uuid = holder_of(server, held.node().trim_start_matches('/'))?;
    let (status, body) = server.http("PUT", &format!("/v1/session/destroy/{uuid}"), None)?;
    ensure!(status == 200, "{status} {body}");

    tokio::time::timeout(WITHIN, held.lost())
        .await
        .context("the lost signal")?;
    let write = held
        .guarded(&[Op::Create {
            path: h.path("/resource"),
            data: b"stale".to_vec(),
            mode: dlock::store::CreateMode::Persistent,
        }])
        .await;
    ensure!(write.is_err(), "a lost hold wrote: {write:?}");
    ensure!(s1.exists(&h.path("/resource")).await?.is_none());
    let next = waiter.await??;
    ensure!(next.token() > held.token());
    next.release().await?;
    let _ = held.release().await;
    h.finish().await;
    Ok(())
}

/// Not a test of its own: the child process of
/// `a_killed_holder_loses_its_slot_when_the_ttl_runs_out`, which runs this
/// test binary again with `DLOCK_CHILD_LOCK=<endpoint> <path>`. It takes
/// the lock, says so, and waits to be killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_holding_a_lock() -> Result<()> {
    let Ok(spec) = std::env::var("DLOCK_CHILD_LOCK") else {
        return Ok(());
    };
    let (url, path) = spec.split_once(' ').context("endpoint and path")?;
    let options = SessionOptions::default().with_session_timeout(TTL);
    let s = dlock::connect_with(url, options).await?;
    let held = Mutex::new(&s, path)?.acquire().await?;
    println!("HELD {}", held.token());
    std::future::pending::<()>().await;
    Ok(())
}

/// A holder whose process dies (SIGKILL: no release, no session destroy,
/// renewals simply stop) keeps its lock until Consul expires the session:
/// Consul keeps a session up to twice its TTL, so the next acquirer gets
/// in within 2 × TTL (+ a margin for the agent's timer and the watch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_loses_its_slot_when_the_ttl_runs_out() -> Result<()> {
    let h = common::consul();
    let path = h.path("/lock");
    let url = format!("consul://{}", shared_consul().endpoint());
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .args(["--exact", "child_holding_a_lock", "--nocapture"])
        .env("DLOCK_CHILD_LOCK", format!("{url} {path}"))
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
    tokio::time::timeout(WITHIN, async {
        while let Some(line) = lines.next_line().await? {
            if line.starts_with("HELD ") {
                return Ok(());
            }
        }
        bail!("the child ended without the lock")
    })
    .await
    .context("the child takes the lock")??;

    let s = h.session().await;
    let ttl = s.session_timeout();
    child.kill().await?;
    let killed = Instant::now();
    let bound = ttl * 2 + Duration::from_secs(5);
    let next = Mutex::new(&s, &path)?
        .acquire_timeout(bound + Duration::from_secs(10))
        .await
        .context("the next acquirer gets in")?;
    let took = killed.elapsed();
    eprintln!("TTL {ttl:?}: the lock of a killed holder passed on after {took:?}");
    ensure!(took >= ttl / 2, "handed over before any TTL ran: {took:?}");
    ensure!(took <= bound, "{took:?} exceeds 2 x TTL + 5 s");
    next.release().await?;
    h.finish().await;
    Ok(())
}

/// A dev agent keeps its store in memory: after a restart the session is
/// gone (`Lost`, the hold's lost signal fires) and the next operation
/// creates a new one that works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_loses_the_session_and_a_new_one_works() -> Result<()> {
    let mut server = ConsulServer::start()?;
    let url = format!("consul://{}", server.endpoint());
    let s = dlock::connect_with(&url, SessionOptions::default().with_session_timeout(TTL)).await?;
    let first = s.session_id();
    let held = Mutex::new(&s, "/restart/lock")?.acquire().await?;
    server.restart()?;
    await_state(&s, &[SessionState::Lost], WITHIN * 2).await?;
    tokio::time::timeout(WITHIN, held.lost())
        .await
        .context("the lost signal")?;
    let again = Mutex::new(&s, "/restart/lock")?
        .acquire_timeout(WITHIN)
        .await?;
    ensure!(s.session_id() != first, "a new session");
    ensure!(s.state() != SessionState::Lost, "{:?}", s.status());
    again.release().await?;
    let _ = held.release().await;
    s.close().await;
    ensure!(kv_get(&server, "restart", "?recurse")?.is_none());
    Ok(())
}

/// A session with a lock delay (`?lock-delay=`) that is invalidated while
/// holding keeps its keys' names from being created again for that long:
/// the create fails with `Error::LockDelay` naming the node; after the
/// delay the same create succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_delay_refuses_the_name_for_its_duration() -> Result<()> {
    let h = common::consul();
    let server = shared_consul();
    let delay = Duration::from_secs(3);
    let url = format!(
        "consul://{}?lock-delay={}s",
        server.endpoint(),
        delay.as_secs()
    );
    let holder =
        dlock::connect_with(&url, SessionOptions::default().with_session_timeout(TTL)).await?;
    let next = h.session().await;
    let path = h.path("/delayed");
    holder.create(&path, b"", ephemeral()).await?;
    let uuid = holder.native_session_id().1;
    let (status, body) = server.http("PUT", &format!("/v1/session/destroy/{uuid}"), None)?;
    ensure!(status == 200, "{status} {body}");
    let destroyed = Instant::now();
    common::await_gone(&next, &path, WITHIN).await?;
    match next.create(&path, b"", ephemeral()).await {
        Err(Error::LockDelay { path: named }) => ensure!(named == path, "{named}"),
        other => bail!("a create within the lock delay: {other:?}"),
    }
    ensure!(
        destroyed.elapsed() < delay,
        "the check came too late to tell"
    );
    // No event marks the delay's end: wait it out, then the name is free.
    tokio::time::sleep(delay.saturating_sub(destroyed.elapsed()) + Duration::from_millis(500))
        .await;
    let again = next.create(&path, b"", ephemeral()).await?;
    ensure!(again.stat.ephemeral_owner == next.session_id());
    next.delete(&path, None).await?;
    holder.close().await;
    h.finish().await;
    Ok(())
}

/// An agent that answers but cannot serve — a client agent cut off from its
/// servers answers HTTP 500, "No known Consul servers" — is left for the
/// next agent the endpoint names, as a silent one is: a session opens, and
/// locks, through the next. (Before, every try went to the first, until
/// the open gave up: `Unreachable`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_cannot_serve_is_left_for_the_next() -> Result<()> {
    let broken = ConsulServer::start_with(ConsulOptions {
        client_without_servers: true,
        ..ConsulOptions::default()
    })?;
    let (status, body) = broken.http("PUT", "/v1/kv/probe", Some("x"))?;
    ensure!(
        status == 500,
        "a client agent without servers: {status} {body}"
    );
    let healthy = ConsulServer::start()?;
    let url = format!("consul://{},{}", broken.endpoint(), healthy.endpoint());
    let options = SessionOptions::default().with_session_timeout(TTL);
    let session = dlock::connect_with(&url, options).await?;
    let held = Mutex::new(&session, "/left/lock")?
        .acquire_timeout(WITHIN)
        .await?;
    let nodes = kv_get(&healthy, "left/lock/", "?recurse")?.unwrap_or_default();
    ensure!(
        nodes.len() == 1,
        "the lock's node, on the agent that serves: {nodes:?}"
    );
    held.release().await?;
    session.close().await;
    Ok(())
}

/// An ACL token whose policy allows `key_prefix "app/"` works below that
/// prefix; outside it every write is `NoAuth` naming the path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_limited_to_a_prefix_works_inside_and_is_refused_outside() -> Result<()> {
    // The agent's default token (for requests without one: the testkit's
    // readiness probe, `http()`) is the master; dlock's requests carry the
    // limited token.
    let hcl = r#"acl { enabled = true, default_policy = "deny", tokens { master = "root-token", default = "root-token" } }"#;
    let server = ConsulServer::start_with(ConsulOptions {
        extra_args: vec!["-hcl".into(), hcl.into()],
        ..ConsulOptions::default()
    })?;
    let root = "?token=root-token";
    let rules = r#"key_prefix "app/" { policy = "write" } session_prefix "" { policy = "write" }"#;
    let policy = serde_json::json!({ "Name": "app-only", "Rules": rules }).to_string();
    let (status, body) = server.http("PUT", &format!("/v1/acl/policy{root}"), Some(&policy))?;
    ensure!(status == 200, "policy: {status} {body}");
    let token = r#"{ "Policies": [ { "Name": "app-only" } ] }"#;
    let (status, body) = server.http("PUT", &format!("/v1/acl/token{root}"), Some(token))?;
    ensure!(status == 200, "token: {status} {body}");
    let secret: Value = serde_json::from_str(&body)?;
    let secret = secret["SecretID"].as_str().context("SecretID")?;
    let options = SessionOptions::default().with_session_timeout(TTL);

    let inside = format!("consul://{}/app?token={secret}", server.endpoint());
    let s = dlock::connect_with(&inside, options.clone()).await?;
    let held = Mutex::new(&s, "/locks/a")?.acquire_timeout(WITHIN).await?;
    held.release().await?;
    s.create("/data", b"x", persistent()).await?;
    s.delete("/data", None).await?;
    s.close().await;

    let outside = format!("consul://{}/other?token={secret}", server.endpoint());
    let s = dlock::connect_with(&outside, options).await?;
    match s.create("/data", b"x", persistent()).await {
        Err(Error::NoAuth { path }) => ensure!(path == "/data", "{path}"),
        other => bail!("a write outside the prefix: {other:?}"),
    }
    match Mutex::new(&s, "/locks/a")?.acquire_timeout(WITHIN).await {
        // The lock's path, or the ancestor whose creation was denied.
        Err(Error::NoAuth { path }) => ensure!(
            path.starts_with("/locks/a") || "/locks/a".starts_with(&path),
            "{path}"
        ),
        other => bail!("a lock outside the prefix: {other:?}"),
    }
    s.close().await;
    ensure!(kv_get(&server, "app", "?recurse")?.is_none());
    Ok(())
}

/// What Consul cannot store is refused with a typed error naming the node
/// and the problem, before anything is written: control characters (by
/// dlock's path rules), characters Consul's key URLs refuse, values beyond
/// Consul's 512 KiB.
async fn bad_keys_and_values_get_typed_errors(h: &Harness) -> Result<()> {
    let s = h.session().await;
    for bad in ["/x\u{1}", "/x\u{3000}y", "/x\u{200b}y", "/x\u{a0}"] {
        let path = h.path(bad);
        match s.create(&path, b"", persistent()).await {
            Err(Error::InvalidPath {
                path: named,
                reason,
            }) => {
                ensure!(named.contains("/x"), "{named:?}");
                ensure!(!reason.is_empty());
            }
            other => bail!("{path:?}: {other:?}"),
        }
    }
    let big = vec![b'v'; 512 * 1024 + 1];
    for mode in [persistent(), ephemeral()] {
        match s.create(&h.path("/big"), &big, mode).await {
            Err(Error::InvalidArgument(m)) => {
                ensure!(m.contains("/big") && m.contains("512"), "{m}")
            }
            other => bail!("a value beyond 512 KiB: {other:?}"),
        }
    }
    s.create(&h.path("/small"), b"", persistent()).await?;
    match s.set_data(&h.path("/small"), &big, None).await {
        Err(Error::InvalidArgument(m)) => ensure!(m.contains("/small"), "{m}"),
        other => bail!("set_data beyond 512 KiB: {other:?}"),
    }
    s.delete(&h.path("/small"), None).await?;
    Ok(())
}

/// Consul's refusals quote the keys they name, and a key named like a
/// reason is not read as one: a fenced delete of our node after another
/// session took its name is refused by `check-session` with a message
/// naming the key, which answers `NoNode` and leaves our session alive
/// (not `SessionExpired`, `LockDelay` or `NoAuth`).
async fn a_key_named_like_a_refusal_is_not_read_as_one(h: &Harness) -> Result<()> {
    let (ours, theirs) = (h.session().await, h.session().await);
    let id = ours.session_id();
    for name in ["/session not found", "/lock delay", "/Permission denied"] {
        let node = h.path(name);
        ours.create(&node, b"", ephemeral()).await?;
        theirs.delete(&node, None).await?;
        theirs.create(&node, b"", ephemeral()).await?;
        match ours.delete(&node, None).await {
            Err(Error::NoNode { path }) if path == node => {}
            other => bail!("{node:?}: {other:?}"),
        }
        ensure!(
            ours.session_id() == id && ours.state() != SessionState::Lost,
            "{node:?}: our session ended"
        );
        ensure!(theirs.exists(&node).await?.is_some(), "their node stays");
        theirs.delete(&node, None).await?;
    }
    Ok(())
}

per_backend!(consul => crate::common::consul();
    bad_keys_and_values_get_typed_errors,
    a_key_named_like_a_refusal_is_not_read_as_one,
);
