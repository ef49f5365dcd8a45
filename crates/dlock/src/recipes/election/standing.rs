//! A candidate's [`Standing`]: its life and its terms of leadership, shared
//! by the candidate and its background task.

use std::sync::{Arc, Mutex as StdMutex};

use tokio::sync::{broadcast, watch};

use super::{Leadership, LeadershipEvent};
use crate::error::Error;
use crate::recipes::error_policy::ErrorPolicy;
use crate::recipes::lifecycle::{lock, Lifecycle};
use crate::recipes::queue::HeldNode;
use crate::store::SessionStatus;

/// How many leadership events a subscriber may fall behind before it misses
/// some (it then gets `Lagged`).
const EVENT_CAPACITY: usize = 64;

/// What a candidate and its background task share: its life and its
/// terms.
pub(crate) struct Standing {
    pub lifecycle: Lifecycle,
    /// The current term, while there is one.
    leadership: watch::Sender<Option<Leadership>>,
    /// Changed under one lock, so that events follow the order of the
    /// changes.
    terms: StdMutex<Terms>,
}

struct Terms {
    /// Gone once the candidate closes: subscribers' channels end.
    events: Option<broadcast::Sender<LeadershipEvent>>,
    /// Signals the current term's end to its [`Leadership`]s.
    end: Option<watch::Sender<bool>>,
    /// The session as it was when the current term began.
    since: Option<SessionStatus>,
    last_node: Option<String>,
    last_error: Option<Error>,
}

impl Standing {
    /// A candidate's standing before it starts: no term, errors calling it
    /// a `what` ("latch", "selector").
    pub fn new(what: &'static str) -> Self {
        Standing {
            lifecycle: Lifecycle::new(what),
            leadership: watch::channel(None).0,
            terms: StdMutex::new(Terms {
                events: Some(broadcast::channel(EVENT_CAPACITY).0),
                end: None,
                since: None,
                last_node: None,
                last_error: None,
            }),
        }
    }

    /// A term with `node`, unless we lead with it already; `since` is the
    /// session's status that allowed it.
    pub fn gain(&self, node: Arc<HeldNode>, since: SessionStatus) -> Leadership {
        let mut terms = lock(&self.terms);
        if let Some(term) = &*self.leadership.borrow() {
            if term.node() == node.created.path {
                return term.clone();
            }
        }
        self.lose_locked(&mut terms);
        let (end, ended) = watch::channel(false);
        let term = Leadership::new(node, ended);
        let epoch = term.epoch();
        terms.end = Some(end);
        terms.since = Some(since);
        terms.last_node = Some(term.node().to_string());
        self.leadership.send_replace(Some(term.clone()));
        if let Some(events) = &terms.events {
            let _ = events.send(LeadershipEvent::IsLeader { epoch });
        }
        term
    }

    /// Our node was deleted by someone else: the current term, if any, was
    /// taken away (its lost signal fires), not given up. Its end follows.
    pub fn node_taken(&self) {
        if let Some(term) = &*self.leadership.borrow() {
            term.held_node().found_gone();
        }
    }

    /// Ends the current term, if any.
    pub fn lose(&self) {
        self.lose_locked(&mut lock(&self.terms));
    }

    fn lose_locked(&self, terms: &mut Terms) {
        // Changed only under the lock we hold.
        let Some(term) = self.leadership.borrow().clone() else {
            return;
        };
        self.leadership.send_replace(None);
        // Its clones' guarded writes end with it, and its node's watch.
        term.held_node().let_go();
        terms.since = None;
        if let Some(end) = terms.end.take() {
            end.send_replace(true);
        }
        if let Some(events) = &terms.events {
            let _ = events.send(LeadershipEvent::NotLeader {
                epoch: term.epoch(),
            });
        }
    }

    /// Tells the current term it is over, ahead of [`lose`](Self::lose)
    /// (a selector's leader gets a grace in between). Whether there was a
    /// term.
    pub fn cancel(&self) -> bool {
        let terms = lock(&self.terms);
        terms
            .end
            .as_ref()
            .map(|end| end.send_replace(true))
            .is_some()
    }

    /// Ends the current term if the session, as it is `now`, no longer
    /// allows it under `policy`. Judged against the status the term began
    /// with, so that a late notification of an old change cannot end a term
    /// that began after it.
    pub fn check_session(&self, policy: ErrorPolicy, now: &SessionStatus) {
        let mut terms = lock(&self.terms);
        if let Some(since) = terms.since {
            if policy.ends_leadership(&since, now) {
                self.lose_locked(&mut terms);
            }
        }
    }

    /// Every event from now on; an ended channel once closed.
    pub fn subscribe(&self) -> broadcast::Receiver<LeadershipEvent> {
        let terms = lock(&self.terms);
        let events = terms.events.as_ref().map(broadcast::Sender::subscribe);
        events.unwrap_or_else(|| broadcast::channel(1).1)
    }

    /// Ends the current term and the subscribers' channels, with a last
    /// event for the term only if `notify` (Curator's close modes).
    pub fn close(&self, notify: bool) {
        let mut terms = lock(&self.terms);
        if !notify {
            terms.events = None;
        }
        self.lose_locked(&mut terms);
        terms.events = None;
    }

    /// The current term, if any.
    pub fn term(&self) -> Option<Leadership> {
        self.leadership.borrow().clone()
    }

    /// The current term, now and after every change.
    pub fn watch_term(&self) -> watch::Receiver<Option<Leadership>> {
        self.leadership.subscribe()
    }

    /// The last failed attempt to take part.
    pub fn last_error(&self) -> Option<Error> {
        lock(&self.terms).last_error.clone()
    }

    /// The node of the last term.
    pub fn last_node(&self) -> Option<String> {
        lock(&self.terms).last_node.clone()
    }

    /// Records a failed attempt to take part (Curator only logs these and
    /// goes on), for [`Candidate::last_error`](super::Candidate::last_error).
    pub fn fail(&self, error: Error) {
        lock(&self.terms).last_error = Some(error);
    }
}
