//! etcd ⇄ Go from the command line: `dlock` processes next to etcd's own
//! Go client recipes — the Go peer harness (`shared/peers/etcd-go`
//! `peerbench buy`), `etcdctl lock` and `etcdctl elect` — on one prefix of
//! a real etcd, with exact outcomes.
#![cfg(feature = "etcd")]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long one step may take.
const WITHIN: Duration = Duration::from_secs(20);

fn etcd() -> String {
    dlock_testkit::shared_etcd().endpoint()
}

fn dlock() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dlock"));
    c.env("DLOCK_ENDPOINT", format!("etcd://{}", etcd()));
    c
}

fn etcdctl() -> Command {
    let mut c = Command::new(std::env::var("DLOCK_ETCDCTL").unwrap_or("etcdctl".into()));
    c.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", etcd()));
    c
}

fn unique(name: &str) -> String {
    format!("/go-cli-{}/{name}", uuid::Uuid::new_v4().simple())
}

/// A process whose stdout lines arrive on a channel.
struct Lines {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Lines {
    fn spawn(mut command: Command) -> Lines {
        let mut child = command
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn (etcdctl comes with apt-get install etcd-client)");
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Lines { child, lines }
    }

    fn next_line(&self) -> String {
        self.lines
            .recv_timeout(WITHIN)
            .expect("a line within the step's time")
    }

    /// Whether a line came that was not read yet.
    fn has_printed(&self) -> bool {
        self.lines.try_recv().is_ok()
    }

    /// SIGINT (etcdctl unlocks or resigns), then its exit.
    fn interrupt(mut self) {
        // SAFETY: kill(2) on our own child, not reaped yet.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "exited with {status}");
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `dlock inspect PATH --json`.
fn inspect(path: &str) -> serde_json::Value {
    let out = dlock().args(["inspect", path, "--json"]).output().unwrap();
    assert!(out.status.success(), "dlock inspect failed");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Waits until `n` contenders are queued at `path` (watching its children
/// through the library), then returns what `dlock inspect` shows.
fn await_participants(path: &str, n: usize) -> serde_json::Value {
    let client = dlock::blocking::connect(&format!("etcd://{}", etcd())).unwrap();
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

/// `key=value` pairs of the last line of a finished process.
fn fields(out: Output) -> HashMap<String, String> {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "failed: {text}");
    let line = text.lines().last().expect("some output");
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
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
    let go = Lines::spawn({
        let mut c = etcdctl();
        c.args(["lock", &lock]);
        c
    });
    let go_key = go.next_line();
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
    go.interrupt();

    // dlock holds (CMD waits for a line on stdin); etcdctl waits.
    let mut held = dlock()
        .args(["lock", &lock, "--", "sh", "-c"])
        .arg(r#"echo "$DLOCK_FENCE $DLOCK_NODE"; read line"#)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(held.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let (fence, node) = first.trim().split_once(' ').expect("fence and node");
    let fence: i64 = fence.parse().unwrap();
    assert_eq!(
        create_revision(node),
        fence,
        "DLOCK_FENCE is the create revision"
    );
    let go = Lines::spawn({
        let mut c = etcdctl();
        c.args(["lock", &lock]);
        c
    });
    let seen = await_participants(&lock, 2);
    assert_eq!(seen["participants"][1]["role"], "waiter", "{seen}");
    assert_eq!(seen["participants"][1]["foreign"], "etcd-go", "{seen}");
    assert!(!go.has_printed(), "etcdctl locked while dlock held");
    held.stdin.take().unwrap().write_all(b"done\n").unwrap();
    assert!(held.wait().unwrap().success());
    let go_key = go.next_line();
    assert!(create_revision(&go_key) > fence);
    go.interrupt();
    await_participants(&lock, 0);
}

/// `etcdctl elect` and `dlock elect` see one leader: while etcdctl leads,
/// `dlock elect --timeout` exits 65 and closes its candidacy; once it
/// resigns, a waiting `dlock elect` leads, and Go's observer (`etcdctl
/// elect -l`) names dlock's id as the leader.
#[test]
fn etcdctl_elect_and_dlock_elect_see_one_leader() {
    let election = unique("elect");
    let go = Lines::spawn({
        let mut c = etcdctl();
        c.args(["elect", &election, "go-a"]);
        c
    });
    let go_key = go.next_line();
    assert_eq!(go.next_line(), "go-a");
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

    let mut dlock_leader = dlock()
        .args(["elect", &election, "--id", "dlock-b", "--", "sh", "-c"])
        .arg("echo leading; read line")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let seen = await_participants(&election, 2);
    assert_eq!(seen["participants"][1]["data"], "dlock-b", "{seen}");
    assert_eq!(seen["participants"][1]["role"], "waiter", "{seen}");
    let observer = Lines::spawn({
        let mut c = etcdctl();
        c.args(["elect", "-l", &election]);
        c
    });
    assert_eq!(observer.next_line(), go_key);
    assert_eq!(observer.next_line(), "go-a");
    go.interrupt();
    let mut leading = String::new();
    BufReader::new(dlock_leader.stdout.take().unwrap())
        .read_line(&mut leading)
        .unwrap();
    assert_eq!(leading.trim(), "leading");
    let dlock_key = observer.next_line();
    assert_eq!(observer.next_line(), "dlock-b");
    assert!(create_revision(&dlock_key) > 0);
    dlock_leader
        .stdin
        .take()
        .unwrap()
        .write_all(b"done\n")
        .unwrap();
    assert!(dlock_leader.wait().unwrap().success());
    drop(observer);
    await_participants(&election, 0);
}
