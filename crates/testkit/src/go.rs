//! etcd's own Go client recipes (`clientv3/concurrency`) as programs: the
//! other side of the etcd ⇄ Go interoperability tests.
//!
//! Go programs are built offline, in GOPATH mode, against Debian's etcd 3.4
//! sources — exactly as `shared/peers/etcd-go/run.sh` builds its harness
//! (Debian packages `golang-go` and `golang-etcd-server-dev`; `scripts/test.sh`
//! installs them). A missing toolchain or missing sources is an error that
//! says so, never a skip. Each program is built once per source text
//! (into a directory keyed by it, shared by test processes).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use anyhow::{ensure, Context, Result};

/// Where Debian's `golang-etcd-server-dev` puts etcd's Go sources.
const GOCODE: &str = "/usr/share/gocode";

const ELECTSALE: &str = include_str!("../go/electsale.go");

/// The etcd Go peer harness `shared/peers/etcd-go/peerbench.go` (modes
/// `buy`, `mutex`, `election`, ...; see its source), built. Its directory
/// can be moved with `$DLOCK_ETCD_GO_PEER`.
///
/// ```no_run
/// let peerbench = dlock_testkit::etcd_go_peerbench()?;
/// std::process::Command::new(peerbench).args(["buy", "--endpoints", "127.0.0.1:2379"]);
/// # Ok::<(), anyhow::Error>(())
/// ```
pub fn etcd_go_peerbench() -> Result<PathBuf> {
    static BUILT: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    once(&BUILT, || {
        let dir = std::env::var_os("DLOCK_ETCD_GO_PEER").map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/peers/etcd-go"),
            PathBuf::from,
        );
        let file = dir.join("peerbench.go");
        let source = std::fs::read_to_string(&file).with_context(|| {
            format!(
                "the etcd Go peer harness is missing at {} (set DLOCK_ETCD_GO_PEER to its directory)",
                file.display()
            )
        })?;
        build("peerbench", &source)
    })
}

/// `crates/testkit/go/electsale.go`, built: Go `concurrency.Election`
/// candidates that sell one unit of a stock key per term of leadership
/// (see its source for the flags and the line it prints).
///
/// ```no_run
/// let electsale = dlock_testkit::etcd_go_electsale()?;
/// # Ok::<(), anyhow::Error>(())
/// ```
pub fn etcd_go_electsale() -> Result<PathBuf> {
    static BUILT: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    once(&BUILT, || build("electsale", ELECTSALE))
}

fn once(
    cell: &'static OnceLock<std::result::Result<PathBuf, String>>,
    build: impl FnOnce() -> Result<PathBuf>,
) -> Result<PathBuf> {
    // One Go build at a time in this process: they share a build cache and
    // two at once only slow each other down.
    static BUILDING: Mutex<()> = Mutex::new(());
    cell.get_or_init(|| {
        let _one = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
        build().map_err(|e| format!("{e:#}"))
    })
    .clone()
    .map_err(|e| anyhow::anyhow!("{e}"))
}

/// Builds `source` (one Go file of package main) as `name`, unless a build
/// of the same text exists.
fn build(name: &str, source: &str) -> Result<PathBuf> {
    let install =
        "install Go and etcd's Go sources: apt-get install golang-go golang-etcd-server-dev \
                   (scripts/test.sh does)";
    let clientv3 = Path::new(GOCODE).join("src/go.etcd.io/etcd/clientv3/concurrency");
    ensure!(
        clientv3.is_dir(),
        "{} is missing: {install}",
        clientv3.display()
    );
    let key = source
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
    let tmp = std::env::temp_dir();
    let dir = tmp.join(format!("dlock-go-{name}-{key:016x}"));
    let bin = dir.join(name);
    if bin.exists() {
        return Ok(bin);
    }
    let work = tempfile::tempdir()?;
    let file = work.path().join(format!("{name}.go"));
    std::fs::write(&file, source)?;
    let out = work.path().join("out");
    std::fs::create_dir(&out)?;
    let output = Command::new("go")
        .current_dir(work.path())
        .env("GO111MODULE", "off")
        .env(
            "GOPATH",
            format!("{}:{GOCODE}", work.path().join("gopath").display()),
        )
        .env("GOPROXY", "off")
        .env("GOFLAGS", "")
        .env("GOCACHE", tmp.join("dlock-go-cache"))
        .args(["build", "-o"])
        .arg(out.join(name))
        .arg(&file)
        .output()
        .with_context(|| format!("cannot run `go`: {install}"))?;
    ensure!(
        output.status.success(),
        "go build {name}.go failed ({install}):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Another process may have won the race; either copy is fine.
    match std::fs::rename(&out, &dir) {
        Ok(()) => Ok(bin),
        Err(_) if bin.exists() => Ok(bin),
        Err(e) => Err(e).with_context(|| format!("install the built {name} at {}", dir.display())),
    }
}
