//! `dlock counter` as real processes against real servers (ZooKeeper,
//! etcd, and Consul with the `consul` feature); the embedded store is
//! refused, as a counter in it would die with the process.

use std::process::Output;

mod common;
use common::{dlock_on as dlock, remove, unique};

fn counter(endpoint: &str, args: &[&str]) -> Output {
    dlock(endpoint)
        .arg("counter")
        .args(args)
        .output()
        .expect("run dlock")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// A bad path is a usage error (64) even when no server answers: it is
/// refused before connecting (before, these commands connected first, and
/// exited 67 after waiting out the unreachable server).
#[test]
fn bad_paths_are_refused_before_connecting() {
    let nobody = format!("zk://127.0.0.1:{}", dlock_testkit::free_port());
    for args in [
        &["counter", "get", "relative"][..],
        &["counter", "add", "/", "1"],
        &["counter", "add", "/c", "1", "--lock-path", "nope"],
        &["count", "get", "relative"],
        &["barrier", "set", "relative"],
        &["members", "list", "relative"],
        &["observe", "relative"],
    ] {
        let out = dlock(&nobody).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        assert!(
            stderr(&out).contains("relative")
                || stderr(&out).contains("root")
                || stderr(&out).contains("nope"),
            "{args:?}: {out:?}"
        );
    }
}

/// get / add / set / cas, their exit codes and output, the node's bytes
/// (Curator's 8-byte big-endian i64), and bad input.
fn gets_adds_sets_and_compares(endpoint: &str) {
    let path = unique("counter");
    let ok = |args: &[&str], expected: &str| {
        let out = counter(endpoint, args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
        assert_eq!(stdout(&out), expected, "{args:?}");
    };
    ok(&["get", &path], "0");
    ok(&["add", &path, "5"], "5");
    ok(&["add", &path, "-7"], "-2");
    ok(&["set", &path, "10"], "10");
    ok(&["set", &path, "12", "--force"], "12");
    ok(&["get", &path], "12");

    let stale = counter(endpoint, &["cas", &path, "10", "11"]);
    assert_eq!(stale.status.code(), Some(1), "{stale:?}");
    assert!(stdout(&stale).is_empty(), "{stale:?}");
    assert!(stderr(&stale).contains("it is 12"), "{stale:?}");
    ok(&["cas", &path, "12", "13"], "13");

    let out = counter(endpoint, &["add", &path, "2", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let facts: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(facts["succeeded"], true, "{facts}");
    assert_eq!(facts["pre_value"], 13, "{facts}");
    assert_eq!(facts["post_value"], 15, "{facts}");
    assert_eq!(facts["optimistic_tries"], 1, "{facts}");
    assert_eq!(facts["promoted_lock_tries"], 0, "{facts}");
    // A forced set has no tries to tell, but --json still answers JSON.
    let out = counter(endpoint, &["set", &path, "15", "--force", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let facts: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(facts["succeeded"], true, "{facts}");
    assert_eq!(facts["post_value"], 15, "{facts}");

    // Bad paths and bad numbers: usage errors naming the problem.
    for args in [
        &["get", "relative"][..],
        &["add", "/", "1"],
        &["add", &path, "1", "--lock-path", "nope"],
        &["add", &path, "one"],
    ] {
        let out = counter(endpoint, args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        assert!(!stderr(&out).is_empty(), "{args:?}");
    }
    // A 4-byte SharedCount is no 8-byte counter: a typed error, untouched.
    let count = unique("count");
    let out = dlock(endpoint)
        .args(["count", "set", &count, "7"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = counter(endpoint, &["add", &count, "1"]);
    assert_eq!(out.status.code(), Some(70), "{out:?}");
    assert!(stderr(&out).contains("8 bytes"), "{out:?}");
    remove(endpoint, &[&path, &count]);
}

/// Processes adding at once, promoted to one lock: the total is exact.
fn concurrent_processes_sum_exactly(endpoint: &str) {
    let path = unique("counter");
    let lock = format!("{}-lock", path);
    let children: Vec<_> = (0..6)
        .map(|_| {
            dlock(endpoint)
                .args(["counter", "add", &path, "3", "--retries", "20"])
                .args(["--lock-path", &lock])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawn dlock")
        })
        .collect();
    // Each saw a total nobody else saw.
    let mut seen: Vec<i64> = children
        .into_iter()
        .map(|child| {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "{out:?}");
            stdout(&out).parse().expect("a number")
        })
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, [3, 6, 9, 12, 15, 18]);
    let out = counter(endpoint, &["get", &path]);
    assert_eq!(stdout(&out), "18", "{out:?}");
    remove(endpoint, &[&path, &lock]);
}

#[test]
fn help_shows_examples() {
    for sub in ["get", "add", "set", "cas"] {
        let out = counter("embedded", &[sub, "--help"]);
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("Example: dlock counter"), "{help}");
    }
}

#[test]
fn embedded_is_refused() {
    let out = counter("embedded", &["add", "/c", "1"]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(stderr(&out).contains("--endpoint"), "{out:?}");
}

on_every_server!(
    gets_adds_sets_and_compares,
    concurrent_processes_sum_exactly
);
