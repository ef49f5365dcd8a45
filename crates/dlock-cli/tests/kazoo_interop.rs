//! dlock processes and kazoo (Python) on one real ZooKeeper: the flash
//! sale with `--layout kazoo` next to kazoo buyers (the peer harness in
//! shared/peers/kazoo, and plain kazoo `Lock`s), `dlock lock` against a
//! kazoo holder, and `dlock inspect` naming kazoo's holder.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use dlock::store::{CreateMode, CreateOptions};
use dlock_testkit::{kazoo_python, shared_zk, KazooProbe};

fn dlock() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dlock"));
    c.env(
        "DLOCK_ENDPOINT",
        format!("zk://{}", shared_zk().connect_string()),
    );
    c.stdout(Stdio::piped());
    c
}

/// kazoo's peer harness (`peerbench.py buy`: buyers whose `Lock` also
/// counts Curator's `-lock-` nodes as contenders).
fn peerbench(args: &[&str]) -> Child {
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/peers/kazoo/peerbench.py");
    assert!(
        script.exists(),
        "the kazoo peer harness is missing at {}",
        script.display()
    );
    Command::new(kazoo_python())
        .arg(script)
        .args(args)
        .args(["--connect", &shared_zk().connect_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("run the kazoo harness")
}

/// `key=value` pairs of the last line a process printed.
fn fields(child: Child) -> HashMap<String, String> {
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "failed: {text}");
    let line = text.lines().last().unwrap_or_else(|| panic!("no output"));
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A fresh directory for one test's nodes.
fn unique() -> String {
    format!("/kazoo-{}", uuid::Uuid::new_v4().simple())
}

/// Deletes `paths`, in order (kazoo leaves persistent directories).
fn remove(admin: &dlock::blocking::Session, paths: &[&str]) {
    for path in paths {
        match admin.block_on(admin.session().delete(path, None)) {
            Ok(()) | Err(dlock::Error::NoNode { .. }) => {}
            Err(e) => panic!("delete {path}: {e}"),
        }
    }
}

fn admin() -> dlock::blocking::Session {
    dlock::blocking::connect(&format!("zk://{}", shared_zk().connect_string())).unwrap()
}

fn set_stock(admin: &dlock::blocking::Session, stock: &str, total: u64) {
    let options = CreateOptions::new(CreateMode::Persistent).with_parents();
    admin
        .block_on(
            admin
                .session()
                .create(stock, total.to_string().as_bytes(), options),
        )
        .unwrap();
}

/// Checks the stock ran out, and removes the sale's nodes (the lock's
/// directory is persistent in kazoo's layout, and must be empty now).
fn close_sale(admin: &dlock::blocking::Session, base: &str) {
    let (lock, stock) = (format!("{base}/lock"), format!("{base}/stock"));
    let (left, _) = admin.block_on(admin.session().get_data(&stock)).unwrap();
    assert_eq!(left, b"0");
    remove(admin, &[&stock, &lock, base]);
}

fn flash_sale(lock: &str, stock: &str) -> Child {
    dlock()
        .args([
            "demo",
            "flash-sale",
            "--layout",
            "kazoo",
            "--buyers",
            "3",
            "--hold-ms",
            "1",
            "--lock-path",
            lock,
            "--stock-path",
            stock,
        ])
        .spawn()
        .unwrap()
}

/// Two `dlock demo flash-sale --layout kazoo` processes and kazoo's peer
/// harness (`buy`, with Curator's pattern) sell exactly the stock — the
/// sale that sold 507 and 516 of 300 before dlock ordered kazoo's nodes.
#[test]
fn flash_sale_processes_and_kazoo_buyers_sell_exactly_the_stock() {
    let base = unique();
    let (lock, stock) = (format!("{base}/lock"), format!("{base}/stock"));
    let total = 300u64;
    let admin = admin();
    set_stock(&admin, &stock, total);
    let python = peerbench(&["buy", "--path", &lock, "--stock", &stock, "--clients", "3"]);
    let processes: Vec<Child> = (0..2).map(|_| flash_sale(&lock, &stock)).collect();
    let dlock_sold: Vec<u64> = processes
        .into_iter()
        .map(|p| fields(p)["sold"].parse().unwrap())
        .collect();
    let kazoo_sold: u64 = fields(python)["sold"].parse().unwrap();
    assert_eq!(
        dlock_sold.iter().sum::<u64>() + kazoo_sold,
        total,
        "dlock processes sold {dlock_sold:?}, kazoo {kazoo_sold}"
    );
    close_sale(&admin, &base);
}

/// kazoo buyers with plain `Lock`s (no extra patterns: they see dlock only
/// because it writes kazoo's names) and a `--layout kazoo` sale.
#[test]
fn flash_sale_and_plain_kazoo_locks_sell_exactly_the_stock() {
    let base = unique();
    let (lock, stock) = (format!("{base}/lock"), format!("{base}/stock"));
    let total = 200u64;
    let admin = admin();
    set_stock(&admin, &stock, total);
    let mut kazoo = KazooProbe::start(&shared_zk().connect_string()).unwrap();
    assert_eq!(
        kazoo.ask(&format!("buy {lock} {stock} 3")).unwrap(),
        "buying"
    );
    let ours: u64 = fields(flash_sale(&lock, &stock))["sold"].parse().unwrap();
    let answer = kazoo.next_line(Duration::from_secs(120)).unwrap();
    let theirs: u64 = answer
        .strip_prefix("sold ")
        .unwrap_or_else(|| panic!("kazoo: {answer}"))
        .parse()
        .unwrap();
    assert_eq!(ours + theirs, total, "dlock sold {ours}, kazoo {theirs}");
    close_sale(&admin, &base);
}

/// While a plain kazoo `Lock` holds, `dlock lock` (any layout) times out
/// (exit 65), and `dlock inspect` names the holder as kazoo's; once kazoo
/// releases, `dlock lock --layout kazoo` runs its command.
#[test]
fn dlock_lock_waits_for_a_kazoo_holder_and_inspect_names_it() {
    let base = unique();
    let path = format!("{base}/held");
    let mut kazoo = KazooProbe::start(&shared_zk().connect_string()).unwrap();
    let answer = kazoo.ask(&format!("lock {path} 10000")).unwrap();
    let node = answer.strip_prefix("acquired ").unwrap().to_string();
    for layout in ["curator", "kazoo"] {
        let out = dlock()
            .args([
                "lock",
                "--layout",
                layout,
                "--timeout",
                "300ms",
                &path,
                "--",
                "true",
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(65), "{layout}: a timeout");
    }
    let out = dlock().args(["inspect", "--json", &path]).output().unwrap();
    assert!(out.status.success());
    let seen: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(seen["recipe"], "mutex", "{seen}");
    let holders = seen["participants"].as_array().unwrap();
    assert_eq!(holders.len(), 1, "{seen}");
    assert_eq!(holders[0]["node"], node.as_str());
    assert_eq!(holders[0]["role"], "holder");
    assert_eq!(holders[0]["foreign"], "kazoo");
    assert_eq!(holders[0]["data"], "kazoo-probe");
    assert_eq!(kazoo.ask(&format!("release {path}")).unwrap(), "released");
    let out = dlock()
        .args([
            "lock",
            "--layout",
            "kazoo",
            "--timeout",
            "10s",
            &path,
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    remove(&admin(), &[&path, &base]);
}

/// `dlock semaphore --layout kazoo` counts kazoo's leases: with kazoo
/// holding the one lease it times out (65), after kazoo gives it back it
/// runs its command.
#[test]
fn dlock_semaphore_layout_kazoo_shares_kazoos_limit() {
    let base = unique();
    let path = format!("{base}/api");
    let mut kazoo = KazooProbe::start(&shared_zk().connect_string()).unwrap();
    let answer = kazoo.ask(&format!("semaphore {path} 1 10000")).unwrap();
    assert!(answer.starts_with("acquired"), "{answer}");
    let semaphore = |timeout: &str| {
        dlock()
            .args(["semaphore", "--layout", "kazoo", "--leases", "1"])
            .args(["--timeout", timeout, &path, "--", "true"])
            .output()
            .unwrap()
    };
    assert_eq!(semaphore("300ms").status.code(), Some(65), "a timeout");
    assert_eq!(kazoo.ask(&format!("release {path}")).unwrap(), "released");
    let out = semaphore("10s");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lock = format!("{path}-__lock__");
    remove(&admin(), &[&path, &lock, &base]);
}

/// `dlock elect --layout kazoo` waits while a kazoo `Election` candidate
/// leads (65 on its timeout), and leads once kazoo's leader resigns.
#[test]
fn dlock_elect_layout_kazoo_waits_for_a_kazoo_leader() {
    let base = unique();
    let path = format!("{base}/cron");
    let mut kazoo = KazooProbe::start(&shared_zk().connect_string()).unwrap();
    assert_eq!(kazoo.ask(&format!("elect {path} k1")).unwrap(), "candidate");
    assert_eq!(
        kazoo.next_line(Duration::from_secs(10)).unwrap(),
        "leader k1"
    );
    let elect = |timeout: &str| {
        dlock()
            .args(["elect", "--layout", "kazoo", "--id", "d1"])
            .args(["--timeout", timeout, &path, "--", "true"])
            .output()
            .unwrap()
    };
    assert_eq!(elect("300ms").status.code(), Some(65), "a timeout");
    assert_eq!(kazoo.ask(&format!("resign {path}")).unwrap(), "resigned");
    let out = elect("10s");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    remove(&admin(), &[&path, &base]);
}

/// `dlock demo parking-lot --layout kazoo` with 2 spaces while a kazoo
/// `Semaphore` client holds one: dlock's cars never have more than the
/// one space left to them (its in-use counter counts dlock's cars only).
#[test]
fn parking_lot_layout_kazoo_leaves_kazoos_space_alone() {
    let base = unique();
    let (lot, probe) = (format!("{base}/lot"), format!("{base}/in-use"));
    let mut kazoo = KazooProbe::start(&shared_zk().connect_string()).unwrap();
    let answer = kazoo.ask(&format!("semaphore {lot} 2 10000")).unwrap();
    assert!(answer.starts_with("acquired"), "{answer}");
    let ours = dlock()
        .args(["demo", "parking-lot", "--layout", "kazoo", "--spaces", "2"])
        .args(["--cars", "4", "--rounds", "3", "--hold-ms", "20"])
        .args(["--path", &lot, "--probe-path", &probe])
        .spawn()
        .unwrap();
    let s = fields(ours);
    assert_eq!(s["layout"], "kazoo");
    assert_eq!(s["acquisitions"], "12");
    assert_eq!(s["max_inside"], "1", "kazoo holds the other space: {s:?}");
    assert_eq!(kazoo.ask(&format!("release {lot}")).unwrap(), "released");
    let lock = format!("{lot}-__lock__");
    remove(&admin(), &[&lot, &lock, &probe, &base]);
}
