//! etcd ⇄ Go from the command line: `dlock` processes next to etcd's own
//! Go client recipes — the Go peer harness (`shared/peers/etcd-go`
//! `peerbench buy`), `etcdctl lock` and `etcdctl elect` — on one prefix of
//! a real etcd, with exact outcomes.
#![cfg(feature = "etcd")]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod common;
use common::{dlock_on, etcdctl, fields, Running};

/// How long one step may take.
const WITHIN: Duration = Duration::from_secs(20);

fn etcd() -> String {
    dlock_testkit::shared_etcd().endpoint()
}

fn dlock() -> Command {
    dlock_on(&common::etcd_endpoint())
}

fn unique(name: &str) -> String {
    format!("/go-cli-{}/{name}", uuid::Uuid::new_v4().simple())
}

/// `etcdctl ARGS`, its stdout lines on a channel.
fn etcdctl_running(args: &[&str]) -> Running {
    let mut c = etcdctl();
    c.args(args);
    Running::spawn(c)
}

/// SIGINT (etcdctl unlocks or resigns), then its exit, which must be 0.
fn interrupt(etcdctl: Running) {
    etcdctl.signal(libc::SIGINT);
    assert_eq!(etcdctl.exit_code(), Some(0), "etcdctl after SIGINT");
}

/// `dlock inspect PATH --json`.
fn inspect(path: &str) -> serde_json::Value {
    common::json_of(&common::etcd_endpoint(), &["inspect", path, "--json"])
}

/// Waits until `n` contenders are queued at `path` (watching its children
/// through the library), then returns what `dlock inspect` shows.
fn await_participants(path: &str, n: usize) -> serde_json::Value {
    let client = dlock::blocking::connect(&common::etcd_endpoint()).unwrap();
    let session = client.session();
    client.block_on(async {
        tokio::time::timeout(WITHIN, async {
            loop {
                match session.children_watch(path).await {
                    Ok((children, _)) if children.len() == n => return,
                    Ok((_, watch)) => {
                        watch.changed().await;
                    }
                    Err(dlock::Error::NoNode { .. }) if n == 0 => return,
                    Err(dlock::Error::NoNode { .. }) => {
                        let (stat, watch) = session.exists_watch(path).await.unwrap();
                        if stat.is_none() {
                            watch.changed().await;
                        }
                    }
                    Err(e) => panic!("watch {path}: {e}"),
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{path} never had {n} contenders"))
    });
    client.close();
    inspect(path)
}

/// The create revision of `key` as etcd's Go client reads it.
fn create_revision(key: &str) -> i64 {
    let out = etcdctl().args(["get", key, "-w", "json"]).output().unwrap();
    assert!(out.status.success());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    json["kvs"][0]["create_revision"]
        .as_i64()
        .unwrap_or_else(|| panic!("no key {key}: {json}"))
}

/// Go buyers (`peerbench buy`, etcd's `concurrency.Mutex`) and two
/// `dlock demo flash-sale` processes share one sale on etcd: together they
/// sell exactly the stock, which ends at zero.
fn go_and_dlock_processes_share_one_flash_sale(lock_kind: &str) {
    let (lock, stock) = (unique("lock"), unique("stock"));
    let total = 300u64;
    assert!(etcdctl()
        .args(["put", &stock, &total.to_string()])
        .output()
        .unwrap()
        .status
        .success());
    let peerbench = dlock_testkit::etcd_go_peerbench().expect("the etcd Go peer harness");
    let go = Command::new(peerbench)
        .args(["buy", "--endpoints", &etcd(), "--clients", "3"])
        .args(["--path", &lock, "--stock-key", &stock])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let processes: Vec<Child> = (0..2)
        .map(|_| {
            dlock()
                .args(["demo", "flash-sale", "--buyers", "3", "--hold-ms", "1"])
                .args([
                    "--lock",
                    lock_kind,
                    "--lock-path",
                    &lock,
                    "--stock-path",
                    &stock,
                ])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let dlock_sold: Vec<u64> = processes
        .into_iter()
        .map(|p| {
            fields(p.wait_with_output().unwrap())["sold"]
                .parse()
                .unwrap()
        })
        .collect();
    let go_sold: u64 = fields(go.wait_with_output().unwrap())["sold"]
        .parse()
        .unwrap();
    assert_eq!(
        dlock_sold.iter().sum::<u64>() + go_sold,
        total,
        "dlock processes sold {dlock_sold:?}, Go {go_sold}"
    );
    assert!(go_sold > 0 && dlock_sold.iter().sum::<u64>() > 0);
    let left = etcdctl()
        .args(["get", &stock, "--print-value-only"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&left.stdout).trim(), "0");
    assert!(etcdctl()
        .args(["del", &stock])
        .output()
        .unwrap()
        .status
        .success());
}

#[test]
fn go_buyers_and_dlock_mutex_processes_sell_exactly_the_stock() {
    go_and_dlock_processes_share_one_flash_sale("mutex");
}

#[test]
fn go_buyers_and_dlock_write_lock_processes_sell_exactly_the_stock() {
    go_and_dlock_processes_share_one_flash_sale("write");
}

/// `etcdctl lock` and `dlock lock` exclude each other both ways: while
/// etcdctl holds, `dlock lock --timeout` (and `read-lock`) exits 65 and
/// leaves nothing queued; while dlock holds, etcdctl waits. The fencing
/// token dlock hands CMD (DLOCK_FENCE) is its key's create revision as
/// etcdctl reads it.
#[test]
fn etcdctl_lock_and_dlock_lock_exclude_each_other() {
    let lock = unique("lock");
    let go = etcdctl_running(&["lock", &lock]);
    let go_key = go.line();
    for command in ["lock", "read-lock", "write-lock"] {
        let out = dlock()
            .args([command, &lock, "--timeout", "1s", "--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(65), "{command} while etcdctl held");
        let seen = inspect(&lock);
        assert_eq!(seen["participants"].as_array().unwrap().len(), 1, "{seen}");
        assert_eq!(seen["participants"][0]["node"], go_key.as_str());
        assert_eq!(seen["participants"][0]["foreign"], "etcd-go");
    }
    interrupt(go);

    // dlock holds (CMD waits for a line on stdin); etcdctl waits.
    let mut held = Running::spawn({
        let mut c = dlock();
        c.args(["lock", &lock, "--", "sh", "-c"])
            .arg(r#"echo "$DLOCK_FENCE $DLOCK_NODE"; read line"#);
        c
    });
    let first = held.line();
    let (fence, node) = first.trim().split_once(' ').expect("fence and node");
    let fence: i64 = fence.parse().unwrap();
    assert_eq!(
        create_revision(node),
        fence,
        "DLOCK_FENCE is the create revision"
    );
    let go = etcdctl_running(&["lock", &lock]);
    let seen = await_participants(&lock, 2);
    assert_eq!(seen["participants"][1]["role"], "waiter", "{seen}");
    assert_eq!(seen["participants"][1]["foreign"], "etcd-go", "{seen}");
    assert!(!go.has_printed(), "etcdctl locked while dlock held");
    held.send("done");
    assert_eq!(held.exit_code(), Some(0));
    let go_key = go.line();
    assert!(create_revision(&go_key) > fence);
    interrupt(go);
    await_participants(&lock, 0);
}

/// `etcdctl elect` and `dlock elect` see one leader: while etcdctl leads,
/// `dlock elect --timeout` exits 65 and closes its candidacy; once it
/// resigns, a waiting `dlock elect` leads, and Go's observer (`etcdctl
/// elect -l`) names dlock's id as the leader.
#[test]
fn etcdctl_elect_and_dlock_elect_see_one_leader() {
    let election = unique("elect");
    let go = etcdctl_running(&["elect", &election, "go-a"]);
    let go_key = go.line();
    assert_eq!(go.line(), "go-a");
    let out = dlock()
        .args([
            "elect",
            &election,
            "--id",
            "dlock-early",
            "--timeout",
            "1s",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(65), "dlock elect while Go leads");
    let seen = inspect(&election);
    assert_eq!(seen["recipe"], "leader-election", "{seen}");
    assert_eq!(seen["participants"].as_array().unwrap().len(), 1, "{seen}");
    assert_eq!(seen["participants"][0]["node"], go_key.as_str());

    let mut dlock_leader = Running::spawn({
        let mut c = dlock();
        c.args(["elect", &election, "--id", "dlock-b", "--", "sh", "-c"])
            .arg("echo leading; read line");
        c
    });
    let seen = await_participants(&election, 2);
    assert_eq!(seen["participants"][1]["data"], "dlock-b", "{seen}");
    assert_eq!(seen["participants"][1]["role"], "waiter", "{seen}");
    let observer = etcdctl_running(&["elect", "-l", &election]);
    assert_eq!(observer.line(), go_key);
    assert_eq!(observer.line(), "go-a");
    interrupt(go);
    assert_eq!(dlock_leader.line(), "leading");
    let dlock_key = observer.line();
    assert_eq!(observer.line(), "dlock-b");
    assert!(create_revision(&dlock_key) > 0);
    dlock_leader.send("done");
    assert_eq!(dlock_leader.exit_code(), Some(0));
    drop(observer);
    await_participants(&election, 0);
}
