//! Running a command while holding something: a lock, leases, leadership.
//!
//! Shared by `dlock lock`, `read-lock`, `write-lock`, `semaphore` and
//! `elect`: start the command with the fencing token in its environment,
//! watch the session, and stop the command if what we hold is lost.

use std::io::IsTerminal;
use std::process::ExitStatus;
use std::time::Duration;

use anyhow::{Context, Result};
use dlock::store::SessionState;
use dlock::{FencingToken, Session};
use tokio::process::Command;

use crate::exit::Exit;

/// How a held thing is given back.
pub type Release = std::pin::Pin<Box<dyn std::future::Future<Output = dlock::Result<()>> + Send>>;

/// What the command runs under.
pub struct Holding {
    /// The fencing token to hand to the command.
    pub token: FencingToken,
    /// Our node (or key).
    pub node: String,
    /// Gives it back.
    pub release: Release,
    /// Resolves if the recipe itself declares the hold over (leadership
    /// cancelled by its error policy), besides the session watch.
    pub ended: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
}

impl Holding {
    /// A hold that ends only with its session.
    pub fn new(token: FencingToken, node: String, release: Release) -> Self {
        Holding {
            token,
            node,
            release,
            ended: None,
        }
    }
}

/// Options shared by the commands that run something.
#[derive(Debug, Clone, clap::Args)]
pub struct RunOptions {
    /// How long to wait to acquire (default: forever).
    #[arg(long, value_parser = crate::duration::parse)]
    pub timeout: Option<Duration>,
    /// After asking the command to stop (SIGTERM), how long to wait before
    /// killing it (SIGKILL).
    #[arg(long, default_value = "5s", value_parser = crate::duration::parse)]
    pub grace: Duration,
    /// Count a suspended connection as a loss once it lasts this long
    /// (default: only a lost session counts; it is declared after the
    /// session timeout).
    #[arg(long, value_parser = crate::duration::parse)]
    pub suspend_grace: Option<Duration>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Runs `options.command` while `holding`, then gives it back. Returns the
/// process exit code: the command's own, or [`Exit::Lost`] if what we held
/// was lost while it ran.
pub async fn run_holding(
    session: &Session,
    endpoint: &str,
    holding: Holding,
    options: &RunOptions,
) -> Result<u8> {
    let held_session = session.session_id();
    let (program, args) = options.command.split_first().expect("clap requires CMD");
    let mut child = Command::new(program)
        .args(args)
        .env("DLOCK_FENCE", holding.token.to_string())
        .env("DLOCK_NODE", &holding.node)
        .env("DLOCK_ENDPOINT", endpoint)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                Exit::NotFound
            } else {
                Exit::CannotRun
            };
            anyhow::Error::new(code.with(format!("cannot run {program}: {e}")))
        })?;
    let pid = child.id().context("the command has no pid")? as libc::pid_t;
    let mut signals = Signals::new()?;
    let ended = async {
        match holding.ended {
            Some(ended) => ended.await,
            None => std::future::pending().await,
        }
    };
    let outcome = tokio::select! {
        status = child.wait() => Outcome::Exited(status?),
        () = lost(session, held_session, options.suspend_grace) => Outcome::Lost,
        () = ended => Outcome::Lost,
        signal = signals.next() => Outcome::Signalled(signal),
    };
    let code = match outcome {
        Outcome::Exited(status) => exit_code(status),
        Outcome::Lost => {
            eprintln!("dlock: lost {} — stopping the command", holding.node);
            stop(&mut child, pid, options.grace).await;
            Exit::Lost as u8
        }
        Outcome::Signalled(signal) => {
            // Pass it on and let the command finish; then release.
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(pid, signal) };
            exit_code(child.wait().await?)
        }
    };
    match holding.release.await {
        Ok(()) | Err(dlock::Error::Lost { .. }) => {}
        Err(e) => eprintln!("dlock: releasing {}: {e}", holding.node),
    }
    Ok(code)
}

enum Outcome {
    Exited(ExitStatus),
    Lost,
    Signalled(libc::c_int),
}

/// The shell's convention: the exit code, or 128 + the signal that ended it.
fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128u8.saturating_add(signal as u8),
        _ => Exit::Internal as u8,
    }
}

/// SIGTERM, then SIGKILL after `grace`.
async fn stop(child: &mut tokio::process::Child, pid: libc::pid_t, grace: Duration) {
    // SAFETY: kill(2) on our own child's pid, which we have not reaped yet.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}

/// Resolves when the session that acquired is over, or (with a grace) when
/// the connection has been suspended for longer than the grace.
pub async fn lost(
    session: &Session,
    acquired_in: dlock::store::SessionId,
    suspend_grace: Option<Duration>,
) {
    let mut status = session.watch_status();
    loop {
        let now = *status.borrow_and_update();
        if now.session_id != acquired_in
            || matches!(now.state, SessionState::Lost | SessionState::Closed)
        {
            return;
        }
        match (now.state, suspend_grace) {
            (SessionState::Suspended, Some(grace)) => {
                if tokio::time::timeout(grace, status.changed()).await.is_err() {
                    return;
                }
            }
            _ => {
                if status.changed().await.is_err() {
                    return;
                }
            }
        }
    }
}

/// SIGINT and SIGTERM sent to dlock, to pass on to the command.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
        })
    }

    async fn next(&mut self) -> libc::c_int {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
        }
    }
}

/// While `acquire` runs, shows on a terminal who holds `label` and our
/// place in the queue (our node is the one of our session).
pub async fn waiting<T>(
    label: &str,
    session: &Session,
    participants: impl Fn()
        -> futures::future::BoxFuture<'static, dlock::Result<Vec<dlock::Participant>>>,
    acquire: impl std::future::Future<Output = T>,
) -> T {
    if !std::io::stderr().is_terminal() {
        return acquire.await;
    }
    tokio::pin!(acquire);
    let mut shown = String::new();
    loop {
        tokio::select! {
            result = &mut acquire => {
                if !shown.is_empty() {
                    eprint!("\r\x1b[K");
                }
                return result;
            }
            () = tokio::time::sleep(Duration::from_millis(300)) => {
                if let Ok(queue) = participants().await {
                    let holders: Vec<String> = queue.iter().filter(|p| p.holds).map(describe).collect();
                    let place = queue.iter().position(|p| p.session == session.session_id());
                    let place = place.map_or("joining".to_string(), |i| format!("we are #{} of {}", i + 1, queue.len()));
                    let line = format!("waiting for {label}: held by {} — {place}", holders.join(", "));
                    if line != shown {
                        eprint!("\r\x1b[K{line}");
                        shown = line;
                    }
                }
            }
        }
    }
}

fn describe(p: &dlock::Participant) -> String {
    let data = String::from_utf8_lossy(&p.data);
    format!(
        "{} (session {:#x}{})",
        p.node.rsplit('/').next().unwrap_or(&p.node),
        p.session,
        if data.is_empty() {
            String::new()
        } else {
            format!(", {data}")
        }
    )
}
