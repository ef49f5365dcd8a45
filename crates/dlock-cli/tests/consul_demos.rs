//! The demos as several processes on one real Consul agent: a flash sale
//! shared by three `dlock` processes, and a parking lot shared by `dlock`
//! and `consul lock -n 3` (Consul 1.8's own binary) in Consul's semaphore
//! layout. Every process closes its sessions when done (Consul deletes
//! their keys at once), so nothing waits out Consul's 10 s minimum TTL.

#![cfg(feature = "consul")]

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dlock_testkit::{consul_binary, shared_consul};

fn endpoint() -> String {
    format!("consul://{}", shared_consul().endpoint())
}

/// A root of its own for each test: `ci-<uuid>`.
fn unique_root() -> String {
    format!("ci-{}", uuid::Uuid::new_v4().simple())
}

fn dlock(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_dlock"))
        .env("DLOCK_ENDPOINT", endpoint())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run dlock")
}

/// `key=value` pairs of the one summary line a demo printed; it must have
/// succeeded.
fn summary(child: Child) -> HashMap<String, String> {
    let out = child.wait_with_output().expect("wait for dlock");
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().expect("a summary line");
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The keys left under `root`, as Consul lists them ("" if none).
fn leftovers(root: &str) -> String {
    let (status, body) = shared_consul()
        .http("GET", &format!("/v1/kv/{root}/?recurse"), None)
        .expect("list the root");
    if status == 404 {
        String::new()
    } else {
        body
    }
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
    let options =
        dlock::store::CreateOptions::new(dlock::store::CreateMode::Persistent).with_parents();
    admin
        .block_on(
            admin
                .session()
                .create(&stock, total.to_string().as_bytes(), options),
        )
        .unwrap();
    let processes: Vec<Child> = (0..3)
        .map(|_| {
            dlock(&[
                "demo",
                "flash-sale",
                "--buyers",
                "4",
                "--hold-ms",
                "2",
                "--lock-path",
                &lock,
                "--stock-path",
                &stock,
            ])
        })
        .collect();
    let summaries: Vec<_> = processes.into_iter().map(summary).collect();
    let sold: Vec<u64> = summaries
        .iter()
        .map(|s| s["sold"].parse().unwrap())
        .collect();
    eprintln!("sold {sold:?} in {:?}", started.elapsed());
    for s in &summaries {
        assert_eq!(s["backend"], "consul", "{s:?}");
        assert_eq!(s["stock"], total.to_string(), "each joined the one sale");
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

/// The most holders at once in the log, and how many entries each kind
/// had: lines `in <kind>` / `out <kind>`, appended in order.
fn concurrency(log: &Path) -> (usize, HashMap<String, usize>) {
    let text = std::fs::read_to_string(log).expect("the log");
    let (mut now, mut max, mut entries) = (0usize, 0, HashMap::new());
    for line in text.lines() {
        match line.split_once(' ') {
            Some(("in", kind)) => {
                now += 1;
                max = max.max(now);
                *entries.entry(kind.to_string()).or_insert(0) += 1;
            }
            Some(("out", _)) => now -= 1,
            _ => panic!("unexpected log line {line:?}"),
        }
    }
    assert_eq!(now, 0, "every entry has its exit:\n{text}");
    (max, entries)
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
            Command::new(consul_binary().expect("the consul binary"))
                .arg("lock")
                .arg(format!("-http-addr={}", shared_consul().endpoint()))
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
    for child in consul {
        let out = child.wait_with_output().expect("wait for consul lock");
        assert!(
            out.status.success(),
            "{:?}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (max, entries) = concurrency(&log);
    eprintln!(
        "parking lot: max {max} inside; {entries:?}; {:?}",
        started.elapsed()
    );
    for s in &summaries {
        assert_eq!(
            (s["semaphore"].as_str(), s["layout"].as_str()),
            ("kv", "consul"),
            "{s:?}"
        );
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
