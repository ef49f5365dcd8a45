//! `dlock members join|list|watch` and `dlock observe` as real processes:
//! on ZooKeeper, etcd and Consul (each case once per endpoint), and the
//! embedded store refused (it lives inside one process, so no other
//! process could see a member or a leader).

use std::time::Duration;

mod common;
use common::{await_gone, await_line, dlock_on, exit_within, unique, zk_endpoint, Running};

/// How long a process may take to answer a signal.
const BOUND: Duration = Duration::from_secs(15);

fn run(endpoint: &str, args: &[&str]) -> std::process::Output {
    dlock_on(endpoint).args(args).output().expect("run dlock")
}

#[test]
fn help_shows_examples() {
    for (args, example) in [
        (
            &["members", "join", "--help"][..],
            "Example: dlock members join",
        ),
        (
            &["members", "list", "--help"],
            "Example: dlock members list",
        ),
        (
            &["members", "watch", "--help"],
            "Example: dlock members watch",
        ),
        (&["observe", "--help"], "Example: dlock observe"),
    ] {
        let out = run("embedded", args);
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains(example), "{args:?}: {help}");
    }
}

#[test]
fn the_embedded_store_is_refused() {
    for args in [
        &["members", "join", "/g", "a", "--", "true"][..],
        &["members", "list", "/g"],
        &["members", "watch", "/g"],
        &["observe", "/e"],
    ] {
        let out = run("embedded", args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("embedded store"), "{args:?}: {err}");
    }
}

/// A watcher sees members join (with a command, and until stopped),
/// change nothing else, and leave; `list` shows them; `join -- CMD` exits
/// with CMD's code and hands it the member's node.
fn members_join_list_watch(endpoint: &str) {
    let path = unique("group");
    let watcher = Running::start(endpoint, &["members", "watch", &path, "--json"]);

    let mut a = Running::start(
        endpoint,
        &[
            "members",
            "join",
            &path,
            "a",
            "--payload",
            "pa",
            "--",
            "sh",
            "-c",
            "cat >/dev/null",
        ],
    );
    let seen = watcher.json();
    assert_eq!(
        seen,
        serde_json::json!({"event": "joined", "id": "a", "payload": "pa"})
    );
    let b = Running::start(
        endpoint,
        &["members", "join", &path, "b", "--payload", "pb"],
    );
    let seen = watcher.json();
    assert_eq!(
        seen,
        serde_json::json!({"event": "joined", "id": "b", "payload": "pb"})
    );

    let listed = run(endpoint, &["members", "list", &path, "--json"]);
    assert_eq!(listed.status.code(), Some(0), "{listed:?}");
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed, serde_json::json!({"a": "pa", "b": "pb"}));
    let plain = run(endpoint, &["members", "list", &path]);
    assert_eq!(String::from_utf8_lossy(&plain.stdout), "a pa\nb pb\n");

    // A second watcher starts with the members there are.
    let late = Running::start(endpoint, &["members", "watch", &path]);
    let mut first = [late.line(), late.line()];
    first.sort();
    assert_eq!(first, ["joined a pa", "joined b pb"]);

    b.signal(libc::SIGTERM);
    assert_eq!(b.exit_code(), Some(0), "stopped: it leaves and exits 0");
    assert_eq!(
        watcher.json(),
        serde_json::json!({"event": "left", "id": "b", "payload": null})
    );
    assert_eq!(late.line(), "left b");
    a.close_stdin();
    assert_eq!(a.exit_code(), Some(0), "CMD's code");
    assert_eq!(watcher.json()["event"], "left");

    let node = format!("{path}/c");
    let coded = run(
        endpoint,
        &[
            "members",
            "join",
            &path,
            "c",
            "--",
            "sh",
            "-c",
            &format!("test \"$DLOCK_MEMBER\" = {node} && exit 3"),
        ],
    );
    assert_eq!(coded.status.code(), Some(3), "{coded:?}");
    assert_eq!(watcher.json()["id"], "c");
    assert_eq!(
        watcher.json(),
        serde_json::json!({"event": "left", "id": "c", "payload": null})
    );

    let empty = run(endpoint, &["members", "list", &path, "--json"]);
    assert_eq!(String::from_utf8_lossy(&empty.stdout).trim(), "{}");
    for w in [watcher, late] {
        w.signal(libc::SIGINT);
        assert_eq!(w.exit_code(), Some(0));
    }
}

/// Kills a process left running when dropped.
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if !await_gone(self.0, Duration::ZERO) {
            // SAFETY: kill(2) on a process this test started.
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
}

/// `members join -- CMD` stops its command as `lock` does: a second signal
/// stops one that ignores the first at once, and a dlock killed with -9
/// takes its command with it (before, the first signal was all, and a
/// command outlived its member, serving while the group said it had left).
#[test]
fn a_members_command_is_stopped_with_it() {
    let endpoint = zk_endpoint();
    let dir = tempfile::tempdir().unwrap();
    let (pid_file, said) = (dir.path().join("pid"), dir.path().join("said"));
    let path = unique("members-stopped");
    let join = |script: &str| {
        dlock_on(&endpoint)
            .args(["members", "join", &path, "a", "--", "sh", "-c", script])
            .stderr(std::fs::File::create(&said).unwrap())
            .spawn()
            .unwrap()
    };
    let pid_of_cmd = || {
        assert!(
            await_line(&pid_file, "", BOUND),
            "the command never started"
        );
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        std::fs::remove_file(&pid_file).unwrap();
        pid
    };
    let stubborn = format!(
        "trap '' TERM; echo $$ > {}; while :; do sleep 0.1; done",
        pid_file.display()
    );
    let member = join(&stubborn);
    let cmd = pid_of_cmd();
    // Whatever the test finds, the stubborn command does not outlive it
    // (it would hold the test harness's output open).
    let _reaper = KillOnDrop(cmd);
    // SAFETY: signalling the dlock this test started.
    unsafe { libc::kill(member.id() as i32, libc::SIGTERM) };
    assert!(
        await_line(&said, "passed SIGTERM on", BOUND),
        "dlock said nothing"
    );
    assert!(
        !await_gone(cmd, Duration::ZERO),
        "the command ignores SIGTERM"
    );
    // SAFETY: as above.
    unsafe { libc::kill(member.id() as i32, libc::SIGTERM) };
    assert_eq!(exit_within(member, BOUND), Some(128 + libc::SIGTERM));
    assert!(
        await_gone(cmd, Duration::ZERO),
        "the command outlived a second signal"
    );

    let member = join(&format!("echo $$ > {}; exec sleep 300", pid_file.display()));
    let cmd = pid_of_cmd();
    // SAFETY: as above.
    unsafe { libc::kill(member.id() as i32, libc::SIGKILL) };
    assert_eq!(exit_within(member, BOUND), None, "killed");
    assert!(await_gone(cmd, BOUND), "the command outlived its dlock");
}

/// `observe` prints nobody, then each leader of an election run by
/// `dlock elect` as it takes over, then nobody again — one JSON line each.
fn observe_prints_leader_changes(endpoint: &str) {
    let path = unique("election");
    let observer = Running::start(endpoint, &["observe", &path, "--json"]);
    assert_eq!(observer.json(), serde_json::json!({"leader": null}));
    let mut first = Running::start(
        endpoint,
        &[
            "elect",
            &path,
            "--id",
            "e1",
            "--",
            "sh",
            "-c",
            "cat >/dev/null",
        ],
    );
    let led = observer.json();
    assert_eq!(led["leader"], "e1", "{led}");
    assert!(led["node"].as_str().unwrap().starts_with(&path), "{led}");
    assert!(led["epoch"].as_i64().unwrap() > 0, "{led}");
    let mut second = Running::start(
        endpoint,
        &[
            "elect",
            &path,
            "--id",
            "e2",
            "--",
            "sh",
            "-c",
            "cat >/dev/null",
        ],
    );
    common::await_children(endpoint, &path, 2, Running::WITHIN);
    first.close_stdin();
    assert_eq!(first.exit_code(), Some(0));
    let next = observer.json();
    assert_eq!(next["leader"], "e2", "{next}");
    assert!(
        next["epoch"].as_i64() > led["epoch"].as_i64(),
        "{next} after {led}"
    );
    second.close_stdin();
    assert_eq!(second.exit_code(), Some(0));
    assert_eq!(observer.json(), serde_json::json!({"leader": null}));
    let plain = Running::start(endpoint, &["observe", &path]);
    assert_eq!(plain.line(), "no leader");
    for o in [observer, plain] {
        o.signal(libc::SIGTERM);
        assert_eq!(o.exit_code(), Some(0));
    }
}

/// `dlock inspect` tells a KV semaphore's limit and free slots (its
/// holders' record), without taking one.
#[test]
fn inspect_tells_a_kv_semaphores_free_slots() {
    let endpoint = zk_endpoint();
    let path = unique("kv");
    let mut holder = Running::start(
        &endpoint,
        &[
            "semaphore",
            &path,
            "--kv",
            "--leases",
            "3",
            "--",
            "sh",
            "-c",
            "echo held; cat >/dev/null",
        ],
    );
    assert_eq!(holder.line(), "held");
    let out = run(&endpoint, &["inspect", &path, "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (
            json["recipe"].as_str(),
            json["limit"].as_u64(),
            json["free"].as_u64()
        ),
        (Some("kv-semaphore"), Some(3), Some(2)),
        "{json}"
    );
    let text = run(&endpoint, &["inspect", &path]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.lines()
            .next()
            .unwrap()
            .ends_with("1 participant(s), limit 3, 2 free"),
        "{text}"
    );
    holder.close_stdin();
    assert_eq!(holder.exit_code(), Some(0));
    let out = run(&endpoint, &["inspect", &path, "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        json["free"],
        serde_json::Value::Null,
        "nobody holds: the record states no limit: {json}"
    );
}

on_every_server!(members_join_list_watch, observe_prints_leader_changes);

/// `dlock observe` follows an election of etcd's own `etcdctl elect`
/// as etcd's Observe does: the leader's proposal, then nobody once it
/// resigned.
#[cfg(feature = "etcd")]
#[test]
fn observe_follows_an_etcdctl_election_on_etcd() {
    let path = unique("goelect");
    let observer = Running::start(&common::etcd_endpoint(), &["observe", &path, "--json"]);
    assert_eq!(observer.json(), serde_json::json!({"leader": null}));
    let etcdctl = common::etcdctl()
        .args(["elect", &path, "proposal-1"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("run etcdctl");
    let led = observer.json();
    assert_eq!(led["leader"], "proposal-1", "{led}");
    assert!(
        led["node"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{path}/")),
        "{led}"
    );
    // Campaigning set up its signal handling: SIGINT makes it resign.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(etcdctl.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(observer.json(), serde_json::json!({"leader": null}));
    let mut etcdctl = etcdctl;
    let _ = etcdctl.wait();
    observer.signal(libc::SIGTERM);
    assert_eq!(observer.exit_code(), Some(0));
}
