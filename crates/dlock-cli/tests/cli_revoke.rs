//! `--revocable[=GRACE]`, `--max-hold` and `dlock revoke --force`, as real
//! processes against real servers: ZooKeeper for every case, and the
//! forced revocation of every kind of holder on etcd and Consul too.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
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

/// One case: a fresh path on a server, and a directory for the logs of
/// the commands its holder and its waiter run.
struct Case {
    endpoint: String,
    path: String,
    dir: tempfile::TempDir,
}

impl Case {
    /// A fresh path named after `name` on `endpoint`.
    fn on(endpoint: &str, name: &str) -> Case {
        Case {
            endpoint: endpoint.to_string(),
            path: unique(name),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// The log of the holder's command.
    fn log(&self) -> PathBuf {
        self.dir.path().join("holder")
    }

    /// `dlock COMMAND PATH FLAGS -- sh -c CMD` where CMD logs that it
    /// started, and on SIGTERM logs so but carries on: only SIGKILL ends
    /// it.
    fn stubborn(&self, command: &[&str], flags: &[&str]) -> Command {
        let script = format!(
            "trap 'echo TERM >> {0}' TERM; echo started >> {0}; while :; do sleep 0.05; done",
            self.log().display()
        );
        let mut c = dlock_on(&self.endpoint);
        c.args(command).arg(&self.path).args(flags);
        c.args(["--", "sh", "-c", &script]);
        c
    }

    /// Waits for the holder's command to log that it started; the node of
    /// the one holder at the path.
    fn started_holder(&self) -> String {
        assert!(
            await_line(&self.log(), "started", BOUND),
            "{}: the holder's command never started",
            self.path
        );
        self.holder_node()
    }

    /// The node of the one holder at the path.
    fn holder_node(&self) -> String {
        let all = participants(&self.endpoint, &self.path);
        let holders: Vec<_> = all.iter().filter(|p| p["role"] == "holder").collect();
        assert_eq!(holders.len(), 1, "one holder at {}: {all:?}", self.path);
        holders[0]["node"].as_str().unwrap().to_string()
    }

    /// `dlock COMMAND PATH -- sh -c CMD` where CMD logs that it got in.
    fn waiter(&self, command: &[&str]) -> Child {
        let args = [command, &[self.path.as_str()]].concat();
        let script = format!("echo in >> {}", self.dir.path().join("waiter").display());
        spawn_sh(&self.endpoint, &args, &script)
    }

    /// The waiter gets in: exits 0 having run its command.
    fn assert_waiter_got_in(&self, waiter: Child) {
        assert_eq!(
            exit_within(waiter, BOUND),
            Some(0),
            "{}: the waiter",
            self.path
        );
        let waiter_log = self.dir.path().join("waiter");
        assert!(
            await_line(&waiter_log, "in", Duration::ZERO),
            "{}",
            self.path
        );
    }

    /// `dlock revoke FLAGS NODE`, which must succeed.
    fn revoke(&self, flags: &[&str], node: &str) -> Output {
        revoke(&self.endpoint, &[flags, &[node]].concat())
    }

    /// Nobody holds or waits at the path any more.
    fn assert_nothing_left(&self) {
        let left = participants(&self.endpoint, &self.path);
        assert!(left.is_empty(), "{}: left behind: {left:?}", self.path);
    }
}

/// `--revocable=GRACE`: a revocation request stops a command that ignores
/// SIGTERM with SIGKILL after GRACE; dlock releases and exits 68, and the
/// waiter gets in.
#[test]
fn a_revocable_lock_kills_a_stubborn_command_after_its_grace() {
    let case = Case::on(&zk(), "revocable");
    let grace = Duration::from_millis(600);
    let mut holder = case
        .stubborn(&["lock"], &["--revocable=600ms"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let node = case.started_holder();
    let waiter = case.waiter(&["lock"]);
    let asked = Instant::now();
    case.revoke(&[], &node);
    let holder_stderr = holder.stderr.take().unwrap();
    assert_eq!(exit_within(holder, BOUND), Some(68), "exit 68: revoked");
    let took = asked.elapsed();
    assert!(
        await_line(&case.log(), "TERM", BOUND),
        "the command got SIGTERM first"
    );
    assert!(took >= grace, "SIGKILL came before the grace: {took:?}");
    let stderr = std::io::read_to_string(holder_stderr).unwrap();
    assert!(stderr.contains("revocation requested"), "{stderr}");
    case.assert_waiter_got_in(waiter);
    case.assert_nothing_left();
}

/// A revocation asked for while dlock still waits: once it gets the lock,
/// it runs no command (which would be stopped as it started), releases and
/// exits 68; nothing is left behind.
#[test]
fn a_revocation_asked_while_waiting_runs_no_command() {
    let case = Case::on(&zk(), "asked-waiting");
    let log = case.log();
    let holder = spawn_sh(
        &case.endpoint,
        &["lock", &case.path],
        &format!(
            "echo started >> {0}; while [ ! -e {0}.go ]; do sleep 0.05; done",
            log.display()
        ),
    );
    case.started_holder();
    let (ran, said) = (case.dir.path().join("ran"), case.dir.path().join("said"));
    let waiter = dlock_on(&case.endpoint)
        .args(["lock", &case.path, "--revocable", "--", "sh", "-c"])
        .arg(format!("echo ran >> {}", ran.display()))
        .stderr(std::fs::File::create(&said).unwrap())
        .spawn()
        .unwrap();
    let node = common::look_until(
        BOUND,
        "a waiter",
        || {
            let all = participants(&case.endpoint, &case.path);
            let waiting = all.iter().find(|p| p["role"] == "waiter");
            waiting.map_or(String::new(), |p| p["node"].as_str().unwrap().to_string())
        },
        |node| !node.is_empty(),
    );
    case.revoke(&[], &node);
    assert!(
        await_line(&said, "revocation requested", BOUND),
        "the waiter heard the request"
    );
    std::fs::write(format!("{}.go", log.display()), b"").unwrap();
    assert_eq!(exit_within(holder, BOUND), Some(0));
    assert_eq!(exit_within(waiter, BOUND), Some(68), "exit 68: revoked");
    assert!(!ran.exists(), "the command ran");
    // (Stopped as it started, it may not have got as far as its echo.)
    assert!(
        await_line(&said, "before CMD ran", Duration::ZERO),
        "the command was started: {}",
        std::fs::read_to_string(&said).unwrap()
    );
    case.assert_nothing_left();
}

/// An operator's `revoke` of a node that is not there says so (exit 1),
/// and of a node no session owns — the lock's directory, a count — is a
/// usage error that leaves it as it was; before, both printed success,
/// and a count was overwritten.
#[test]
fn revoke_names_what_it_could_not_revoke() {
    let endpoint = zk();
    let path = unique("revoke-nothing");
    let count = format!("{path}-count");
    let set = dlock_on(&endpoint)
        .args(["count", "set", &count, "7"])
        .output()
        .unwrap();
    assert!(set.status.success(), "{set:?}");
    let missing = format!("{path}/_c_0-lock-0000000042");
    let cases = [
        (&missing, 1, "nothing to revoke"),
        (&count, 64, "no holder's or waiter's node"),
    ];
    for force in [&[][..], &["--force"]] {
        for (node, code, said) in cases {
            let out = dlock_on(&endpoint)
                .arg("revoke")
                .args(force)
                .arg(node)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(code), "{force:?} {node}: {stderr}");
            assert!(stderr.contains(said), "{stderr}");
        }
    }
    let got = dlock_on(&endpoint)
        .args(["count", "get", &count])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&got.stdout).trim(), "7", "{got:?}");
    common::remove(&endpoint, &[&count]);
}

/// Without `--revocable`, a revocation request is not listened to: the
/// command runs to its end.
#[test]
fn a_lock_without_revocable_ignores_requests() {
    let case = Case::on(&zk(), "not-revocable");
    let log = case.log();
    let mut holder = spawn_sh(
        &case.endpoint,
        &["lock", &case.path],
        &format!(
            "echo started >> {0}; while [ ! -e {0}.go ]; do sleep 0.05; done",
            log.display()
        ),
    );
    let node = case.started_holder();
    case.revoke(&[], &node);
    // Still holding after the request was written and seen by everyone:
    // inspect reads after the revoke's write.
    assert_eq!(case.holder_node(), node);
    assert!(holder.try_wait().unwrap().is_none());
    std::fs::write(format!("{}.go", log.display()), b"").unwrap();
    assert_eq!(exit_within(holder, BOUND), Some(0));
}

/// `--max-hold`: the hold ends by itself at the limit; the command is
/// stopped, dlock exits 66, and a waiter gets in.
#[test]
fn max_hold_stops_the_command_and_lets_the_waiter_in() {
    let case = Case::on(&zk(), "max-hold");
    let started = Instant::now();
    let holder = case
        .stubborn(&["lock"], &["--max-hold", "700ms", "--grace", "200ms"])
        .spawn()
        .unwrap();
    assert!(await_line(&case.log(), "started", BOUND));
    let waiter = dlock_on(&case.endpoint)
        .args(["lock", &case.path, "--", "true"])
        .spawn()
        .unwrap();
    assert_eq!(exit_within(holder, BOUND), Some(66), "exit 66: lost");
    assert!(started.elapsed() >= Duration::from_millis(700));
    assert_eq!(exit_within(waiter, BOUND), Some(0));
    case.assert_nothing_left();
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
    for kind in KINDS {
        let case = Case::on(endpoint, kind.name);
        let holder = case
            .stubborn(kind.args, &["--grace", "200ms"])
            .spawn()
            .unwrap();
        let node = case.started_holder();
        let waiter = case.waiter(kind.args);
        let out = case.revoke(&["--force"], &node);
        assert!(String::from_utf8_lossy(&out.stdout).contains("revoked by force"));
        assert_eq!(
            exit_within(holder, BOUND),
            Some(66),
            "{}: the holder stops, exit 66",
            kind.name
        );
        case.assert_waiter_got_in(waiter);
        case.assert_nothing_left();
    }
}

on_every_server!(revoke_force_reaches_every_kind_of_holder);

/// `--revocable` on a semaphore: the lease holder stops at a request.
#[test]
fn a_revocable_semaphore_lease_stops_at_a_request() {
    let case = Case::on(&zk(), "sem-revocable");
    let holder = case
        .stubborn(&["semaphore"], &["--leases", "2", "--revocable=200ms"])
        .spawn()
        .unwrap();
    let node = case.started_holder();
    case.revoke(&[], &node);
    assert_eq!(exit_within(holder, BOUND), Some(68));
    case.assert_nothing_left();
}

/// `--layout consul` takes `--revocable` and `--max-hold` as every lock
/// does. On Consul: a revocation request stops a revocable holder (exit
/// 68), and when the limit ends a hold (exit 66), a `consul lock` waiting
/// on the prefix sees `.lock` go and gets in.
#[cfg(feature = "consul")]
#[test]
fn consul_layout_holds_are_revocable_and_limited() {
    let endpoint = common::consul_endpoint();
    let case = Case::on(&endpoint, "consul-revocable");
    let flags = ["--layout", "consul", "--revocable=200ms"];
    let holder = case.stubborn(&["lock"], &flags).spawn().unwrap();
    let node = case.started_holder();
    assert!(node.ends_with("/.lock"), "{node}");
    case.revoke(&[], &node);
    assert_eq!(exit_within(holder, BOUND), Some(68), "exit 68: revoked");
    case.assert_nothing_left();

    let case = Case::on(&endpoint, "consul-max-hold");
    let started = Instant::now();
    let flags = [
        "--layout",
        "consul",
        "--max-hold",
        "700ms",
        "--grace",
        "200ms",
    ];
    let holder = case.stubborn(&["lock"], &flags).spawn().unwrap();
    assert!(await_line(&case.log(), "started", BOUND));
    let waiter_log = case.dir.path().join("waiter");
    let waiter = common::consul_lock()
        .arg(case.path.trim_start_matches('/'))
        .arg(format!("echo in >> {}", waiter_log.display()))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    assert_eq!(exit_within(holder, BOUND), Some(66), "exit 66: lost");
    assert!(started.elapsed() >= Duration::from_millis(700));
    assert_eq!(exit_within(waiter, BOUND), Some(0), "consul lock ran");
    assert!(await_line(&waiter_log, "in", Duration::ZERO));
    case.assert_nothing_left();
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
