//! The leader demo, run as the real binary: on the embedded store with both
//! recipes, on ZooKeeper — alone and together with Curator 5.4's
//! `LeaderSelector` (`shared/peers/curator/run.sh selectorprobe`) — and on
//! Consul.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn dlock(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(args)
        .env_remove("DLOCK_ENDPOINT")
        .output()
        .expect("run dlock")
}

/// Parses the one summary line (`<first> key=value ...`) into pairs.
fn summary(out: &Output, first: &str) -> HashMap<String, String> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "exactly one summary line, got {stdout:?}");
    let mut words = lines[0].split(' ');
    assert_eq!(words.next(), Some(first), "{stdout:?}");
    // Curator's peer puts a bare word (its mode) among the pairs.
    words
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

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

#[test]
fn selectors_take_turns_one_leader_at_a_time() {
    let out = dlock(&[
        "demo",
        "leader",
        "--recipe",
        "selector",
        "--candidates",
        "4",
        "--terms",
        "12",
        "--hold-ms",
        "10",
    ]);
    assert_safe(&summary(&out, "leader"), "embedded", "selector", 4, 12);
}

#[test]
fn latches_take_turns_one_leader_at_a_time() {
    let out = dlock(&[
        "demo",
        "leader",
        "--recipe",
        "latch",
        "--candidates",
        "4",
        "--terms",
        "12",
        "--hold-ms",
        "10",
    ]);
    assert_safe(&summary(&out, "leader"), "embedded", "latch", 4, 12);
}

#[test]
fn the_defaults_run_twenty_terms_of_five_selectors() {
    let out = dlock(&["demo", "leader"]);
    assert_safe(&summary(&out, "leader"), "embedded", "selector", 5, 20);
}

#[test]
fn bad_input_is_named_in_one_line() {
    for (args, needle) in [
        (
            vec!["demo", "leader", "--path", "relative"],
            "invalid path \"relative\"",
        ),
        (
            vec!["demo", "leader", "--probe-path", "/a//b"],
            "invalid path \"/a//b\"",
        ),
        (vec!["demo", "leader", "--recipe", "raft"], "raft"),
        (vec!["demo", "leader", "--candidates", "0"], "0"),
    ] {
        let out = dlock(&args);
        assert!(!out.status.success(), "{args:?} should fail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty());
    }
}

/// A fresh pair of election and probe paths on the shared server.
fn zk_paths() -> (String, String, String) {
    let zk = dlock_testkit::shared_zk();
    let id = uuid::Uuid::new_v4().simple();
    (
        format!("zk://{}", zk.connect_string()),
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
    let endpoint = format!("consul://{}", dlock_testkit::shared_consul().endpoint());
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
        let out = dlock(&[
            "--endpoint",
            endpoint,
            "demo",
            "leader",
            "--recipe",
            recipe,
            "--candidates",
            "3",
            "--terms",
            "9",
            "--hold-ms",
            "10",
            "--path",
            path,
            "--probe-path",
            probe,
        ]);
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
    let run_sh =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/peers/curator/run.sh");
    assert!(
        run_sh.exists(),
        "the Curator peer harness is missing at {}",
        run_sh.display()
    );
    let peer = Command::new("bash")
        .arg(&run_sh)
        .args(["selectorprobe", "--connect", &hosts, "--path", &path, "--probe", &probe])
        .args(["--clients", "3", "--rounds", "8", "--hold-ms", "20"])
        .env("PEER_BUILD_DIR", PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("peerbench-curator"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the Curator peer (needs a JDK and libcurator-recipes-java: scripts/test.sh installs them)");
    // Start once Curator's candidates are queued, so that the two sides
    // really share the election.
    wait_for_children(&endpoint, &path);
    let ours = dlock(&[
        "--endpoint",
        &endpoint,
        "demo",
        "leader",
        "--recipe",
        "selector",
        "--candidates",
        "3",
        "--terms",
        "24",
        "--hold-ms",
        "20",
        "--path",
        &path,
        "--probe-path",
        &probe,
    ]);
    let theirs = peer.wait_with_output().expect("the Curator peer ran");
    assert_safe(&summary(&ours, "leader"), "zookeeper", "selector", 3, 24);
    let theirs_summary = summary(&theirs, "peer=curator-5.4");
    assert_eq!(theirs_summary["terms"], "24", "{theirs_summary:?}");
    assert_eq!(
        theirs_summary["violations"], "0",
        "Curator saw two leaders: {theirs_summary:?}"
    );
}

/// Waits until someone queues at `path` (through the library, by watch).
fn wait_for_children(endpoint: &str, path: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let session = dlock::connect(endpoint).await.expect("connect");
        tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                match session.children_watch(path).await {
                    Ok((children, _)) if !children.is_empty() => return,
                    Ok((_, watch)) => {
                        watch.changed().await;
                    }
                    Err(dlock::Error::NoNode { .. }) => {
                        let (stat, watch) = session.exists_watch(path).await.expect("exists");
                        if stat.is_none() {
                            watch.changed().await;
                        }
                    }
                    Err(e) => panic!("watching {path}: {e}"),
                }
            }
        })
        .await
        .expect("Curator's candidates never queued");
        session.close().await;
    });
}
