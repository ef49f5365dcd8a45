//! The demos as several processes on one real ZooKeeper, next to Apache
//! Curator 5.4's peer harness (shared/peers/curator).

use std::process::{Child, Command, Stdio};

use dlock_testkit::shared_zk;

mod common;
use common::{
    assert_fields, dlock_on, fields_of as fields, join_sale, set_stock, unique, zk_endpoint,
};

/// `dlock` on the shared ZooKeeper, its stdout piped.
fn dlock() -> Command {
    let mut c = dlock_on(&zk_endpoint());
    c.stdout(Stdio::piped());
    c
}

/// Curator's peer harness on the shared ZooKeeper.
fn curator(args: &[&str]) -> Command {
    let mut c = common::curator_peer(args);
    c.args(["--connect", &shared_zk().connect_string()]);
    c
}

/// Three dlock processes and Curator buyers share one sale: together they
/// sell exactly the stock, and the stock ends at zero.
#[test]
fn processes_and_curator_share_one_flash_sale() {
    let (lock, stock) = (unique("lock"), unique("stock"));
    let total = 600u64;
    let admin = dlock::blocking::connect(&zk_endpoint()).unwrap();
    set_stock(&admin, &stock, total);
    let java = curator(&["buy", "--path", &lock, "--stock", &stock, "--clients", "2"])
        .spawn()
        .expect("run the Curator harness");
    let processes: Vec<Child> = (0..3)
        .map(|_| join_sale(&zk_endpoint(), &lock, &stock))
        .collect();
    let dlock_sold: Vec<u64> = processes
        .into_iter()
        .map(|p| fields(p)["sold"].parse().unwrap())
        .collect();
    let curator_sold: u64 = fields(java)["sold"].parse().unwrap();
    let sold = dlock_sold.iter().sum::<u64>() + curator_sold;
    assert_eq!(
        sold, total,
        "dlock processes sold {dlock_sold:?}, Curator {curator_sold}"
    );
    let (left, _) = admin.block_on(admin.session().get_data(&stock)).unwrap();
    assert_eq!(left, b"0");
    admin
        .block_on(admin.session().delete(&stock, None))
        .unwrap();
}

/// Curator's semaphore (`semprobe`) and dlock's parking lot share one
/// semaphore and one in-use counter: neither ever sees more than 3 inside,
/// and dlock sees the semaphore really admit 3.
#[test]
fn curator_and_dlock_share_one_parking_lot() {
    let (lot, probe) = (unique("lot"), unique("in-use"));
    let java = curator(&[
        "semprobe", "--leases", "3", "--path", &lot, "--probe", &probe,
    ])
    .args(["--clients", "4", "--rounds", "10"])
    .spawn()
    .expect("run the Curator harness");
    let ours = dlock()
        .args([
            "demo",
            "parking-lot",
            "--spaces",
            "3",
            "--cars",
            "8",
            "--rounds",
            "5",
        ])
        // Long enough that an admission on a loaded machine is quicker
        // than a stay: the lot fills up.
        .args(["--hold-ms", "100"])
        .args(["--path", &lot, "--probe-path", &probe])
        .spawn()
        .unwrap();
    let ours = fields(ours);
    let theirs = fields(java);
    assert_eq!(ours["violations"], "0", "{ours:?}");
    assert_eq!(theirs["violations"], "0", "{theirs:?}");
    assert_eq!(ours["max_inside"], "3", "the semaphore admits 3: {ours:?}");
    assert_eq!(theirs["acquisitions"], "40");
}

/// The parking lot on ZooKeeper with both semaphores: no violations, and
/// the lot fills up (max_inside = spaces).
#[test]
fn the_parking_lot_fills_and_never_overfills_on_zookeeper() {
    for semaphore in ["v2", "kv"] {
        let (lot, probe) = (unique("lot"), unique("in-use"));
        let run = dlock()
            .args(["demo", "parking-lot", "--semaphore", semaphore])
            .args([
                "--cars",
                "8",
                "--spaces",
                "3",
                "--rounds",
                "3",
                "--hold-ms",
                "100",
            ])
            .args(["--path", &lot, "--probe-path", &probe])
            .spawn()
            .unwrap();
        let s = fields(run);
        assert_eq!(s["semaphore"], semaphore);
        assert_eq!(s["violations"], "0", "{s:?}");
        assert_eq!(s["max_inside"], "3", "{s:?}");
        assert_eq!(s["acquisitions"], "24", "{s:?}");
    }
}

/// The demos on etcd: the parking lot (both semaphores) and the leader
/// election (both recipes), with zero violations.
#[cfg(feature = "etcd")]
#[test]
fn the_demos_run_safely_on_etcd() {
    let etcd = || {
        let mut c = dlock_on(&common::etcd_endpoint());
        c.stdout(Stdio::piped());
        c
    };
    // The parking lot and the leader demo, each on a path and a probe of
    // its own.
    let on_paths_of_its_own = |args: &[&str]| {
        let (path, probe) = (unique("path"), unique("probe"));
        let run = etcd()
            .args(args)
            .args(["--path", &path, "--probe-path", &probe])
            .spawn()
            .unwrap();
        fields(run)
    };
    for semaphore in ["v2", "kv"] {
        let args = ["--semaphore", semaphore, "--cars", "6", "--rounds", "2"];
        let s = on_paths_of_its_own(&[&["demo", "parking-lot"], &args[..]].concat());
        assert_eq!(s["violations"], "0", "{s:?}");
        assert!(s["max_inside"].parse::<u32>().unwrap() <= 3, "{s:?}");
    }
    for recipe in ["latch", "selector"] {
        let args = ["--recipe", recipe, "--candidates", "3", "--terms", "6"];
        let s = on_paths_of_its_own(&[&["demo", "leader"], &args[..]].concat());
        assert_fields(&s, &[("violations", "0"), ("terms", "6")]);
    }
    let (lock, stock) = (unique("lock"), unique("stock"));
    let run = etcd()
        .args(["demo", "flash-sale", "--buyers", "20", "--stock", "30"])
        .args(["--lock-path", &lock, "--stock-path", &stock])
        .spawn()
        .unwrap();
    let s = fields(run);
    assert_fields(&s, &[("sold", "30"), ("oversold", "0")]);
}
