//! A server process under a `/bin/sh` watchdog that dies with us.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

use anyhow::{anyhow, Context, Result};

/// The watchdog. Arguments: `$1` log file, `$2` directory to remove when the
/// owner dies, then the server command line.
///
/// It starts the server in the background (stdin from /dev/null, output to the
/// log), prints the server's pid, and blocks reading its own stdin — a pipe
/// whose write end only the owning Rust process holds. A line `keep` means an
/// orderly stop: kill the server, keep the directory. End of file (the owner
/// died, or dropped the pipe) or a fatal signal: kill the server and remove the
/// directory.
const WATCHDOG: &str = r#"
log="$1"; dir="$2"; shift 2
"$@" </dev/null >>"$log" 2>&1 &
p=$!
trap 'kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; rm -rf -- "$dir"; exit 1' INT TERM HUP
echo "$p"
cmd=
read -r cmd
kill -9 "$p" 2>/dev/null
wait "$p" 2>/dev/null
if [ "$cmd" != keep ]; then rm -rf -- "$dir"; fi
"#;

/// One running server process plus its watchdog.
#[derive(Debug)]
pub(crate) struct Supervised {
    watchdog: Child,
    stdin: Option<ChildStdin>,
    pid: u32,
}

impl Supervised {
    /// Starts `program args..` with output appended to `log`, working directory
    /// `cwd`; `cleanup_dir` is removed by the watchdog if this process dies.
    pub(crate) fn spawn(
        program: &Path,
        args: &[OsString],
        env: &[(String, String)],
        log: &Path,
        cwd: &Path,
        cleanup_dir: &Path,
    ) -> Result<Supervised> {
        let log_file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("cannot open log file {}", log.display()))?;
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(WATCHDOG)
            .arg("dlock-testkit-watchdog")
            .arg(log)
            .arg(cleanup_dir)
            .arg(program)
            .args(args)
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file));
        // etcd reads ETCD_* variables as flags; don't let the caller's leak in.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ETCD_") {
                cmd.env_remove(k);
            }
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut watchdog = cmd
            .spawn()
            .context("cannot spawn /bin/sh (watchdog for the server)")?;
        let stdin = watchdog.stdin.take();
        let stdout = watchdog.stdout.take().expect("piped stdout");
        let mut line = String::new();
        let read = BufReader::new(stdout).read_line(&mut line);
        let pid = match read.ok().and_then(|_| line.trim().parse::<u32>().ok()) {
            Some(pid) => pid,
            None => {
                let _ = watchdog.kill();
                let _ = watchdog.wait();
                return Err(anyhow!(
                    "the /bin/sh watchdog did not report the server pid (got {line:?})"
                ));
            }
        };
        Ok(Supervised {
            watchdog,
            stdin,
            pid,
        })
    }

    /// The server's own pid (not the watchdog's).
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// True while the server process exists, is our watchdog's child and has
    /// not exited (a zombie counts as exited).
    pub(crate) fn is_running(&self) -> bool {
        if self.stdin.is_none() {
            return false;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) else {
            return false;
        };
        // "pid (comm) state ppid ..." — comm may contain spaces and parens.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            return false;
        };
        let mut it = rest.split_whitespace();
        let state = it.next().unwrap_or("");
        let ppid = it.next().and_then(|p| p.parse::<u32>().ok()).unwrap_or(0);
        ppid == self.watchdog.id() && state != "Z" && state != "X"
    }

    /// Sends `sig` to the server if it is running.
    pub(crate) fn signal(&self, sig: libc::c_int) -> Result<()> {
        if !self.is_running() {
            return Err(anyhow!("server process {} is not running", self.pid));
        }
        // SAFETY: plain kill(2) on a pid verified above to be our watchdog's child.
        let rc = unsafe { libc::kill(self.pid as libc::pid_t, sig) };
        if rc != 0 {
            return Err(anyhow!(
                "kill({}, {sig}): {}",
                self.pid,
                std::io::Error::last_os_error()
            ));
        }
        if sig == libc::SIGSTOP {
            // kill(2) returns before every thread has stopped; wait until they
            // have, so that "paused" really means nothing answers any more.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while !all_threads_stopped(self.pid) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        Ok(())
    }

    /// Kills the server (`SIGKILL`) and waits until it and the watchdog are
    /// gone. The cleanup directory is kept. Idempotent.
    pub(crate) fn stop(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"keep\n");
            let _ = stdin.flush();
            drop(stdin);
            // The watchdog kills and reaps the server, then exits.
            let _ = self.watchdog.wait();
        }
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop();
    }
}

/// True if every thread of `pid` is in state `T` (stopped) or gone: after
/// `kill(pid, SIGSTOP)` returns, threads may still run for a moment, so a
/// test that needs the process frozen waits for this.
///
/// ```no_run
/// let child = std::process::Command::new("sleep").arg("60").spawn()?;
/// unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) };
/// while !dlock_testkit::all_threads_stopped(child.id()) {
///     std::thread::yield_now();
/// }
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat"))
            .ok()
            .and_then(|s| {
                s.rfind(')')
                    .map(|i| s[i + 1..].trim_start().starts_with(['T', 't', 'Z', 'X']))
            })
            .unwrap_or(true)
    })
}

/// The last `n` lines of a log file (or a note that it cannot be read).
pub(crate) fn log_tail(path: &Path, n: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            let start = lines.len().saturating_sub(n);
            let mut out = String::new();
            for l in &lines[start..] {
                if l.len() > 600 {
                    let mut cut = 600;
                    while !l.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    out.push_str(&l[..cut]);
                    out.push_str(" ...");
                } else {
                    out.push_str(l);
                }
                out.push('\n');
            }
            if out.is_empty() {
                out.push_str("(log is empty)\n");
            }
            out
        }
        Err(e) => format!("(cannot read log {}: {e})\n", path.display()),
    }
}

/// Finds an executable: first an explicit environment variable, then `PATH`,
/// then fixed fallbacks.
pub(crate) fn find_executable(env_var: &str, name: &str, fallbacks: &[PathBuf]) -> Option<PathBuf> {
    if let Some(v) = std::env::var_os(env_var).filter(|v| !v.is_empty()) {
        let p = PathBuf::from(v);
        return is_executable(&p).then_some(p);
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if is_executable(&p) {
                return Some(p);
            }
        }
    }
    fallbacks.iter().find(|p| is_executable(p)).cloned()
}

pub(crate) fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// A server's fixed launch description plus its (possibly stopped) process and
/// its temporary directory. Restarting relaunches the same command line in the
/// same directory.
#[derive(Debug)]
pub(crate) struct Node {
    // Declared before `dir` so the process is killed before the directory goes.
    proc: Option<Supervised>,
    dir: tempfile::TempDir,
    log: PathBuf,
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(String, String)>,
}

impl Node {
    /// A node in a fresh temporary directory named `dlock-<prefix>-XXXX`; the
    /// command line is built by `args` from that directory.
    pub(crate) fn new(
        prefix: &str,
        program: PathBuf,
        env: Vec<(String, String)>,
        args: impl FnOnce(&Path) -> Result<Vec<OsString>>,
    ) -> Result<Node> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("dlock-{prefix}-"))
            .tempdir()
            .context("cannot create a temporary directory")?;
        let log = dir.path().join("server.log");
        let args = args(dir.path())?;
        Ok(Node {
            proc: None,
            dir,
            log,
            program,
            args,
            env,
        })
    }

    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn log(&self) -> &Path {
        &self.log
    }

    /// Starts the process (stopping a previous one first).
    pub(crate) fn launch(&mut self) -> Result<()> {
        self.stop();
        let _ = writeln!(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)?,
            "==== dlock-testkit: starting {} ====",
            self.program.display()
        );
        let p = Supervised::spawn(
            &self.program,
            &self.args,
            &self.env,
            &self.log,
            self.dir.path(),
            self.dir.path(),
        )?;
        self.proc = Some(p);
        Ok(())
    }

    /// Kills the process (if any) and waits for it. Keeps the directory.
    pub(crate) fn stop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.stop();
        }
    }

    pub(crate) fn is_running(&self) -> bool {
        self.proc.as_ref().is_some_and(|p| p.is_running())
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.proc
            .as_ref()
            .filter(|p| p.is_running())
            .map(|p| p.pid())
    }

    pub(crate) fn signal(&self, sig: libc::c_int) -> Result<()> {
        match &self.proc {
            Some(p) => p.signal(sig),
            None => Err(anyhow!("server is stopped")),
        }
    }

    /// Polls `ready` every 50 ms until it holds; fails early if the process
    /// exits, or at `deadline`. The error is a short reason (no log).
    pub(crate) fn wait_until(
        &self,
        deadline: std::time::Instant,
        mut ready: impl FnMut() -> bool,
    ) -> Result<(), String> {
        loop {
            if !self.is_running() {
                return Err("exited during startup".to_string());
            }
            if ready() {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                return Err("did not become ready before the startup timeout".to_string());
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// The last `n` lines of the log.
    pub(crate) fn log_tail(&self, n: usize) -> String {
        log_tail(&self.log, n)
    }

    /// True if the log says a port could not be bound.
    pub(crate) fn log_says_address_in_use(&self) -> bool {
        std::fs::read(&self.log)
            .map(|b| {
                let t = String::from_utf8_lossy(&b);
                t.contains("Address already in use") || t.contains("address already in use")
            })
            .unwrap_or(false)
    }
}
