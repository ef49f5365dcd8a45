//! The life of a recipe that keeps something running in the background
//! ([`LeaderLatch`](super::leader_latch::LeaderLatch),
//! [`LeaderSelector`](super::leader_selector::LeaderSelector),
//! [`SharedValue`](super::shared_value::SharedValue) and the
//! [`SharedCount`](super::shared_count::SharedCount) over it,
//! [`ChildrenCache`](super::children_cache::ChildrenCache),
//! [`GroupMember`](super::group_member::GroupMember)): made, started once,
//! closed once — Curator's `State` of each, with its "cannot be started more
//! than once" and "already closed" refusals, kept in one place so that they
//! cannot drift apart.

use std::future::Future;
use std::sync::{Mutex as StdMutex, MutexGuard as StdMutexGuard};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::session::Session;

/// Where a recipe is in its life (Curator's `State` of `LeaderLatch`,
/// `LeaderSelector` and `SharedCount`). A recipe only ever moves forward:
/// latent, started, closed.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// use dlock::recipes::lifecycle::State;
/// let session = dlock::connect("embedded").await?;
/// let latch = dlock::LeaderLatch::new(&session, "/doc/lifecycle")?;
/// assert_eq!(latch.state(), State::Latent);
/// latch.start()?;
/// assert_eq!(latch.state(), State::Started);
/// latch.close().await?;
/// assert_eq!(latch.state(), dlock::LatchState::Closed); // the same type
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Made, not started.
    Latent,
    /// Started: running in the background.
    Started,
    /// Closed (or its session was): nothing runs any more.
    Closed,
}

/// A recipe's state and its background task.
#[derive(Debug)]
pub(crate) struct Lifecycle {
    /// What the recipe is called in errors ("latch", "shared count", ...).
    what: &'static str,
    state: watch::Sender<State>,
    task: StdMutex<Option<JoinHandle<()>>>,
}

/// How long a background task pauses after failed attempts in a row: the
/// session's retry policy, growing up to the ninth failure.
#[derive(Debug, Default)]
pub(crate) struct Backoff(u32);

impl Backoff {
    /// A success: the next failure pauses the least again.
    pub fn reset(&mut self) {
        self.0 = 0;
    }

    /// Waits out the pause for one more failure; `false` if `stop` came
    /// first.
    pub async fn pause(&mut self, session: &Session, stop: impl Future) -> bool {
        let pause = session.options().retry.sleep_for(self.0.min(8));
        self.0 += 1;
        tokio::select! {
            biased;
            _ = stop => false,
            _ = tokio::time::sleep(pause) => true,
        }
    }
}

/// Locks a std mutex, ignoring poison: what the recipes guard with one is
/// left consistent at every await-free step, so a panic elsewhere does not
/// make it unusable.
pub(crate) fn lock<T>(mutex: &StdMutex<T>) -> StdMutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Lifecycle {
    pub fn new(what: &'static str) -> Self {
        Lifecycle {
            what,
            state: watch::channel(State::Latent).0,
            task: StdMutex::new(None),
        }
    }

    pub fn state(&self) -> State {
        *self.state.borrow()
    }

    pub fn subscribe(&self) -> watch::Receiver<State> {
        self.state.subscribe()
    }

    /// Latent → started, for a start that reads or makes something first:
    /// [`Begun::launch`] ends it. Dropped before (the start's future
    /// cancelled midway), the begin is taken back, so that starting may be
    /// tried again. Curator refuses a second start, even after a close, and
    /// so do we.
    pub fn begin_start(&self, path: &str) -> Result<Begun<'_>> {
        self.begin(path)?;
        Ok(Begun {
            lifecycle: self,
            launched: false,
            on_cancel: None,
        })
    }

    /// Latent → started. Curator refuses a second start, even after a
    /// close, and so do we.
    fn begin(&self, path: &str) -> Result<()> {
        let started = self.state.send_if_modified(|state| {
            let latent = *state == State::Latent;
            if latent {
                *state = State::Started;
            }
            latent
        });
        match started {
            true => Ok(()),
            false => Err(Error::InvalidArgument(format!(
                "the {} at {path} cannot be started more than once",
                self.what
            ))),
        }
    }

    /// Takes back a [`begin`](Self::begin) whose start failed before
    /// anything ran, so that starting may be tried again — unless it was
    /// closed meanwhile.
    fn unbegin(&self) {
        self.state.send_if_modified(|state| {
            let started = *state == State::Started;
            if started {
                *state = State::Latent;
            }
            started
        });
    }

    /// Begins and runs `task` on the current tokio runtime. The runtime is
    /// looked for first: without one, the recipe stays latent.
    pub fn start(&self, path: &str, task: impl Future<Output = ()> + Send + 'static) -> Result<()> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::InvalidArgument(format!("a {} runs on a tokio runtime", self.what))
        })?;
        // Begun and kept under the task's lock: a close from another thread
        // between the two would find no task to stop and wait for, and
        // return while the task still made its node.
        let mut slot = lock(&self.task);
        self.begin(path)?;
        *slot = Some(runtime.spawn(task));
        Ok(())
    }

    /// Keeps `task` as the recipe's background task, unless the recipe was
    /// closed since it began: then the task is handed back.
    pub fn attach(&self, task: JoinHandle<()>) -> std::result::Result<(), JoinHandle<()>> {
        // Checked under the task's lock: a close either sees the task or
        // happened before this check.
        let mut slot = lock(&self.task);
        if self.state() != State::Started {
            return Err(task);
        }
        *slot = Some(task);
        Ok(())
    }

    /// Closed (see [`force_close`](Self::force_close)), its task aborted —
    /// for a drop, which cannot wait.
    pub fn abort(&self) {
        if let Some(task) = self.force_close() {
            task.abort();
        }
    }

    /// Closed, its task aborted and waited for: nothing runs when it
    /// returns. Idempotent.
    pub async fn stop(&self) {
        if let Some(task) = self.force_close() {
            task.abort();
            let _ = task.await;
        }
    }

    /// Started → closed, handing back the task to stop.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if never started; [`Error::Closed`] if
    /// closed already.
    pub fn close(&self, path: &str) -> Result<Option<JoinHandle<()>>> {
        let mut was = State::Started;
        self.state.send_if_modified(|state| {
            was = *state;
            let started = *state == State::Started;
            if started {
                *state = State::Closed;
            }
            started
        });
        self.check(was, path)?;
        Ok(lock(&self.task).take())
    }

    /// Closed, whatever the state was (an idempotent close; a session that
    /// closed under the recipe), handing back the task, if any.
    pub fn force_close(&self) -> Option<JoinHandle<()>> {
        self.state
            .send_if_modified(|state| std::mem::replace(state, State::Closed) != State::Closed);
        lock(&self.task).take()
    }

    /// `Ok` while started.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] before the start; [`Error::Closed`] after
    /// the close.
    pub fn ensure_started(&self, path: &str) -> Result<()> {
        self.check(self.state(), path)
    }

    /// As [`ensure_started`](Self::ensure_started), for a `state` seen
    /// before.
    pub fn check(&self, state: State, path: &str) -> Result<()> {
        match state {
            State::Started => Ok(()),
            State::Closed => Err(Error::Closed),
            State::Latent => Err(Error::InvalidArgument(format!(
                "the {} at {path} was not started",
                self.what
            ))),
        }
    }

    /// Waits for a task that was told to stop to end by itself, so that its
    /// clean-up (deleting a node, say) is done when the close returns.
    pub async fn join(task: Option<JoinHandle<()>>, path: &str) {
        if let Some(task) = task {
            if let Err(e) = task.await {
                tracing::error!(%path, error = %e, "a recipe's background task failed");
            }
        }
    }
}

/// A start begun ([`Lifecycle::begin_start`]): taken back if dropped
/// before it [`launch`](Self::launch)es.
pub(crate) struct Begun<'a> {
    lifecycle: &'a Lifecycle,
    launched: bool,
    /// Undoes what the start made before it was cancelled.
    on_cancel: Option<Box<dyn FnOnce() + Send + 'a>>,
}

impl<'a> Begun<'a> {
    /// Runs `undo` if the start is cancelled before it launches (a start
    /// that failed cleans up after itself).
    pub fn on_cancel(mut self, undo: impl FnOnce() + Send + 'a) -> Self {
        self.on_cancel = Some(Box::new(undo));
        self
    }

    /// Ends the start: on `begun` (what the start read or made first), runs
    /// `task` as the background task — stopped again if closed meanwhile;
    /// on a failure, takes the begin back so that starting may be tried
    /// again.
    pub fn launch<T, F>(mut self, begun: Result<T>, task: impl FnOnce(T) -> F) -> Result<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let value = begun.inspect_err(|_| self.on_cancel = None)?;
        self.launched = true;
        let attached = self.lifecycle.attach(tokio::spawn(task(value)));
        attached.map_err(|task| {
            task.abort();
            Error::Closed
        })
    }
}

impl Drop for Begun<'_> {
    fn drop(&mut self) {
        if !self.launched {
            self.lifecycle.unbegin();
            if let Some(undo) = self.on_cancel.take() {
                undo();
            }
        }
    }
}
