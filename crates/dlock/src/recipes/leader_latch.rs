//! [`LeaderLatch`]: leader election by latch — Curator's `LeaderLatch`, node
//! for node, with an epoch (fencing token) on every term of leadership.
//!
//! Layout (a compatibility contract with Curator 5.4): each candidate creates
//! one `<path>/_c_<uuid>-latch-<seq>` ephemeral-sequential node (parents as
//! containers) holding its id as UTF-8 (an empty id stores no data); the
//! candidate whose node comes first in sequence order leads, every other one
//! watches only its predecessor. dlock and Java latches on one path elect one
//! leader among them, and each side lists the other's ids (see
//! [`election`](super::election) for the listing).
//!
//! A candidate waits its turn in the same wait queue as a mutex's waiters
//! (the first node leads, as the first node holds the lock); unlike a lock
//! it never leaves the queue by itself: it keeps its node until closed or
//! reset, and a node that goes (its session or directory lost) is replaced.
//!
//! Curator's fixes after 5.4 are in: a latch claims leadership only with a
//! node of its *current* session (CURATOR-696), starts over when its
//! directory vanished (CURATOR-724), and re-checks after every reconnection.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::{broadcast, watch};

use super::deadline::Deadline;
use super::election::{Candidate, Standing, LEADS};
pub use super::election::{LeaderParticipant, Leadership, LeadershipEvent};
use super::error_policy::ErrorPolicy;
use super::lifecycle::{lock, Backoff, Lifecycle, State};
use super::queue::{HeldNode, PendingNode, Stop, WaitQueue};
use crate::error::{Error, Result};
use crate::session::Session;
use crate::store::{Child, CreateMode, Created, WatchEvent};

/// Curator's node name for latch participants.
pub(crate) const LATCH_NAME: &str = "latch-";

/// Whether `name` is a latch candidate's node.
pub(crate) fn is_node(name: &str) -> bool {
    super::queue::is_sequenced(name, LATCH_NAME)
}

/// The candidates' queue at `path`, laid out as [`LeaderLatch::new`] lays
/// it: for listing candidates with their sessions.
pub(crate) fn candidates(session: &Session, path: &str) -> Result<WaitQueue> {
    WaitQueue::new(session, path, LATCH_NAME, &[LATCH_NAME])
}

/// Whether closing a latch tells its subscribers that leadership ended
/// (Curator's `LeaderLatch.CloseMode`).
///
/// ```
/// use dlock::recipes::leader_latch::CloseMode;
/// assert_eq!(CloseMode::default(), CloseMode::Silent);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CloseMode {
    /// Subscribers get no [`LeadershipEvent::NotLeader`] for the close (the
    /// default): their channel just ends.
    #[default]
    Silent,
    /// A leader's subscribers get [`LeadershipEvent::NotLeader`] before their
    /// channel ends.
    NotifyLeader,
}

/// Where a latch is in its life (Curator's `LeaderLatch.State`): the one
/// [`State`] every background recipe has.
///
/// ```
/// use dlock::recipes::leader_latch::LatchState;
/// assert_ne!(LatchState::Latent, LatchState::Closed);
/// ```
pub type LatchState = State;

/// Leader election where every candidate stays in the race until it closes
/// (Curator's `LeaderLatch`).
///
/// [`start`](Self::start) enters the race in the background; the candidate
/// whose node is first leads until it closes or its session fails it (per
/// the [`ErrorPolicy`]: by default a suspension already counts), and then
/// the next one leads. Learn about leadership by waiting
/// ([`await_leadership`](Self::await_leadership)), polling
/// ([`has_leadership`](Candidate::has_leadership)), watching
/// ([`watch_leadership`](Candidate::watch_leadership)) or from every change
/// as an event ([`subscribe`](Self::subscribe)). Each term is a
/// [`Leadership`] with an epoch that only grows. What every election has
/// (id, path, state, participants, ...) comes from [`Candidate`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// use dlock::recipes::leader_latch::{LeaderLatch, LeadershipEvent};
/// let (s1, s2) = (dlock::connect("embedded").await?, dlock::connect("embedded").await?);
/// let first = LeaderLatch::new(&s1, "/doc/latch")?.with_id("first");
/// let second = LeaderLatch::new(&s2, "/doc/latch")?.with_id("second");
/// let mut events = second.subscribe();
/// first.start()?;
/// let term = first.await_leadership().await?;
/// second.start()?;
/// # while second.participants().await?.len() < 2 { tokio::task::yield_now().await; }
/// let ids: Vec<_> = second.participants().await?.into_iter().map(|p| (p.id, p.is_leader)).collect();
/// assert_eq!(ids, [("first".to_string(), true), ("second".to_string(), false)]);
/// first.close().await?;                        // hands leadership on
/// let next = second.await_leadership().await?;
/// assert!(next.epoch() > term.epoch());        // the epoch only grows
/// assert_eq!(events.recv().await.unwrap(), LeadershipEvent::IsLeader { epoch: next.epoch() });
/// second.close().await?;
/// # Ok(()) }
/// ```
pub struct LeaderLatch {
    candidate: Candidate,
    close_mode: CloseMode,
    /// Our node right now, shared with the task.
    our_path: Arc<StdMutex<Option<String>>>,
    shutdown: watch::Sender<Option<CloseMode>>,
    resets: watch::Sender<u64>,
}

super::election::candidate!(LeaderLatch);

impl LeaderLatch {
    /// A latch at `path` (a ZooKeeper-style path), through `session`, with
    /// the empty id, [`CloseMode::Silent`] and [`ErrorPolicy::Standard`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPath`] for a path ZooKeeper would refuse (relative,
    /// trailing slash, ...) or the root.
    pub fn new(session: &Session, path: &str) -> Result<Self> {
        let queue = WaitQueue::new(session, path, LATCH_NAME, &[LATCH_NAME])?;
        Ok(LeaderLatch {
            candidate: Candidate::new(queue, "latch"),
            close_mode: CloseMode::Silent,
            our_path: Arc::default(),
            shutdown: watch::channel(None).0,
            resets: watch::channel(0).0,
        })
    }

    /// Sets this candidate's id, stored as UTF-8 in its node (before
    /// [`start`](Self::start)).
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.candidate.id = id.into();
        self
    }

    /// Sets what [`close`](Self::close) tells subscribers.
    pub fn with_close_mode(mut self, mode: CloseMode) -> Self {
        self.close_mode = mode;
        self
    }

    /// Sets which session states end leadership (before
    /// [`start`](Self::start)).
    pub fn with_error_policy(mut self, policy: ErrorPolicy) -> Self {
        self.candidate.policy = policy;
        self
    }

    /// Enters the race: from now on a background task keeps a node for this
    /// candidate and follows the election, until [`close`](Self::close) (or
    /// until the latch is dropped, which deletes the node in the
    /// background). Operations wait while the session is suspended, so
    /// starting without a connection is fine (Curator's
    /// `AfterConnectionEstablished`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the latch was started before, or if
    /// there is no tokio runtime to run it on.
    pub fn start(&self) -> Result<()> {
        let task = Task {
            queue: self.candidate.queue.clone(),
            data: self.candidate.id.as_bytes().to_vec(),
            policy: self.candidate.policy,
            standing: self.candidate.standing.clone(),
            our_path: self.our_path.clone(),
            node: None,
        };
        let run = task.run(self.shutdown.subscribe(), self.resets.subscribe());
        self.standing.lifecycle.start(self.path(), run)
    }

    /// Leaves the race with the configured [`CloseMode`]: see
    /// [`close_with`](Self::close_with).
    pub async fn close(&self) -> Result<()> {
        self.close_with(self.close_mode).await
    }

    /// Leaves the race: leadership ends (subscribers hear of it only with
    /// [`CloseMode::NotifyLeader`]), the background task stops, and our node
    /// is deleted — before this returns if the session is connected, else in
    /// the background as soon as it can be. The next candidate then leads.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the latch was never started;
    /// [`Error::Closed`] if it was closed already (or its session was).
    pub async fn close_with(&self, mode: CloseMode) -> Result<()> {
        let task = self.standing.lifecycle.close(self.path())?;
        self.shutdown.send_replace(Some(mode));
        Lifecycle::join(task, self.path()).await;
        Ok(())
    }

    /// Gives up leadership (if held) and rejoins the race at the back, with
    /// a new node (Curator's `reset`).
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] unless the latch is started.
    pub fn reset(&self) -> Result<()> {
        if self.state() != State::Started {
            return Err(Error::Closed);
        }
        self.resets.send_modify(|n| *n += 1);
        Ok(())
    }

    /// Every change of leadership from now on, in order (Curator's
    /// `LeaderLatchListener`). The channel ends when the latch closes; a
    /// subscriber more than 64 events behind gets `Lagged`.
    pub fn subscribe(&self) -> broadcast::Receiver<LeadershipEvent> {
        self.standing.subscribe()
    }

    /// Waits until this candidate leads, and returns the term.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] if the latch is (or gets) closed first (Curator:
    /// `EOFException`); [`Error::InvalidArgument`] if it was not started.
    pub async fn await_leadership(&self) -> Result<Leadership> {
        let mut leadership = self.watch_leadership();
        let mut state = self.standing.lifecycle.subscribe();
        loop {
            let now = *state.borrow_and_update();
            self.standing.lifecycle.check(now, self.path())?;
            if let Some(term) = leadership.borrow_and_update().clone() {
                return Ok(term);
            }
            tokio::select! {
                _ = leadership.changed() => {}
                _ = state.changed() => {}
            }
        }
    }

    /// Waits at most `timeout` until this candidate leads.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] if it does not lead in time; otherwise as
    /// [`await_leadership`](Self::await_leadership).
    pub async fn await_leadership_timeout(&self, timeout: Duration) -> Result<Leadership> {
        tokio::time::timeout(timeout, self.await_leadership())
            .await
            .map_err(|_| Error::Timeout(timeout))?
    }

    /// Our node right now, if we have one (Curator's `getOurPath`).
    pub fn our_path(&self) -> Option<String> {
        lock(&self.our_path).clone()
    }

    /// The last node this latch led with (Curator's `getLastPathIsLeader`).
    pub fn last_path_is_leader(&self) -> Option<String> {
        self.standing.last_node()
    }
}

/// What woke the task's loop.
enum Wake {
    Shutdown,
    Reset,
    Stepped(Result<()>),
}

/// The background task that follows the election for one latch. Every step
/// is cancellation-safe: a node whose create was cut short is found by its
/// protection prefix and deleted in the background.
struct Task {
    queue: WaitQueue,
    data: Vec<u8>,
    policy: ErrorPolicy,
    standing: Arc<Standing>,
    our_path: Arc<StdMutex<Option<String>>>,
    node: Option<(PendingNode, Created)>,
}

impl Task {
    async fn run(
        mut self,
        mut shutdown: watch::Receiver<Option<CloseMode>>,
        mut resets: watch::Receiver<u64>,
    ) {
        let session = self.queue.session.clone();
        let mut status = session.watch_status();
        let mut backoff = Backoff::default();
        loop {
            let standing = self.standing.clone();
            let policy = self.policy;
            let wake = {
                let step = self.step();
                tokio::pin!(step);
                loop {
                    tokio::select! {
                        biased;
                        _ = shutdown.changed() => break Wake::Shutdown,
                        _ = resets.changed() => break Wake::Reset,
                        changed = status.changed() => {
                            if changed.is_err() {
                                break Wake::Stepped(Err(Error::Closed));
                            }
                            // Connection states act at once, whatever the
                            // step is waiting for.
                            let now = *status.borrow_and_update();
                            standing.check_session(policy, &now);
                        }
                        result = &mut step => break Wake::Stepped(result),
                    }
                }
            };
            // Let others run between steps, even when the store answers at
            // once (the embedded one) on a single-threaded runtime.
            tokio::task::yield_now().await;
            match wake {
                Wake::Shutdown => break,
                Wake::Reset => self.drop_node(),
                Wake::Stepped(Ok(())) => backoff.reset(),
                Wake::Stepped(Err(Error::Closed)) => {
                    // The session is closed: nothing more can happen.
                    self.standing.lose();
                    self.standing.lifecycle.force_close();
                    break;
                }
                Wake::Stepped(Err(e)) => {
                    tracing::warn!(path = %self.queue.dir, error = %e, "leader latch: retrying after an error");
                    self.standing.lose();
                    self.standing.fail(e);
                    if !backoff.pause(&session, shutdown.changed()).await {
                        break;
                    }
                }
            }
        }
        let mode = shutdown.borrow().unwrap_or(CloseMode::Silent);
        self.finish(mode).await;
    }

    /// One turn of the election: make sure we have a node, wait in the
    /// queue until it is first, then lead until something changes.
    async fn step(&mut self) -> Result<()> {
        let (created, children) = match &self.node {
            Some((_, created)) => (
                created.clone(),
                self.queue.sorted_children_seen(created.stat.czxid).await?,
            ),
            None => {
                // Curator's reset: not a leader without a node.
                self.standing.lose();
                let (pending, created, children) = self
                    .queue
                    .enter(&self.data, CreateMode::EphemeralSequential)
                    .await?;
                *lock(&self.our_path) = Some(created.path.clone());
                self.node = Some((pending, created.clone()));
                (created, children)
            }
        };
        let ours = children.iter().find(|c| c.name == created.name()).cloned();
        if children.first() != ours.as_ref() {
            // CURATOR-653: a former leader that finds itself behind steps
            // down before it waits.
            self.standing.lose();
        }
        // A predecessor that is gone already makes the queue look again at
        // once (CURATOR-644/645: not a reset, which could livelock two
        // latches).
        let waited = self
            .queue
            .wait(&created, children, &LEADS, Deadline::Never, None);
        match (waited.await, ours) {
            (Ok(()), Some(ours)) => self.lead(&created, &ours).await,
            // Our node is gone, with its session or its directory (an empty
            // listing: CURATOR-724): start over.
            (Ok(()), None) | (Err(Stop::Failed(Error::NoNode { .. })), _) => {
                tracing::debug!(path = %self.queue.dir, node = %created.name(), "our latch node is gone: starting over");
                self.drop_node();
                Ok(())
            }
            (Err(Stop::Failed(e)), _) => Err(e),
            (Err(Stop::TimedOut), _) => Ok(()),
        }
    }

    /// We are first: lead, if the node is really ours, until something
    /// changes.
    async fn lead(&mut self, created: &Created, ours: &Child) -> Result<()> {
        // Watching our own node as well: if anyone deletes it, leadership
        // ends at once, not at the next reconnection or listing. (Where the
        // store keeps what its watches deliver, this costs no request.)
        let Some(watch) = self.queue.watch_sibling(ours).await? else {
            self.drop_node();
            return Ok(());
        };
        let status = self.queue.session.status();
        if created.stat.ephemeral_owner != status.session_id {
            // CURATOR-696: a node left by an older session, not yet reaped —
            // whoever comes after it may lead already.
            tracing::debug!(path = %created.path, "our latch node belongs to an older session: starting over");
            self.drop_node();
            return Ok(());
        }
        if status.state.is_connected() {
            let queue = &self.queue;
            let node = HeldNode::new(&queue.session, &queue.dir, "leadership", created.clone());
            self.standing.gain(node, status);
        }
        if watch.changed().await == WatchEvent::NodeDeleted {
            self.standing.node_taken();
            self.standing.lose();
        }
        Ok(())
    }

    /// Gives up our node (deleted in the background) and leadership.
    fn drop_node(&mut self) {
        self.standing.lose();
        *lock(&self.our_path) = None;
        self.node = None;
    }

    /// Leaves the race: leadership ends before our node goes, so that no
    /// successor can lead while we still think we do.
    async fn finish(mut self, mode: CloseMode) {
        self.standing.close(mode == CloseMode::NotifyLeader);
        *lock(&self.our_path) = None;
        if let Some((pending, _)) = self.node.take() {
            if self.queue.session.state().is_connected() {
                if let Err(e) = pending.delete().await {
                    tracing::warn!(path = %self.queue.dir, error = %e, "leader latch: deleting our node failed");
                }
            }
            // Otherwise dropping it deletes it in the background, once the
            // session can.
        }
    }
}
