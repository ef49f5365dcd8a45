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

#[test]
fn zk_standalone_start_stop_restart_pause_drop() {
    let t = Instant::now();
    let mut zk = ZkServer::start().expect("start ZooKeeper");
    eprintln!(
        "standalone ZooKeeper ready in {:?} at {}",
        t.elapsed(),
        zk.connect_string()
    );
    assert_eq!(zk.connect_string(), format!("127.0.0.1:{}", zk.port()));
    assert_eq!(zk.four_letter("ruok").unwrap().trim(), "imok");
    let srvr = zk.four_letter("srvr").unwrap();
    assert!(srvr.contains("Mode: standalone"), "{srvr}");
    let conf = zk.four_letter("conf").unwrap();
    assert!(conf.contains("maxSessionTimeout=60000"), "{conf}");
    assert!(conf.contains("tickTime=500"), "{conf}");
    let pid = zk.pid().expect("pid");
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    assert_eq!(comm.trim(), "java", "pid must be the JVM, not the watchdog");

    // pause: the port still accepts, but nothing answers.
    zk.pause();
    assert!(zk_four_letter(zk.port(), "ruok")
        .map(|s| s.is_empty())
        .unwrap_or(true));
    zk.resume();
    eventually(
        "ZooKeeper answers after resume",
        Duration::from_secs(10),
        || zk.is_serving(),
    );

    // stop / restart on the same port with the same data dir.
    let port = zk.port();
    zk.stop();
    assert!(!zk.is_running());
    assert!(!process_alive(pid));
    assert!(zk.dir().join("data").is_dir(), "stop keeps the data dir");
    assert!(
        zk_four_letter(port, "ruok").is_err(),
        "nothing listens after stop"
    );
    let t = Instant::now();
    zk.restart().expect("restart");
    eprintln!("ZooKeeper restart in {:?}", t.elapsed());
    assert_eq!(zk.port(), port);
    assert!(zk.is_serving());

    let (pid, dir) = (zk.pid().unwrap(), zk.dir().to_path_buf());
    drop(zk);
    assert_gone(&[pid], &[dir]);
}

#[test]
fn zk_ensemble_survives_losing_its_leader() {
    let t = Instant::now();
    let mut ens = ZkEnsemble::start(3).expect("start ensemble");
    eprintln!(
        "3-node ZooKeeper ensemble ready in {:?}: {}",
        t.elapsed(),
        ens.connect_string()
    );
    assert_eq!(ens.len(), 3);
    assert_eq!(ens.connect_string().split(',').count(), 3);
    for i in 0..3 {
        assert_eq!(ens.four_letter(i, "ruok").unwrap().trim(), "imok");
        let mode = ens.mode(i).expect("mode");
        assert!(mode == "leader" || mode == "follower", "member {i}: {mode}");
    }
    let leader = ens.leader_index().expect("a leader");
    assert_eq!(
        (0..3)
            .filter(|&i| ens.mode(i).as_deref() == Some("leader"))
            .count(),
        1
    );

    let t = Instant::now();
    ens.kill(leader);
    assert!(!ens.is_running(leader));
    ens.wait_for_quorum(Duration::from_secs(30))
        .expect("quorum after losing the leader");
    eprintln!(
        "ZooKeeper re-election after killing the leader took {:?}",
        t.elapsed()
    );
    let new_leader = ens.leader_index().expect("new leader");
    assert_ne!(new_leader, leader);
    for i in (0..3).filter(|&i| i != leader) {
        assert!(ens.is_serving(i), "member {i} serves");
    }

    let t = Instant::now();
    ens.restart(leader).expect("restart old leader");
    eprintln!("ZooKeeper member rejoin took {:?}", t.elapsed());
    assert_eq!(ens.mode(leader).as_deref(), Some("follower"));

    let pids: Vec<u32> = (0..3).map(|i| ens.pid(i).unwrap()).collect();
    let dirs: Vec<PathBuf> = (0..3).map(|i| ens.dir(i).to_path_buf()).collect();
    drop(ens);
    assert_gone(&pids, &dirs);
}

#[test]
fn etcd_single_start_stop_restart_pause_drop() {
    let t = Instant::now();
    let mut etcd = EtcdServer::start().expect("start etcd");
    eprintln!("etcd ready in {:?} at {}", t.elapsed(), etcd.endpoint());
    assert_eq!(etcd.endpoint(), format!("127.0.0.1:{}", etcd.port()));
    assert_eq!(etcd.url(), format!("http://127.0.0.1:{}", etcd.port()));
    let (code, body) = http_get(etcd.port(), "/health").unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("\"health\":\"true\""), "{body}");
    let pid = etcd.pid().unwrap();
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .unwrap()
            .trim(),
        "etcd"
    );

    etcd.pause();
    assert!(!etcd.is_healthy());
    etcd.resume();
    eventually("etcd healthy after resume", Duration::from_secs(10), || {
        etcd.is_healthy()
    });

    let port = etcd.port();
    etcd.stop();
    assert!(!etcd.is_running());
    assert!(!process_alive(pid));
    assert!(http_get(port, "/health").is_err());
    let t = Instant::now();
    etcd.restart().expect("restart etcd");
    eprintln!("etcd restart in {:?}", t.elapsed());
    assert!(etcd.is_healthy());

    let (pid, dir) = (etcd.pid().unwrap(), etcd.dir().to_path_buf());
    drop(etcd);
    assert_gone(&[pid], &[dir]);
}

#[test]
fn etcd_cluster_survives_losing_its_leader() {
    let t = Instant::now();
    let mut c = EtcdCluster::start(3).expect("start etcd cluster");
    eprintln!(
        "3-member etcd cluster ready in {:?}: {:?}",
        t.elapsed(),
        c.endpoints()
    );
    assert_eq!(c.endpoints().len(), 3);
    for i in 0..3 {
        assert!(c.is_healthy(i));
        assert!(etcd_healthy(c.port(i)));
    }
    eventually("an etcd leader", Duration::from_secs(10), || {
        c.leader_index().is_some()
    });
    let leader = c.leader_index().unwrap();

    let t = Instant::now();
    c.kill(leader);
    c.wait_for_quorum(Duration::from_secs(30))
        .expect("quorum after losing the leader");
    eprintln!(
        "etcd re-election after killing the leader took {:?}",
        t.elapsed()
    );
    assert_ne!(c.leader_index(), Some(leader));
    assert!(!c.is_healthy(leader));

    c.restart(leader).expect("restart old leader");
    assert!(c.is_healthy(leader));

    let pids: Vec<u32> = (0..3).map(|i| c.pid(i).unwrap()).collect();
    let dirs: Vec<PathBuf> = (0..3).map(|i| c.dir(i).to_path_buf()).collect();
    drop(c);
    assert_gone(&pids, &dirs);
}

#[test]
fn consul_dev_agent_start_kv_session_stop_restart_drop() {
    let t = Instant::now();
    let mut consul = ConsulServer::start().expect("start Consul");
    eprintln!(
        "Consul dev agent ready in {:?} at {}",
        t.elapsed(),
        consul.endpoint()
    );
    assert_eq!(consul.endpoint(), format!("127.0.0.1:{}", consul.port()));
    assert_eq!(consul.url(), format!("http://127.0.0.1:{}", consul.port()));
    let pid = consul.pid().unwrap();
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .unwrap()
            .trim(),
        "consul"
    );

    let (code, body) = consul
        .http("PUT", "/v1/kv/testkit/a", Some("hello"))
        .unwrap();
    assert_eq!((code, body.trim()), (200, "true"));
    let (code, body) = consul.http("GET", "/v1/kv/testkit/a?raw", None).unwrap();
    assert_eq!((code, body.as_str()), (200, "hello"));
    let (code, body) = consul.http("GET", "/v1/kv/testkit/?recurse", None).unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("testkit/a"), "{body}");
    let (code, body) = consul
        .http("PUT", "/v1/session/create", Some("{}"))
        .unwrap();
    assert_eq!(code, 200, "{body}");
    let id = body
        .split('"')
        .nth(3)
        .unwrap_or_else(|| panic!("no session ID in {body}"));
    let (code, body) = consul
        .http("PUT", &format!("/v1/session/destroy/{id}"), None)
        .unwrap();
    assert_eq!((code, body.trim()), (200, "true"));

    consul.pause();
    assert!(consul.http("GET", "/v1/status/leader", None).is_err());
    consul.resume();

    let port = consul.port();
    consul.stop();
    assert!(!consul.is_running());
    assert!(!process_alive(pid));
    assert!(http_get(port, "/v1/status/leader").is_err());
    let t = Instant::now();
    consul.restart().expect("restart Consul");
    eprintln!("Consul dev agent restart in {:?}", t.elapsed());
    // A dev agent's store lives in memory.
    let (code, _) = consul.http("GET", "/v1/kv/testkit/a", None).unwrap();
    assert_eq!(code, 404);

    let (pid, dir) = (consul.pid().unwrap(), consul.dir().to_path_buf());
    drop(consul);
    assert_gone(&[pid], &[dir]);
}

#[test]
fn consul_cluster_survives_losing_its_leader() {
    let t = Instant::now();
    let mut c = ConsulCluster::start(3).expect("start Consul cluster");
    eprintln!(
        "3-server Consul cluster ready in {:?}: {}",
        t.elapsed(),
        c.connect_string()
    );
    assert_eq!(c.len(), 3);
    assert_eq!(c.connect_string(), c.endpoints().join(","));
    let leaders: Vec<String> = (0..3)
        .map(|i| c.http(i, "GET", "/v1/status/leader", None).unwrap().1)
        .collect();
    assert!(leaders.iter().all(|l| *l == leaders[0]), "{leaders:?}");
    let leader = c.leader_index().expect("a leader");
    let follower = (leader + 1) % 3;
    let (code, _) = c
        .http(follower, "PUT", "/v1/kv/testkit/k", Some("v"))
        .unwrap();
    assert_eq!(code, 200);

    let t = Instant::now();
    c.kill(leader);
    assert!(!c.is_running(leader));
    c.wait_for_quorum(Duration::from_secs(30))
        .expect("quorum after losing the leader");
    eprintln!(
        "Consul re-election after killing the leader took {:?}",
        t.elapsed()
    );
    let new_leader = c.leader_index().expect("new leader");
    assert_ne!(new_leader, leader);
    // A consistent read: a new leader answers default-mode reads before it
    // has applied its predecessor's last entries (seen under load: 404),
    // and refuses consistent ones ("not ready") until it has.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (code, body) = loop {
        let read = c
            .http(new_leader, "GET", "/v1/kv/testkit/k?raw&consistent", None)
            .unwrap();
        if read.0 == 200 || Instant::now() > deadline {
            break read;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!((code, body.as_str()), (200, "v"));

    let t = Instant::now();
    c.restart(leader).expect("restart old leader");
    eprintln!("Consul member rejoin took {:?}", t.elapsed());
    assert!(c.knows_leader(leader));

    let pids: Vec<u32> = (0..3).map(|i| c.pid(i).unwrap()).collect();
    let dirs: Vec<PathBuf> = (0..3).map(|i| c.dir(i).to_path_buf()).collect();
    drop(c);
    assert_gone(&pids, &dirs);
}

#[test]
fn start_error_names_binary_port_and_log() {
    // Occupy a port, then ask for it: the error must say so clearly.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let opts = EtcdOptions {
        port: Some(port),
        ..Default::default()
    };
    let msg = format!(
        "{:#}",
        EtcdServer::start_with(opts).expect_err("port is taken")
    );
    assert!(msg.contains("/etcd"), "{msg}");
    assert!(
        msg.contains(&format!("127.0.0.1:{port} is already in use")),
        "{msg}"
    );
    let opts = ZkOptions {
        port: Some(port),
        ..Default::default()
    };
    let msg = format!(
        "{:#}",
        ZkServer::start_with(opts).expect_err("port is taken")
    );
    assert!(
        msg.contains("java") && msg.contains(&format!("127.0.0.1:{port} is already in use")),
        "{msg}"
    );
    let opts = ConsulOptions {
        port: Some(port),
        ..Default::default()
    };
    let msg = format!(
        "{:#}",
        ConsulServer::start_with(opts).expect_err("port is taken")
    );
    assert!(
        msg.contains("/consul") && msg.contains(&format!("127.0.0.1:{port} is already in use")),
        "{msg}"
    );

    // A server that exits at once: the error shows the end of its log.
    let opts = EtcdOptions {
        extra_args: vec!["--no-such-flag".into()],
        ..Default::default()
    };
    let msg = format!("{:#}", EtcdServer::start_with(opts).expect_err("bad flag"));
    assert!(msg.contains("exited during startup"), "{msg}");
    assert!(msg.contains("last 40 lines of"), "{msg}");
    assert!(msg.contains("no-such-flag"), "{msg}");
    let opts = ZkOptions {
        extra_jvm_args: vec!["-XX:+NoSuchJvmOption".into()],
        ..Default::default()
    };
    let msg = format!(
        "{:#}",
        ZkServer::start_with(opts).expect_err("bad JVM flag")
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
