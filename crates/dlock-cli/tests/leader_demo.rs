//! The leader demo, run as the real binary: on the embedded store with both
//! recipes, on ZooKeeper — alone and together with Curator 5.4's
//! `LeaderSelector` (`shared/peers/curator/run.sh selectorprobe`) — and on
//! Consul.

use std::collections::HashMap;
use std::process::{Output, Stdio};
use std::time::Duration;

mod common;
use common::{assert_each_fails_naming, curator_peer, run_alone as dlock, summary};

fn assert_safe(
    s: &HashMap<String, String>,
    backend: &str,
    recipe: &str,
    candidates: u32,
    terms: u32,
) {
    assert_eq!(s["backend"], backend);
    assert_eq!(s["recipe"], recipe);
    assert_eq!(s["candidates"], candidates.to_string());
    assert_eq!(s["terms"], terms.to_string(), "every term served: {s:?}");
    assert_eq!(s["violations"], "0", "one leader at a time: {s:?}");
    assert!(s["seconds"].parse::<f64>().unwrap() > 0.0);
}

/// `dlock GLOBAL demo leader --recipe RECIPE --candidates C --terms T
/// --hold-ms HOLD PATHS...`, run to its end.
fn leader_demo(global: &[&str], recipe: &str, [c, t, hold]: [u32; 3], paths: &[&str]) -> Output {
    let (c, t, hold) = (c.to_string(), t.to_string(), hold.to_string());
    let demo = ["demo", "leader", "--recipe", recipe, "--candidates", &c];
    let turns = ["--terms", &t, "--hold-ms", &hold];
    dlock(&[global, &demo, &turns, paths].concat())
}

/// Four candidates of `recipe` serve twelve terms, one leader at a time.
fn take_turns(recipe: &str) {
    let out = leader_demo(&[], recipe, [4, 12, 10], &[]);
    assert_safe(&summary(&out, "leader"), "embedded", recipe, 4, 12);
}

/// Ctrl-C mid-term: the leader counts itself out before the demo ends
/// (exit 130, with its summary), for selectors and latches, so that the
/// shared probe is back at 0 for the next run on it.
#[test]
fn ctrl_c_counts_the_leader_out_before_the_election_ends() {
    let endpoint = common::zk_endpoint();
    for recipe in ["selector", "latch"] {
        let (election, probe) = (common::unique("election"), common::unique("probe"));
        let args = [
            "leader",
            "--recipe",
            recipe,
            "--candidates",
            "3",
            "--terms",
            "1000",
            "--hold-ms",
            "300",
            "--path",
            &election,
            "--probe-path",
            &probe,
        ];
        common::interrupt_demo(&endpoint, &args, &probe, recipe);
    }
}

#[test]
fn selectors_take_turns_one_leader_at_a_time() {
    take_turns("selector");
}

#[test]
fn latches_take_turns_one_leader_at_a_time() {
    take_turns("latch");
}

#[test]
fn the_defaults_run_twenty_terms_of_five_selectors() {
    let out = dlock(&["demo", "leader"]);
    assert_safe(&summary(&out, "leader"), "embedded", "selector", 5, 20);
}

#[test]
fn bad_input_is_named_in_one_line() {
    assert_each_fails_naming(&[
        ("demo leader --path relative", "invalid path \"relative\""),
        ("demo leader --probe-path /a//b", "invalid path \"/a//b\""),
        ("demo leader --recipe raft", "raft"),
        ("demo leader --candidates 0", "0"),
    ]);
}

/// A fresh pair of election and probe paths on the shared server.
fn zk_paths() -> (String, String, String) {
    let id = uuid::Uuid::new_v4().simple();
    (
        common::zk_endpoint(),
        format!("/leader-demo-{id}/election"),
        format!("/leader-demo-{id}/leaders"),
    )
}

#[test]
fn both_recipes_run_on_zookeeper() {
    let (endpoint, path, probe) = zk_paths();
    both_recipes_run_on(&endpoint, "zookeeper", &path, &probe);
}

/// The same on the shared Consul agent.
#[cfg(feature = "consul")]
#[test]
fn both_recipes_run_on_consul() {
    let id = uuid::Uuid::new_v4().simple();
    let endpoint = common::consul_endpoint();
    let (path, probe) = (
        format!("/leader-demo-{id}/election"),
        format!("/leader-demo-{id}/leaders"),
    );
    both_recipes_run_on(&endpoint, "consul", &path, &probe);
}

/// Both recipes take turns with 3 candidates for 9 terms on `endpoint`,
/// whose summary names the store `backend`.
fn both_recipes_run_on(endpoint: &str, backend: &str, path: &str, probe: &str) {
    for recipe in ["selector", "latch"] {
        let paths = ["--path", path, "--probe-path", probe];
        let out = leader_demo(&["--endpoint", endpoint], recipe, [3, 9, 10], &paths);
        assert_safe(&summary(&out, "leader"), backend, recipe, 3, 9);
    }
}

/// Curator's `LeaderSelector`s (autoRequeue, ids `curator-N`) and dlock's
/// selectors in one election, one probe counter: nobody on either side
/// ever sees a second leader.
#[test]
fn curator_and_dlock_selectors_share_one_election() {
    let (endpoint, path, probe) = zk_paths();
    let hosts = endpoint.trim_start_matches("zk://").to_string();
    let peer = curator_peer(&["selectorprobe", "--connect", &hosts, "--path", &path])
        .args(["--probe", &probe, "--clients", "3", "--rounds", "8", "--hold-ms", "20"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the Curator peer (needs a JDK and libcurator-recipes-java: scripts/test.sh installs them)");
    // Start once Curator's candidates are queued, so that the two sides
    // really share the election.
    common::await_children(&endpoint, &path, 1, Duration::from_secs(60));
    let paths = ["--path", &path, "--probe-path", &probe];
    let ours = leader_demo(&["--endpoint", &endpoint], "selector", [3, 24, 20], &paths);
    let theirs = peer.wait_with_output().expect("the Curator peer ran");
    assert_safe(&summary(&ours, "leader"), "zookeeper", "selector", 3, 24);
    let theirs_summary = summary(&theirs, "peer=curator-5.4");
    assert_eq!(theirs_summary["terms"], "24", "{theirs_summary:?}");
    assert_eq!(
        theirs_summary["violations"], "0",
        "Curator saw two leaders: {theirs_summary:?}"
    );
}
