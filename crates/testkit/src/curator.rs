//! Apache Curator 5.4 in a Java process, driven by line commands: the other
//! side of the interoperability tests (see `java/CuratorProbe.java` for the
//! commands). Uses Debian's Curator jars.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use crate::line_probe::LineProbe;

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
    once(&DIR, || compile("CuratorProbe", SOURCE))
}

/// The Curator peer harness `shared/peers/curator/PeerBench.java`,
/// compiled once per process into a directory keyed by its source: pass it
/// as `PEER_BUILD_DIR` to the harness's `run.sh`, which then runs it as it
/// is. (Left to `run.sh`, tests running at once would compile into one
/// directory together, and a JVM could load a class file half written.)
///
/// ```no_run
/// let classes = dlock_testkit::curator_peerbench_classes()?;
/// std::process::Command::new("bash").arg("run.sh").env("PEER_BUILD_DIR", classes);
/// # Ok::<(), anyhow::Error>(())
/// ```
pub fn peerbench_classes() -> Result<&'static Path> {
    static DIR: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    once(&DIR, || {
        let file = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/peers/curator/PeerBench.java");
        let source = std::fs::read_to_string(&file).with_context(|| {
            format!("the Curator peer harness is missing at {}", file.display())
        })?;
        compile("PeerBench", &source)
    })
}

fn once(
    cell: &'static OnceLock<std::result::Result<PathBuf, String>>,
    compile: impl FnOnce() -> Result<PathBuf>,
) -> Result<&'static Path> {
    cell.get_or_init(|| compile().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map(PathBuf::as_path)
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// Compiles the class `name` from `source` against Curator's jars, unless
/// a compile of the same text exists: into a temporary directory, then
/// renamed into place, so a class there is always whole.
fn compile(name: &str, source: &str) -> Result<PathBuf> {
    for jar in JARS {
        let p = format!("/usr/share/java/{jar}.jar");
        ensure!(
            Path::new(&p).exists(),
            "{p} is missing: install Curator with scripts/test.sh (apt-get install libcurator-recipes-java libslf4j-java)"
        );
    }
    let key = source
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
    let class = format!("{name}.class");
    let dir = std::env::temp_dir().join(format!("dlock-curator-{name}-{key:016x}"));
    if dir.join(&class).exists() {
        return Ok(dir);
    }
    let work = tempfile::tempdir()?;
    let file = work.path().join(format!("{name}.java"));
    std::fs::write(&file, source)?;
    let out = work.path().join("classes");
    let status = Command::new("javac")
        .args(["-nowarn", "-cp", &classpath(), "-d"])
        .arg(&out)
        .arg(&file)
        .status()
        .context("javac (Java 17) must be installed")?;
    ensure!(status.success(), "javac failed on {name}");
    // Another process may have won the race; either copy is fine.
    match std::fs::rename(&out, &dir) {
        Ok(()) => Ok(dir),
        Err(_) if dir.join(&class).exists() => Ok(dir),
        Err(e) => Err(e).context(format!("install the compiled {name}")),
    }
}

/// A Java process running Curator, answering one line per command
/// ([`LineProbe`]'s `next_line`, `send`, `ask`).
pub struct CuratorProbe(LineProbe);

impl CuratorProbe {
    /// Starts the probe against `connect` (`host:port[,...]`) and waits until
    /// Curator is connected.
    pub fn start(connect: &str) -> Result<CuratorProbe> {
        let cp = format!("{}:{}", classes()?.display(), classpath());
        let mut command = Command::new("java");
        command.args([
            "-Xss512k",
            "-XX:TieredStopAtLevel=1",
            "-cp",
            &cp,
            "CuratorProbe",
            connect,
        ]);
        // Killed right after its quit, as before: tests that need its
        // session gone close it themselves.
        LineProbe::start("Curator", Duration::ZERO, command).map(CuratorProbe)
    }
}

crate::line_probe::drives_through_line_probe!(CuratorProbe);
