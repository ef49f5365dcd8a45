//! Apache Curator 5.4 in a Java process, driven by line commands: the other
//! side of the interoperability tests (see `java/CuratorProbe.java` for the
//! commands). Uses Debian's Curator jars.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{mpsc, OnceLock};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};

const JARS: &[&str] = &[
    "curator-recipes",
    "curator-framework",
    "curator-client",
    "zookeeper",
    "zookeeper-jute",
    "guava",
    "slf4j-api",
    "slf4j-nop",
    "netty-handler",
    "netty-common",
    "netty-buffer",
    "netty-transport",
    "netty-codec",
    "netty-resolver",
    "netty-transport-native-epoll",
    "netty-transport-native-unix-common",
];

const SOURCE: &str = include_str!("../java/CuratorProbe.java");

/// The class path of Debian's Curator jars.
pub fn classpath() -> String {
    JARS.iter()
        .map(|j| format!("/usr/share/java/{j}.jar"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Compiles the probe once per process (into a directory keyed by its
/// source, so processes share it).
fn classes() -> Result<&'static Path> {
    static DIR: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| compile().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map(PathBuf::as_path)
        .map_err(|e| anyhow::anyhow!("{e}"))
}

fn compile() -> Result<PathBuf> {
    for jar in JARS {
        let p = format!("/usr/share/java/{jar}.jar");
        ensure!(
            Path::new(&p).exists(),
            "{p} is missing: install Curator with scripts/test.sh (apt-get install libcurator-recipes-java libslf4j-java)"
        );
    }
    let key = SOURCE
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
    let dir = std::env::temp_dir().join(format!("dlock-curator-probe-{key:016x}"));
    if dir.join("CuratorProbe.class").exists() {
        return Ok(dir);
    }
    let work = tempfile::tempdir()?;
    let source = work.path().join("CuratorProbe.java");
    std::fs::write(&source, SOURCE)?;
    let out = work.path().join("classes");
    let status = Command::new("javac")
        .args(["-nowarn", "-cp", &classpath(), "-d"])
        .arg(&out)
        .arg(&source)
        .status()
        .context("javac (Java 17) must be installed")?;
    ensure!(status.success(), "javac failed on the Curator probe");
    // Another process may have won the race; either copy is fine.
    match std::fs::rename(&out, &dir) {
        Ok(()) => Ok(dir),
        Err(_) if dir.join("CuratorProbe.class").exists() => Ok(dir),
        Err(e) => Err(e).context("install the compiled probe"),
    }
}

/// A Java process running Curator, answering one line per command.
pub struct CuratorProbe {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl CuratorProbe {
    /// Starts the probe against `connect` (`host:port[,...]`) and waits until
    /// Curator is connected.
    pub fn start(connect: &str) -> Result<CuratorProbe> {
        let cp = format!("{}:{}", classes()?.display(), classpath());
        let mut child = Command::new("java")
            .args([
                "-Xss512k",
                "-XX:TieredStopAtLevel=1",
                "-cp",
                &cp,
                "CuratorProbe",
                connect,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("start java")?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut probe = CuratorProbe {
            child,
            stdin,
            lines,
        };
        let ready = probe.next_line(Duration::from_secs(60))?;
        if ready != "ready" {
            bail!("the Curator probe said {ready:?}");
        }
        Ok(probe)
    }

    /// The next line Curator prints, waiting at most `within`.
    pub fn next_line(&mut self, within: Duration) -> Result<String> {
        self.lines
            .recv_timeout(within)
            .with_context(|| format!("no answer from Curator within {within:?}"))
    }

    /// Sends a command without waiting for its answer.
    pub fn send(&mut self, command: &str) -> Result<()> {
        writeln!(self.stdin, "{command}")?;
        Ok(self.stdin.flush()?)
    }

    /// Sends a command and returns its answer (an `error ...` answer is an
    /// error).
    pub fn ask(&mut self, command: &str) -> Result<String> {
        self.send(command)?;
        let answer = self.next_line(Duration::from_secs(30))?;
        ensure!(
            !answer.starts_with("error"),
            "Curator: {command} -> {answer}"
        );
        Ok(answer)
    }
}

impl Drop for CuratorProbe {
    fn drop(&mut self) {
        let _ = self.send("quit");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
