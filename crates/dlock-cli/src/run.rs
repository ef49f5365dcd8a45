//! Running a command while holding something: a lock, leases, leadership.
//!
//! Shared by `dlock lock`, `read-lock`, `write-lock`, `semaphore` and
//! `elect`: start the command with the fencing token in its environment,
//! watch the session, and stop the command if what we hold is lost.

use std::future::Future;
use std::io::IsTerminal;
use std::pin::Pin;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use dlock::store::SessionState;
use dlock::{Acquisition, FencingToken, Hold, Session};
use tokio::process::Command;
use tokio::sync::Notify;

use crate::exit::Exit;

/// How a held thing is given back.
pub type Release = Pin<Box<dyn Future<Output = dlock::Result<()>> + Send>>;

/// What the command runs under: the acquisitions of one acquire (a lock,
/// a semaphore's leases, a term of leadership) and how to give them back.
/// Every recipe's hold is an [`Acquisition`], so one code path serves all.
pub struct Holding {
    acquisitions: Vec<Acquisition>,
    release: Release,
    /// Resolves if the recipe itself declares the hold over (leadership
    /// cancelled by its error policy), besides the session watch.
    ended: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// Told when someone asks for the hold (`--revocable`), and how long
    /// the command then gets between SIGTERM and SIGKILL.
    revocation: Option<(Arc<Notify>, Duration)>,
}

impl Holding {
    /// Holds of any recipe, given back in turn (the first error is kept).
    pub fn of(holds: Vec<Box<dyn Hold>>) -> Self {
        let acquisitions = holds.iter().map(|h| h.acquisition().clone()).collect();
        let release = Box::pin(async move {
            let mut first_error = None;
            for hold in holds {
                if let Err(e) = hold.release().await {
                    first_error.get_or_insert(e);
                }
            }
            first_error.map_or(Ok(()), Err)
        });
        Holding {
            acquisitions,
            release,
            ended: None,
            revocation: None,
        }
    }

    /// One acquisition that `release` gives back, and that is over early
    /// when `ended` resolves.
    pub fn ending(
        acquisition: Acquisition,
        release: Release,
        ended: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        Holding {
            acquisitions: vec![acquisition],
            release,
            ended: Some(Box::pin(ended)),
            revocation: None,
        }
    }

    /// Stops the command when `requested` is notified (a revocation
    /// request reached one of our nodes), giving it `grace` after SIGTERM.
    pub fn revocable(mut self, requested: Arc<Notify>, grace: Duration) -> Self {
        self.revocation = Some((requested, grace));
        self
    }

    /// The token to hand on: the largest, so that a fenced resource that
    /// has seen it refuses every older holder of any of these.
    fn token(&self) -> FencingToken {
        self.acquisitions
            .iter()
            .map(Acquisition::token)
            .max()
            .unwrap_or_default()
    }

    /// Our nodes, comma-separated.
    fn nodes(&self) -> String {
        let nodes: Vec<&str> = self.acquisitions.iter().map(Acquisition::node).collect();
        nodes.join(",")
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
    /// The command and its arguments, after `--`. It runs with DLOCK_FENCE
    /// (the fencing token), DLOCK_NODE (our node, or nodes, comma-separated)
    /// and DLOCK_ENDPOINT (the endpoint without user and password, which are
    /// not passed on: a nested dlock needs its credentials from elsewhere).
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Revocation and a hold limit, for the commands that take a lock or
/// leases.
#[derive(Debug, Clone, clap::Args)]
pub struct HoldOptions {
    /// Listen for revocation requests (`dlock revoke NODE`, Curator's
    /// Revoker): on one, stop CMD — SIGTERM, then SIGKILL after GRACE
    /// (default: --grace) — release, and exit 68. Revocable nodes carry no
    /// data, as in Curator.
    #[arg(long, value_name = "GRACE", num_args = 0..=1, require_equals = true,
          value_parser = crate::duration::parse)]
    pub revocable: Option<Option<Duration>>,
    /// Hold at most this long: then the library itself releases (even if
    /// dlock is stuck), CMD is stopped as on a loss (SIGTERM, SIGKILL after
    /// --grace) and dlock exits 66; a waiter gets in at once.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse_positive)]
    pub max_hold: Option<Duration>,
}

/// What the commands that take a lock or leases share: how to hold it
/// (revocation, a hold limit) and the command to run under it.
#[derive(Debug, Clone, clap::Args)]
pub struct HeldRun {
    #[command(flatten)]
    pub hold: HoldOptions,
    #[command(flatten)]
    pub run: RunOptions,
}

impl HeldRun {
    /// The limits `--revocable` and `--max-hold` put on one run's holds.
    pub fn limits(&self) -> Limits {
        Limits {
            revocation: self
                .hold
                .revocable
                .map(|grace| (Arc::new(Notify::new()), grace.unwrap_or(self.run.grace))),
            max_hold: self.hold.max_hold,
        }
    }
}

/// The limits on one run's holds: with `--revocable`, what a revocation
/// request notifies and the grace after SIGTERM; with `--max-hold`, how
/// long a hold may last.
#[derive(Debug, Clone)]
pub struct Limits {
    revocation: Option<(Arc<Notify>, Duration)>,
    max_hold: Option<Duration>,
}

impl Limits {
    /// `recipe` made revocable if `--revocable` asked (listening with a
    /// [`Listener`] that stops the command) and limited by `--max-hold`,
    /// each by the recipe's own builder method, e.g.
    /// `limits.apply(mutex, Mutex::revocable, Mutex::with_max_hold)`.
    pub fn apply<R>(
        &self,
        mut recipe: R,
        revocable: impl FnOnce(R, Listener) -> R,
        limited: impl FnOnce(R, Duration) -> R,
    ) -> R {
        if let Some((requested, _)) = &self.revocation {
            recipe = revocable(recipe, listener(requested));
        }
        if let Some(max_hold) = self.max_hold {
            recipe = limited(recipe, max_hold);
        }
        recipe
    }

    /// `holding`, told of revocation requests if `--revocable` asked.
    pub fn hold(&self, holding: Holding) -> Holding {
        match &self.revocation {
            Some((requested, grace)) => holding.revocable(requested.clone(), *grace),
            None => holding,
        }
    }
}

/// A revocation listener, as the recipes' `revocable` takes it.
pub type Listener = Box<dyn Fn(&str) + Send + Sync>;

/// A revocation listener that notifies `requested`.
fn listener(requested: &Arc<Notify>) -> Listener {
    let requested = requested.clone();
    Box::new(move |node: &str| {
        eprintln!("dlock: revocation requested for {node}");
        requested.notify_one();
    })
}

/// How a run ended.
#[derive(Debug, Clone, Copy)]
pub struct Ran {
    /// The exit code: the command's own, [`Exit::Lost`] if what we held was
    /// lost while it ran, 128 + N if signal N stopped dlock while waiting.
    pub code: u8,
    /// Lost, or stopped by a signal: nothing more should be run (an
    /// `elect --requeue` ends).
    pub last: bool,
}

/// Acquires and runs commands under the hold — the one path of `lock`,
/// `read-lock`, `write-lock`, `semaphore` and `elect`.
pub struct Runner<'a> {
    session: &'a Session,
    /// `DLOCK_ENDPOINT` for the command: without credentials.
    endpoint: String,
    options: &'a RunOptions,
    signals: Signals,
}

impl<'a> Runner<'a> {
    /// A runner for `options.command` on `session`, whose endpoint is
    /// `endpoint` (its credentials are not passed on). Takes over SIGINT
    /// and SIGTERM from now on.
    pub fn new(
        session: &'a Session,
        endpoint: &dlock::Endpoint,
        options: &'a RunOptions,
    ) -> Result<Self> {
        Ok(Runner {
            session,
            endpoint: endpoint.without_credentials().to_string(),
            options,
            signals: Signals::new()?,
        })
    }

    /// Waits for `acquire` (showing the queue at `path` on a terminal),
    /// then runs the command under what it acquired and gives that back.
    /// `acquire` fails with [`dlock::Error::Timeout`] when `--timeout`
    /// passed. A SIGINT or SIGTERM while waiting drops the acquire (which
    /// removes its node) and ends the run with 128 + the signal.
    pub async fn run(
        &mut self,
        path: &str,
        acquire: impl Future<Output = dlock::Result<Holding>>,
    ) -> Result<Ran> {
        let acquired = tokio::select! {
            acquired = waiting(path, self.session, acquire) => acquired,
            signal = self.signals.next() => {
                return Ok(Ran { code: 128u8.saturating_add(signal as u8), last: true });
            }
        };
        let holding = acquired.map_err(|e| match e {
            dlock::Error::Timeout(t) => Exit::Timeout
                .with(format!("could not acquire within {t:?}"))
                .into(),
            other => anyhow::Error::new(other),
        })?;
        self.hold(holding).await
    }

    /// Runs the command while `holding`, then gives it back.
    async fn hold(&mut self, holding: Holding) -> Result<Ran> {
        let options = self.options;
        let nodes = holding.nodes();
        let held_session = holding
            .acquisitions
            .first()
            .map_or(self.session.session_id(), Acquisition::session_id);
        let (program, args) = options.command.split_first().expect("clap requires CMD");
        // Asked for while we waited: CMD would be stopped as it starts.
        let asked = holding.revocation.as_ref();
        if asked.is_some_and(|(requested, _)| {
            futures::FutureExt::now_or_never(requested.notified()).is_some()
        }) {
            eprintln!("dlock: revocation requested for {nodes} before CMD ran — not running it");
            let code = match self.give_back(holding.release, &nodes).await {
                GaveBack::Interrupted(signal) => 128u8.saturating_add(signal as u8),
                _ => Exit::Revoked as u8,
            };
            return Ok(Ran { code, last: true });
        }
        let token = holding.token().to_string();
        let env = [
            ("DLOCK_FENCE", token.as_str()),
            ("DLOCK_NODE", &nodes),
            ("DLOCK_ENDPOINT", &self.endpoint),
        ];
        let (mut child, cmd) = spawn_cmd(program, args, &env)?;
        let ended = async {
            match holding.ended {
                Some(ended) => ended.await,
                None => std::future::pending().await,
            }
        };
        let revoked = async {
            match &holding.revocation {
                Some((requested, _)) => requested.notified().await,
                None => std::future::pending().await,
            }
        };
        // Any of our holds taken away: revoked by force, or past --max-hold.
        let taken = async {
            if holding.acquisitions.is_empty() {
                return std::future::pending().await;
            }
            futures::future::select_all(holding.acquisitions.iter().map(|a| Box::pin(a.lost())))
                .await;
        };
        let session_lost = lost(self.session, held_session, options.suspend_grace);
        tokio::pin!(ended, revoked, taken, session_lost);
        // A signal is passed on and CMD may finish; the hold is still
        // watched meanwhile, and a second signal stops CMD at once.
        let mut forwarded = false;
        let outcome = loop {
            tokio::select! {
                status = child.wait() => break Outcome::Exited(status?),
                () = &mut session_lost => break Outcome::Lost,
                () = &mut ended => break Outcome::Lost,
                () = &mut taken => break Outcome::Lost,
                () = &mut revoked, if !forwarded => break Outcome::Revoked,
                signal = self.signals.next() => {
                    if forwarded {
                        break Outcome::Signalled(signal);
                    }
                    pass_on(signal, cmd.group, |signal| cmd.signal(signal));
                    forwarded = true;
                }
            }
        };
        let exited = matches!(outcome, Outcome::Exited(_));
        let mut ran = match outcome {
            Outcome::Exited(status) => Ran {
                code: exit_code(status),
                last: forwarded,
            },
            Outcome::Lost => {
                eprintln!("dlock: lost {nodes} — stopping the command");
                stop(&mut child, cmd, options.grace).await;
                Ran {
                    code: Exit::Lost as u8,
                    last: true,
                }
            }
            Outcome::Revoked => {
                eprintln!("dlock: revocation requested for {nodes} — stopping the command");
                let grace = holding.revocation.as_ref().map_or(options.grace, |r| r.1);
                stop(&mut child, cmd, grace).await;
                Ran {
                    code: Exit::Revoked as u8,
                    last: true,
                }
            }
            Outcome::Signalled(signal) => {
                eprintln!("dlock: a second signal — stopping the command now");
                stop(&mut child, cmd, Duration::ZERO).await;
                Ran {
                    code: 128u8.saturating_add(signal as u8),
                    last: true,
                }
            }
        };
        match self.give_back(holding.release, &nodes).await {
            // Lost while CMD ran, unseen until it ended (the two raced, or
            // the server ended the session before this client knew): its
            // run was not protected, whatever it answered.
            GaveBack::Lost if exited => {
                eprintln!(
                    "dlock: {nodes} was lost before the command ended — its run was not protected"
                );
                ran = Ran {
                    code: Exit::Lost as u8,
                    last: true,
                };
            }
            GaveBack::Interrupted(signal) => {
                ran = Ran {
                    code: 128u8.saturating_add(signal as u8),
                    last: true,
                };
            }
            _ => {}
        }
        Ok(ran)
    }

    /// Gives back what was held, saying why if it fails (a hold already
    /// lost was said to be, or is the caller's to say). A signal meanwhile
    /// (a double barrier's leave waiting on a hung peer, a release on an
    /// unreachable server) gives up: the session's close takes the rest.
    async fn give_back(&mut self, release: Release, nodes: &str) -> GaveBack {
        let released = tokio::select! {
            released = release => released,
            signal = self.signals.next() => {
                eprintln!("dlock: {} while giving back {nodes} — leaving it to the session's close", signal_name(signal));
                return GaveBack::Interrupted(signal);
            }
        };
        match released {
            Err(dlock::Error::Lost { .. }) => GaveBack::Lost,
            Err(e) => {
                eprintln!("dlock: releasing {nodes}: {e}");
                GaveBack::Done
            }
            Ok(()) => GaveBack::Done,
        }
    }
}

/// How giving back what was held went.
enum GaveBack {
    /// Released, or failing otherwise than lost (said so).
    Done,
    /// It had been lost.
    Lost,
    /// A signal came first.
    Interrupted(libc::c_int),
}

/// Whom CMD's signals reach. Without a controlling terminal (a service,
/// cron, a container without one) CMD leads a process group of its own,
/// so that stopping CMD stops what it started too. With one, CMD stays in
/// dlock's group, so that the terminal's job control — Ctrl-Z and `fg`,
/// reads of the terminal — works on dlock and CMD together, as on any
/// job: there only CMD itself is signalled.
#[derive(Clone, Copy)]
pub(crate) struct Target {
    pub(crate) pid: libc::pid_t,
    pub(crate) group: bool,
}

impl Target {
    pub(crate) fn signal(self, signal: libc::c_int) {
        let whom = if self.group { -self.pid } else { self.pid };
        // SAFETY: kill(2) on our child, or on the group it leads, which
        // lives while any of its processes does (so its id is not reused).
        unsafe { libc::kill(whom, signal) };
    }

    /// Whether CMD's group has processes left (CMD itself reaped or not).
    fn group_lives(self) -> bool {
        // SAFETY: signal 0 only checks.
        self.group && unsafe { libc::kill(-self.pid, 0) } == 0
    }
}

/// Starts CMD (`program` with `args`, `env` added): in a process group of
/// its own when dlock has no terminal (see [`Target`]), and told SIGTERM
/// if dlock dies. A program that cannot be run is its exit code's error.
pub(crate) fn spawn_cmd(
    program: &str,
    args: &[String],
    env: &[(&str, &str)],
) -> Result<(tokio::process::Child, Target)> {
    let group = !has_terminal();
    let mut command = Command::new(program);
    command
        .args(args)
        .envs(env.iter().copied())
        .kill_on_drop(true);
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: `prepare` makes only async-signal-safe calls.
    unsafe { command.pre_exec(move || prepare(parent, group)) };
    let child = command.spawn().map_err(|e| {
        let code = if e.kind() == std::io::ErrorKind::NotFound {
            Exit::NotFound
        } else {
            Exit::CannotRun
        };
        anyhow::Error::new(code.with(format!("cannot run {program}: {e}")))
    })?;
    let pid = child.id().context("the command has no pid")? as libc::pid_t;
    Ok((child, Target { pid, group }))
}

/// Whether dlock has a controlling terminal.
fn has_terminal() -> bool {
    std::fs::File::open("/dev/tty").is_ok()
}

/// In the child, before CMD runs: a process group of its own if `group`,
/// and SIGTERM if dlock dies without stopping it (`kill -9`): a lock's
/// session outlives dlock by up to its timeout, and CMD must not run on
/// past it.
fn prepare(parent: libc::pid_t, group: bool) -> std::io::Result<()> {
    let failed = |done: libc::c_int| match done {
        -1 => Err(std::io::Error::last_os_error()),
        _ => Ok(()),
    };
    // SAFETY: setpgid, prctl and getppid are async-signal-safe.
    unsafe {
        if group {
            failed(libc::setpgid(0, 0))?;
        }
        #[cfg(target_os = "linux")]
        failed(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM))?;
        // dlock died before the line above: nobody would stop CMD.
        if libc::getppid() != parent {
            return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
        }
    }
    Ok(())
}

enum Outcome {
    Exited(ExitStatus),
    Lost,
    Revoked,
    Signalled(libc::c_int),
}

/// The shell's convention: the exit code, or 128 + the signal that ended it.
pub(crate) fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128u8.saturating_add(signal as u8),
        _ => Exit::Internal as u8,
    }
}

/// SIGTERM to CMD (its group), then SIGKILL after `grace` (at once if
/// none) to whatever of it is left: CMD gone first, what it started still
/// gets the rest of the grace, then SIGKILL.
pub(crate) async fn stop(child: &mut tokio::process::Child, cmd: Target, grace: Duration) {
    if !grace.is_zero() {
        // A grace too long to count is for ever, in effect.
        let grace = grace.min(crate::duration::CENTURY);
        let deadline = tokio::time::Instant::now() + grace;
        cmd.signal(libc::SIGTERM);
        let exited = tokio::time::timeout_at(deadline, child.wait())
            .await
            .is_ok();
        if exited && !cmd.group_lives() {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
    cmd.signal(libc::SIGKILL);
    let _ = child.wait().await;
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
                // Past the grace, or the session gone with its channel.
                if !matches!(
                    tokio::time::timeout(grace, status.changed()).await,
                    Ok(Ok(()))
                ) {
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

/// Passes `signal`, which dlock caught, on to CMD with `send` — unless
/// the terminal sent it (Ctrl-C's SIGINT, Ctrl-\\'s SIGQUIT) and CMD is in
/// dlock's process group (`!own_group`): the terminal signals its whole
/// foreground group, so CMD has it already, and a second copy is what many
/// programs take for "stop now, skip the clean-up". A hang-up is always
/// passed on: the terminal sends it to the session's leader alone, which
/// dlock is when a shell `exec`s it (`ssh -t host dlock ...`).
pub(crate) fn pass_on(signal: libc::c_int, own_group: bool, send: impl FnOnce(libc::c_int)) {
    let name = signal_name(signal);
    let typed = matches!(signal, libc::SIGINT | libc::SIGQUIT);
    if !own_group && typed && Signals::sent_by_the_kernel(signal) {
        eprintln!("dlock: the command got {name} from the terminal — waiting for it to end (a second signal stops it now)");
    } else {
        send(signal);
        eprintln!("dlock: passed {name} on to the command — waiting for it to end (a second signal stops it now)");
    }
}

fn signal_name(signal: libc::c_int) -> &'static str {
    match signal {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        libc::SIGQUIT => "SIGQUIT",
        _ => "a signal",
    }
}

/// The `si_code` of the last delivery of each signal, by number: who sent
/// it (the kernel, for a terminal's signals; a process, for `kill`).
/// Linux's codes; elsewhere nothing is noted, and every signal is passed
/// on.
#[cfg(any(target_os = "linux", target_os = "android"))]
static LAST_SENDER: [std::sync::atomic::AtomicI32; 32] =
    [const { std::sync::atomic::AtomicI32::new(libc::SI_USER) }; 32];

/// SIGINT and SIGTERM sent to dlock (to pass on to a command, or to stop):
/// [`next`](Signals::next) is whichever comes first.
pub(crate) struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
}

impl Signals {
    pub(crate) fn new() -> Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        // Before tokio's handlers, which run in the order registered: the
        // sender is noted by the time a signal is received.
        #[cfg(any(target_os = "linux", target_os = "android"))]
        static NOTE_SENDERS: std::sync::Once = std::sync::Once::new();
        #[cfg(any(target_os = "linux", target_os = "android"))]
        NOTE_SENDERS.call_once(|| {
            for number in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
                let note = move |info: &libc::siginfo_t| {
                    LAST_SENDER[number as usize]
                        .store(info.si_code, std::sync::atomic::Ordering::Relaxed);
                };
                // SAFETY: the action only stores into an atomic, which is
                // async-signal-safe. Failing, the sender stays unknown and
                // every signal is passed on, as before.
                let _ = unsafe { signal_hook_registry::register_sigaction(number, note) };
            }
        });
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    /// Whether the last `signal` came from the kernel, as a terminal's
    /// signals do (`si_code` `SI_KERNEL`), rather than from `kill`.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    pub(crate) fn sent_by_the_kernel(signal: libc::c_int) -> bool {
        let noted = LAST_SENDER.get(signal as usize);
        noted.is_some_and(|n| n.load(std::sync::atomic::Ordering::Relaxed) == libc::SI_KERNEL)
    }

    /// Not known here: every signal is passed on.
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    pub(crate) fn sent_by_the_kernel(_signal: libc::c_int) -> bool {
        false
    }

    pub(crate) async fn next(&mut self) -> libc::c_int {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
            _ = self.hangup.recv() => libc::SIGHUP,
            _ = self.quit.recv() => libc::SIGQUIT,
        }
    }
}

/// While `acquire` runs, shows on a terminal who holds `path` and our
/// place in the queue (our node is the one of our session), as
/// [`dlock::inspect`] sees them.
async fn waiting<T>(path: &str, session: &Session, acquire: impl Future<Output = T>) -> T {
    if !std::io::stderr().is_terminal() {
        return acquire.await;
    }
    tokio::pin!(acquire);
    let mut shown = String::new();
    // A look runs beside the acquire, never in its way: the acquire (and
    // its deadline) is polled while a look waits out an outage.
    let mut look = None;
    loop {
        let idle = look.is_none();
        let looking = async {
            match look.as_mut() {
                Some(look) => look.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            result = &mut acquire => {
                if !shown.is_empty() {
                    eprint!("\r\x1b[K");
                }
                return result;
            }
            () = tokio::time::sleep(Duration::from_millis(300)), if idle => {
                look = Some(Box::pin(dlock::inspect(session, path)));
            }
            seen = looking => {
                look = None;
                if let Ok(seen) = seen {
                    let queue = seen.participants;
                    let holders: Vec<String> = queue
                        .iter()
                        .filter(|p| p.role == dlock::Role::Holder)
                        .map(describe)
                        .collect();
                    let place = queue.iter().position(|p| p.session == session.session_id());
                    let place = place.map_or("joining".to_string(), |i| format!("we are #{} of {}", i + 1, queue.len()));
                    let line = format!("waiting for {path}: held by {} — {place}", holders.join(", "));
                    if line != shown {
                        eprint!("\r\x1b[K{line}");
                        shown = line;
                    }
                }
            }
        }
    }
}

fn describe(p: &dlock::Contender) -> String {
    let data = crate::commands::printable(&p.data);
    format!(
        "{} (session {:#x}{}{})",
        dlock::path::node_name(&p.node),
        p.session,
        if data.is_empty() {
            String::new()
        } else {
            format!(", {data}")
        },
        p.foreign
            .map_or(String::new(), |f| format!(", {}", f.as_str()))
    )
}
