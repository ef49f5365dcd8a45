//! Helpers shared by the CLI test binaries: the servers' endpoints, running
//! `dlock`, reading what it prints, a holder whose command logs its fence
//! and node and waits to be let go, waiting for the store, and a macro
//! that runs each case on every server.
//!
//! Each test binary uses only some of them.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The shared ZooKeeper, as a `zk://` endpoint.
pub fn zk_endpoint() -> String {
    format!("zk://{}", dlock_testkit::shared_zk().connect_string())
}

/// The shared etcd, as an `etcd://` endpoint.
#[cfg(feature = "etcd")]
pub fn etcd_endpoint() -> String {
    format!("etcd://{}", dlock_testkit::shared_etcd().endpoint())
}

/// The shared Consul agent, as a `consul://` endpoint.
#[cfg(feature = "consul")]
pub fn consul_endpoint() -> String {
    format!("consul://{}", dlock_testkit::shared_consul().endpoint())
}

/// A path of its own for one test: `/cli-<uuid>/<name>`.
pub fn unique(name: &str) -> String {
    let root = ROOT.with(|root| root.borrow().clone());
    let root = root.unwrap_or_else(|| format!("/cli-{}", uuid::Uuid::new_v4().simple()));
    format!("{root}/{name}")
}

thread_local! {
    /// The root of the case `on_every_server!` runs on this thread, which
    /// [`unique`] names paths under.
    static ROOT: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Runs `case` with [`unique`] paths under a root of its own, then checks
/// that nothing is left there — no ephemeral node, no node holding data,
/// and on etcd and Consul no key at all (an empty directory elsewhere may
/// be a container not yet reaped) — and removes the empty skeleton.
pub fn leaving_nothing(endpoint: &str, case: impl FnOnce()) {
    let root = format!("/cli-{}", uuid::Uuid::new_v4().simple());
    ROOT.with(|r| *r.borrow_mut() = Some(root.clone()));
    case();
    ROOT.with(|r| *r.borrow_mut() = None);
    use dlock::recipes::kv_semaphore::{Record, RECORD};
    use dlock::Layout;
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let session = dlock::connect(endpoint).await.expect("connect");
        let keyed = matches!(
            session.backend(),
            dlock::store::BackendKind::Etcd | dlock::store::BackendKind::Consul
        );
        let (mut left, mut order, mut stack) = (Vec::new(), Vec::new(), vec![root.clone()]);
        while let Some(path) = stack.pop() {
            let Ok((data, stat)) = session.get_data(&path).await else {
                continue;
            };
            let children = session.children(&path).await.unwrap_or_default();
            // A KV semaphore's record without holders stays by design.
            let idle_record = path.ends_with(&format!("/{RECORD}"))
                && [Layout::Curator, Layout::Consul].into_iter().any(|layout| {
                    Record::decode(layout, &path, &data).is_ok_and(|r| r.holders.is_empty())
                });
            let a_key = keyed && children.is_empty() && path != root && !idle_record;
            if stat.ephemeral_owner != 0 || !(data.is_empty() || idle_record) || a_key {
                left.push(format!("{path} ({} bytes)", data.len()));
            }
            stack.extend(children.iter().map(|c| format!("{path}/{}", c.name)));
            order.push(path);
        }
        assert!(left.is_empty(), "left behind under {root}: {left:#?}");
        for path in order.into_iter().rev() {
            let _ = session.delete(&path, None).await;
        }
        session.close().await;
    });
}

/// The `dlock` binary under test, with `DLOCK_ENDPOINT` set.
pub fn dlock_on(endpoint: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dlock"));
    c.env("DLOCK_ENDPOINT", endpoint);
    c
}

/// What `dlock ARGS` on `endpoint` prints as JSON; it must succeed.
pub fn json_of(endpoint: &str, args: &[&str]) -> serde_json::Value {
    let out = dlock_on(endpoint).args(args).output().expect("run dlock");
    assert_succeeded(&out);
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// `dlock ARGS -- sh -c SCRIPT` on `endpoint`, started.
pub fn spawn_sh(endpoint: &str, args: &[&str], script: &str) -> Child {
    dlock_on(endpoint)
        .args(args)
        .args(["--", "sh", "-c", script])
        .spawn()
        .expect("start dlock")
}

/// The lines of a log that commands appended to.
pub fn log_lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

/// Runs `dlock ARGS` with nothing inherited from `DLOCK_ENDPOINT` (the
/// embedded store, unless ARGS name an `--endpoint`).
pub fn run_alone(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(args)
        .env_remove("DLOCK_ENDPOINT")
        .output()
        .expect("run dlock")
}

/// Asserts that a finished process succeeded, showing its stderr if not.
pub fn assert_succeeded(out: &Output) {
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Each `(args, needle)`, dlock's arguments split at spaces, run alone
/// fails with one message on stderr that contains `needle`, and prints
/// nothing on stdout.
pub fn assert_each_fails_naming(cases: &[(&str, &str)]) {
    for (args, needle) in cases {
        let out = run_alone(&args.split(' ').collect::<Vec<_>>());
        assert!(!out.status.success(), "{args:?} should fail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty());
    }
}

/// The `key=value` words of `line` (bare words, such as the mode Curator's
/// peer prints among them, are passed over).
pub fn pairs(line: &str) -> HashMap<String, String> {
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The pairs of the one summary line (`<first> key=value ...`) of a demo
/// that succeeded.
pub fn summary(out: &Output, first: &str) -> HashMap<String, String> {
    assert_succeeded(out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "exactly one summary line, got {stdout:?}");
    assert_eq!(
        lines[0].split(' ').next(),
        Some(first),
        "{stdout:?} starts with {first}"
    );
    pairs(lines[0])
}

/// The pairs `expected` are among `pairs` (a summary's or [`fields`]).
pub fn assert_fields(pairs: &HashMap<String, String>, expected: &[(&str, &str)]) {
    let seen: Vec<(&str, &str)> = expected
        .iter()
        .map(|(k, _)| (*k, pairs.get(*k).map_or("<missing>", String::as_str)))
        .collect();
    assert_eq!(seen, expected, "{pairs:?}");
}

/// The pairs of the last line a finished process printed; it must have
/// succeeded.
pub fn fields(out: Output) -> HashMap<String, String> {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "failed ({:?}): {text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    pairs(text.lines().last().expect("some output"))
}

/// [`fields`] of a running child (its stdout piped), once it is done.
pub fn fields_of(child: Child) -> HashMap<String, String> {
    fields(child.wait_with_output().expect("wait for the process"))
}

/// A peer harness in `/work/shared/peers` (e.g. `curator/run.sh`), which
/// must be there.
pub fn peer_harness(path: &str) -> PathBuf {
    let harness = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/peers")
        .join(path);
    assert!(
        harness.exists(),
        "the peer harness is missing at {}",
        harness.display()
    );
    harness
}

/// Curator 5.4's peer harness (`shared/peers/curator/run.sh ARGS`), built
/// once per process (see `curator_peerbench_classes`); its stdout piped.
pub fn curator_peer(args: &[&str]) -> Command {
    let classes = dlock_testkit::curator_peerbench_classes().expect("compile the Curator peer");
    let mut c = Command::new("bash");
    c.arg(peer_harness("curator/run.sh"))
        .args(args)
        .env("PEER_BUILD_DIR", classes)
        .stdout(Stdio::piped());
    c
}

/// Runs `dlock demo ARGS` on `endpoint` until its probe counter at `probe`
/// (a SharedCount: 4-byte big-endian) shows someone inside, then sends it
/// Ctrl-C (SIGINT), and asserts that it wound down (`what` names the run):
/// exit 130, its summary without violations, the probe back at 0. The
/// probe is removed.
pub fn interrupt_demo(endpoint: &str, args: &[&str], probe: &str, what: &str) {
    let (out, left) = interrupted_demo(endpoint, args, probe);
    assert_eq!(out.status.code(), Some(130), "{what}: {out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let s = pairs(stdout.lines().next().expect("the summary line"));
    assert_eq!(s["violations"], "0", "{what}: {s:?}");
    assert_eq!(left, 0, "{what}: the probe was left raised");
}

/// [`interrupt_demo`]'s run: how it ended, and the probe's value after.
fn interrupted_demo(endpoint: &str, args: &[&str], probe: &str) -> (Output, i32) {
    let child = dlock_on(endpoint)
        .arg("demo")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run dlock");
    let admin = dlock::blocking::connect(endpoint).expect("connect");
    let value = |data: &[u8]| i32::from_be_bytes(data.try_into().expect("a 4-byte count"));
    let inside: Result<dlock::Result<()>, _> = admin.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                // Not there yet: wait for it to appear.
                let (stat, appeared) = admin.session().exists_watch(probe).await?;
                if stat.is_none() {
                    appeared.changed().await;
                    continue;
                }
                let (data, _, changed) = admin.session().get_data_watch(probe).await?;
                if value(&data) > 0 {
                    return Ok(());
                }
                changed.changed().await;
            }
        })
        .await
    });
    let pid = child.id() as i32;
    // SAFETY (both): signalling our own child.
    let kill = || unsafe { libc::kill(pid, libc::SIGKILL) };
    if !matches!(inside, Ok(Ok(()))) {
        kill();
        panic!("nobody went inside: {inside:?}");
    }
    unsafe { libc::kill(pid, libc::SIGINT) };
    let (done, ended) = mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output()));
    let Ok(out) = ended.recv_timeout(Duration::from_secs(60)) else {
        kill();
        panic!("the demo did not wind down within 60 s of Ctrl-C");
    };
    let out = out.expect("wait for dlock");
    let (data, _) = admin
        .block_on(admin.session().get_data(probe))
        .expect("read the probe");
    admin
        .block_on(admin.session().delete(probe, None))
        .expect("remove the probe");
    admin.close();
    (out, value(&data))
}

/// Stores `total` as the stock of a sale at `stock` (persistent, with its
/// parents), for processes that join it.
pub fn set_stock(admin: &dlock::blocking::Session, stock: &str, total: u64) {
    let options =
        dlock::store::CreateOptions::new(dlock::store::CreateMode::Persistent).with_parents();
    admin
        .block_on(
            admin
                .session()
                .create(stock, total.to_string().as_bytes(), options),
        )
        .unwrap();
}

/// `dlock demo flash-sale` joining the sale of `stock` under `lock`, four
/// buyers each holding 2 ms, its stdout piped.
pub fn join_sale(endpoint: &str, lock: &str, stock: &str) -> Child {
    dlock_on(endpoint)
        .args(["demo", "flash-sale", "--buyers", "4", "--hold-ms", "2"])
        .args(["--lock-path", lock, "--stock-path", stock])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run dlock")
}

/// Waits for every child; each must succeed.
pub fn wait_all(children: Vec<Child>) {
    for child in children {
        assert_succeeded(&child.wait_with_output().expect("wait for a child"));
    }
}

/// The most holders at once by a log of lines `in <kind>` / `out <kind>`
/// (appends are atomic and ordered), and how many entries each kind had.
pub fn concurrency(lines: &[String]) -> (usize, HashMap<String, usize>) {
    let (mut now, mut max, mut entries) = (0usize, 0, HashMap::new());
    for line in lines {
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
    assert_eq!(now, 0, "every entry has its exit:\n{}", lines.join("\n"));
    (max, entries)
}

/// `consul lock` (Consul 1.8's own binary) on the shared agent, before
/// its prefix and command.
#[cfg(feature = "consul")]
pub fn consul_lock() -> Command {
    let mut c = Command::new(dlock_testkit::consul_binary().expect("the consul binary"));
    c.arg("lock").arg(format!(
        "-http-addr={}",
        dlock_testkit::shared_consul().endpoint()
    ));
    c
}

/// etcd's own `etcdctl` (v3 API; `DLOCK_ETCDCTL` names another binary)
/// on the shared etcd, before its arguments.
#[cfg(feature = "etcd")]
pub fn etcdctl() -> Command {
    let mut c = Command::new(std::env::var("DLOCK_ETCDCTL").unwrap_or("etcdctl".into()));
    c.env("ETCDCTL_API", "3").arg(format!(
        "--endpoints={}",
        dlock_testkit::shared_etcd().url()
    ));
    c
}

/// The keys left under the KV root `root` of the shared Consul agent that
/// a finished test must not leave, as it lists them ("" if none): all but
/// the records of KV semaphores without holders, which their last holder
/// leaves (never deleting them, as `api.Semaphore` does not).
#[cfg(feature = "consul")]
pub fn consul_leftovers(root: &str) -> String {
    let consul = dlock_testkit::shared_consul();
    let (status, body) = consul
        .http("GET", &format!("/v1/kv/{root}/?keys"), None)
        .expect("list the root");
    if status == 404 {
        return String::new();
    }
    let keys: Vec<String> = serde_json::from_str(&body).expect("Consul lists JSON");
    let idle = |key: &str| {
        key.ends_with("/.lock") && {
            let (_, raw) = consul
                .http("GET", &format!("/v1/kv/{key}?raw"), None)
                .expect("read a key");
            use dlock::recipes::kv_semaphore::Record;
            let decoded = |layout| Record::decode(layout, key, raw.as_bytes());
            [dlock::Layout::Curator, dlock::Layout::Consul]
                .into_iter()
                .any(|layout| decoded(layout).is_ok_and(|r| r.holders.is_empty()))
        }
    };
    let left: Vec<&String> = keys.iter().filter(|k| !idle(k)).collect();
    match left.is_empty() {
        true => String::new(),
        false => format!("{left:?}"),
    }
}

/// Waits for a line in a file that a command appends to (the file is the
/// event; a short poll of a local file stands in for a watch).
pub fn await_line(path: &Path, needle: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if std::fs::read_to_string(path).is_ok_and(|s| s.lines().any(|l| l.contains(needle))) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `tmux -L SOCKET ARGS...`, on a server of the test's own.
pub fn tmux(socket: &str, args: &[&str]) -> Output {
    Command::new("tmux")
        .arg("-L")
        .arg(socket)
        .args(args)
        .output()
        .expect("tmux is installed (scripts/test.sh installs it)")
}

/// Looks with `look` until `done` holds of what it saw, and returns that;
/// panics with the last sight after `within`. For what tells nobody when
/// it changes (another process's view, a terminal's screen).
pub fn look_until<T: std::fmt::Display>(
    within: Duration,
    what: &str,
    mut look: impl FnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        let seen = look();
        if done(&seen) {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "never saw {what} within {within:?}:\n{seen}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits (by watch, through the library) until `path` has at least `n`
/// children; it need not exist yet.
pub fn await_children(endpoint: &str, path: &str, n: usize, within: Duration) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let session = dlock::connect(endpoint).await.expect("connect");
        let reached = tokio::time::timeout(within, async {
            loop {
                match session.children_watch(path).await {
                    Ok((children, _)) if children.len() >= n => return,
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
        .await;
        session.close().await;
        reached.unwrap_or_else(|_| panic!("{path} did not reach {n} children in {within:?}"));
    });
}

/// A process whose stdout lines arrive on a channel, and whose stdin is
/// ours (a command it runs reads it; closing it ends that command).
/// Dropping it kills the process.
pub struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Running {
    /// How long a line or the exit may take: a few session timeouts (the
    /// CLI's default is 10 s).
    pub const WITHIN: Duration = Duration::from_secs(30);

    /// `dlock ARGS` on `endpoint`.
    pub fn start(endpoint: &str, args: &[&str]) -> Running {
        let mut command = dlock_on(endpoint);
        command.args(args);
        Running::spawn(command)
    }

    /// Any command.
    pub fn spawn(mut command: Command) -> Running {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {command:?}: {e}"));
        let lines = dlock_testkit::line_channel(child.stdout.take().unwrap());
        Running {
            stdin: child.stdin.take(),
            child,
            lines,
        }
    }

    pub fn line(&self) -> String {
        self.lines
            .recv_timeout(Self::WITHIN)
            .expect("a line from the process in time")
    }

    pub fn json(&self) -> serde_json::Value {
        let line = self.line();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    }

    /// Whether a line came that was not read yet.
    pub fn has_printed(&self) -> bool {
        self.lines.try_recv().is_ok()
    }

    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: signalling our own child, not reaped yet.
        assert_eq!(
            unsafe { libc::kill(self.child.id() as libc::pid_t, signal) },
            0
        );
    }

    /// Writes `line` to its stdin.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        writeln!(stdin, "{line}").expect("write to the process");
        stdin.flush().expect("flush to the process");
    }

    /// Closes its stdin: a command reading it ends.
    pub fn close_stdin(&mut self) {
        self.stdin.take();
    }

    /// Waits (on a thread, by `wait`) for it to exit; its exit code.
    pub fn exit_code(mut self) -> Option<i32> {
        let child = std::mem::replace(
            &mut self.child,
            Command::new("true").spawn().expect("a placeholder child"),
        );
        exit_within(child, Self::WITHIN)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (on a thread, by `wait`) for `child` to exit; its exit code.
/// Past `within` it is killed and the test fails.
pub fn exit_within(mut child: Child, within: Duration) -> Option<i32> {
    let (tx, rx) = mpsc::channel();
    let pid = child.id() as libc::pid_t;
    std::thread::spawn(move || {
        let _ = tx.send(child.wait().unwrap().code());
    });
    rx.recv_timeout(within).unwrap_or_else(|_| {
        // SAFETY: signalling our own child, not reaped yet.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        panic!("pid {pid} still running after {within:?}")
    })
}

/// A running `dlock ... -- sh -c CMD` whose command logs `TAG FENCE NODE`
/// once inside and then holds until [`finish`](Self::finish)ed (a line on
/// its standard input, which the command inherits from dlock).
pub struct Holder(pub Child);

impl Holder {
    pub fn start(endpoint: &str, args: &[&str], log: &Path, tag: &str) -> Holder {
        Holder(
            dlock_on(endpoint)
                .args(args)
                .args(["--", "sh", "-c"])
                .arg(format!(
                    "echo {tag} $DLOCK_FENCE $DLOCK_NODE >> {}; read line",
                    log.display()
                ))
                .stdin(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    }

    /// Lets the command end; dlock's exit code.
    pub fn finish(mut self) -> Option<i32> {
        let mut stdin = self.0.stdin.take().unwrap();
        writeln!(stdin, "done").unwrap();
        drop(stdin);
        self.0.wait().unwrap().code()
    }
}

/// The log line of `tag`'s command: `[tag, fence, node]`.
pub fn logged(log: &Path, tag: &str) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(tag))
        .unwrap_or_else(|| panic!("{tag} never ran: {text}"));
    line.split_whitespace().map(String::from).collect()
}

/// Each listed case, `fn case(endpoint: &str)`, as a test per shared
/// server: `zookeeper::case`, and with their features `etcd::case` and
/// `consul::case`.
#[macro_export]
macro_rules! on_every_server {
    ($($case:ident),+ $(,)?) => {
        $crate::on_every_server!(@server zookeeper => $crate::common::zk_endpoint(); $($case),+);
        #[cfg(feature = "etcd")]
        $crate::on_every_server!(@server etcd => $crate::common::etcd_endpoint(); $($case),+);
        #[cfg(feature = "consul")]
        $crate::on_every_server!(@server consul => $crate::common::consul_endpoint(); $($case),+);
    };
    (@server $server:ident => $endpoint:expr; $($case:ident),+) => {
        mod $server {
            $(
                #[test]
                fn $case() {
                    let endpoint = $endpoint;
                    $crate::common::leaving_nothing(&endpoint, || super::$case(&endpoint));
                }
            )+
        }
    };
}

/// Deletes what a test made (a node holding data, such as a counter)
/// through the library, so that nothing is left under the test's root.
pub fn remove(endpoint: &str, paths: &[&str]) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let session = dlock::connect(endpoint).await.expect("connect");
        for path in paths {
            match session.delete(path, None).await {
                Ok(()) | Err(dlock::Error::NoNode { .. }) => {}
                Err(e) => panic!("delete {path}: {e}"),
            }
        }
        let root = dlock::path::parent(paths[0]).to_string();
        if let Ok(children) = session.children(&root).await {
            assert!(children.is_empty(), "left under {root}: {children:?}");
            let _ = session.delete(&root, None).await;
        }
        session.close().await;
    });
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet) within
/// `within`. Polled: another process's end tells nobody else.
pub fn await_gone(pid: i32, within: Duration) -> bool {
    let gone = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
            stat.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    };
    let deadline = Instant::now() + within;
    while !gone() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}
