//! dlock processes and kazoo (Python) on one real ZooKeeper: the flash
//! sale with `--layout kazoo` next to kazoo buyers (the peer harness in
//! shared/peers/kazoo, and plain kazoo `Lock`s), `dlock lock` against a
//! kazoo holder, and `dlock inspect` naming kazoo's holder.

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use dlock_testkit::{kazoo_python, shared_zk, KazooProbe};

mod common;
use common::{dlock_on, fields_of as fields, peer_harness, set_stock, zk_endpoint};

/// `dlock` on the shared ZooKeeper, its stdout piped.
fn dlock() -> Command {
    let mut c = dlock_on(&zk_endpoint());
    c.stdout(Stdio::piped());
    c
}

/// kazoo's peer harness (`peerbench.py buy`: buyers whose `Lock` also
/// counts Curator's `-lock-` nodes as contenders).
fn peerbench(args: &[&str]) -> Child {
    Command::new(kazoo_python())
        .arg(peer_harness("kazoo/peerbench.py"))
        .args(args)
        .args(["--connect", &shared_zk().connect_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("run the kazoo harness")
}

/// `dlock ARGS --timeout TIMEOUT PATH -- true`, run to its end.
fn run_with_timeout(args: &[&str], timeout: &str, path: &str) -> Output {
    dlock()
        .args(args)
        .args(["--timeout", timeout, path, "--", "true"])
        .output()
        .unwrap()
}

/// `dlock ARGS` at `path` times out (65) while kazoo holds it, and runs
/// its command once kazoo lets go (`let_go PATH`, answered `answer`).
fn waits_for_kazoo(kazoo: &mut KazooProbe, args: &[&str], path: &str, let_go: &str, answer: &str) {
    let out = run_with_timeout(args, "300ms", path);
    assert_eq!(out.status.code(), Some(65), "{args:?}: a timeout");
    assert_eq!(kazoo.ask(&format!("{let_go} {path}")).unwrap(), answer);
    let out = run_with_timeout(args, "10s", path);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fresh directory for one test's nodes.
fn unique() -> String {
    format!("/kazoo-{}", uuid::Uuid::new_v4().simple())
}

/// A fresh directory, the path `name` in it, and a kazoo probe on the
/// shared ZooKeeper.
fn kazoo_at(name: &str) -> (String, String, KazooProbe) {
    let base = unique();
    let path = format!("{base}/{name}");
    let kazoo = KazooProbe::start(&shared_zk().connect_string()).unwrap();
    (base, path, kazoo)
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
    dlock::blocking::connect(&zk_endpoint()).unwrap()
}

/// A sale of `total` under a fresh directory: an admin session, the
/// directory, and the sale's lock and stock paths.
fn open_sale(total: u64) -> (dlock::blocking::Session, String, String, String) {
    let base = unique();
    let (lock, stock) = (format!("{base}/lock"), format!("{base}/stock"));
    let admin = admin();
    set_stock(&admin, &stock, total);
    (admin, base, lock, stock)
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
    let total = 300u64;
    let (admin, base, lock, stock) = open_sale(total);
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
    let total = 200u64;
    let (admin, base, lock, stock) = open_sale(total);
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
    let (base, path, mut kazoo) = kazoo_at("held");
    let answer = kazoo.ask(&format!("lock {path} 10000")).unwrap();
    let node = answer.strip_prefix("acquired ").unwrap().to_string();
    let curator_layout = run_with_timeout(&["lock", "--layout", "curator"], "300ms", &path);
    assert_eq!(curator_layout.status.code(), Some(65), "a timeout");
    let seen = common::json_of(&zk_endpoint(), &["inspect", "--json", &path]);
    assert_eq!(seen["recipe"], "mutex", "{seen}");
    let holders = seen["participants"].as_array().unwrap();
    assert_eq!(holders.len(), 1, "{seen}");
    assert_eq!(holders[0]["node"], node.as_str());
    assert_eq!(holders[0]["role"], "holder");
    assert_eq!(holders[0]["foreign"], "kazoo");
    assert_eq!(holders[0]["data"], "kazoo-probe");
    waits_for_kazoo(
        &mut kazoo,
        &["lock", "--layout", "kazoo"],
        &path,
        "release",
        "released",
    );
    remove(&admin(), &[&path, &base]);
}

/// `dlock semaphore --layout kazoo` counts kazoo's leases: with kazoo
/// holding the one lease it times out (65), after kazoo gives it back it
/// runs its command.
#[test]
fn dlock_semaphore_layout_kazoo_shares_kazoos_limit() {
    let (base, path, mut kazoo) = kazoo_at("api");
    let answer = kazoo.ask(&format!("semaphore {path} 1 10000")).unwrap();
    assert!(answer.starts_with("acquired"), "{answer}");
    let args = ["semaphore", "--layout", "kazoo", "--leases", "1"];
    waits_for_kazoo(&mut kazoo, &args, &path, "release", "released");
    let lock = format!("{path}-__lock__");
    remove(&admin(), &[&path, &lock, &base]);
}

/// `dlock elect --layout kazoo` waits while a kazoo `Election` candidate
/// leads (65 on its timeout), and leads once kazoo's leader resigns.
#[test]
fn dlock_elect_layout_kazoo_waits_for_a_kazoo_leader() {
    let (base, path, mut kazoo) = kazoo_at("cron");
    assert_eq!(kazoo.ask(&format!("elect {path} k1")).unwrap(), "candidate");
    assert_eq!(
        kazoo.next_line(Duration::from_secs(10)).unwrap(),
        "leader k1"
    );
    let args = ["elect", "--layout", "kazoo", "--id", "d1"];
    waits_for_kazoo(&mut kazoo, &args, &path, "resign", "resigned");
    remove(&admin(), &[&path, &base]);
}

/// `dlock demo parking-lot --layout kazoo` with 2 spaces while a kazoo
/// `Semaphore` client holds one: dlock's cars never have more than the
/// one space left to them (its in-use counter counts dlock's cars only).
#[test]
fn parking_lot_layout_kazoo_leaves_kazoos_space_alone() {
    let (base, lot, mut kazoo) = kazoo_at("lot");
    let probe = format!("{base}/in-use");
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
