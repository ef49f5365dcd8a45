//! The parking-lot demo, run as the real binary on the embedded store.

use std::collections::HashMap;
mod common;
use common::{assert_each_fails_naming, run_alone as dlock};

/// The summary line of a run that went to its end, as key=value pairs.
fn summary(out: &std::process::Output) -> HashMap<String, String> {
    common::summary(out, "parking-lot")
}

fn assert_full_and_safe(s: &HashMap<String, String>, cars: u32, spaces: u32, rounds: u32) {
    assert_eq!(s["backend"], "embedded");
    assert_eq!(s["cars"], cars.to_string());
    assert_eq!(s["spaces"], spaces.to_string());
    assert_eq!(s["acquisitions"], (cars * rounds).to_string());
    assert_eq!(s["violations"], "0", "{s:?}");
    assert_eq!(
        s["max_inside"],
        spaces.to_string(),
        "the semaphore admits {spaces} at once: {s:?}"
    );
    assert!(s["seconds"].parse::<f64>().unwrap() > 0.0);
}

#[test]
fn the_v2_semaphore_fills_the_lot_and_never_overfills_it() {
    let s = summary(&dlock(&["demo", "parking-lot", "--semaphore", "v2"]));
    assert_eq!(s["semaphore"], "v2");
    assert_full_and_safe(&s, 15, 3, 3);
}

#[test]
fn the_kv_semaphore_fills_the_lot_and_never_overfills_it() {
    let s = summary(&dlock(&["demo", "parking-lot", "--semaphore", "kv"]));
    assert_eq!(s["semaphore"], "kv");
    assert_full_and_safe(&s, 15, 3, 3);
}

#[test]
fn the_flags_are_honoured() {
    let s = summary(&dlock(&[
        "demo",
        "parking-lot",
        "--cars",
        "6",
        "--spaces",
        "2",
        "--rounds",
        "2",
        "--hold-ms",
        "30",
        "--path",
        "/garage/sem",
        "--probe-path",
        "/garage/count",
    ]));
    assert_eq!(s["semaphore"], "v2", "the default");
    assert_full_and_safe(&s, 6, 2, 2);
}

/// Ctrl-C mid-run: every car that parked counts itself out and leaves
/// before the demo ends (exit 130, with its summary), so that the shared
/// probe is back at 0 — left raised, a later run on it would count
/// violations nobody made. On ZooKeeper, whose sessions outlive a killed
/// process.
#[test]
fn ctrl_c_counts_every_car_out_before_the_lot_closes() {
    let endpoint = common::zk_endpoint();
    let (lot, probe) = (common::unique("lot"), common::unique("probe"));
    let args = [
        "parking-lot",
        "--cars",
        "4",
        "--spaces",
        "2",
        "--rounds",
        "1000",
        "--hold-ms",
        "300",
        "--path",
        &lot,
        "--probe-path",
        &probe,
    ];
    common::interrupt_demo(&endpoint, &args, &probe, "parking-lot");
}

#[test]
fn bad_input_is_named_in_one_line() {
    assert_each_fails_naming(&[
        (
            "demo parking-lot --path relative",
            "invalid path \"relative\"",
        ),
        ("demo parking-lot --spaces 0", "--spaces"),
        ("demo parking-lot --semaphore v3", "--semaphore"),
    ]);
}
