//! `dlock barrier` and `dlock double-barrier` as real processes against a
//! real ZooKeeper.

use std::process::{Command, Output};
use std::sync::mpsc;
use std::time::Duration;

mod common;
use common::{dlock_on, unique, zk_endpoint};

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
