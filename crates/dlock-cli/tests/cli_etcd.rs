//! `dlock lock`, `semaphore` and `inspect` as real processes against a real
//! etcd (the same cases as cli_lock.rs runs on ZooKeeper).
#![cfg(feature = "etcd")]

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use dlock_testkit::shared_etcd;

fn dlock() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dlock"));
    c.env(
        "DLOCK_ENDPOINT",
        format!("etcd://{}", shared_etcd().endpoint()),
    );
    c
}

fn unique(name: &str) -> String {
    format!("/cli-etcd-{}/{name}", uuid::Uuid::new_v4().simple())
}

/// Waits for a line in a file commands append to.
fn await_line(path: &std::path::Path, needle: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if std::fs::read_to_string(path).is_ok_and(|s| s.lines().any(|l| l.contains(needle))) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn participants(path: &str) -> Vec<serde_json::Value> {
    let out = dlock().args(["inspect", path, "--json"]).output().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    json["participants"].as_array().cloned().unwrap_or_default()
}

#[test]
fn lock_processes_never_overlap_on_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let path = unique("lock");
    let children: Vec<Child> = (0..5)
        .map(|i| {
            dlock()
                .args(["lock", &path, "--", "sh", "-c"])
                .arg(format!(
                    "echo start {i} >> {0}; sleep 0.05; echo end {i} >> {0}",
                    log.display()
                ))
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let lines: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(lines.len(), 10, "{lines:?}");
    for pair in lines.chunks(2) {
        assert!(
            pair[0].starts_with("start ") && pair[1] == pair[0].replace("start", "end"),
            "overlap: {lines:?}"
        );
    }
}

/// A frozen holder loses its lease; the next process takes the lock; the
/// holder, resumed, stops its command and exits with the lock-lost code.
#[test]
fn a_frozen_holder_loses_the_lock_on_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let path = unique("frozen");
    let mut holder = dlock()
        .args([
            "--session-timeout",
            "2s",
            "lock",
            &path,
            "--grace",
            "1s",
            "--",
            "sh",
            "-c",
        ])
        .arg(format!(
            "echo holder-start >> {0}; sleep 30; echo holder-end >> {0}",
            log.display()
        ))
        .spawn()
        .unwrap();
    assert!(await_line(&log, "holder-start", Duration::from_secs(20)));
    let mut next = dlock()
        .args(["lock", &path, "--", "sh", "-c"])
        .arg(format!("echo next-ran >> {}", log.display()))
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while participants(&path).len() < 2 {
        assert!(Instant::now() < deadline, "the second process never queued");
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = holder.id() as i32;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    assert!(
        await_line(&log, "next-ran", Duration::from_secs(15)),
        "the lock never passed on"
    );
    assert!(next.wait().unwrap().success());
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert_eq!(
        holder.wait().unwrap().code(),
        Some(66),
        "lock-lost exit code"
    );
    assert!(!std::fs::read_to_string(&log)
        .unwrap()
        .contains("holder-end"));
}

/// `dlock semaphore --leases 2` with six processes on etcd: never more
/// than two inside.
#[test]
fn a_semaphore_admits_at_most_its_leases_on_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let path = unique("sem");
    let children: Vec<Child> = (0..6)
        .map(|_| {
            dlock()
                .args(["semaphore", &path, "--leases", "2", "--", "sh", "-c"])
                .arg(format!(
                    "echo in >> {0}; sleep 0.2; echo out >> {0}",
                    log.display()
                ))
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let (mut inside, mut most) = (0, 0);
    for line in text.lines() {
        inside += if line == "in" { 1 } else { -1 };
        most = most.max(inside);
    }
    assert!(most <= 2 && most > 0, "{most} inside at once:\n{text}");
}
