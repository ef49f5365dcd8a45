//! `dlock barrier` and `dlock double-barrier` as real processes against a
//! real ZooKeeper.

use std::process::{Command, Output};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;
use common::{await_line, dlock_on, spawn_sh, unique, zk_endpoint};

fn dlock() -> Command {
    dlock_on(&zk_endpoint())
}

fn run(args: &[&str]) -> Output {
    dlock().args(args).output().expect("run dlock")
}

/// Runs `dlock args` on a thread; its output arrives on the channel.
fn spawn(args: &[&str]) -> mpsc::Receiver<Output> {
    let mut command = dlock();
    command.args(args);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(command.output().expect("run dlock"));
    });
    rx
}

const WITHIN: Duration = Duration::from_secs(30);

#[test]
fn barrier_set_wait_remove() {
    for sub in ["set", "remove", "wait"] {
        let help = run(&["barrier", sub, "--help"]);
        let help = String::from_utf8_lossy(&help.stdout);
        assert!(help.contains("Example: dlock barrier"), "{help}");
    }
    let path = unique("barrier");
    assert_eq!(
        run(&["barrier", "wait", &path]).status.code(),
        Some(0),
        "unset"
    );
    assert_eq!(run(&["barrier", "set", &path]).status.code(), Some(0));
    assert_eq!(
        run(&["barrier", "set", &path]).status.code(),
        Some(0),
        "twice"
    );
    let timed = run(&["barrier", "wait", &path, "--timeout", "200ms"]);
    assert_eq!(timed.status.code(), Some(65), "{timed:?}");
    let waiter = spawn(&["barrier", "wait", &path]);
    assert!(
        waiter.recv_timeout(Duration::from_millis(300)).is_err(),
        "passed a set barrier"
    );
    assert_eq!(run(&["barrier", "remove", &path]).status.code(), Some(0));
    let waited = waiter.recv_timeout(WITHIN).expect("the waiter goes");
    assert_eq!(waited.status.code(), Some(0), "{waited:?}");
    assert_eq!(
        run(&["barrier", "remove", &path]).status.code(),
        Some(0),
        "twice"
    );
}

#[test]
fn double_barrier_runs_members_together() {
    let help = run(&["double-barrier", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("Example: dlock double-barrier"), "{help}");

    let path = unique("double");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let script = format!("echo \"$DLOCK_NODE\" >> {}", log.display());
    let lonely = run(&[
        "double-barrier",
        &path,
        "--count",
        "2",
        "--timeout",
        "300ms",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    assert_eq!(lonely.status.code(), Some(65), "{lonely:?}");
    assert!(!log.exists(), "ran without the other member");

    let members: Vec<_> = (0..2)
        .map(|_| {
            spawn(&[
                "double-barrier",
                &path,
                "--count",
                "2",
                "--",
                "sh",
                "-c",
                &script,
            ])
        })
        .collect();
    for m in members {
        let out = m.recv_timeout(WITHIN).expect("members finish");
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    }
    let log = std::fs::read_to_string(&log).unwrap();
    let mut nodes: Vec<&str> = log.lines().collect();
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes.len(), 2, "{log}");
    assert!(
        nodes.iter().all(|n| n.starts_with(&format!("{path}/"))),
        "{log}"
    );
}

/// Whether process `pid` has a child (its CMD) not yet reaped.
fn has_children(pid: u32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|entry| {
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // `pid (comm) state ppid ...`: the comm may hold spaces.
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        after.split_whitespace().nth(1) == Some(pid.to_string().as_str())
    })
}

/// A member whose CMD ended, waiting to leave for a member whose step
/// hangs, ends on SIGTERM with 128 + 15, leaving the rest to its session's
/// close: before, nothing read signals once CMD had ended, and only
/// SIGKILL ended it.
#[test]
fn a_member_waiting_to_leave_ends_on_a_signal() {
    let (endpoint, path) = (zk_endpoint(), unique("double-signal"));
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let args = ["double-barrier", path.as_str(), "--count", "2"];
    let quick = spawn_sh(
        &endpoint,
        &args,
        &format!("echo quick >> {}", log.display()),
    );
    let mut slow = spawn_sh(
        &endpoint,
        &args,
        &format!("echo slow >> {}; exec sleep 60", log.display()),
    );
    assert!(await_line(&log, "quick", WITHIN), "the members entered");
    // Its CMD reaped: it is giving back (leaving), not running CMD.
    let ended = Instant::now() + WITHIN;
    while has_children(quick.id()) {
        assert!(Instant::now() < ended, "the quick member's CMD never ended");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(quick.id() as libc::pid_t, libc::SIGTERM) };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(quick.wait_with_output());
    });
    let out = rx.recv_timeout(WITHIN).expect("the quick member ended");
    assert_eq!(out.unwrap().status.code(), Some(128 + libc::SIGTERM));
    // SAFETY: as above.
    unsafe { libc::kill(slow.id() as libc::pid_t, libc::SIGTERM) };
    let slow = slow.wait().unwrap();
    assert_eq!(slow.code(), Some(128 + libc::SIGTERM), "sleep's SIGTERM");
}
