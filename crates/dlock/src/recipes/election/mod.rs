//! What the two leader elections share: a [`Candidate`] (which
//! [`LeaderLatch`] and [`LeaderSelector`] both dereference to), one term of
//! leadership ([`Leadership`]), its beginning and end as events
//! ([`LeadershipEvent`]), and one candidate as listed
//! ([`LeaderParticipant`]).
//!
//! Listing (a compatibility contract with Curator 5.4's
//! `LeaderSelector.getParticipants`, which its `LeaderLatch` uses too):
//! the candidates are the election's sequential nodes in queue order; each
//! one's id is its node's data as UTF-8; the first node still there leads,
//! and a node that vanishes while being read is left out. So a Java and a
//! dlock candidate on one path list each other alike.
//!
//! [`LeaderLatch`]: super::leader_latch::LeaderLatch
//! [`LeaderSelector`]: super::leader_selector::LeaderSelector

mod standing;

use std::fmt;
use std::sync::Arc;

use tokio::sync::watch;

use super::error_policy::ErrorPolicy;
use super::guard::{deref_hold, Acquisition};
use super::lifecycle::State;
use super::queue::{FirstN, HeldNode, WaitQueue};
use crate::error::{Error, Result};
use crate::session::Session;
use crate::store::FencingToken;

pub(crate) use self::standing::Standing;

/// Who leads: the first node in queue order, as the first holder of a
/// mutex.
pub(crate) const LEADS: FirstN = FirstN(1);

/// A change of leadership, as a latch's subscribers see it (Curator's
/// `LeaderLatchListener.isLeader` / `notLeader`).
///
/// ```
/// use dlock::recipes::leader_latch::LeadershipEvent;
/// use dlock::FencingToken;
/// let gained = LeadershipEvent::IsLeader { epoch: FencingToken(7) };
/// assert_ne!(gained, LeadershipEvent::NotLeader { epoch: FencingToken(7) });
/// ```
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

deref_hold!(
    /// The term's acquisition: its leader node, lost signal and guarded writes
    /// (which land only while the term lasts and our leader node exists —
    /// that is, while nobody else can lead).
    Leadership => acquisition: Acquisition
);

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
    /// Wait on this to stop leading; [`lost`](Acquisition::lost) tells
    /// only of a loss (the session's, or the node's taken away), not of a
    /// term given up.
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
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// use dlock::recipes::leader_latch::{LeaderLatch, LeaderParticipant};
/// let session = dlock::connect("embedded").await?;
/// let latch = LeaderLatch::new(&session, "/doc/participant")?.with_id("me");
/// latch.start()?;
/// let term = latch.await_leadership().await?;
/// let me: LeaderParticipant = latch.leader().await?.unwrap();
/// assert!(me.id == "me" && me.is_leader && me.epoch == term.epoch());
/// # latch.close().await?; Ok(()) }
/// ```
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

/// Makes a recipe with a `candidate` field one: it dereferences to the
/// [`Candidate`], and shows what every candidate shows as its `Debug`.
macro_rules! candidate {
    ($recipe:ident) => {
        impl std::fmt::Debug for $recipe {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($recipe))
                    .field("path", &self.path())
                    .field("id", &self.id())
                    .field("state", &self.state())
                    .field("leadership", &self.leadership())
                    .finish_non_exhaustive()
            }
        }

        /// What every election has: id, path, state, leadership,
        /// participants.
        impl std::ops::Deref for $recipe {
            type Target = $crate::recipes::election::Candidate;

            fn deref(&self) -> &Self::Target {
                &self.candidate
            }
        }
    };
}
pub(crate) use candidate;

/// A candidate of an election: what a [`LeaderLatch`](crate::LeaderLatch)
/// and a [`LeaderSelector`](crate::LeaderSelector) have in common, and
/// dereference to — who it is, where, in which state, whether it leads,
/// and who else is in the race.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// use dlock::recipes::election::Candidate;
/// use dlock::recipes::leader_selector::LeaderSelector;
/// let session = dlock::connect("embedded").await?;
/// let latch = dlock::LeaderLatch::new(&session, "/doc/candidate")?.with_id("a");
/// let selector = LeaderSelector::new(&session, "/doc/candidate-turns", |_| async {})?;
/// let both: [&Candidate; 2] = [&latch, &selector];
/// assert_eq!(both.map(|c| c.path()), ["/doc/candidate", "/doc/candidate-turns"]);
/// assert!(both.iter().all(|c| !c.has_leadership()));
/// # Ok(()) }
/// ```
pub struct Candidate {
    pub(crate) queue: WaitQueue,
    pub(crate) id: String,
    pub(crate) policy: ErrorPolicy,
    pub(crate) standing: Arc<Standing>,
}

impl Candidate {
    /// A candidate without an id, under [`ErrorPolicy::Standard`], that
    /// errors call a `what` ("latch", "selector").
    pub(crate) fn new(queue: WaitQueue, what: &'static str) -> Self {
        Candidate {
            queue,
            id: String::new(),
            policy: ErrorPolicy::Standard,
            standing: Arc::new(Standing::new(what)),
        }
    }

    /// This candidate's id, as stored in its nodes.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The election's path.
    pub fn path(&self) -> &str {
        &self.queue.dir
    }

    /// The session this candidate uses.
    pub fn session(&self) -> &Session {
        &self.queue.session
    }

    /// Where the candidate is in its life.
    pub fn state(&self) -> State {
        self.standing.lifecycle.state()
    }

    /// Whether this candidate leads now, as far as it knows.
    pub fn has_leadership(&self) -> bool {
        self.leadership().is_some()
    }

    /// The current term, if this candidate leads.
    pub fn leadership(&self) -> Option<Leadership> {
        match self.state() {
            State::Started => self.standing.term(),
            State::Latent | State::Closed => None,
        }
    }

    /// The current term (or `None`), now and after every change.
    pub fn watch_leadership(&self) -> watch::Receiver<Option<Leadership>> {
        self.standing.watch_term()
    }

    /// The last error the background task met, if any (it keeps retrying;
    /// Curator only logs these).
    pub fn last_error(&self) -> Option<Error> {
        self.standing.last_error()
    }

    /// Every candidate in queue order, the leader first (Curator's
    /// `getParticipants`). Reads the store, so it may briefly disagree with
    /// [`has_leadership`](Self::has_leadership). Empty if nobody has joined.
    pub async fn participants(&self) -> Result<Vec<LeaderParticipant>> {
        let all = self.queue.participants(&LEADS).await?;
        Ok(all
            .into_iter()
            .enumerate()
            .map(|(i, p)| LeaderParticipant {
                id: String::from_utf8_lossy(&p.data).into_owned(),
                is_leader: i == 0,
                node: p.node,
                epoch: p.token,
            })
            .collect())
    }

    /// The current leader, if there is any candidate (Curator's
    /// `getLeader`).
    pub async fn leader(&self) -> Result<Option<LeaderParticipant>> {
        Ok(self.participants().await?.into_iter().next())
    }
}
