//! The flash-sale demo, run as the real binary.

use std::collections::HashMap;

mod common;
use common::{assert_each_fails_naming, assert_fields, run_alone as dlock};

/// The summary line of a sale that ran to its end, as key=value pairs.
fn summary(out: &std::process::Output) -> HashMap<String, String> {
    common::summary(out, "flash-sale")
}

/// `dlock demo flash-sale ARGS` on the embedded store; its summary.
fn sale(args: &[&str]) -> HashMap<String, String> {
    summary(&dlock(&[&["demo", "flash-sale"], args].concat()))
}

#[test]
fn the_mutex_sells_exactly_the_stock() {
    let s = sale(&["--buyers", "200", "--stock", "50"]);
    assert_eq!(s["backend"], "embedded");
    assert_eq!(s["lock"], "mutex");
    assert_eq!(s["buyers"], "200");
    assert_eq!(s["stock"], "50");
    assert_eq!(s["sold"], "50");
    assert_eq!(s["left"], "0");
    assert_eq!(s["oversold"], "0");
    assert!(s["seconds"].parse::<f64>().unwrap() > 0.0);
}

#[test]
fn without_a_lock_the_sale_oversells() {
    let s = sale(&["--buyers", "200", "--stock", "50", "--lock", "none"]);
    assert_eq!(s["lock"], "none");
    let sold: u64 = s["sold"].parse().unwrap();
    assert!(sold > 50, "sold {sold} of 50 without a lock");
    assert_eq!(s["oversold"].parse::<u64>().unwrap(), sold - 50);
}

#[test]
fn the_defaults_sell_twenty_to_a_hundred_buyers() {
    let s = sale(&[]);
    assert_fields(&s, &[("buyers", "100"), ("stock", "20"), ("sold", "20")]);
}

#[test]
fn bad_input_is_named_in_one_line() {
    assert_each_fails_naming(&[
        (
            "demo flash-sale --lock-path relative",
            "invalid path \"relative\"",
        ),
        (
            "--endpoint redis://h:1 demo flash-sale",
            "unknown scheme \"redis\"",
        ),
        ("--endpoint zk://h demo flash-sale", "needs a port"),
        (
            "--session-timeout 10parsecs demo flash-sale",
            "unknown unit",
        ),
        (
            "demo flash-sale --ledger ledger/relative",
            "invalid path \"ledger/relative\"",
        ),
    ]);
}

#[test]
fn the_write_half_of_a_read_write_lock_sells_exactly_the_stock() {
    let s = sale(&["--buyers", "50", "--stock", "30", "--lock", "write"]);
    assert_fields(&s, &[("lock", "write"), ("sold", "30"), ("oversold", "0")]);
}

/// The Kleppmann scenario: holders stall past their session; unguarded
/// writes of the stalled holders land late and oversell, fenced ones are
/// rejected and the sale sells exactly its stock.
#[test]
fn fencing_keeps_stalled_holders_from_overselling() {
    let run = |guard: &str| {
        let out = dlock(&[
            "--session-timeout",
            "150ms",
            "demo",
            "flash-sale",
            "--buyers",
            "10",
            "--stock",
            "20",
            "--stall-every",
            "5",
            "--guard",
            guard,
        ]);
        (
            summary(&out),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (fenced, report) = run("fence");
    assert_eq!(fenced["sold"], "20", "{report}");
    assert_eq!(fenced["oversold"], "0");
    assert!(
        report.contains("stalls=") && !report.contains("abandoned=0"),
        "stalled purchases were abandoned: {report}"
    );
    let (unguarded, report) = run("none");
    assert!(
        unguarded["oversold"].parse::<u64>().unwrap() > 0,
        "stale writes oversold: {report}"
    );
}

/// `--ledger` records every write that landed, in the same atomic write as
/// the stock: without a lock the sale oversells, and the ledger on a real
/// ZooKeeper holds exactly as many entries as the process reports sales,
/// the oversold ones included. The summary line keeps its form.
#[test]
fn the_ledger_records_every_sale_that_landed() {
    let endpoint = common::zk_endpoint();
    let root = format!("/flash-sale-{}", uuid::Uuid::new_v4().simple());
    let (stock, ledger) = (format!("{root}/stock"), format!("{root}/ledger"));
    let out = dlock(&[
        "--endpoint",
        &endpoint,
        "demo",
        "flash-sale",
        "--buyers",
        "20",
        "--stock",
        "20",
        "--hold-ms",
        "5",
        "--lock",
        "none",
        "--lock-path",
        &format!("{root}/lock"),
        "--stock-path",
        &stock,
        "--ledger",
        &ledger,
    ]);
    let s = summary(&out);
    let sold: usize = s["sold"].parse().unwrap();
    assert!(sold > 20, "sold {sold} of 20 without a lock");
    let admin = dlock::blocking::connect(&endpoint).unwrap();
    let session = admin.session();
    let entries = admin.block_on(session.children(&ledger)).unwrap();
    assert_eq!(entries.len(), sold, "one ledger entry per sale that landed");
    let mut units = Vec::new();
    for e in &entries {
        let path = format!("{ledger}/{}", e.name);
        assert!(e.name.starts_with("sale-"), "{path}");
        let (data, stat) = admin.block_on(session.get_data(&path)).unwrap();
        let data = String::from_utf8(data).unwrap();
        let words: Vec<&str> = data.split(' ').collect();
        assert_eq!(words.len(), 3, "{data:?}");
        assert_eq!(words[1], "fence=none", "{data:?}");
        assert!(words[2].starts_with("pid="), "{data:?}");
        assert_eq!(stat.ephemeral_owner, 0, "ledger entries persist");
        units.push(
            words[0]
                .strip_prefix("unit=")
                .unwrap()
                .parse::<u32>()
                .unwrap(),
        );
        admin.block_on(session.delete(&path, None)).unwrap();
    }
    units.sort_unstable();
    units.dedup();
    assert!(
        units.len() < sold,
        "without a lock some units were sold twice: {units:?}"
    );
    admin.block_on(session.delete(&ledger, None)).unwrap();
    admin.block_on(session.delete(&stock, None)).unwrap();
    // Nothing else is left: the root is an empty container, if anything.
    match admin.block_on(session.children(&root)) {
        Ok(children) => assert!(children.is_empty(), "left under {root}: {children:?}"),
        Err(dlock::Error::NoNode { .. }) => {}
        Err(e) => panic!("{e}"),
    }
    let _ = admin.block_on(session.delete(&root, None));
    admin.close();
}
