//! The `dlock` commands as real processes against a real ZooKeeper; the
//! cases that concern every backend run against a real etcd and a real
//! Consul too (`etcd::*`, `consul::*`).

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dlock_testkit::{shared_zk, CuratorProbe};

mod common;
use common::{
    await_gone, await_line, concurrency, dlock_on, exit_within, json_of, log_lines, logged,
    look_until, spawn_sh, tmux, unique, wait_all, zk_endpoint as endpoint, Holder,
};

/// How long the server of `endpoint` may keep the session of a holder that
/// went silent (killed, frozen) when the session timeout asked for is
/// `timeout`: ZooKeeper and etcd expire it after the timeout; Consul's
/// session TTL is at least 10 s, and Consul may keep a session up to twice
/// its TTL.
fn keeps_a_silent_session(endpoint: &str, timeout: Duration) -> Duration {
    if endpoint.starts_with("consul") {
        timeout.max(Duration::from_secs(10)) * 2
    } else {
        timeout
    }
}

/// The longest a waiter may take to get the lock of a holder that went
/// silent: the server's expiry, plus a tenth of it (at least 2 s) for the
/// server's timer (ZooKeeper expires sessions on its next tick), the
/// delete's fsync, the waiter's watch and a forked command on a loaded
/// machine.
fn silent_holder_hands_over_within(endpoint: &str, timeout: Duration) -> Duration {
    let expiry = keeps_a_silent_session(endpoint, timeout);
    expiry + (expiry / 10).max(Duration::from_secs(2))
}

fn dlock() -> Command {
    dlock_on(&endpoint())
}

/// Waits until the lock at `path` has `n` participants, via `inspect`.
fn await_participants(path: &str, n: usize, within: Duration) {
    await_participants_on(&endpoint(), path, n, within)
}

fn await_participants_on(endpoint: &str, path: &str, n: usize, within: Duration) {
    look_until(
        within,
        &format!("{n} participants at {path}"),
        || inspect_on(endpoint, path),
        |json| json["participants"].as_array().map_or(0, Vec::len) == n,
    );
}

/// Several `dlock lock` processes on one path never run their commands at
/// the same time: each command's start and end lines come in pairs.
fn lock_processes_never_overlap(endpoint: &str) {
    let path = unique("lock");
    let lines = run_together(endpoint, &["lock", &path], 6, |i, log| {
        format!("echo start {i} >> {log}; sleep 0.05; echo end {i} >> {log}")
    });
    assert_eq!(lines.len(), 12, "{lines:?}");
    for pair in lines.chunks(2) {
        let (start, end) = (&pair[0], &pair[1]);
        assert!(
            start.starts_with("start ") && end == &start.replace("start", "end"),
            "overlap: {lines:?}"
        );
    }
}

/// `n` processes `dlock ARGS -- sh -c SCRIPT` at once, the script of the
/// `i`th given its number and the log it appends to; all must succeed.
/// The lines of the log.
fn run_together(
    endpoint: &str,
    args: &[&str],
    n: usize,
    script: impl Fn(usize, &str) -> String,
) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let children: Vec<Child> = (0..n)
        .map(|i| spawn_sh(endpoint, args, &script(i, &log.display().to_string())))
        .collect();
    wait_all(children);
    log_lines(&log)
}

/// The command sees the fencing token and its node, and dlock exits with
/// the command's own code.
fn the_command_gets_the_token_and_its_exit_code_is_kept(endpoint: &str) {
    let path = unique("env");
    let out = dlock_on(endpoint)
        .args([
            "lock",
            &path,
            "--",
            "sh",
            "-c",
            "echo $DLOCK_FENCE $DLOCK_NODE $DLOCK_ENDPOINT; exit 7",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let words: Vec<&str> = stdout.split_whitespace().collect();
    assert!(words[0].parse::<i64>().unwrap() > 0, "{stdout}");
    assert!(
        words[1].starts_with(&format!("{path}/_c_")) && words[1].contains("-lock-"),
        "{stdout}"
    );
    assert_eq!(words[2], endpoint);
}

/// Resumes a process this test froze (SIGSTOP) when dropped: if the test
/// fails while it is frozen, it is not left stopped for good.
struct Thaw(i32);

impl Drop for Thaw {
    fn drop(&mut self) {
        // SAFETY: signalling a child of this test; SIGCONT to a running
        // process is harmless.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// A `dlock lock` frozen (SIGSTOP) past its session timeout loses the lock
/// to another process; resumed, it stops its command and exits with the
/// lock-lost code.
fn a_frozen_holder_loses_the_lock_and_stops_its_command(endpoint: &str) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let path = unique("frozen");
    let timeout = Duration::from_secs(2);
    let mut holder = dlock_on(endpoint)
        .args([
            "--session-timeout",
            "2s",
            "lock",
            &path,
            "--grace",
            "1s",
            "--",
            "sh",
            "-c",
        ])
        .arg(format!(
            "echo holder-start >> {0}; sleep 30; echo holder-end >> {0}",
            log.display()
        ))
        .spawn()
        .unwrap();
    assert!(await_line(&log, "holder-start", Duration::from_secs(20)));
    let mut next = spawn_sh(
        endpoint,
        &["lock", &path],
        &format!("echo next-ran >> {}", log.display()),
    );
    await_participants_on(endpoint, &path, 2, Duration::from_secs(10));
    let pid = holder.id() as i32;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let _thaw = Thaw(pid);
    // The server expires the frozen holder's session; the next process runs
    // (the bound leaves room for starting the process).
    let within = silent_holder_hands_over_within(endpoint, timeout) + Duration::from_secs(10);
    assert!(
        await_line(&log, "next-ran", within),
        "the lock never passed on within {within:?}"
    );
    assert!(next.wait().unwrap().success());
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let status = holder.wait().unwrap();
    assert_eq!(status.code(), Some(66), "lock-lost exit code");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains("holder-end"),
        "the holder's command was stopped: {text}"
    );
}

/// A Curator probe holding `path` by its command `kind` (`mutex`,
/// `revocable`); the node it holds.
fn curator_holding(kind: &str, path: &str) -> (CuratorProbe, String) {
    let mut curator = CuratorProbe::start(&shared_zk().connect_string()).unwrap();
    let answer = curator.ask(&format!("{kind} {path} 10000")).unwrap();
    let node = answer.strip_prefix("acquired ").unwrap().to_string();
    (curator, node)
}

/// `inspect` shows a Curator holder and dlock waiters in queue order.
#[test]
fn inspect_shows_a_curator_holder_and_dlock_waiters() {
    let path = unique("mixed");
    let (mut curator, curator_node) = curator_holding("mutex", &path);
    let waiters: Vec<Child> = (0..2)
        .map(|_| {
            dlock()
                .args(["lock", &path, "--", "true"])
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    await_participants(&path, 3, Duration::from_secs(20));
    let json = inspect_on(&endpoint(), &path);
    assert_eq!(json["path"], path.as_str());
    assert_eq!(json["recipe"], "mutex");
    let list = json["participants"].as_array().unwrap();
    assert_eq!(list[0]["node"], curator_node.as_str());
    assert_eq!(list[0]["role"], "holder");
    assert!(list[1..].iter().all(|p| p["role"] == "waiter"));
    assert!(
        list.windows(2)
            .all(|w| w[0]["fence"].as_i64() < w[1]["fence"].as_i64()),
        "queue order: {json}"
    );
    let table = dlock().args(["inspect", &path]).output().unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("(mutex): 3 participant(s)") && table.contains(&curator_node),
        "{table}"
    );
    curator.ask(&format!("release {path}")).unwrap();
    wait_all(waiters);
}

/// `dlock revoke` reaches a revocable Curator holder.
#[test]
fn revoke_reaches_a_curator_holder() {
    let path = unique("revoke");
    let (mut curator, node) = curator_holding("revocable", &path);
    let out = dlock().args(["revoke", &node]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        curator.next_line(Duration::from_secs(10)).unwrap(),
        format!("revoked {node}")
    );
    curator.ask(&format!("release {path}")).unwrap();
}

/// A timed-out acquire exits with its own code and runs nothing.
fn an_acquire_timeout_has_its_exit_code(endpoint: &str) {
    let path = unique("busy");
    let mut holder = dlock_on(endpoint)
        .args(["lock", &path, "--", "sleep", "3"])
        .spawn()
        .unwrap();
    await_participants_on(endpoint, &path, 1, Duration::from_secs(10));
    let out = dlock_on(endpoint)
        .args(["lock", &path, "--timeout", "200ms", "--", "echo", "ran"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(65));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("could not acquire within"));
    // SIGTERM: passed on to the command, then the lock is released (a
    // SIGKILL would leave the node until the session expires).
    // SAFETY: signalling our own child.
    unsafe { libc::kill(holder.id() as i32, libc::SIGTERM) };
    let _ = holder.wait();
}

/// Bad usage: one line naming the problem, and the documented exit code.
#[test]
fn bad_usage_is_named_with_its_exit_code() {
    // Each case: dlock's arguments (split at spaces), its exit code, and
    // what its one line of stderr names.
    let cases: &[(&str, i32, &str)] = &[
        ("lock /x", 64, "<CMD>"),
        ("lock relative -- true", 64, "invalid path \"relative\""),
        (
            "--endpoint embedded lock /x -- true",
            64,
            "embedded store lives inside one dlock process",
        ),
        (
            "--endpoint mongo://h:1 lock /x -- true",
            64,
            "unknown scheme \"mongo\"",
        ),
        (
            "--endpoint zk://127.0.0.1:1 --session-timeout 1s lock /x -- true",
            67,
            "unreachable",
        ),
        (
            "lock /x -- /no/such/program",
            127,
            "cannot run /no/such/program",
        ),
        ("semaphore /x --leases 0 -- true", 64, "0 is not in 1.."),
        (
            "semaphore /x --leases 2 --qty 3 -- true",
            64,
            "--qty 3 is more than the 2 leases",
        ),
        (
            "semaphore /x --leases 2 --kv --qty 2 -- true",
            64,
            "--kv takes no --qty",
        ),
        (
            "semaphore /x --leases 2 --layout kazoo --revocable -- true",
            64,
            "drop --revocable",
        ),
        (
            "lock /x --timeout 999999999999999999999999 -- true",
            64,
            "too long a duration",
        ),
        (
            "bench mutex --seconds 0",
            64,
            "--seconds must be a positive",
        ),
        (
            "bench mutex --seconds 1e300",
            64,
            "--seconds must be a positive",
        ),
        (
            "bench mutex --seconds 1e19",
            64,
            "--seconds must be a positive",
        ),
        (
            "bench double-barrier --clients 2 --members 3",
            64,
            "--members 3 cannot open with only --clients 2",
        ),
    ];
    for (args, code, needle) in cases {
        let out = dlock().args(args.split(' ')).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(*code), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

/// A holder process killed with -9 cannot release: the next waiter gets the
/// lock once the server expires the dead session — within the time the
/// server may keep a silent session (the session timeout; 2 × TTL on
/// Consul) plus a tenth of it, at least 2 s.
fn a_killed_holder_hands_over_within_the_session_timeout(endpoint: &str) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let path = unique("killed");
    let timeout = Duration::from_secs(2);
    let mut holder = spawn_sh(
        endpoint,
        &["--session-timeout", "2s", "lock", &path],
        &format!("echo holding $$ >> {}; exec sleep 30", log.display()),
    );
    assert!(await_line(&log, "holding", Duration::from_secs(20)));
    let orphan: i32 = std::fs::read_to_string(&log)
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let mut next = spawn_sh(
        endpoint,
        &["lock", &path],
        &format!("echo next >> {}", log.display()),
    );
    await_participants_on(endpoint, &path, 2, Duration::from_secs(10));
    let bound = silent_holder_hands_over_within(endpoint, timeout);
    let killed = Instant::now();
    holder.kill().unwrap(); // SIGKILL: no release, no goodbye to the server
    let _ = holder.wait();
    assert!(await_line(&log, "next", bound + Duration::from_secs(10)));
    let handover = killed.elapsed();
    assert!(next.wait().unwrap().success());
    // The killed holder's command got SIGTERM as dlock died.
    let stopped = await_gone(orphan, Duration::from_secs(10));
    // SAFETY: signalling the command's pid, which it wrote itself.
    unsafe { libc::kill(orphan, libc::SIGKILL) };
    assert!(stopped, "the killed holder's command ran on");
    assert!(
        handover <= bound,
        "handed over after {handover:?} (bound {bound:?})"
    );
}

/// A hold lost while CMD runs stops what CMD started too: without a
/// controlling terminal (as a service runs it) CMD leads a process group of
/// its own, and the group gets the signals — also a child that ignores
/// SIGTERM, at the end of the grace.
#[test]
fn a_lost_hold_stops_what_the_command_started() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let mut dlock = dlock();
    // SAFETY: setsid (no controlling terminal) is async-signal-safe.
    unsafe {
        dlock.pre_exec(|| match libc::setsid() {
            -1 => Err(std::io::Error::last_os_error()),
            _ => Ok(()),
        })
    };
    let out = dlock
        .args([
            "lock",
            &unique("group"),
            "--max-hold",
            "500ms",
            "--grace",
            "5s",
        ])
        .args(["--", "sh", "-c"])
        .arg(format!(
            "(trap '' TERM; exec sleep 60) & echo started $! >> {}; wait",
            log.display()
        ))
        // Not piped: the sleep would hold a pipe open as long as it runs.
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(out.code(), Some(66), "{out:?}");
    let started: i32 = logged(&log, "started")[1].parse().unwrap();
    let stopped = await_gone(started, Duration::from_secs(10));
    // SAFETY: the pid the command wrote for its own child.
    unsafe { libc::kill(started, libc::SIGKILL) };
    assert!(stopped, "what the command started ran on");
}

/// On a terminal, CMD stays in dlock's process group, the terminal's
/// foreground job: it reads what is typed (a background group would be
/// stopped reading it), and so does the shell that ran dlock after it.
#[test]
fn on_a_terminal_the_command_reads_it_as_the_foreground_job() {
    let dir = tempfile::tempdir().unwrap();
    let (got, then) = (dir.path().join("got"), dir.path().join("then"));
    let socket = format!("dlock-tty-{}", uuid::Uuid::new_v4().simple());
    let script = format!(
        "'{}' --endpoint '{}' lock '{}' -- sh -c 'read x; echo \"$x\" > {}'; read y; echo \"$y\" > {}",
        env!("CARGO_BIN_EXE_dlock"),
        endpoint(),
        unique("tty"),
        got.display(),
        then.display()
    );
    let started = tmux(
        &socket,
        &["new-session", "-d", "-s", "t", "sh", "-c", &script],
    );
    assert!(started.status.success(), "{started:?}");
    let typed = |text: &str| {
        let sent = tmux(&socket, &["send-keys", "-t", "t", text, "Enter"]);
        assert!(sent.status.success(), "{sent:?}");
    };
    typed("hello");
    let cmd_read = await_line(&got, "hello", Duration::from_secs(20));
    typed("world");
    let shell_read = await_line(&then, "world", Duration::from_secs(20));
    tmux(&socket, &["kill-server"]);
    assert!(cmd_read, "CMD never read the terminal");
    assert!(shell_read, "the shell never had the terminal back");
}

/// On a terminal, Ctrl-C reaches CMD once: the terminal signals its whole
/// foreground group, CMD with dlock, and dlock does not pass a second copy
/// on (before, CMD got SIGINT twice, which many programs take for "stop
/// now, skip the clean-up").
#[test]
fn on_a_terminal_ctrl_c_reaches_the_command_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str| dir.path().join(name).display().to_string();
    let (ready, fifo, seen, said) = (file("ready"), file("fifo"), file("seen"), file("said"));
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success(), "mkfifo {fifo}");
    // CMD takes each SIGINT as it comes: the terminal's, then, once dlock
    // said what it did with it, whatever else is pending.
    let cmd = format!(
        "import signal\n\
         signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGINT}})\n\
         open('{ready}', 'w').write('ready\\n')\n\
         first = signal.sigwaitinfo({{signal.SIGINT}})\n\
         open('{fifo}').read()\n\
         second = signal.sigtimedwait({{signal.SIGINT}}, 0)\n\
         open('{seen}', 'w').write(f'first={{first.si_code}} second={{second and second.si_pid}}\\n')\n"
    );
    let script_file = file("cmd.py");
    std::fs::write(&script_file, cmd).unwrap();
    let socket = format!("dlock-ctrl-c-{}", uuid::Uuid::new_v4().simple());
    let script = format!(
        "'{}' --endpoint '{}' lock '{}' -- python3 '{script_file}' 2> '{said}'",
        env!("CARGO_BIN_EXE_dlock"),
        endpoint(),
        unique("ctrl-c"),
    );
    let started = tmux(
        &socket,
        &["new-session", "-d", "-s", "t", "sh", "-c", &script],
    );
    assert!(started.status.success(), "{started:?}");
    let within = Duration::from_secs(20);
    let cmd_ready = await_line(Path::new(&ready), "ready", within);
    let sent = tmux(&socket, &["send-keys", "-t", "t", "C-c"]);
    let dlock_said = cmd_ready && await_line(Path::new(&said), "SIGINT", within);
    if dlock_said {
        std::fs::write(&fifo, "go").unwrap();
    }
    let cmd_saw = dlock_said && await_line(Path::new(&seen), "first=", within);
    tmux(&socket, &["kill-server"]);
    assert!(cmd_ready, "CMD never started");
    assert!(sent.status.success(), "{sent:?}");
    let said = std::fs::read_to_string(&said).unwrap_or_default();
    assert!(dlock_said, "dlock said nothing of the SIGINT: {said}");
    assert!(cmd_saw, "CMD never reported");
    let seen = std::fs::read_to_string(&seen).unwrap();
    assert_eq!(
        seen.trim(),
        format!("first={} second=None", libc::SI_KERNEL),
        "dlock said: {said}"
    );
}

/// A running `dlock lock --metrics-addr` serves Prometheus text with the
/// acquire metrics of the lock it holds.
#[test]
fn a_running_lock_serves_its_metrics() {
    let path = unique("metrics");
    let port = dlock_testkit::free_port();
    let mut holder = dlock()
        .args([
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
            "lock",
            &path,
            "--",
            "sleep",
            "30",
        ])
        .spawn()
        .unwrap();
    await_participants(&path, 1, Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = loop {
        match dlock_testkit::http_get(port, "/metrics") {
            Ok((200, body)) if body.contains("dlock_acquire_seconds") => break body,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            other => panic!("no acquire metrics at :{port}: {other:?}"),
        }
    };
    // SIGTERM to dlock is passed on to the command; dlock then releases.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(holder.id() as i32, libc::SIGTERM) };
    assert_eq!(
        holder.wait().unwrap().code(),
        Some(128 + libc::SIGTERM),
        "the command ended by the forwarded SIGTERM"
    );
    assert!(
        body.contains("dlock_acquire_seconds_count{") && body.contains("recipe=\"mutex\""),
        "{body}"
    );
    assert!(body.contains(&format!("path=\"{path}\"")), "{body}");
}

/// Ten `dlock semaphore --leases 3` processes: never more than three
/// commands inside at once, and the semaphore really admits three.
fn a_semaphore_admits_at_most_its_leases(endpoint: &str) {
    // On etcd the lot need not fill within the run; it must never overfill.
    let must_fill = !endpoint.starts_with("etcd");
    let path = unique("sem");
    let lines = run_together(
        endpoint,
        &["semaphore", &path, "--leases", "3"],
        10,
        |_, log| format!("echo in sem >> {log}; sleep 0.3; echo out sem >> {log}"),
    );
    let (most, entries) = concurrency(&lines);
    let text = lines.join("\n");
    assert_eq!(entries["sem"], 10, "{text}");
    assert!(most <= 3, "{most} inside at once:\n{text}");
    if must_fill {
        assert_eq!(most, 3, "the semaphore admits three:\n{text}");
    }
}

/// Two `dlock elect` candidates: the first leader's command runs, exits,
/// and leadership passes to the other, whose command runs after it.
fn elect_hands_over_when_the_leaders_command_exits(endpoint: &str) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let path = unique("elect");
    let run = |id: &str| {
        spawn_sh(
            endpoint,
            &["elect", &path, "--id", id],
            &format!(
                "echo start $DLOCK_FENCE >> {0}; sleep 0.3; echo end >> {0}",
                log.display()
            ),
        )
    };
    let first = run("a");
    assert!(await_line(&log, "start", Duration::from_secs(20)));
    let second = run("b");
    wait_all(vec![first, second]);
    let lines: Vec<String> = log_lines(&log);
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert!(
        lines[0].starts_with("start")
            && lines[1] == "end"
            && lines[2].starts_with("start")
            && lines[3] == "end",
        "{lines:?}"
    );
    let epoch = |l: &str| l.split_whitespace().nth(1).unwrap().parse::<i64>().unwrap();
    assert!(
        epoch(&lines[2]) > epoch(&lines[0]),
        "the second term has a larger epoch: {lines:?}"
    );
}

/// `count`: set, get, compare-and-set (exit code 1 when the value differs
/// or there is no count).
#[test]
fn count_gets_sets_and_compares() {
    let path = unique("count");
    let run = |args: &[&str]| dlock().arg("count").args(args).output().unwrap();
    assert!(run(&["set", &path, "5"]).status.success());
    assert_eq!(
        String::from_utf8_lossy(&run(&["get", &path]).stdout).trim(),
        "5"
    );
    assert!(run(&["cas", &path, "5", "-7"]).status.success());
    assert_eq!(
        String::from_utf8_lossy(&run(&["get", &path]).stdout).trim(),
        "-7"
    );
    let stale = run(&["cas", &path, "5", "9"]);
    assert_eq!(stale.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&stale.stderr).contains("is not 5"));
    assert_eq!(
        String::from_utf8_lossy(&run(&["get", &path]).stdout).trim(),
        "-7"
    );
    let none = unique("none");
    let missing = run(&["get", &none]);
    assert_eq!(missing.status.code(), Some(70));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no node at"));
    let missing = run(&["cas", &none, "0", "1"]);
    assert_eq!(missing.status.code(), Some(1), "no count: no effect");
    assert!(String::from_utf8_lossy(&missing.stderr).contains("there is no count at"));
    assert_eq!(run(&["get", &none]).status.code(), Some(70), "nothing made");
    // Counters persist by design; this test removes its own.
    let admin = dlock::blocking::connect(&endpoint()).unwrap();
    admin.block_on(admin.session().delete(&path, None)).unwrap();
}

/// `dlock inspect PATH --json` on `endpoint`.
fn inspect_on(endpoint: &str, path: &str) -> serde_json::Value {
    json_of(endpoint, &["inspect", path, "--json"])
}

/// The participants' values of `field`, in order.
fn column(json: &serde_json::Value, field: &str) -> Vec<String> {
    json["participants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[field].as_str().unwrap_or("").to_string())
        .collect()
}

fn has_run(log: &std::path::Path, tag: &str) -> bool {
    std::fs::read_to_string(log).is_ok_and(|t| t.lines().any(|l| l.starts_with(&format!("{tag} "))))
}

/// read-lock and write-lock: readers share, a writer waits for them, a
/// reader queued behind a waiting writer waits for it (fair); the writer's
/// node is a write node and its token is larger.
#[test]
fn readers_share_and_a_writer_excludes_them() {
    let (endpoint, dir) = (endpoint(), tempfile::tempdir().unwrap());
    let log = dir.path().join("log");
    let path = unique("rw");
    let r1 = Holder::start(&endpoint, &["read-lock", &path], &log, "r1");
    let r2 = Holder::start(&endpoint, &["read-lock", &path], &log, "r2");
    assert!(await_line(&log, "r1 ", Duration::from_secs(20)));
    assert!(
        await_line(&log, "r2 ", Duration::from_secs(20)),
        "readers share"
    );
    let w = Holder::start(&endpoint, &["write-lock", &path], &log, "w");
    await_participants(&path, 3, Duration::from_secs(20));
    let r3 = Holder::start(&endpoint, &["read-lock", &path], &log, "r3");
    await_participants(&path, 4, Duration::from_secs(20));
    let json = inspect_on(&endpoint, &path);
    assert_eq!(json["recipe"], "read-write-lock");
    assert_eq!(
        column(&json, "role"),
        ["holder", "holder", "waiter", "waiter"],
        "{json}"
    );
    assert_eq!(
        column(&json, "access"),
        ["read", "read", "write", "read"],
        "{json}"
    );
    assert!(!has_run(&log, "w") && !has_run(&log, "r3"));
    assert_eq!(r1.finish(), Some(0));
    assert!(!has_run(&log, "w"), "the writer waits for every reader");
    assert_eq!(r2.finish(), Some(0));
    assert!(await_line(&log, "w ", Duration::from_secs(20)));
    let (writer, reader) = (logged(&log, "w"), logged(&log, "r1"));
    assert!(writer[2].contains("__WRIT__") && reader[2].contains("__READ__"));
    assert!(writer[1].parse::<i64>().unwrap() > reader[1].parse::<i64>().unwrap());
    assert!(!has_run(&log, "r3"), "a reader behind a writer waits");
    assert_eq!(w.finish(), Some(0));
    assert!(await_line(&log, "r3 ", Duration::from_secs(20)));
    assert_eq!(r3.finish(), Some(0));
}

/// semaphore --kv: at most --leases holders; a waiter shows as such, gets
/// in when a holder leaves, and its node is its session's entry.
#[test]
fn a_kv_semaphore_admits_its_leases_and_queues_the_rest() {
    let (endpoint, dir) = (endpoint(), tempfile::tempdir().unwrap());
    let log = dir.path().join("log");
    let path = unique("kv");
    let args = ["semaphore", &path, "--kv", "--leases", "2"];
    let k1 = Holder::start(&endpoint, &args, &log, "k1");
    assert!(await_line(&log, "k1 ", Duration::from_secs(20)));
    let k2 = Holder::start(&endpoint, &args, &log, "k2");
    assert!(await_line(&log, "k2 ", Duration::from_secs(20)));
    let k3 = Holder::start(&endpoint, &args, &log, "k3");
    await_participants(&path, 3, Duration::from_secs(20));
    let json = inspect_on(&endpoint, &path);
    assert_eq!(json["recipe"], "kv-semaphore");
    assert_eq!(
        column(&json, "role"),
        ["holder", "holder", "waiter"],
        "{json}"
    );
    assert!(!has_run(&log, "k3"));
    let node = &logged(&log, "k1")[2];
    let entry = node.strip_prefix(&format!("{path}/")).unwrap();
    assert!(
        entry.len() == 16 && entry.bytes().all(|b| b.is_ascii_hexdigit()),
        "{node}"
    );
    assert_eq!(k1.finish(), Some(0));
    assert!(await_line(&log, "k3 ", Duration::from_secs(20)));
    assert_eq!(k2.finish(), Some(0));
    assert_eq!(k3.finish(), Some(0));
    await_participants(&path, 0, Duration::from_secs(10));
}

/// elect --requeue: two candidates take turns, each running its command
/// again whenever leadership comes back, with ever larger epochs; SIGTERM
/// ends each, and their candidacies with them.
#[test]
fn elect_requeue_runs_the_command_each_term() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let path = unique("requeue");
    let candidate = |id: &str| {
        spawn_sh(
            &endpoint(),
            &["elect", &path, "--id", id, "--requeue"],
            &format!("echo {id} $DLOCK_FENCE >> {}", log.display()),
        )
    };
    let a = candidate("a");
    assert!(await_line(&log, "a ", Duration::from_secs(20)));
    let b = candidate("b");
    let terms = |id: &str| {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with(&format!("{id} ")))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while terms("a") < 2 || terms("b") < 2 {
        assert!(Instant::now() < deadline, "no turns taken");
        std::thread::sleep(Duration::from_millis(20));
    }
    for c in [&a, &b] {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    }
    for c in [a, b] {
        assert!(exit_within(c, Duration::from_secs(10)).is_some());
    }
    // Closed candidacies leave nothing behind at once.
    assert_eq!(
        inspect_on(&endpoint(), &path)["participants"],
        serde_json::json!([])
    );
    let text = std::fs::read_to_string(&log).unwrap();
    let epochs: Vec<i64> = text
        .lines()
        .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
        .collect();
    assert!(epochs.windows(2).all(|w| w[0] < w[1]), "{text}");
}

/// --suspend-grace: a holder whose connection is down longer than the grace
/// stops its command (exit 66) long before its session could expire; one
/// without it rides out the same outage and keeps its lock, and so does an
/// elected leader (its term ended at the first suspension).
#[test]
fn suspend_grace_counts_a_long_suspension_as_a_loss() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let proxy = dlock_testkit::TcpProxy::start(&shared_zk().connect_string()).unwrap();
    let via = format!("zk://{}", proxy.address());
    let (strict_path, patient_path) = (unique("strict"), unique("patient"));
    let elected_path = unique("elected");
    let mut strict = dlock_on(&via)
        .args(["--session-timeout", "20s", "lock", &strict_path])
        .args([
            "--suspend-grace",
            "200ms",
            "--grace",
            "1s",
            "--",
            "sh",
            "-c",
        ])
        .arg(format!("echo strict 0 x >> {}; read line", log.display()))
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let patient = Holder::start(
        &via,
        &["--session-timeout", "20s", "lock", &patient_path],
        &log,
        "patient",
    );
    let elected = Holder::start(
        &via,
        &["--session-timeout", "20s", "elect", &elected_path],
        &log,
        "elected",
    );
    assert!(await_line(&log, "strict ", Duration::from_secs(20)));
    assert!(await_line(&log, "patient ", Duration::from_secs(20)));
    assert!(await_line(&log, "elected ", Duration::from_secs(20)));
    let (tx, said) = mpsc::channel();
    let stderr = strict.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let _ = tx.send(line.unwrap_or_default());
        }
    });
    let cut = Instant::now();
    proxy.cut();
    let lost = loop {
        let line = said
            .recv_timeout(Duration::from_secs(10))
            .expect("never declared lost");
        if line.contains("lost") {
            break cut.elapsed();
        }
    };
    proxy.restore();
    assert!(
        lost < Duration::from_secs(10),
        "declared lost after {lost:?}"
    );
    assert_eq!(exit_within(strict, Duration::from_secs(20)), Some(66));
    assert_eq!(
        patient.finish(),
        Some(0),
        "the patient holder kept its lock"
    );
    assert_eq!(elected.finish(), Some(0), "the leader kept its term");
}

/// DLOCK_ENDPOINT carries no credentials, though dlock was given some.
#[test]
fn the_command_gets_the_endpoint_without_credentials() {
    let path = unique("creds");
    let hosts = shared_zk().connect_string();
    let out = dlock()
        .args(["--endpoint", &format!("zk://alice:s3cret@{hosts}")])
        .args(["lock", &path, "--", "sh", "-c", "echo $DLOCK_ENDPOINT"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("zk://{hosts}")
    );
    let help = dlock().args(["lock", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        help.contains("DLOCK_ENDPOINT (the endpoint without user and password"),
        "{help}"
    );
}

/// `elect --timeout` that is not elected in time exits 65 having closed its
/// candidacy: `inspect` right after lists the leader alone.
fn an_elect_timeout_closes_its_candidacy(endpoint: &str) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let path = unique("elect-timeout");
    let leader = Holder::start(
        endpoint,
        &["elect", &path, "--id", "leader"],
        &log,
        "leader",
    );
    assert!(await_line(&log, "leader ", Duration::from_secs(20)));
    let out = dlock_on(endpoint)
        .args([
            "elect",
            &path,
            "--id",
            "late",
            "--timeout",
            "300ms",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(65),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = inspect_on(endpoint, &path);
    assert_eq!(column(&json, "data"), ["leader"], "{json}");
    assert_eq!(leader.finish(), Some(0));
}

/// `bench`: every workload runs with a few clients, counts what they did
/// and finds no violation — for the mutex, the write half and the
/// election, also none of holders let in out of their fencing tokens'
/// order.
fn bench_runs_every_workload_without_violations(endpoint: &str) {
    let workloads: [(&str, &[&str]); 7] = [
        // First: its counter persists by design and is removed at once,
        // checking that nothing else is left under the root — before the
        // others' directories are there (on ZooKeeper, containers the
        // server reaps a moment after their last node goes).
        ("counter", &["--rounds", "5"]),
        ("mutex", &[]),
        ("rwlock", &["--write-every", "2"]),
        ("semaphore", &["--leases", "2"]),
        ("election", &[]),
        ("double-barrier", &[]),
        ("raw", &[]),
    ];
    for (workload, extra) in workloads {
        let path = unique(&format!("bench-{workload}"));
        let out = dlock_on(endpoint)
            .args(["bench", workload, "--clients", "3", "--seconds", "0.3"])
            .args(["--path", &path])
            .args(extra)
            .output()
            .unwrap();
        let line = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{workload}: {line}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let fields: std::collections::HashMap<&str, &str> = line
            .split_whitespace()
            .filter_map(|field| field.split_once('='))
            .collect();
        assert_eq!(fields.get("recipe"), Some(&workload), "{line}");
        assert_eq!(fields.get("violations"), Some(&"0"), "{line}");
        let ops: u64 = fields["ops"].parse().unwrap();
        assert!(ops > 0, "{line}");
        if workload == "counter" {
            // Counters persist by design.
            common::remove(endpoint, &[&path]);
        }
    }
}

on_every_server!(
    bench_runs_every_workload_without_violations,
    lock_processes_never_overlap,
    the_command_gets_the_token_and_its_exit_code_is_kept,
    a_frozen_holder_loses_the_lock_and_stops_its_command,
    an_acquire_timeout_has_its_exit_code,
    a_killed_holder_hands_over_within_the_session_timeout,
    a_semaphore_admits_at_most_its_leases,
    elect_hands_over_when_the_leaders_command_exits,
    an_elect_timeout_closes_its_candidacy,
);

/// A holder by etcd's Go client (`etcdctl lock`) shows in `inspect` as a
/// foreign mutex holder, not as nothing.
#[cfg(feature = "etcd")]
#[test]
fn inspect_shows_an_etcdctl_lock_holder_on_etcd() {
    let path = unique("golock");
    // etcdctl holds the lock while its command runs: the command prints
    // the key (etcdctl hands it over as ETCD_LOCK_KEY) and waits for a
    // line on a FIFO the test writes to. (Signalling a bare `etcdctl
    // lock` races its signal set-up, which comes after it prints the
    // key: under load SIGINT killed it before it could unlock.)
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("release");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let script = dir.path().join("hold.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"$ETCD_LOCK_KEY\"\nread _ < '{}'\n",
            fifo.display()
        ),
    )
    .unwrap();
    let made = Command::new("chmod")
        .arg("+x")
        .arg(&script)
        .status()
        .unwrap();
    assert!(made.success());
    let mut etcdctl = common::etcdctl()
        .args(["lock", &path])
        .arg(&script)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut key = String::new();
    std::io::BufReader::new(etcdctl.stdout.take().unwrap())
        .read_line(&mut key)
        .unwrap();
    let json = inspect_on(&common::etcd_endpoint(), &path);
    assert_eq!(json["recipe"], "mutex", "{json}");
    assert_eq!(column(&json, "role"), ["holder"], "{json}");
    assert_eq!(column(&json, "foreign"), ["etcd-go"], "{json}");
    assert_eq!(column(&json, "node"), [key.trim()], "{json}");
    // The command ends; etcdctl unlocks and exits.
    std::fs::write(&fifo, "go\n").unwrap();
    assert_eq!(exit_within(etcdctl, Duration::from_secs(10)), Some(0));
    assert_eq!(
        inspect_on(&common::etcd_endpoint(), &path)["recipe"],
        "none"
    );
}
