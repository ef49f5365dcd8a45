//! A peer in a child process, driven by line commands on stdin and
//! answering one line each on stdout: the shape of the Curator (Java) and
//! kazoo (Python) probes.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};

/// A running probe: `next_line`, `send` and `ask`. Dropping it sends
/// `quit`, waits out the peer's grace, then kills it.
pub struct LineProbe {
    /// The peer's name in errors ("Curator", "kazoo").
    peer: &'static str,
    /// How long a `quit` may take before the child is killed.
    quit_grace: Duration,
    /// `None` once dropped.
    child: Option<Child>,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl LineProbe {
    /// Starts `command` with piped stdin/stdout and waits (at most 60 s)
    /// for its first line, which must be `ready`.
    pub(crate) fn start(
        peer: &'static str,
        quit_grace: Duration,
        mut command: Command,
    ) -> Result<LineProbe> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("start the {peer} probe ({command:?})"))?;
        let stdin = child.stdin.take().expect("piped");
        let lines = line_channel(child.stdout.take().expect("piped"));
        let mut probe = LineProbe {
            peer,
            quit_grace,
            child: Some(child),
            stdin,
            lines,
        };
        let ready = probe.next_line(Duration::from_secs(60))?;
        if ready != "ready" {
            bail!("the {peer} probe said {ready:?}");
        }
        Ok(probe)
    }

    /// The next line the peer prints, waiting at most `within`.
    pub fn next_line(&mut self, within: Duration) -> Result<String> {
        let peer = self.peer;
        self.lines
            .recv_timeout(within)
            .with_context(|| format!("no answer from {peer} within {within:?}"))
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
            "{}: {command} -> {answer}",
            self.peer
        );
        Ok(answer)
    }
}

/// The lines `output` gives (a child's stdout, say), as they come, read
/// on a thread of their own; the channel ends with the output.
///
/// ```
/// let echo = std::process::Command::new("echo")
///     .arg("hello")
///     .stdout(std::process::Stdio::piped())
///     .spawn()
///     .unwrap();
/// let lines = dlock_testkit::line_channel(echo.stdout.unwrap());
/// assert_eq!(lines.recv().unwrap(), "hello");
/// ```
pub fn line_channel(output: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(output).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    lines
}

impl Drop for LineProbe {
    fn drop(&mut self) {
        let _ = self.send("quit");
        let Some(mut child) = self.child.take() else {
            return;
        };
        // A clean quit closes the peer's session at once (its nodes go); a
        // kill leaves them until the session expires. A probe stuck in a
        // blocking call never reads the quit: after the grace it is killed.
        let pid = child.id() as libc::pid_t;
        let (tx, exited) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = child.wait();
            let _ = tx.send(());
        });
        if exited.recv_timeout(self.quit_grace).is_err() {
            // SAFETY: kill(2) on our own child, which has not been reaped
            // (the waiter has not returned).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let _ = exited.recv();
        }
    }
}

/// A probe type that wraps a [`LineProbe`] (`struct Probe(LineProbe)`) is
/// driven through it: `Deref` and `DerefMut` to the `LineProbe`.
macro_rules! drives_through_line_probe {
    ($probe:ty) => {
        impl std::ops::Deref for $probe {
            type Target = $crate::line_probe::LineProbe;
            fn deref(&self) -> &$crate::line_probe::LineProbe {
                &self.0
            }
        }

        impl std::ops::DerefMut for $probe {
            fn deref_mut(&mut self) -> &mut $crate::line_probe::LineProbe {
                &mut self.0
            }
        }
    };
}
pub(crate) use drives_through_line_probe;
