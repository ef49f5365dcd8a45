//! `dlock top` as a real process against real servers: `--once --json`
//! snapshots of a holder and a waiter (ZooKeeper, etcd, Consul), and the
//! live view in a real terminal (tmux), quit with `q`.

use std::process::Stdio;
use std::time::Duration;

mod common;
use common::{dlock_on, logged, look_until, tmux, Holder};

/// How long a process of the test gets to show what it must: a few
/// session timeouts (the CLI's default is 10 s).
const WITHIN: Duration = Duration::from_secs(30);

fn unique_root() -> String {
    format!("/cli-top-{}", uuid::Uuid::new_v4().simple())
}

/// Waits for a line in a file that a command appends to.
fn await_line(path: &std::path::Path, needle: &str) -> bool {
    common::await_line(path, needle, WITHIN)
}

/// `dlock top --once --json PREFIX`, which must succeed.
fn once_json(endpoint: &str, prefix: &str) -> serde_json::Value {
    common::json_of(endpoint, &["top", "--once", "--json", prefix])
}

/// Snapshots until `done` holds (a waiter queueing tells nobody, so its
/// arrival is looked for); bounded by [`WITHIN`].
fn await_snapshot(
    endpoint: &str,
    prefix: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    look_until(
        WITHIN,
        &format!("the snapshot looked for under {prefix}"),
        || once_json(endpoint, prefix),
        done,
    )
}

fn participants(json: &serde_json::Value) -> Vec<serde_json::Value> {
    json["recipes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["participants"].as_array().unwrap().clone())
        .collect()
}

/// Waits until nothing is left under `root` (ZooKeeper reaps the emptied
/// containers on its own schedule), watching it with a session of our own.
fn await_nothing_under(endpoint: &str, root: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let session = dlock::connect(endpoint).await.unwrap();
        let outcome = tokio::time::timeout(WITHIN, async {
            loop {
                let Some(stat) = session.exists(root).await? else {
                    return Ok::<_, dlock::Error>(());
                };
                if stat.num_children == 0 {
                    // An empty directory of ours: remove it, as a
                    // container reaper would.
                    match session.delete(root, None).await {
                        Ok(()) | Err(dlock::Error::NoNode { .. }) => return Ok(()),
                        // A child came meanwhile: look again.
                        Err(dlock::Error::NotEmpty { .. }) => continue,
                        Err(e) => return Err(e),
                    }
                }
                // Wait for the children (or the root) to go.
                match session.children_watch(root).await {
                    Ok((_, watch)) => {
                        watch.changed().await;
                    }
                    Err(dlock::Error::NoNode { .. }) => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
        })
        .await;
        session.close().await;
        outcome
            .unwrap_or_else(|_| panic!("{root} still has nodes after {WITHIN:?}"))
            .unwrap();
    });
}

/// `--once --json` lists the mutex under the prefix with its holder (the
/// fencing token and node its command was given) first and its waiter
/// second; once the holder ends, the waiter holds.
fn once_json_shows_holder_then_waiter(endpoint: &str) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let root = unique_root();
    let path = format!("{root}/jobs/nightly");
    let first = Holder::start(endpoint, &["lock", &path], &log, "first");
    assert!(await_line(&log, "first "), "the first holder never ran");
    let second = Holder::start(endpoint, &["lock", &path], &log, "second");
    let json = await_snapshot(endpoint, &root, |j| participants(j).len() == 2);
    let [_, fence, node] = <[String; 3]>::try_from(logged(&log, "first")).unwrap();
    assert_eq!(json["prefix"], root.as_str());
    assert_eq!(json["truncated"], false);
    let recipes = json["recipes"].as_array().unwrap();
    assert_eq!(recipes.len(), 1, "{json}");
    assert_eq!(recipes[0]["path"], path.as_str());
    assert_eq!(recipes[0]["recipe"], "mutex");
    let seen = participants(&json);
    assert_eq!(seen[0]["role"], "holder", "{json}");
    assert_eq!(seen[0]["fence"].to_string(), fence);
    assert_eq!(seen[0]["node"], node.as_str());
    assert!(seen[0]["session"].as_str().unwrap().starts_with("0x"));
    assert_eq!(seen[0]["foreign"], serde_json::Value::Null);
    assert_eq!(seen[1]["role"], "waiter", "{json}");
    assert_eq!(seen[1]["position"], 1);
    assert!(seen[1]["fence"].as_i64() > seen[0]["fence"].as_i64());
    assert_ne!(seen[1]["session"], seen[0]["session"]);

    assert_eq!(first.finish(), Some(0));
    assert!(await_line(&log, "second "), "the waiter never ran");
    let [_, fence, _] = <[String; 3]>::try_from(logged(&log, "second")).unwrap();
    let json = once_json(endpoint, &root);
    let seen = participants(&json);
    assert_eq!(seen.len(), 1, "{json}");
    assert_eq!(
        (seen[0]["role"].as_str(), seen[0]["fence"].to_string()),
        (Some("holder"), fence)
    );
    assert_eq!(second.finish(), Some(0));
    await_nothing_under(endpoint, &root);
    assert_eq!(participants(&once_json(endpoint, &root)).len(), 0);
}

/// What the pane shows now.
fn pane(socket: &str) -> String {
    String::from_utf8_lossy(&tmux(socket, &["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
}

/// Captures the pane until `done` holds; the screen it last showed.
fn await_pane(socket: &str, what: &str, done: impl Fn(&str) -> bool) -> String {
    look_until(
        WITHIN,
        &format!("{what} in the pane"),
        || pane(socket),
        |s| done(s),
    )
}

/// Runs `sh -c SCRIPT`, which starts `dlock top ROOT`, in a detached tmux
/// session of its own (120×30) on `socket`, and waits for top's title.
fn top_in_tmux(socket: &str, script: &str, root: &str) {
    let size = ["-x", "120", "-y", "30"];
    let mut args = vec!["new-session", "-d", "-s", "top"];
    args.extend(size);
    args.extend(["sh", "-c", script]);
    let started = tmux(socket, &args);
    assert!(started.status.success(), "{started:?}");
    await_pane(socket, "top's title", |s| {
        s.contains(&format!("dlock top {root}"))
    });
}

/// The live view in a real terminal (a detached tmux session, 120×30):
/// a lock taken by another process appears as a holder line with its
/// fencing token, without any key pressed (the store's watches tell top),
/// then a waiter behind it, then the handoff to that waiter; `q` ends top
/// with status 0.
fn live_view_in_tmux_shows_a_new_holder_and_quits_on_q(endpoint: &str) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let status = dir.path().join("status");
    let socket = format!("dlock-top-{}", uuid::Uuid::new_v4().simple());
    let endpoint = endpoint.to_string();
    let root = unique_root();
    let path = format!("{root}/jobs/nightly");
    let script = format!(
        "'{}' --endpoint '{endpoint}' top '{root}'; echo $? > '{}'",
        env!("CARGO_BIN_EXE_dlock"),
        status.display()
    );
    top_in_tmux(&socket, &script, &root);

    let holder = Holder::start(&endpoint, &["lock", &path], &log, "held");
    assert!(await_line(&log, "held "), "the holder never ran");
    let [_, fence, _] = <[String; 3]>::try_from(logged(&log, "held")).unwrap();
    let screen = await_pane(&socket, "the holder", |s| {
        s.lines()
            .any(|l| l.contains("holder") && l.contains(&fence))
    });
    // Recipes show below the prefix the title names.
    assert!(screen.contains("jobs/nightly"), "{screen}");

    // A second process queues: it shows as waiter 1; when the first ends,
    // the screen shows the second holding with its own token.
    let next = Holder::start(&endpoint, &["lock", &path], &log, "next");
    await_pane(&socket, "the waiter", |s| {
        s.lines().any(|l| l.contains("waiter 1"))
    });
    assert_eq!(holder.finish(), Some(0));
    assert!(await_line(&log, "next "), "the waiter never ran");
    let [_, next_fence, _] = <[String; 3]>::try_from(logged(&log, "next")).unwrap();
    await_pane(&socket, "the handoff", |s| {
        s.lines()
            .any(|l| l.contains("holder") && l.contains(&next_fence))
            && !s.contains("waiter 1")
    });

    let sent = tmux(&socket, &["send-keys", "-t", "top", "q"]);
    assert!(sent.status.success(), "{sent:?}");
    assert!(
        await_line(&status, ""),
        "top did not end on q:\n{}",
        pane(&socket)
    );
    let code = std::fs::read_to_string(&status).unwrap();
    tmux(&socket, &["kill-server"]);
    assert_eq!(code.trim(), "0", "top's exit status");
    assert_eq!(next.finish(), Some(0));
    await_nothing_under(&endpoint, &root);
}

/// `top` stopped by a signal (here SIGTERM, as `timeout` or a service
/// manager sends) gives the terminal back as it found it — cooked, echoing
/// — and exits 128 + the signal; before, the signal killed it with the
/// terminal left raw on the alternate screen.
#[test]
fn a_signalled_top_gives_the_terminal_back() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str| dir.path().join(name);
    let (pid, status, stty) = (file("pid"), file("status"), file("stty"));
    let socket = format!("dlock-top-sig-{}", uuid::Uuid::new_v4().simple());
    let root = unique_root();
    let script = format!(
        "sh -c 'echo $$ > {}; exec \"$0\" --endpoint {} top {root}' '{}'; echo $? > '{}'; stty -a > '{}'",
        pid.display(),
        common::zk_endpoint(),
        env!("CARGO_BIN_EXE_dlock"),
        status.display(),
        stty.display(),
    );
    top_in_tmux(&socket, &script, &root);
    let pid: i32 = std::fs::read_to_string(&pid)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: kill(2) on the process this test started (through tmux).
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let ended = await_line(&stty, "icanon");
    let (code, modes) = (
        std::fs::read_to_string(&status).unwrap_or_default(),
        std::fs::read_to_string(&stty).unwrap_or_default(),
    );
    tmux(&socket, &["kill-server"]);
    assert!(ended, "top did not end on SIGTERM");
    assert_eq!(code.trim(), "143", "top's exit status");
    let flags: Vec<&str> = modes.split_whitespace().collect();
    for mode in ["icanon", "echo", "isig"] {
        assert!(
            flags.contains(&mode),
            "the terminal was left without {mode}: {modes}"
        );
    }
}

/// A foreign holder is named as such: while `etcdctl lock` (etcd's Go
/// `concurrency.Mutex`) holds a path and a `dlock lock` waits behind it,
/// `--once --json` lists the Go key as the holder with `"foreign":
/// "etcd-go"` and dlock's node as waiter 1, and the screen's holder line
/// says `[etcd-go]`.
#[cfg(feature = "etcd")]
#[test]
fn a_foreign_etcd_go_holder_is_named_on_etcd() {
    use std::io::BufRead;
    let endpoint = common::etcd_endpoint();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let root = unique_root();
    let path = format!("{root}/jobs/orders");
    let mut go = common::etcdctl()
        .args(["lock", &path])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn (etcdctl comes with apt-get install etcd-client)");
    // etcdctl prints its key once it holds.
    // (Its output stays open until it ends: it writes as it unlocks.)
    let mut go_out = std::io::BufReader::new(go.stdout.take().unwrap());
    let mut go_key = String::new();
    go_out.read_line(&mut go_key).unwrap();
    let go_key = go_key.trim().to_string();
    let waiter = Holder::start(&endpoint, &["lock", &path], &log, "dlock");
    let json = await_snapshot(&endpoint, &root, |j| participants(j).len() == 2);
    let seen = participants(&json);
    assert_eq!(json["recipes"][0]["recipe"], "mutex", "{json}");
    assert_eq!(
        (&seen[0]["role"], &seen[0]["node"], &seen[0]["foreign"]),
        (&"holder".into(), &go_key.as_str().into(), &"etcd-go".into()),
        "{json}"
    );
    assert_eq!(
        (&seen[1]["role"], &seen[1]["foreign"]),
        (&"waiter".into(), &serde_json::Value::Null)
    );

    let out = dlock_on(&endpoint)
        .args(["top", "--once", &root])
        .output()
        .unwrap();
    assert!(out.status.success());
    let screen = String::from_utf8(out.stdout).unwrap();
    let holder_line = screen
        .lines()
        .find(|l| l.contains("holder"))
        .unwrap_or_else(|| panic!("no holder line:\n{screen}"));
    assert!(holder_line.contains("[etcd-go]"), "{screen}");
    assert!(
        holder_line.contains(&seen[0]["fence"].to_string()),
        "{screen}"
    );

    // SAFETY: kill(2) on our own child, not reaped yet.
    unsafe { libc::kill(go.id() as libc::pid_t, libc::SIGINT) };
    let status = go.wait().unwrap();
    assert!(status.success(), "etcdctl unlocks on SIGINT: {status}");
    drop(go_out);
    assert!(await_line(&log, "dlock "), "dlock never got the lock");
    assert_eq!(waiter.finish(), Some(0));
    await_nothing_under(&endpoint, &root);
}

on_every_server!(
    once_json_shows_holder_then_waiter,
    live_view_in_tmux_shows_a_new_holder_and_quits_on_q,
);
