//! The demos as several processes on one real Consul agent: a flash sale
//! shared by three `dlock` processes, and a parking lot shared by `dlock`
//! and `consul lock -n 3` (Consul 1.8's own binary) in Consul's semaphore
//! layout. Every process closes its sessions when done (Consul deletes
//! their keys at once), so nothing waits out Consul's 10 s minimum TTL.

#![cfg(feature = "consul")]

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use dlock_testkit::shared_consul;

mod common;
use common::{
    assert_fields, concurrency, consul_endpoint as endpoint, consul_leftovers as leftovers,
    consul_lock, dlock_on, fields_of as summary, join_sale, set_stock, wait_all,
};

/// A root of its own for each test: `ci-<uuid>`.
fn unique_root() -> String {
    format!("ci-{}", uuid::Uuid::new_v4().simple())
}

fn dlock(args: &[&str]) -> Child {
    dlock_on(&endpoint())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run dlock")
}

/// Deletes one key the test itself wrote (not a recursive delete: whatever
/// else is left must show up in `leftovers`).
fn delete_key(key: &str) {
    let (status, body) = shared_consul()
        .http("DELETE", &format!("/v1/kv/{key}"), None)
        .expect("delete a key");
    assert_eq!(status, 200, "delete {key}: {body}");
}

/// Three processes of four buyers each, one lock, one stock: together they
/// sell exactly the stock, and it ends at zero.
#[test]
fn three_processes_share_one_flash_sale_on_consul() {
    let root = unique_root();
    let (lock, stock) = (format!("/{root}/lock"), format!("/{root}/stock"));
    let total = 60u64;
    let started = Instant::now();
    // The first process sets the stock; the others, started once it has,
    // join its sale (without --stock a process sells what is stored).
    let admin = dlock::blocking::connect(&endpoint()).unwrap();
    set_stock(&admin, &stock, total);
    let processes: Vec<Child> = (0..3)
        .map(|_| join_sale(&endpoint(), &lock, &stock))
        .collect();
    let summaries: Vec<_> = processes.into_iter().map(summary).collect();
    let sold: Vec<u64> = summaries
        .iter()
        .map(|s| s["sold"].parse().unwrap())
        .collect();
    eprintln!("sold {sold:?} in {:?}", started.elapsed());
    for s in &summaries {
        assert_eq!(s["backend"], "consul", "{s:?}");
        // The stock it found on starting: the whole stock, or less if
        // another process had sold some by then — never a sale of its own.
        let found: u64 = s["stock"].parse().unwrap();
        assert!(found <= total, "each joined the one sale: {s:?}");
    }
    assert_eq!(sold.iter().sum::<u64>(), total, "sold {sold:?}");
    let (left, _) = admin.block_on(admin.session().get_data(&stock)).unwrap();
    assert_eq!(left, b"0");
    admin
        .block_on(admin.session().delete(&stock, None))
        .unwrap();
    admin.close();
    assert_eq!(leftovers(&root), "", "keys left behind");
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// Two parking-lot processes (`--layout consul`) and four `consul lock -n
/// 3` processes park in one lot: by the log all of them write, never more
/// than 3 are inside, and both kinds got in.
#[test]
fn the_parking_lot_and_consul_lock_n_share_one_lot() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let root = unique_root();
    let (lot, probe) = (format!("{root}/lot"), format!("{root}/in-use"));
    let started = Instant::now();
    let mut consul = Vec::new();
    for _ in 0..4 {
        consul.push(
            consul_lock()
                .arg("-n=3")
                .arg(&lot)
                // Long enough to overlap the cars' stays.
                .arg(format!(
                    "echo in consul >> {0}; sleep 0.3; echo out consul >> {0}",
                    log.display()
                ))
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("run consul lock"),
        );
    }
    let (lot_path, probe_path) = (format!("/{lot}"), format!("/{probe}"));
    let ours: Vec<Child> = (0..2)
        .map(|_| {
            dlock(&[
                "demo",
                "parking-lot",
                "--layout",
                "consul",
                "--spaces",
                "3",
                "--cars",
                "3",
                "--rounds",
                "3",
                "--hold-ms",
                "100",
                "--path",
                &lot_path,
                "--probe-path",
                &probe_path,
                "--log",
                log.to_str().unwrap(),
            ])
        })
        .collect();
    let summaries: Vec<_> = ours.into_iter().map(summary).collect();
    wait_all(consul);
    let (max, entries) = concurrency(&common::log_lines(&log));
    eprintln!(
        "parking lot: max {max} inside; {entries:?}; {:?}",
        started.elapsed()
    );
    for s in &summaries {
        assert_fields(s, &[("semaphore", "kv"), ("layout", "consul")]);
        assert_eq!(s["violations"], "0", "{s:?}");
        assert_eq!(s["acquisitions"], "9", "{s:?}");
    }
    assert!(max <= 3, "{max} inside a lot of 3");
    assert!(max >= 2, "the lot was never shared: {max}");
    assert_eq!(entries.get("consul"), Some(&4), "{entries:?}");
    assert_eq!(entries.get("parking-lot"), Some(&18), "{entries:?}");
    // The in-use counter persists by design (the demo never resets it).
    delete_key(&probe);
    assert_eq!(leftovers(&root), "", "keys left behind");
    assert!(started.elapsed() < Duration::from_secs(60));
}
