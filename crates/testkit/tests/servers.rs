//! Starts real servers: standalone ZooKeeper, a 3-node ensemble, a single
//! etcd, a 3-member etcd cluster, a Consul dev agent and a 3-server Consul
//! cluster; checks they answer, survive the loss of one member, and leave
//! nothing behind (process or directory).

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dlock_testkit::{
    http_get, shared_consul, shared_etcd, shared_zk, zk_four_letter, ConsulCluster, ConsulOptions,
    ConsulServer, EtcdCluster, EtcdOptions, EtcdServer, ZkEnsemble, ZkOptions, ZkServer,
};

fn process_alive(pid: u32) -> bool {
    // A zombie is as good as gone.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !matches!(
            s.rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next()),
            Some("Z" | "X")
        ),
        Err(_) => false,
    }
}

fn eventually(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn assert_gone(pids: &[u32], dirs: &[PathBuf]) {
    for &pid in pids {
        assert!(!process_alive(pid), "server process {pid} still alive");
    }
    for d in dirs {
        assert!(!d.exists(), "directory {} still exists", d.display());
    }
}

fn etcd_healthy(port: u16) -> bool {
    matches!(http_get(port, "/health"), Ok((200, ref b)) if b.contains("\"health\":\"true\""))
}

/// `/proc/PID/comm`: the program a pid runs.
fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap()
        .trim()
        .to_string()
}

/// What only one kind of single server is checked for, besides the
/// lifecycle [`single_lifecycle`] puts every kind through.
trait SingleChecks {
    /// Checked once it serves.
    fn check_serving(&self);

    /// Checked once it has been restarted.
    fn check_restarted(&self) {}
}

/// A test of the lifecycle every single server goes through: start, serve,
/// pause (nothing answers), resume, stop (the directory stays, nothing
/// listens), restart on the same port, drop (process and directory gone);
/// with the [`SingleChecks`] of its kind. `$program` is what the server's
/// process runs (not the watchdog's `sh`); `$ask` sends one request to a
/// port and gives its answer as text: a paused server leaves it
/// unanswered, a stopped one refuses it.
macro_rules! single_lifecycle {
    ($test:ident, $server:ty, $program:literal, $ask:ident) => {
        #[test]
        fn $test() {
            let name = stringify!($server);
            let t = Instant::now();
            let mut server = <$server>::start().unwrap_or_else(|e| panic!("start {name}: {e:#}"));
            eprintln!("{name} ready in {:?} at {}", t.elapsed(), server.endpoint());
            assert_eq!(server.endpoint(), format!("127.0.0.1:{}", server.port()));
            server.check_serving();
            let pid = server.pid().expect("pid");
            assert_eq!(
                comm(pid),
                $program,
                "pid must be {name}'s, not the watchdog's"
            );

            // pause: the port still accepts, but nothing answers.
            server.pause();
            let answer = $ask(server.port());
            assert!(
                answer.as_ref().map_or(true, |a| a.is_empty()),
                "{name} paused: {answer:?}"
            );
            assert!(!server.is_serving(), "{name} paused serves");
            server.resume();
            eventually(
                &format!("{name} serves after resume"),
                Duration::from_secs(10),
                || server.is_serving(),
            );

            // stop / restart on the same port with the same directory.
            let port = server.port();
            server.stop();
            assert!(!server.is_running());
            assert!(!process_alive(pid));
            assert!(
                server.dir().join("data").is_dir(),
                "stop keeps the data dir"
            );
            let answer = $ask(port);
            assert!(
                answer.is_err(),
                "{name}: something answers after stop: {answer:?}"
            );
            let t = Instant::now();
            server
                .restart()
                .unwrap_or_else(|e| panic!("restart {name}: {e:#}"));
            eprintln!("{name} restart in {:?}", t.elapsed());
            assert_eq!(server.port(), port);
            assert!(server.is_serving());
            server.check_restarted();

            let (pid, dir) = (server.pid().unwrap(), server.dir().to_path_buf());
            drop(server);
            assert_gone(&[pid], &[dir]);
        }
    };
}

/// `ruok`, the answer.
fn ruok(port: u16) -> std::io::Result<String> {
    zk_four_letter(port, "ruok")
}

/// `GET /health`, the answer as `"CODE BODY"`.
fn get_health(port: u16) -> std::io::Result<String> {
    http_get(port, "/health").map(|(code, body)| format!("{code} {body}"))
}

/// `GET /v1/status/leader`, the answer as `"CODE BODY"`.
fn get_leader(port: u16) -> std::io::Result<String> {
    http_get(port, "/v1/status/leader").map(|(code, body)| format!("{code} {body}"))
}

impl SingleChecks for ZkServer {
    fn check_serving(&self) {
        assert_eq!(self.connect_string(), self.endpoint());
        assert_eq!(self.four_letter("ruok").unwrap().trim(), "imok");
        let srvr = self.four_letter("srvr").unwrap();
        assert!(srvr.contains("Mode: standalone"), "{srvr}");
        let conf = self.four_letter("conf").unwrap();
        assert!(conf.contains("maxSessionTimeout=60000"), "{conf}");
        assert!(conf.contains("tickTime=500"), "{conf}");
    }
}

impl SingleChecks for EtcdServer {
    fn check_serving(&self) {
        assert_eq!(self.url(), format!("http://127.0.0.1:{}", self.port()));
        let (code, body) = http_get(self.port(), "/health").unwrap();
        assert_eq!(code, 200);
        assert!(body.contains("\"health\":\"true\""), "{body}");
    }
}

impl SingleChecks for ConsulServer {
    /// The KV store and sessions work.
    fn check_serving(&self) {
        assert_eq!(self.url(), format!("http://127.0.0.1:{}", self.port()));
        let (code, body) = self.http("PUT", "/v1/kv/testkit/a", Some("hello")).unwrap();
        assert_eq!((code, body.trim()), (200, "true"));
        let (code, body) = self.http("GET", "/v1/kv/testkit/a?raw", None).unwrap();
        assert_eq!((code, body.as_str()), (200, "hello"));
        let (code, body) = self.http("GET", "/v1/kv/testkit/?recurse", None).unwrap();
        assert_eq!(code, 200);
        assert!(body.contains("testkit/a"), "{body}");
        let (code, body) = self.http("PUT", "/v1/session/create", Some("{}")).unwrap();
        assert_eq!(code, 200, "{body}");
        let id = body
            .split('"')
            .nth(3)
            .unwrap_or_else(|| panic!("no session ID in {body}"));
        let (code, body) = self
            .http("PUT", &format!("/v1/session/destroy/{id}"), None)
            .unwrap();
        assert_eq!((code, body.trim()), (200, "true"));
    }

    /// A dev agent's store lives in memory.
    fn check_restarted(&self) {
        let (code, _) = self.http("GET", "/v1/kv/testkit/a", None).unwrap();
        assert_eq!(code, 404);
    }
}

single_lifecycle!(
    zk_standalone_start_stop_restart_pause_drop,
    ZkServer,
    "java",
    ruok
);
single_lifecycle!(
    etcd_single_start_stop_restart_pause_drop,
    EtcdServer,
    "etcd",
    get_health
);
single_lifecycle!(
    consul_dev_agent_start_kv_session_stop_restart_drop,
    ConsulServer,
    "consul",
    get_leader
);

/// What only one kind of group is checked for, besides what
/// [`group_survives_losing_its_leader`] checks of every kind.
trait GroupChecks {
    /// Checked once every member serves.
    fn check_serving(&self);

    /// Done before the leader (the index) is killed.
    fn before_kill(&self, _leader: usize) {}

    /// Checked once a new leader (the index) was elected.
    fn check_re_elected(&self, _new_leader: usize) {}

    /// Checked once the old leader (the index) has rejoined.
    fn check_rejoined(&self, _old_leader: usize) {}
}

/// A test that three members serve and elect a leader; the leader is
/// killed, the others elect a new one and serve; the old leader rejoins;
/// drop leaves nothing; with the [`GroupChecks`] of its kind.
macro_rules! group_survives_losing_its_leader {
    ($test:ident, $group:ty) => {
        #[test]
        fn $test() {
            let name = stringify!($group);
            let t = Instant::now();
            let mut group = <$group>::start(3).unwrap_or_else(|e| panic!("start {name}: {e:#}"));
            eprintln!(
                "3-member {name} ready in {:?}: {}",
                t.elapsed(),
                group.connect_string()
            );
            assert_eq!(group.len(), 3);
            assert_eq!(group.endpoints().len(), 3);
            assert_eq!(group.connect_string(), group.endpoints().join(","));
            for i in 0..3 {
                assert!(group.is_serving(i), "{name} member {i} serves");
                assert_eq!(group.endpoint(i), format!("127.0.0.1:{}", group.port(i)));
            }
            group.check_serving();
            eventually(&format!("a {name} leader"), Duration::from_secs(10), || {
                group.leader_index().is_some()
            });
            let leader = group.leader_index().unwrap();
            group.before_kill(leader);

            let t = Instant::now();
            group.kill(leader);
            assert!(!group.is_running(leader));
            assert!(!group.is_serving(leader));
            group
                .wait_for_quorum(Duration::from_secs(30))
                .expect("quorum after losing the leader");
            eprintln!(
                "{name} re-election after killing the leader took {:?}",
                t.elapsed()
            );
            let new_leader = group.leader_index().expect("new leader");
            assert_ne!(new_leader, leader);
            for i in (0..3).filter(|&i| i != leader) {
                assert!(group.is_serving(i), "{name} member {i} serves");
            }
            group.check_re_elected(new_leader);

            let t = Instant::now();
            group.restart(leader).expect("restart old leader");
            eprintln!("{name} member rejoin took {:?}", t.elapsed());
            assert!(group.is_serving(leader));
            group.check_rejoined(leader);

            let pids: Vec<u32> = (0..3).map(|i| group.pid(i).unwrap()).collect();
            let dirs: Vec<PathBuf> = (0..3).map(|i| group.dir(i).to_path_buf()).collect();
            drop(group);
            assert_gone(&pids, &dirs);
        }
    };
}

impl GroupChecks for ZkEnsemble {
    /// One leader at once, the others followers.
    fn check_serving(&self) {
        for i in 0..3 {
            assert_eq!(self.four_letter(i, "ruok").unwrap().trim(), "imok");
            let mode = self.mode(i).expect("mode");
            assert!(mode == "leader" || mode == "follower", "member {i}: {mode}");
        }
        let leaders = (0..3).filter(|&i| self.mode(i).as_deref() == Some("leader"));
        assert_eq!(leaders.count(), 1);
        assert!(self.leader_index().is_some(), "a leader at once");
    }

    fn check_rejoined(&self, old_leader: usize) {
        assert_eq!(self.mode(old_leader).as_deref(), Some("follower"));
    }
}

impl GroupChecks for EtcdCluster {
    fn check_serving(&self) {
        for i in 0..3 {
            assert!(etcd_healthy(self.port(i)));
        }
    }
}

impl GroupChecks for ConsulCluster {
    /// Every member names the same leader, at once.
    fn check_serving(&self) {
        let leaders: Vec<String> = (0..3)
            .map(|i| self.http(i, "GET", "/v1/status/leader", None).unwrap().1)
            .collect();
        assert!(leaders.iter().all(|l| *l == leaders[0]), "{leaders:?}");
        assert!(self.leader_index().is_some(), "a leader at once");
    }

    /// A write through a follower, read back from the new leader below.
    fn before_kill(&self, leader: usize) {
        let follower = (leader + 1) % 3;
        let (code, _) = self
            .http(follower, "PUT", "/v1/kv/testkit/k", Some("v"))
            .unwrap();
        assert_eq!(code, 200);
    }

    /// A consistent read: a new leader answers default-mode reads before it
    /// has applied its predecessor's last entries (seen under load: 404),
    /// and refuses consistent ones ("not ready") until it has.
    fn check_re_elected(&self, new_leader: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let (code, body) = loop {
            let read = self
                .http(new_leader, "GET", "/v1/kv/testkit/k?raw&consistent", None)
                .unwrap();
            if read.0 == 200 || Instant::now() > deadline {
                break read;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!((code, body.as_str()), (200, "v"));
    }
}

group_survives_losing_its_leader!(zk_ensemble_survives_losing_its_leader, ZkEnsemble);
group_survives_losing_its_leader!(etcd_cluster_survives_losing_its_leader, EtcdCluster);
group_survives_losing_its_leader!(consul_cluster_survives_losing_its_leader, ConsulCluster);

/// The message of `$server::start_with` with the default options but
/// `$field: $value`, which must fail.
macro_rules! start_error {
    ($server:ty, $options:ident { $field:ident: $value:expr }) => {{
        let opts = $options {
            $field: $value,
            ..Default::default()
        };
        let started = <$server>::start_with(opts);
        format!("{:#}", started.expect_err(stringify!($field)))
    }};
}

#[test]
fn start_error_names_binary_port_and_log() {
    // Occupy a port, then ask for it: the error must say so clearly.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let in_use = format!("127.0.0.1:{port} is already in use");
    for (program, msg) in [
        (
            "/etcd",
            start_error!(EtcdServer, EtcdOptions { port: Some(port) }),
        ),
        (
            "java",
            start_error!(ZkServer, ZkOptions { port: Some(port) }),
        ),
        (
            "/consul",
            start_error!(ConsulServer, ConsulOptions { port: Some(port) }),
        ),
    ] {
        assert!(msg.contains(program) && msg.contains(&in_use), "{msg}");
    }

    // A server that exits at once: the error shows the end of its log.
    let bad_flag = vec!["--no-such-flag".into()];
    let msg = start_error!(
        EtcdServer,
        EtcdOptions {
            extra_args: bad_flag
        }
    );
    assert!(msg.contains("exited during startup"), "{msg}");
    assert!(msg.contains("last 40 lines of"), "{msg}");
    assert!(msg.contains("no-such-flag"), "{msg}");
    let bad_flag = vec!["-XX:+NoSuchJvmOption".into()];
    let msg = start_error!(
        ZkServer,
        ZkOptions {
            extra_jvm_args: bad_flag
        }
    );
    assert!(
        msg.contains("exited during startup") && msg.contains("NoSuchJvmOption"),
        "{msg}"
    );
}

#[test]
fn shared_servers_are_started_once() {
    let zk = shared_zk();
    assert!(std::ptr::eq(zk, shared_zk()));
    assert_eq!(zk_four_letter(zk.port(), "ruok").unwrap().trim(), "imok");
    let etcd = shared_etcd();
    assert!(std::ptr::eq(etcd, shared_etcd()));
    assert!(etcd_healthy(etcd.port()));
    let consul = shared_consul();
    assert!(std::ptr::eq(consul, shared_consul()));
    assert_eq!(
        consul.http("GET", "/v1/status/leader", None).unwrap().0,
        200
    );
}

/// A child process that is killed when the test ends, even by a panic.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs one `#[ignore]`d test of this binary in a child process.
fn child(test: &str, envs: &[(&str, &str)]) -> KillOnDrop {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        test,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("DLOCK_TESTKIT_CHILD", "1")
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    KillOnDrop(cmd.spawn().unwrap())
}

#[test]
fn servers_die_with_their_process() {
    let mut c = child("child_starts_shared_servers_and_hangs", &[]);
    let out = BufReader::new(c.0.stdout.take().unwrap());
    let mut pids = Vec::new();
    let mut dirs = Vec::new();
    for line in out.lines() {
        let line = line.unwrap();
        // libtest may print "test NAME ... " right before the test's output.
        if let Some(rest) = line.split_once("CHILD-SERVER ").map(|(_, r)| r) {
            let (pid, dir) = rest.split_once(' ').unwrap();
            pids.push(pid.parse::<u32>().unwrap());
            dirs.push(PathBuf::from(dir));
        }
        if line.ends_with("CHILD-READY") {
            break;
        }
    }
    assert_eq!(pids.len(), 3, "child did not report its servers");
    for (&pid, dir) in pids.iter().zip(&dirs) {
        assert!(process_alive(pid) && dir.exists());
    }
    // SIGKILL: no destructor, no atexit; only the watchdogs can clean up.
    c.0.kill().unwrap();
    c.0.wait().unwrap();
    eventually(
        "the child's servers die and their dirs vanish",
        Duration::from_secs(10),
        || pids.iter().all(|&p| !process_alive(p)) && dirs.iter().all(|d| !Path::new(d).exists()),
    );
}

#[test]
#[ignore = "helper run in a child process by servers_die_with_their_process"]
fn child_starts_shared_servers_and_hangs() {
    if std::env::var_os("DLOCK_TESTKIT_CHILD").is_none() {
        return;
    }
    let zk = shared_zk();
    println!("CHILD-SERVER {} {}", zk.pid().unwrap(), zk.dir().display());
    let etcd = shared_etcd();
    println!(
        "CHILD-SERVER {} {}",
        etcd.pid().unwrap(),
        etcd.dir().display()
    );
    let consul = shared_consul();
    println!(
        "CHILD-SERVER {} {}",
        consul.pid().unwrap(),
        consul.dir().display()
    );
    println!("CHILD-READY");
    std::thread::sleep(Duration::from_secs(120));
    panic!("child was not killed");
}

#[test]
fn missing_binaries_give_install_hints() {
    let mut c = child(
        "child_checks_missing_binaries",
        &[
            ("DLOCK_JAVA", "/nonexistent/java"),
            ("DLOCK_ETCD", "/nonexistent/etcd"),
            ("DLOCK_CONSUL", "/nonexistent/consul"),
        ],
    );
    let status = c.0.wait().unwrap();
    assert!(status.success(), "child_checks_missing_binaries failed");
}

#[test]
#[ignore = "helper run in a child process by missing_binaries_give_install_hints"]
fn child_checks_missing_binaries() {
    if std::env::var_os("DLOCK_TESTKIT_CHILD").is_none() {
        return;
    }
    let zk = format!("{:#}", ZkServer::start().expect_err("java is missing"));
    assert!(
        zk.contains("java")
            && zk.contains("apt-get install -y zookeeper")
            && zk.contains("scripts/test.sh"),
        "{zk}"
    );
    let ens = format!("{:#}", ZkEnsemble::start(3).expect_err("java is missing"));
    assert!(ens.contains("apt-get install -y zookeeper"), "{ens}");
    let etcd = format!("{:#}", EtcdServer::start().expect_err("etcd is missing"));
    assert!(
        etcd.contains("etcd") && etcd.contains("apt-get install -y etcd-server"),
        "{etcd}"
    );
    let shared = format!(
        "{:#}",
        dlock_testkit::try_shared_etcd().expect_err("etcd is missing")
    );
    assert!(
        shared.contains("apt-get install -y etcd-server"),
        "{shared}"
    );
    for consul in [
        format!(
            "{:#}",
            ConsulServer::start().expect_err("consul is missing")
        ),
        format!(
            "{:#}",
            ConsulCluster::start(3).expect_err("consul is missing")
        ),
        format!(
            "{:#}",
            dlock_testkit::try_shared_consul().expect_err("consul is missing")
        ),
    ] {
        assert!(
            consul.contains("/nonexistent/consul")
                && consul.contains("scripts/consul.sh get")
                && consul.contains("scripts/test.sh"),
            "{consul}"
        );
    }
    println!("CHILD-OK");
}
