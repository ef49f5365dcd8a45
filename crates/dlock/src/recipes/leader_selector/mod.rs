//! [`LeaderSelector`]: leader election by turns — Curator's `LeaderSelector`:
//! candidates queue on a [`Mutex`]; the holder leads by running the user's
//! `take_leadership` and gives leadership up when it returns.
//!
//! Layout (a compatibility contract with Curator 5.4): exactly a mutex on
//! the election path — `<path>/_c_<uuid>-lock-<seq>` ephemeral-sequential
//! nodes holding the candidate's id as UTF-8 (without an id, the session's
//! default data, Curator's host address). dlock and Java selectors on one
//! path take turns with each other, and with plain `InterProcessMutex`
//! holders on that path.
//!
//! What Curator fixed after 5.4 is in: interrupting leadership never
//! cancels a queued turn (CURATOR-518), and [`requeue`](LeaderSelector::requeue)
//! works right after leadership was lost or interrupted (CURATOR-671).

use std::future::Future;
use std::sync::{Arc, Mutex as StdMutex, MutexGuard as StdMutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::{watch, Notify};

use super::election::Candidate;
pub use super::election::{LeaderParticipant, Leadership};
use super::error_policy::ErrorPolicy;
use super::lifecycle::{lock, Lifecycle, State};
use super::mutex::Mutex;
use super::queue::WaitQueue;
use crate::error::Result;
use crate::session::Session;

mod worker;

use self::worker::Worker;

type TakeLeadership = Arc<dyn Fn(Leadership) -> BoxFuture<'static, ()> + Send + Sync>;

/// Where a selector is in its life (Curator's `LeaderSelector.State`): the
/// one [`State`] every background recipe has. Started means queued, leading,
/// or idle until requeued.
///
/// ```
/// use dlock::recipes::leader_selector::SelectorState;
/// assert_eq!(SelectorState::Started, dlock::LatchState::Started);
/// ```
pub type SelectorState = State;

/// Leader election by turns (Curator's `LeaderSelector`).
///
/// Give it an async `take_leadership`: when this candidate's turn comes, it
/// is called with the term's [`Leadership`] (epoch, node, cancellation
/// signal) and leads for as long as the future runs; leadership is given up
/// when it returns. Then the candidate waits until
/// [`requeue`](Self::requeue)d — or queues again by itself with
/// [`with_auto_requeue`](Self::with_auto_requeue).
///
/// A term is **cancelled** — the `Leadership` signals it, and after the
/// [grace](Self::with_cancel_grace) (none by default) the future is dropped
/// — when the session fails it per the [`ErrorPolicy`] (by default a
/// suspension already counts), on [`interrupt_leadership`](Self::interrupt_leadership),
/// and on [`close`](Self::close). Either way leadership is released before
/// anyone else can lead, and one selector never leads twice at once.
/// What every election has (id, path, state, participants, ...) comes from
/// [`Candidate`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// use dlock::recipes::leader_selector::LeaderSelector;
/// let session = dlock::connect("embedded").await?;
/// let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
/// let selector = LeaderSelector::new(&session, "/doc/selector", move |term| {
///     let tx = tx.clone();
///     async move {
///         // Lead: do the work, fenced by the epoch; return to give up.
///         tx.send(term.epoch()).unwrap();
///     }
/// })?
/// .with_id("worker-1")
/// .with_auto_requeue();
/// selector.start()?;
/// let (first, second) = (rx.recv().await.unwrap(), rx.recv().await.unwrap());
/// assert!(second > first); // every term has a larger epoch
/// selector.close().await?;
/// # Ok(()) }
/// ```
pub struct LeaderSelector {
    candidate: Candidate,
    mutex: Mutex,
    auto_requeue: bool,
    grace: Duration,
    take: TakeLeadership,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
}

super::election::candidate!(LeaderSelector);

impl LeaderSelector {
    /// A candidate at `path` (a ZooKeeper-style path), through `session`,
    /// that leads by running `take_leadership`. No id,
    /// [`ErrorPolicy::Standard`], no auto-requeue, no cancellation grace.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPath`](crate::Error::InvalidPath) for a path ZooKeeper would refuse, or the root.
    pub fn new<F, Fut>(session: &Session, path: &str, take_leadership: F) -> Result<Self>
    where
        F: Fn(Leadership) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        // The selector's candidates are the mutex's queue.
        let queue = WaitQueue::mutex(session, path)?;
        Ok(LeaderSelector {
            candidate: Candidate::new(queue, "selector"),
            mutex: Mutex::new(session, path)?,
            auto_requeue: false,
            grace: Duration::ZERO,
            take: Arc::new(move |term| take_leadership(term).boxed()),
            shared: Arc::new(Shared::new()),
            shutdown: watch::channel(false).0,
        })
    }

    /// Sets this candidate's id, stored as UTF-8 in its lock nodes (before
    /// [`start`](Self::start)). An empty id stores the session's default
    /// data instead, as Curator does.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.candidate.id = id.into();
        self.mutex = match self.candidate.id.is_empty() {
            true => Mutex::new(self.mutex.session(), self.mutex.path())
                .and_then(|m| m.with_layout(self.mutex.layout()))
                .expect("the path and the layout were valid"),
            false => self.mutex.with_data(self.candidate.id.as_bytes().to_vec()),
        };
        self
    }

    /// Writes `layout`'s nodes (before [`start`](Self::start)):
    /// [`Layout::Curator`](crate::Layout::Curator) (the default) or
    /// [`Layout::Kazoo`](crate::Layout::Kazoo), in which candidates are
    /// kazoo `Lock` nodes, as kazoo's `Election` makes them — so that dlock
    /// and kazoo candidates on one path elect one leader. kazoo's candidates
    /// are ordered among ours in either layout, but a kazoo `Election` sees
    /// ours only in kazoo's.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for [`Layout::Consul`](crate::Layout::Consul).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// use dlock::{Layout, LeaderSelector};
    /// let session = dlock::connect("embedded").await?;
    /// let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    /// let selector = LeaderSelector::new(&session, "/doc/kazoo-election", move |term| {
    ///     let tx = tx.clone();
    ///     async move { tx.send(term.node().to_string()).unwrap(); }
    /// })?
    /// .with_layout(Layout::Kazoo)?
    /// .with_id("py-compatible");
    /// selector.start()?;
    /// assert!(rx.recv().await.unwrap().contains("__lock__"));
    /// selector.close().await?;
    /// # session.delete("/doc/kazoo-election", None).await?; Ok(()) }
    /// ```
    pub fn with_layout(mut self, layout: crate::Layout) -> Result<Self> {
        self.mutex = self.mutex.with_layout(layout)?;
        self.candidate.queue = self.candidate.queue.with_layout(layout)?;
        Ok(self)
    }

    /// Sets which session states end a term (before
    /// [`start`](Self::start)).
    pub fn with_error_policy(mut self, policy: ErrorPolicy) -> Self {
        self.candidate.policy = policy;
        self
    }

    /// Queues again by itself after every term (Curator's `autoRequeue`).
    pub fn with_auto_requeue(mut self) -> Self {
        self.auto_requeue = true;
        self
    }

    /// How long a cancelled `take_leadership` may go on after its
    /// [`Leadership`] signalled the cancellation, before it is dropped.
    /// Default: zero — dropped at once. Leadership is released only after.
    pub fn with_cancel_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Starts the background task and queues for the first turn.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if it was started before, or if there is
    /// no tokio runtime to run it on.
    pub fn start(&self) -> Result<()> {
        let worker = Worker {
            mutex: self.mutex.clone(),
            policy: self.candidate.policy,
            auto_requeue: self.auto_requeue,
            grace: self.grace,
            take: self.take.clone(),
            standing: self.candidate.standing.clone(),
            shared: self.shared.clone(),
        };
        let run = worker.run(self.shutdown.subscribe());
        self.standing.lifecycle.start(self.path(), run)?;
        self.requeue()?;
        Ok(())
    }

    /// Queues for another turn. Returns `true` if this arranged a new turn:
    /// now if the selector is idle, or right after the current term if it
    /// leads (also when that term is being lost or interrupted:
    /// CURATOR-671); `false` if a turn is already pending.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`](crate::Error::Closed) after [`close`](Self::close);
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) before [`start`](Self::start).
    pub fn requeue(&self) -> Result<bool> {
        self.standing.lifecycle.ensure_started(self.path())?;
        let mut queue = self.shared.queue();
        Ok(match queue.phase {
            Phase::Idle => {
                queue.phase = Phase::Queued;
                self.shared.wake.notify_one();
                true
            }
            Phase::Queued => false,
            Phase::Leading if queue.again => false,
            Phase::Leading => {
                queue.again = true;
                true
            }
        })
    }

    /// Cancels the current term, if this candidate leads (its `Leadership`
    /// signals, `take_leadership` is dropped after the grace, leadership is
    /// released). A queued turn is not affected (CURATOR-518). Returns
    /// whether a term was cancelled.
    pub fn interrupt_leadership(&self) -> bool {
        self.standing.cancel()
    }

    /// Leaves the election: a running term is cancelled and leadership
    /// released, a queued turn is withdrawn, and the background task ends
    /// before this returns.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if it was never started; [`Error::Closed`](crate::Error::Closed)
    /// if it was closed already.
    pub async fn close(&self) -> Result<()> {
        let worker = self.standing.lifecycle.close(self.path())?;
        self.shutdown.send_replace(true);
        Lifecycle::join(worker, self.path()).await;
        Ok(())
    }
}

/// Where the candidate is between turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not queued: waits for `requeue`.
    Idle,
    /// Queued: waiting for (or acquiring) the lock.
    Queued,
    /// Leading (or ending a term).
    Leading,
}

struct Queue {
    phase: Phase,
    /// Queue again after the current term.
    again: bool,
}

/// What the selector and its task share, beyond its [`Standing`](crate::recipes::election::Standing).
struct Shared {
    queue: StdMutex<Queue>,
    wake: Notify,
}

impl Shared {
    fn new() -> Self {
        Shared {
            queue: StdMutex::new(Queue {
                phase: Phase::Idle,
                again: false,
            }),
            wake: Notify::new(),
        }
    }

    fn queue(&self) -> StdMutexGuard<'_, Queue> {
        lock(&self.queue)
    }
}
