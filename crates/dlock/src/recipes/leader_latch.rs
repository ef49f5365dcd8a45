//! [`LeaderLatch`]: leader election by latch — Curator's `LeaderLatch`, node
//! for node, with an epoch (fencing token) on every term of leadership.
//!
//! Layout (a compatibility contract with Curator 5.4): each candidate creates
//! one `<path>/_c_<uuid>-latch-<seq>` ephemeral-sequential node (parents as
//! containers) holding its id as UTF-8 (an empty id stores no data); the
//! candidate whose node comes first in sequence order leads, every other one
//! watches only its predecessor. dlock and Java latches on one path elect one
//! leader among them, and each side lists the other's ids.
//!
//! Also here, shared with [`LeaderSelector`](super::leader_selector::LeaderSelector):
//! [`Leadership`] (one term, with its epoch and end signal) and
//! [`LeaderParticipant`] (one candidate as `participants()` lists it).
//!
//! Fixes Curator made after 5.4 are in: the latch checks that its node is
//! owned by its *current* session before claiming leadership (CURATOR-696),
//! starts over when the latch directory vanished (CURATOR-724), and
//! re-checks after every reconnection.

use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, Mutex as StdMutex, MutexGuard as StdMutexGuard};
use std::time::Duration;

use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use super::error_policy::ErrorPolicy;
use super::guard::Acquisition;
use super::queue::{FirstN, HeldNode, Participant, PendingNode, WaitQueue};
use crate::error::{Error, Result};
use crate::session::Session;
use crate::store::{Child, CreateMode, Created, FencingToken, SessionStatus};

/// Curator's node name for latch participants.
pub(crate) const LATCH_NAME: &str = "latch-";

/// Whether `name` is a latch candidate's node.
pub(crate) fn is_node(name: &str) -> bool {
    name.contains(LATCH_NAME)
}

/// The candidates' queue at `path`, laid out as [`LeaderLatch::new`] lays
/// it: for listing candidates with their sessions.
pub(crate) fn candidates(session: &Session, path: &str) -> Result<WaitQueue> {
    WaitQueue::new(session, path, LATCH_NAME, &[LATCH_NAME])
}

/// How many leadership events a subscriber may fall behind before it misses
/// some (it then gets `Lagged`).
const EVENT_CAPACITY: usize = 64;

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

/// Where a latch is in its life (Curator's `LeaderLatch.State`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LatchState {
    /// Made, not started.
    Latent,
    /// Started: a candidate (and perhaps the leader).
    Started,
    /// Closed (or its session was closed): no longer a candidate.
    Closed,
}

/// A change of leadership, as a latch's subscribers see it (Curator's
/// `LeaderLatchListener.isLeader` / `notLeader`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeadershipEvent {
    /// This candidate became the leader, for a term with this epoch.
    IsLeader {
        /// The term's epoch (fencing token).
        epoch: FencingToken,
    },
    /// This candidate stopped being the leader; the term with this epoch is
    /// over.
    NotLeader {
        /// The epoch of the term that ended.
        epoch: FencingToken,
    },
}

/// One term of leadership: its epoch, its node, and a signal for its end.
///
/// The **epoch** is a fencing token: the creation transaction id (`czxid`)
/// of the node we lead with. A later leader — of this election or any other
/// in the store — always has a larger one, so a resource that remembers the
/// largest epoch it has seen can refuse a deposed leader's late writes.
/// Cheap to clone; every clone sees the end of the term.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// use dlock::recipes::leader_latch::LeaderLatch;
/// let session = dlock::connect("embedded").await?;
/// let latch = LeaderLatch::new(&session, "/doc/leadership")?;
/// latch.start()?;
/// let term = latch.await_leadership().await?;
/// assert!(term.epoch().0 > 0 && !term.is_cancelled());
/// latch.close().await?;
/// term.cancelled().await; // resolves: the term is over
/// assert!(term.is_cancelled());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Leadership {
    acquisition: Acquisition,
    ended: watch::Receiver<bool>,
}

/// The term's acquisition: its leader node, lost signal and guarded writes
/// (which land only while our leader node exists — that is, while nobody
/// else can lead).
impl Deref for Leadership {
    type Target = Acquisition;

    fn deref(&self) -> &Acquisition {
        &self.acquisition
    }
}

impl Leadership {
    pub(crate) fn new(node: Arc<HeldNode>, ended: watch::Receiver<bool>) -> Self {
        Leadership {
            acquisition: Acquisition::new(node),
            ended,
        }
    }

    /// The term's epoch: the fencing token to pass to what the leader
    /// writes to.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// use dlock::recipes::leader_latch::LeaderLatch;
    /// use dlock::store::{CreateMode, CreateOptions, Op};
    /// let session = dlock::connect("embedded").await?;
    /// session.create("/doc/fenced/config", b"v1", CreateOptions::new(CreateMode::Persistent).with_parents()).await?;
    /// let latch = LeaderLatch::new(&session, "/doc/fenced/election")?;
    /// latch.start()?;
    /// let term = latch.await_leadership().await?;
    /// assert_eq!(term.epoch(), term.token());
    /// let set = Op::SetData { path: "/doc/fenced/config".into(), data: b"v2".to_vec(), version: None };
    /// term.guarded(&[set.clone()]).await?;
    /// latch.close().await?;
    /// assert!(matches!(term.guarded(&[set]).await, Err(dlock::Error::Lost { .. })));
    /// # session.delete("/doc/fenced/config", None).await?; Ok(()) }
    /// ```
    pub fn epoch(&self) -> FencingToken {
        self.token()
    }

    /// Whether the term is over, or is being cancelled (the leader must stop
    /// now).
    pub fn is_cancelled(&self) -> bool {
        *self.ended.borrow() || self.ended.has_changed().is_err()
    }

    /// Resolves when the term is over or is being cancelled: leadership was
    /// lost (per the [`ErrorPolicy`]), interrupted, or given up by a close.
    pub async fn cancelled(&self) {
        let mut ended = self.ended.clone();
        let _ = ended.wait_for(|ended| *ended).await;
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("epoch", &self.epoch())
            .field("node", &self.node())
            .field("session_id", &format_args!("{:#x}", self.session_id()))
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

/// One candidate of an election, as `participants()` lists it — Curator's
/// `Participant`: the id is the node's data as UTF-8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderParticipant {
    /// The candidate's id: its node's data as UTF-8 (invalid bytes
    /// replaced). A `LeaderSelector` without an id stores the session's
    /// default data, Curator's host address.
    pub id: String,
    /// Whether it leads: the first candidate whose node still exists.
    pub is_leader: bool,
    /// The candidate's node (full path).
    pub node: String,
    /// The node's fencing token: the epoch it leads (or will lead) with.
    pub epoch: FencingToken,
}

/// Curator's `LeaderSelector.getParticipants`: ids from node data, the first
/// node still there leads.
pub(crate) fn leader_participants(all: Vec<Participant>) -> Vec<LeaderParticipant> {
    all.into_iter()
        .enumerate()
        .map(|(i, p)| LeaderParticipant {
            id: String::from_utf8_lossy(&p.data).into_owned(),
            is_leader: i == 0,
            node: p.node,
            epoch: p.token,
        })
        .collect()
}

/// Leader election where every candidate stays in the race until it closes
/// (Curator's `LeaderLatch`).
///
/// [`start`](Self::start) enters the race in the background; the candidate
/// whose node is first leads until it closes or its session fails it (per
/// the [`ErrorPolicy`]: by default a suspension already counts), and then
/// the next one leads. Learn about leadership by waiting
/// ([`await_leadership`](Self::await_leadership)), polling
/// ([`has_leadership`](Self::has_leadership)), watching
/// ([`watch_leadership`](Self::watch_leadership)) or from every change as
/// an event ([`subscribe`](Self::subscribe)). Each term is a
/// [`Leadership`] with an epoch that only grows.
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
    queue: WaitQueue,
    id: String,
    close_mode: CloseMode,
    policy: ErrorPolicy,
    shared: Arc<Shared>,
    shutdown: watch::Sender<Option<CloseMode>>,
    resets: watch::Sender<u64>,
    task: StdMutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for LeaderLatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderLatch")
            .field("path", &self.path())
            .field("id", &self.id)
            .field("state", &self.state())
            .field("leadership", &self.leadership())
            .finish()
    }
}

impl LeaderLatch {
    /// A latch at `path` (a ZooKeeper-style path), through `session`, with
    /// the empty id, [`CloseMode::Silent`] and [`ErrorPolicy::Standard`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPath`] for a path ZooKeeper would refuse (relative,
    /// trailing slash, ...) or the root.
    pub fn new(session: &Session, path: &str) -> Result<Self> {
        Ok(LeaderLatch {
            queue: WaitQueue::new(session, path, LATCH_NAME, &[LATCH_NAME])?,
            id: String::new(),
            close_mode: CloseMode::Silent,
            policy: ErrorPolicy::Standard,
            shared: Arc::new(Shared::new()),
            shutdown: watch::channel(None).0,
            resets: watch::channel(0).0,
            task: StdMutex::new(None),
        })
    }

    /// Sets this candidate's id, stored as UTF-8 in its node (before
    /// [`start`](Self::start)).
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
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
        self.policy = policy;
        self
    }

    /// This candidate's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The election's path.
    pub fn path(&self) -> &str {
        &self.queue.dir
    }

    /// The session this latch uses.
    pub fn session(&self) -> &Session {
        &self.queue.session
    }

    /// Where the latch is in its life.
    pub fn state(&self) -> LatchState {
        *self.shared.state.borrow()
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
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::InvalidArgument("a LeaderLatch runs on a tokio runtime".into()))?;
        let mut started = false;
        self.shared.state.send_if_modified(|state| {
            started = *state == LatchState::Latent;
            if started {
                *state = LatchState::Started;
            }
            started
        });
        if !started {
            return Err(Error::InvalidArgument(format!(
                "the latch at {} cannot be started more than once",
                self.path()
            )));
        }
        let task = Task {
            queue: self.queue.clone(),
            data: self.id.as_bytes().to_vec(),
            policy: self.policy,
            shared: self.shared.clone(),
            node: None,
        };
        let handle = runtime.spawn(task.run(self.shutdown.subscribe(), self.resets.subscribe()));
        *lock(&self.task) = Some(handle);
        Ok(())
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
        let mut was = LatchState::Started;
        self.shared.state.send_if_modified(|state| {
            was = *state;
            if *state == LatchState::Started {
                *state = LatchState::Closed;
                return true;
            }
            false
        });
        match was {
            LatchState::Started => {}
            LatchState::Latent => {
                return Err(Error::InvalidArgument(format!(
                    "the latch at {} was not started",
                    self.path()
                )))
            }
            LatchState::Closed => return Err(Error::Closed),
        }
        self.shutdown.send_replace(Some(mode));
        let task = lock(&self.task).take();
        if let Some(task) = task {
            if let Err(e) = task.await {
                tracing::error!(path = %self.path(), error = %e, "the latch task failed");
            }
        }
        Ok(())
    }

    /// Gives up leadership (if held) and rejoins the race at the back, with
    /// a new node (Curator's `reset`).
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] unless the latch is started.
    pub fn reset(&self) -> Result<()> {
        if self.state() != LatchState::Started {
            return Err(Error::Closed);
        }
        self.resets.send_modify(|n| *n += 1);
        Ok(())
    }

    /// Whether this candidate leads now, as far as it knows.
    pub fn has_leadership(&self) -> bool {
        self.state() == LatchState::Started && self.shared.leadership.borrow().is_some()
    }

    /// The current term, if this candidate leads.
    pub fn leadership(&self) -> Option<Leadership> {
        match self.state() {
            LatchState::Started => self.shared.leadership.borrow().clone(),
            _ => None,
        }
    }

    /// The current term (or `None`), now and after every change.
    pub fn watch_leadership(&self) -> watch::Receiver<Option<Leadership>> {
        self.shared.leadership.subscribe()
    }

    /// Every change of leadership from now on, in order (Curator's
    /// `LeaderLatchListener`). The channel ends when the latch closes; a
    /// subscriber more than 64 events behind gets `Lagged`.
    pub fn subscribe(&self) -> broadcast::Receiver<LeadershipEvent> {
        match &self.shared.lock().events {
            Some(events) => events.subscribe(),
            None => broadcast::channel(1).1,
        }
    }

    /// Waits until this candidate leads, and returns the term.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`] if the latch is (or gets) closed first (Curator:
    /// `EOFException`); [`Error::InvalidArgument`] if it was not started.
    pub async fn await_leadership(&self) -> Result<Leadership> {
        let mut leadership = self.shared.leadership.subscribe();
        let mut state = self.shared.state.subscribe();
        loop {
            match *state.borrow_and_update() {
                LatchState::Started => {}
                LatchState::Closed => return Err(Error::Closed),
                LatchState::Latent => {
                    return Err(Error::InvalidArgument(format!(
                        "the latch at {} was not started",
                        self.path()
                    )))
                }
            }
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
        self.shared.lock().our_path.clone()
    }

    /// The last node this latch led with (Curator's `getLastPathIsLeader`).
    pub fn last_path_is_leader(&self) -> Option<String> {
        self.shared.lock().last_path_is_leader.clone()
    }

    /// The last error the background task met, if any (it keeps retrying;
    /// Curator only logs these).
    pub fn last_error(&self) -> Option<Error> {
        self.shared.lock().last_error.clone()
    }

    /// Every candidate in queue order, the leader first (Curator's
    /// `getParticipants`). Reads the store, so it may briefly disagree with
    /// [`has_leadership`](Self::has_leadership). Empty if nobody has joined.
    pub async fn participants(&self) -> Result<Vec<LeaderParticipant>> {
        Ok(leader_participants(
            self.queue.participants(&FirstN(1)).await?,
        ))
    }

    /// The current leader, if there is any candidate (Curator's
    /// `getLeader`).
    pub async fn leader(&self) -> Result<Option<LeaderParticipant>> {
        Ok(self.participants().await?.into_iter().next())
    }
}

/// What the latch and its task share.
struct Shared {
    state: watch::Sender<LatchState>,
    leadership: watch::Sender<Option<Leadership>>,
    inner: StdMutex<Inner>,
}

struct Inner {
    events: Option<broadcast::Sender<LeadershipEvent>>,
    term_end: Option<watch::Sender<bool>>,
    /// The session as it was when the current term began.
    term_since: Option<SessionStatus>,
    our_path: Option<String>,
    last_path_is_leader: Option<String>,
    last_error: Option<Error>,
}

fn lock<T>(mutex: &StdMutex<T>) -> StdMutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn new() -> Self {
        Shared {
            state: watch::channel(LatchState::Latent).0,
            leadership: watch::channel(None).0,
            inner: StdMutex::new(Inner {
                events: Some(broadcast::channel(EVENT_CAPACITY).0),
                term_end: None,
                term_since: None,
                our_path: None,
                last_path_is_leader: None,
                last_error: None,
            }),
        }
    }

    fn lock(&self) -> StdMutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    /// Leadership with `node`, unless we lead with it already; `since` is
    /// the session's status that allowed it.
    fn gain(&self, node: Arc<HeldNode>, since: SessionStatus) {
        let mut inner = self.lock();
        if let Some(term) = &*self.leadership.borrow() {
            if term.node() == node.created.path {
                return;
            }
        }
        self.lose_locked(&mut inner);
        let (end, ended) = watch::channel(false);
        let term = Leadership::new(node, ended);
        let epoch = term.epoch();
        inner.term_end = Some(end);
        inner.term_since = Some(since);
        inner.last_path_is_leader = Some(term.node().to_string());
        self.leadership.send_replace(Some(term));
        if let Some(events) = &inner.events {
            let _ = events.send(LeadershipEvent::IsLeader { epoch });
        }
    }

    /// Ends the current term, if any.
    fn lose(&self) {
        let mut inner = self.lock();
        self.lose_locked(&mut inner);
    }

    fn lose_locked(&self, inner: &mut Inner) {
        if self.leadership.borrow().is_none() {
            return;
        }
        let Some(term) = self.leadership.send_replace(None) else {
            return;
        };
        inner.term_since = None;
        if let Some(end) = inner.term_end.take() {
            end.send_replace(true);
        }
        if let Some(events) = &inner.events {
            let _ = events.send(LeadershipEvent::NotLeader {
                epoch: term.epoch(),
            });
        }
    }

    /// Ends the current term if the session, as it is `now`, no longer
    /// allows it under `policy`. Judged against the status the term began
    /// with, so that a late notification of an old change cannot end a term
    /// that began after it.
    fn check_session(&self, policy: ErrorPolicy, now: &SessionStatus) {
        let mut inner = self.lock();
        if let Some(since) = inner.term_since {
            if policy.ends_leadership(&since, now) {
                self.lose_locked(&mut inner);
            }
        }
    }

    fn set_our_path(&self, path: Option<String>) {
        self.lock().our_path = path;
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
    shared: Arc<Shared>,
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
        let mut failures = 0u32;
        loop {
            let shared = self.shared.clone();
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
                            shared.check_session(policy, &now);
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
                Wake::Stepped(Ok(())) => failures = 0,
                Wake::Stepped(Err(Error::Closed)) => {
                    // The session is closed: nothing more can happen.
                    self.shared.lose();
                    self.shared.state.send_replace(LatchState::Closed);
                    break;
                }
                Wake::Stepped(Err(e)) => {
                    tracing::warn!(path = %self.queue.dir, error = %e, "leader latch: retrying after an error");
                    self.shared.lose();
                    self.shared.lock().last_error = Some(e);
                    let pause = session.options().retry.sleep_for(failures.min(8));
                    failures += 1;
                    tokio::select! {
                        _ = shutdown.changed() => break,
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
        let mode = shutdown.borrow().unwrap_or(CloseMode::Silent);
        self.finish(mode).await;
    }

    /// One look at the election: make sure we have a node, find our place,
    /// and wait for what could change it.
    async fn step(&mut self) -> Result<()> {
        let (name, children) = match &self.node {
            Some((_, created)) => (
                created.name().to_string(),
                self.queue.sorted_children_seen(created.stat.czxid).await?,
            ),
            None => {
                // Curator's reset: not a leader without a node.
                self.shared.lose();
                let (pending, created, children) = self
                    .queue
                    .enter(&self.data, CreateMode::EphemeralSequential)
                    .await?;
                self.shared.set_our_path(Some(created.path.clone()));
                let name = created.name().to_string();
                self.node = Some((pending, created));
                (name, children)
            }
        };
        // An empty listing also covers a vanished latch directory
        // (CURATOR-724): our node is gone, so start over.
        match children.iter().position(|c| c.name == name) {
            None => {
                tracing::debug!(path = %self.queue.dir, node = %name, "our latch node is gone: starting over");
                self.drop_node();
                Ok(())
            }
            Some(0) => self.lead(&children[0]).await,
            Some(i) => self.follow(&children[i - 1]).await,
        }
    }

    /// We are first: lead, if the node is really ours, until something
    /// changes.
    async fn lead(&mut self, ours: &Child) -> Result<()> {
        let session = self.queue.session.clone();
        let Some((_, created)) = &self.node else {
            return Ok(());
        };
        let created = created.clone();
        // Watching our own node as well: if anyone deletes it, we stop
        // leading at once instead of at the next reconnection. (Where the
        // store keeps what its watches deliver, this costs no request.)
        let Some(watch) = self.queue.watch_sibling(ours).await? else {
            self.drop_node();
            return Ok(());
        };
        let status = session.status();
        if created.stat.ephemeral_owner != status.session_id {
            // CURATOR-696: a node left by an older session, not yet reaped —
            // whoever comes after it may lead already.
            tracing::debug!(path = %created.path, "our latch node belongs to an older session: starting over");
            self.drop_node();
            return Ok(());
        }
        if status.state.is_connected() {
            let node = HeldNode::new(&session, &self.queue.dir, "leadership", created);
            self.shared.gain(node, status);
        }
        watch.changed().await;
        Ok(())
    }

    /// Someone is ahead of us: not the leader; wait for our predecessor.
    async fn follow(&mut self, predecessor: &Child) -> Result<()> {
        // CURATOR-653: a former leader that finds itself behind steps down.
        self.shared.lose();
        if let Some(watch) = self.queue.watch_sibling(predecessor).await? {
            watch.changed().await;
        }
        // Gone already: look again at once (CURATOR-644/645: not a reset,
        // which could livelock two latches).
        Ok(())
    }

    /// Gives up our node (deleted in the background) and leadership.
    fn drop_node(&mut self) {
        self.shared.lose();
        self.shared.set_our_path(None);
        self.node = None;
    }

    /// Leaves the race: leadership ends before our node goes, so that no
    /// successor can lead while we still think we do.
    async fn finish(mut self, mode: CloseMode) {
        match mode {
            CloseMode::NotifyLeader => {
                self.shared.lose();
                self.shared.lock().events = None;
            }
            CloseMode::Silent => {
                self.shared.lock().events = None;
                self.shared.lose();
            }
        }
        self.shared.set_our_path(None);
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
