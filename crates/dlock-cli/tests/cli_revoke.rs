//! `--revocable[=GRACE]`, `--max-hold` and `dlock revoke --force`, as real
//! processes against real servers: ZooKeeper for every case, and the
//! forced revocation of every kind of holder on etcd and Consul too.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{await_line, dlock_on, exit_within, spawn_sh, unique, zk_endpoint as zk};

/// How long a holder may take, from a revocation or its hold limit, to
/// stop its command and exit — and a waiter to get in: a watch event, a
/// signal, a release. (Consul sessions are 10 s here; nothing waits for
/// one to expire.)
const BOUND: Duration = Duration::from_secs(8);

/// The participants at `path`, as `dlock inspect --json` lists them.
fn participants(endpoint: &str, path: &str) -> Vec<serde_json::Value> {
    let json = common::json_of(endpoint, &["inspect", path, "--json"]);
    json["participants"].as_array().cloned().unwrap_or_default()
}

/// The node of the one holder at `path`.
fn holder_node(endpoint: &str, path: &str) -> String {
    let all = participants(endpoint, path);
    let holders: Vec<_> = all.iter().filter(|p| p["role"] == "holder").collect();
    assert_eq!(holders.len(), 1, "one holder at {path}: {all:?}");
    holders[0]["node"].as_str().unwrap().to_string()
}

/// Waits for the holder's command at `path` to log that it started; the
/// holder's node.
fn started_holder(endpoint: &str, path: &str, log: &std::path::Path) -> String {
    assert!(
        await_line(log, "started", BOUND),
        "{path}: the holder's command never started"
    );
    holder_node(endpoint, path)
}

/// `dlock revoke ARGS`, which must succeed.
fn revoke(endpoint: &str, args: &[&str]) -> Output {
    let out = dlock_on(endpoint)
        .arg("revoke")
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "revoke {args:?}: {out:?}");
    out
}

/// `dlock ARGS -- sh -c CMD` where CMD says it started, and on SIGTERM
/// says so but carries on: only SIGKILL ends it.
fn stubborn(endpoint: &str, args: &[&str], log: &std::path::Path) -> Command {
    let script = format!(
        "trap 'echo TERM >> {0}' TERM; echo started >> {0}; while :; do sleep 0.05; done",
        log.display()
    );
    let mut c = dlock_on(endpoint);
    c.args(args).args(["--", "sh", "-c", &script]);
    c
}

/// `--revocable=GRACE`: a revocation request stops a command that ignores
/// SIGTERM with SIGKILL after GRACE; dlock releases and exits 68, and the
/// waiter gets in.
#[test]
fn a_revocable_lock_kills_a_stubborn_command_after_its_grace() {
    let endpoint = zk();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let path = unique("revocable");
    let grace = Duration::from_millis(600);
    let mut holder = stubborn(&endpoint, &["lock", &path, "--revocable=600ms"], &log)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let node = started_holder(&endpoint, &path, &log);
    let waiter_log = dir.path().join("waiter");
    let waiter = spawn_sh(
        &endpoint,
        &["lock", &path],
        &format!("echo in >> {}", waiter_log.display()),
    );
    let asked = Instant::now();
    revoke(&endpoint, &[&node]);
    let holder_stderr = holder.stderr.take().unwrap();
    assert_eq!(exit_within(holder, BOUND), Some(68), "exit 68: revoked");
    let took = asked.elapsed();
    assert!(
        await_line(&log, "TERM", BOUND),
        "the command got SIGTERM first"
    );
    assert!(took >= grace, "SIGKILL came before the grace: {took:?}");
    let stderr = std::io::read_to_string(holder_stderr).unwrap();
    assert!(stderr.contains("revocation requested"), "{stderr}");
    assert_eq!(exit_within(waiter, BOUND), Some(0));
    assert!(await_line(&waiter_log, "in", Duration::ZERO));
    assert!(participants(&endpoint, &path).is_empty());
}

/// Without `--revocable`, a revocation request is not listened to: the
/// command runs to its end.
#[test]
fn a_lock_without_revocable_ignores_requests() {
    let endpoint = zk();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let path = unique("not-revocable");
    let mut holder = spawn_sh(
        &endpoint,
        &["lock", &path],
        &format!(
            "echo started >> {0}; while [ ! -e {0}.go ]; do sleep 0.05; done",
            log.display()
        ),
    );
    let node = started_holder(&endpoint, &path, &log);
    revoke(&endpoint, &[&node]);
    // Still holding after the request was written and seen by everyone:
    // inspect reads after the revoke's write.
    assert_eq!(holder_node(&endpoint, &path), node);
    assert!(holder.try_wait().unwrap().is_none());
    std::fs::write(format!("{}.go", log.display()), b"").unwrap();
    assert_eq!(exit_within(holder, BOUND), Some(0));
}

/// `--max-hold`: the hold ends by itself at the limit; the command is
/// stopped, dlock exits 66, and a waiter gets in.
#[test]
fn max_hold_stops_the_command_and_lets_the_waiter_in() {
    let endpoint = zk();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let path = unique("max-hold");
    let started = Instant::now();
    let holder = stubborn(
        &endpoint,
        &["lock", &path, "--max-hold", "700ms", "--grace", "200ms"],
        &log,
    )
    .spawn()
    .unwrap();
    assert!(await_line(&log, "started", BOUND));
    let waiter = dlock_on(&endpoint)
        .args(["lock", &path, "--", "true"])
        .spawn()
        .unwrap();
    assert_eq!(exit_within(holder, BOUND), Some(66), "exit 66: lost");
    assert!(started.elapsed() >= Duration::from_millis(700));
    assert_eq!(exit_within(waiter, BOUND), Some(0));
    assert!(participants(&endpoint, &path).is_empty());
}

/// One kind of holder: its name, and the dlock command that holds it.
struct Kind {
    name: &'static str,
    args: &'static [&'static str],
}

const KINDS: &[Kind] = &[
    Kind {
        name: "lock",
        args: &["lock"],
    },
    Kind {
        name: "read-lock",
        args: &["read-lock"],
    },
    Kind {
        name: "write-lock",
        args: &["write-lock"],
    },
    Kind {
        name: "semaphore",
        args: &["semaphore", "--leases", "1"],
    },
    Kind {
        name: "kv-semaphore",
        args: &["semaphore", "--leases", "1", "--kv"],
    },
    Kind {
        name: "leader",
        args: &["elect"],
    },
];

/// `dlock revoke --force` reaches every kind of holder, revocable or not:
/// the holder stops its command and exits 66, the waiter gets in, nothing
/// is left.
fn revoke_force_reaches_every_kind_of_holder(endpoint: &str) {
    let dir = tempfile::tempdir().unwrap();
    for kind in KINDS {
        let log = dir.path().join(kind.name);
        let path = unique(kind.name);
        let args = [kind.args, &[path.as_str(), "--grace", "200ms"]].concat();
        let holder = stubborn(endpoint, &args, &log).spawn().unwrap();
        let node = started_holder(endpoint, &path, &log);
        let waiter_log = dir.path().join(format!("{}-waiter", kind.name));
        let waiter_args = [kind.args, &[path.as_str()]].concat();
        let waiter = spawn_sh(
            endpoint,
            &waiter_args,
            &format!("echo in >> {}", waiter_log.display()),
        );
        let out = revoke(endpoint, &["--force", &node]);
        assert!(String::from_utf8_lossy(&out.stdout).contains("revoked by force"));
        assert_eq!(
            exit_within(holder, BOUND),
            Some(66),
            "{}: the holder stops, exit 66",
            kind.name
        );
        assert_eq!(
            exit_within(waiter, BOUND),
            Some(0),
            "{}: the waiter",
            kind.name
        );
        assert!(
            await_line(&waiter_log, "in", Duration::ZERO),
            "{}",
            kind.name
        );
        let left = participants(endpoint, &path);
        assert!(left.is_empty(), "{}: left behind: {left:?}", kind.name);
    }
}

on_every_server!(revoke_force_reaches_every_kind_of_holder);

/// `--revocable` on a semaphore: the lease holder stops at a request.
#[test]
fn a_revocable_semaphore_lease_stops_at_a_request() {
    let endpoint = zk();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let path = unique("sem-revocable");
    let holder = stubborn(
        &endpoint,
        &["semaphore", &path, "--leases", "2", "--revocable=200ms"],
        &log,
    )
    .spawn()
    .unwrap();
    let node = started_holder(&endpoint, &path, &log);
    revoke(&endpoint, &[&node]);
    assert_eq!(exit_within(holder, BOUND), Some(68));
    assert!(participants(&endpoint, &path).is_empty());
}

/// `--layout consul` has neither revocation nor a hold limit: refused as a
/// usage error naming the flags.
#[test]
fn consul_layout_refuses_revocable_and_max_hold() {
    for args in [
        "lock /x --layout consul --revocable -- true",
        "lock /x --layout consul --max-hold 1s -- true",
    ] {
        let out = dlock_on(&zk()).args(args.split(' ')).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{args}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--revocable and --max-hold"),
            "{args}: {stderr}"
        );
    }
}

/// In Consul's layout, `dlock revoke --force` reaches a `consul lock -n`
/// holder too: its `api.Semaphore` monitors the prefix, finds its
/// contender key gone, stops its command and exits — at once, not at its
/// session's end — leaving nothing behind.
#[cfg(feature = "consul")]
#[test]
fn revoke_force_stops_a_consul_lock_n_holder() {
    let consul = dlock_testkit::shared_consul();
    let http = format!("-http-addr={}", consul.endpoint());
    let binary = dlock_testkit::consul_binary().expect("the consul binary");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let prefix = format!("cr-{}/sem", uuid::Uuid::new_v4().simple());
    let holder = Command::new(&binary)
        .args(["lock", &http, "-n=2", &prefix])
        .arg(format!("echo started >> {}; sleep 30", log.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        await_line(&log, "started", BOUND),
        "consul lock never started"
    );
    let keys = Command::new(&binary)
        .args(["kv", "get", &http, "-keys", &format!("{prefix}/")])
        .output()
        .unwrap();
    let keys = String::from_utf8(keys.stdout).unwrap();
    let contenders: Vec<&str> = keys.lines().filter(|k| !k.ends_with("/.lock")).collect();
    assert_eq!(contenders.len(), 1, "one contender key: {keys}");
    let endpoint = format!("consul://{}", consul.endpoint());
    let revoked = Instant::now();
    revoke(&endpoint, &["--force", &format!("/{}", contenders[0])]);
    // Its command would run 30 s; `consul lock` 1.8 exits 0 after stopping
    // it on a lost slot, so the time tells.
    let code = exit_within(holder, BOUND);
    assert!(code.is_some(), "consul lock did not stop within {BOUND:?}");
    assert!(revoked.elapsed() < BOUND);
    let left = Command::new(&binary)
        .args(["kv", "get", &http, "-recurse", &prefix])
        .output()
        .unwrap();
    assert!(left.stdout.is_empty(), "left behind: {left:?}");
}
