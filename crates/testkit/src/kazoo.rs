//! kazoo 2.8 (Python) in a child process, driven by line commands: the
//! other side of the kazoo interoperability tests (see
//! `python/kazoo_probe.py` for the commands). Uses Debian's `python3-kazoo`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};

/// The probe's source, run in place.
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python/kazoo_probe.py");

/// The Python that has kazoo: `$DLOCK_PYTHON`, else Debian's
/// `/usr/bin/python3` (where `python3-kazoo` installs; a `python3` earlier
/// on `PATH`, such as pyenv's, may lack it).
pub fn python() -> String {
    std::env::var("DLOCK_PYTHON").unwrap_or_else(|_| "/usr/bin/python3".to_string())
}

/// A Python process running kazoo, answering one line per command.
pub struct KazooProbe {
    /// `None` once dropped.
    child: Option<Child>,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl KazooProbe {
    /// Starts the probe against `connect` (`host:port[,...]`) and waits
    /// until kazoo is connected.
    pub fn start(connect: &str) -> Result<KazooProbe> {
        let installed = Command::new(python())
            .args(["-c", "import kazoo.recipe.lock"])
            .status()
            .with_context(|| format!("{} must be installed", python()))?;
        ensure!(
            installed.success(),
            "kazoo is missing from {}: install it with scripts/test.sh (apt-get install python3-kazoo), or name a Python that has it in DLOCK_PYTHON",
            python()
        );
        let mut child = Command::new(python())
            .args(["-u", SCRIPT, connect])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("start {}", python()))?;
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
        let mut probe = KazooProbe {
            child: Some(child),
            stdin,
            lines,
        };
        let ready = probe.next_line(Duration::from_secs(60))?;
        if ready != "ready" {
            bail!("the kazoo probe said {ready:?}");
        }
        Ok(probe)
    }

    /// The next line the probe prints, waiting at most `within`.
    pub fn next_line(&mut self, within: Duration) -> Result<String> {
        self.lines
            .recv_timeout(within)
            .with_context(|| format!("no answer from kazoo within {within:?}"))
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
        ensure!(!answer.starts_with("error"), "kazoo: {command} -> {answer}");
        Ok(answer)
    }
}

impl Drop for KazooProbe {
    fn drop(&mut self) {
        let _ = self.send("quit");
        let Some(mut child) = self.child.take() else {
            return;
        };
        // A clean quit closes kazoo's session at once (its nodes go); a
        // kill would leave them until the session expires. A probe stuck in
        // a blocking acquire never reads the quit: it is killed.
        let pid = child.id() as libc::pid_t;
        let (tx, exited) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = child.wait();
            let _ = tx.send(());
        });
        if exited.recv_timeout(Duration::from_secs(10)).is_err() {
            // SAFETY: kill(2) on our own child, which has not been reaped
            // (the waiter has not returned).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let _ = exited.recv();
        }
    }
}
