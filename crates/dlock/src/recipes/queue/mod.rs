//! The one wait queue every queueing recipe shares (Curator's
//! `LockInternals`): a participant creates an ephemeral-sequential node in a
//! directory, and waits until a per-recipe [`Predicate`] over the sorted
//! siblings says it holds. It watches only what the predicate names (its
//! predecessor, normally), so a release wakes exactly one waiter.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Instrument;

use crate::error::{Error, Result};
use crate::path;
use crate::session::Session;
use crate::store::{sort_sequenced, Child, CreateMode, Created, SessionState, Watch};

/// What a recipe's predicate decides for one participant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The participant holds.
    Acquired,
    /// Wait until this sibling, as listed, changes or goes.
    WatchNode(Child),
    /// Wait until the set of siblings changes.
    WatchChildren,
}

/// A recipe's rule for "do I hold?", given the siblings in queue order.
pub(crate) trait Predicate: Send + Sync {
    /// Decides for our node `ours` (a name among `sorted`). Errors with
    /// `NoNode` if our node is not there (its session was lost).
    fn check(&self, sorted: &[Child], ours: &str) -> Result<Verdict>;
}

/// Curator's standard driver: the first `max_leases` participants hold; a
/// waiter watches the participant `max_leases` places ahead of it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FirstN(pub usize);

impl Predicate for FirstN {
    fn check(&self, sorted: &[Child], ours: &str) -> Result<Verdict> {
        let index = position(sorted, ours)?;
        Ok(if index < self.0 {
            Verdict::Acquired
        } else {
            Verdict::WatchNode(sorted[index - self.0].clone())
        })
    }
}

/// Our node's place in the queue, or `NoNode` if it is gone (Curator's
/// `validateOurIndex`: "Sequential path not found").
pub(crate) fn position(sorted: &[Child], ours: &str) -> Result<usize> {
    sorted
        .iter()
        .position(|c| c.name == ours)
        .ok_or_else(|| Error::NoNode {
            path: format!("sequential node {ours} not found"),
        })
}

/// A directory of sequenced participants.
#[derive(Debug, Clone)]
pub(crate) struct WaitQueue {
    pub session: Session,
    pub dir: String,
    /// The recipe's node name (`lock-`, `lease-`, `latch-`, ...).
    pub lock_name: &'static str,
    /// Lock names stripped, in turn, to find the sort key.
    pub sort_names: &'static [&'static str],
    /// Called with our node's path when someone asks us to give it up.
    pub revocation: Option<super::revocation::Listener>,
    /// `dir` as a metrics label value, shared (not copied) by every
    /// acquisition's metrics.
    path_label: metrics::SharedString,
}

/// A node in the queue that is deleted (in the background) unless
/// [`disarm`](Self::disarm)ed: makes acquisition cancellation-safe — a
/// dropped, timed-out or failed acquire leaves nothing behind. (A create
/// still in flight is the protected create's to clean up.)
pub(crate) struct PendingNode {
    session: Session,
    path: String,
    armed: bool,
}

impl PendingNode {
    pub fn disarm(mut self) {
        self.armed = false;
    }

    /// Deletes the node now (retrying), instead of in the background.
    pub async fn delete(mut self) -> Result<()> {
        // Disarmed only once done: if this future is dropped midway, the
        // drop deletes the node in the background.
        let result = self.session.delete_protected(&self.path).await;
        self.armed = false;
        result
    }
}

impl Drop for PendingNode {
    fn drop(&mut self) {
        if self.armed {
            self.session
                .delete_in_background(std::mem::take(&mut self.path));
        }
    }
}

/// One participant of a queueing recipe, as the recipes' `participants()`
/// list it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// let session = dlock::connect("embedded").await?;
/// let mutex = dlock::Mutex::new(&session, "/doc/participants")?.with_data(b"worker-1".to_vec());
/// let guard = mutex.acquire().await?;
/// let all = mutex.participants().await?;
/// assert_eq!(all.len(), 1);
/// assert!(all[0].holds && all[0].data == b"worker-1" && all[0].token == guard.token());
/// # guard.release().await?; Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Participant {
    /// The participant's node (full path).
    pub node: String,
    /// The session that owns the node.
    pub session: crate::store::SessionId,
    /// The node's fencing token.
    pub token: crate::store::FencingToken,
    /// The node's data (Curator: host address, or the participant's id).
    pub data: Vec<u8>,
    /// Whether it holds (the lock, a lease, leadership) now.
    pub holds: bool,
}

/// How a wait ended without acquiring.
#[derive(Debug)]
pub(crate) enum Stop {
    TimedOut,
    Failed(Error),
}

impl WaitQueue {
    pub fn new(
        session: &Session,
        dir: &str,
        lock_name: &'static str,
        sort_names: &'static [&'static str],
    ) -> Result<Self> {
        path::validate(dir)?;
        if dir == "/" {
            return Err(Error::InvalidPath {
                path: dir.into(),
                reason: "a recipe cannot live at the root".into(),
            });
        }
        Ok(WaitQueue {
            session: session.clone(),
            dir: dir.to_string(),
            lock_name,
            sort_names,
            revocation: None,
            path_label: metrics::SharedString::from_shared(std::sync::Arc::from(dir)),
        })
    }

    pub fn node_path(&self, name: &str) -> String {
        path::join(&self.dir, name)
    }

    /// The children in queue order (empty if the directory is gone).
    pub async fn sorted_children(&self, watch: bool) -> Result<(Vec<Child>, Option<Watch>)> {
        let store = self.session.store();
        let listed = self
            .session
            .retrying(|| store.children(&self.dir, watch))
            .await;
        self.in_queue_order(listed)
    }

    /// The children in queue order, as of a moment no earlier than our
    /// node's creation (`since`), perhaps behind the latest changes: what a
    /// waiter needs after a wakeup, often without a round trip (see
    /// [`Store::children_seen`]).
    ///
    /// [`Store::children_seen`]: crate::store::Store::children_seen
    pub async fn sorted_children_seen(&self, since: i64) -> Result<Vec<Child>> {
        let store = self.session.store();
        let listed = self
            .session
            .retrying(|| store.children_seen(&self.dir, since))
            .await;
        Ok(self.in_queue_order(listed.map(|c| (c, None)))?.0)
    }

    /// A listing sorted; a gone directory lists nothing.
    fn in_queue_order(
        &self,
        listed: Result<(Vec<Child>, Option<Watch>)>,
    ) -> Result<(Vec<Child>, Option<Watch>)> {
        match listed {
            Ok((mut children, w)) => {
                sort_sequenced(&mut children, self.sort_names);
                Ok((children, w))
            }
            Err(Error::NoNode { .. }) => Ok((Vec::new(), None)),
            Err(e) => Err(e),
        }
    }

    /// Every participant in queue order, marking those `predicate` says
    /// hold. Nodes that vanish while being read are skipped.
    pub async fn participants(&self, predicate: &dyn Predicate) -> Result<Vec<Participant>> {
        let (children, _) = self.sorted_children(false).await?;
        let mut all = Vec::with_capacity(children.len());
        for child in &children {
            let node = self.node_path(&child.name);
            let store = self.session.store();
            let (data, stat) = match self.session.retrying(|| store.get_data(&node, false)).await {
                Ok((data, stat, _)) => (data, stat),
                Err(Error::NoNode { .. }) => continue,
                Err(e) => return Err(e),
            };
            all.push(Participant {
                holds: predicate.check(&children, &child.name)? == Verdict::Acquired,
                node,
                session: stat.ephemeral_owner,
                token: stat.token(),
                data,
            });
        }
        Ok(all)
    }

    /// Acquires: creates our node and waits until `predicate` says we hold,
    /// up to `deadline`. Returns `Ok(None)` on timeout. If our node vanishes
    /// while waiting (its session was lost), starts over with a new node, as
    /// Curator does, within the retry policy.
    pub async fn acquire(
        &self,
        data: &[u8],
        mode: CreateMode,
        predicate: &dyn Predicate,
        deadline: Option<Instant>,
        wake: Option<&Notify>,
    ) -> Result<Option<Created>> {
        let span = tracing::debug_span!(
            "dlock.acquire",
            recipe = self.recipe(),
            path = %self.dir,
            session = %format_args!("{:#x}", self.session.session_id()),
            node = tracing::field::Empty,
            token = tracing::field::Empty,
        );
        let started = Instant::now();
        let labels = [
            ("recipe", metrics::SharedString::const_str(self.recipe())),
            ("path", self.path_label.clone()),
        ];
        let result = self
            .acquire_inner(data, mode, predicate, deadline, wake, &labels)
            .instrument(span.clone())
            .await;
        match &result {
            Ok(Some(created)) => {
                span.record("node", created.path.as_str());
                span.record("token", created.token().0);
                metrics::histogram!("dlock_acquire_seconds", &labels)
                    .record(started.elapsed().as_secs_f64());
            }
            Ok(None) => metrics::counter!("dlock_acquire_timeouts_total", &labels).increment(1),
            Err(e) => {
                tracing::debug!(parent: &span, error = %e, "acquire failed");
                metrics::counter!("dlock_acquire_errors_total", &labels).increment(1);
            }
        }
        result
    }

    /// The recipe a lock name belongs to, for spans and metrics.
    pub fn recipe(&self) -> &'static str {
        match self.lock_name {
            "lock-" => "mutex",
            "__READ__" => "read",
            "__WRIT__" => "write",
            "lease-" => "semaphore",
            "latch-" => "latch",
            _ => "other",
        }
    }

    async fn acquire_inner(
        &self,
        data: &[u8],
        mode: CreateMode,
        predicate: &dyn Predicate,
        deadline: Option<Instant>,
        wake: Option<&Notify>,
        labels: &[(&'static str, metrics::SharedString); 2],
    ) -> Result<Option<Created>> {
        let mut retry = 0;
        loop {
            let (pending, created, children) = match self.enter(data, mode).await {
                // The container reaper removed the (empty) directory between
                // its creation and ours: go again, as Curator does.
                Err(Error::NoNode { .. }) if retry < self.session.options().retry.max_retries => {
                    retry += 1;
                    continue;
                }
                entered => entered?,
            };
            let at_once =
                predicate.check(&children, created.name()).ok() == Some(Verdict::Acquired);
            let queued = Instant::now();
            match self
                .wait(&created, children, predicate, deadline, wake)
                .await
            {
                Ok(()) => {
                    pending.disarm();
                    if !at_once {
                        metrics::counter!("dlock_handoffs_total", labels).increment(1);
                        metrics::histogram!("dlock_wait_seconds", labels)
                            .record(queued.elapsed().as_secs_f64());
                    }
                    return Ok(Some(created));
                }
                Err(Stop::TimedOut) => {
                    pending.delete().await?;
                    return Ok(None);
                }
                Err(Stop::Failed(Error::NoNode { .. }))
                    if retry < self.session.options().retry.max_retries =>
                {
                    // Our node is gone: the session was lost meanwhile.
                    retry += 1;
                    pending.disarm();
                }
                Err(Stop::Failed(e)) => {
                    // Keep the primary error; the node goes in the background.
                    drop(pending);
                    return Err(e);
                }
            }
        }
    }

    /// Creates our node (protected, parents as containers) and lists the
    /// queue, in one round trip where the backend can. A revocable queue
    /// stores no data (as Curator) and watches our node for requests.
    pub async fn enter(
        &self,
        data: &[u8],
        mode: CreateMode,
    ) -> Result<(PendingNode, Created, Vec<Child>)> {
        let data = if self.revocation.is_some() {
            &[][..]
        } else {
            data
        };
        let prefix = self.session.protection_prefix();
        let (created, children) = self
            .session
            .create_protected(&self.dir, &prefix, self.lock_name, data, mode, true)
            .await?;
        let pending = PendingNode {
            session: self.session.clone(),
            path: created.path.clone(),
            armed: true,
        };
        if let Some(listener) = &self.revocation {
            super::revocation::watch(&self.session, created.path.clone(), listener.clone());
        }
        let mut children = children.unwrap_or_default();
        sort_sequenced(&mut children, self.sort_names);
        Ok((pending, created, children))
    }

    /// Waits until `predicate` says our node holds. `children` is a fresh
    /// sorted listing to start from. Wakes on the watched node or siblings,
    /// on any session event, and on `wake` (a recipe's own trigger, such as
    /// a changed semaphore limit).
    pub async fn wait(
        &self,
        ours: &Created,
        mut children: Vec<Child>,
        predicate: &dyn Predicate,
        deadline: Option<Instant>,
        wake: Option<&Notify>,
    ) -> Result<(), Stop> {
        // Our node lives only as long as the session it was created in; reads
        // renew a lost session transparently, so the session is checked,
        // not inferred from the listing. A lost lease's keys may still be
        // listed for a moment (etcd's lessor removes them up to half a
        // second late: not ours to hold, CURATOR-604), and a watch armed
        // after the loss belongs to the new session and would never fire
        // for it. Either way: start over with a node of the live session.
        let owner = ours.stat.ephemeral_owner;
        let session_gone = || {
            (owner != 0 && !self.session_owns(owner)).then(|| {
                Stop::Failed(Error::NoNode {
                    path: ours.path.clone(),
                })
            })
        };
        let name = ours.name();
        let since = ours.stat.czxid;
        let mut children_watch: Option<Watch> = None;
        loop {
            if let Some(stop) = session_gone() {
                return Err(stop);
            }
            let watch = match predicate.check(&children, name).map_err(Stop::Failed)? {
                Verdict::Acquired => return Ok(()),
                Verdict::WatchNode(sibling) => {
                    match self.watch_sibling(&sibling).await {
                        Ok(Some(watch)) => watch,
                        // Already gone: look again at once.
                        Ok(None) => {
                            children = self
                                .sorted_children_seen(since)
                                .await
                                .map_err(Stop::Failed)?;
                            continue;
                        }
                        Err(e) => return Err(Stop::Failed(e)),
                    }
                }
                Verdict::WatchChildren => match children_watch.take() {
                    Some(watch) => watch,
                    None => {
                        let (fresh, watch) =
                            self.sorted_children(true).await.map_err(Stop::Failed)?;
                        children = fresh;
                        children_watch = watch;
                        if children_watch.is_none() {
                            // The directory is gone, and our node with it.
                            return Err(Stop::Failed(Error::NoNode {
                                path: self.dir.clone(),
                            }));
                        }
                        continue;
                    }
                },
            };
            if let Some(stop) = session_gone() {
                return Err(stop);
            }
            let woke = tokio::select! {
                _ = watch.changed() => true,
                _ = wait_notify(wake) => true,
                _ = sleep_until(deadline) => false,
            };
            if !woke {
                return Err(Stop::TimedOut);
            }
            children = self
                .sorted_children_seen(since)
                .await
                .map_err(Stop::Failed)?;
        }
    }
}

impl WaitQueue {
    /// Watches `sibling`, as a listing showed it, for a change. `None` if
    /// it is gone already — also when its name is back on a newer node
    /// (etcd reuses names): that one came after the listing, so it is not
    /// the node we queued behind.
    pub async fn watch_sibling(&self, sibling: &Child) -> Result<Option<Watch>> {
        let store = self.session.store();
        self.session
            .retrying(|| store.watch_child(&self.dir, sibling))
            .await
    }

    /// Whether `owner` is the session's current, live session.
    fn session_owns(&self, owner: crate::store::SessionId) -> bool {
        let status = self.session.status();
        status.session_id == owner
            && !matches!(status.state, SessionState::Lost | SessionState::Closed)
    }
}

async fn wait_notify(wake: Option<&Notify>) {
    match wake {
        Some(n) => n.notified().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// A deadline `timeout` from now; `None` waits forever.
pub(crate) fn deadline(timeout: Option<Duration>) -> Option<Instant> {
    timeout.map(|t| Instant::now() + t)
}

/// Shared state of a held node: what guards point at.
#[derive(Debug)]
pub(crate) struct HeldNode {
    pub session: Session,
    /// Shared with the metrics labels of the release.
    pub recipe_path: Arc<str>,
    pub what: &'static str,
    pub created: Created,
    pub session_id: crate::store::SessionId,
    pub acquired_at: Instant,
}

impl HeldNode {
    pub fn new(
        session: &Session,
        recipe_path: &str,
        what: &'static str,
        created: Created,
    ) -> Arc<Self> {
        // The node's owner is the session it was acquired in, even if the
        // client has moved to a new session since (then it is lost already).
        let session_id = match created.stat.ephemeral_owner {
            0 => session.session_id(),
            owner => owner,
        };
        Arc::new(HeldNode {
            session: session.clone(),
            recipe_path: Arc::from(recipe_path),
            what,
            session_id,
            created,
            acquired_at: Instant::now(),
        })
    }

    /// Whether the session that created the node is over.
    pub fn is_lost(&self) -> bool {
        let s = self.session.status();
        s.session_id != self.session_id
            || matches!(
                s.state,
                crate::store::SessionState::Lost | crate::store::SessionState::Closed
            )
    }

    pub fn lost_error(&self) -> Error {
        Error::Lost {
            what: self.what,
            path: self.recipe_path.to_string(),
        }
    }

    /// Deletes the node; reports [`Error::Lost`] if it was lost before.
    pub async fn release(&self) -> Result<()> {
        let lost = self.is_lost();
        let labels = [
            ("recipe", metrics::SharedString::const_str(self.what)),
            (
                "path",
                metrics::SharedString::from_shared(self.recipe_path.clone()),
            ),
        ];
        metrics::histogram!("dlock_hold_seconds", &labels)
            .record(self.acquired_at.elapsed().as_secs_f64());
        tracing::debug!(node = %self.created.path, token = self.created.token().0, lost, "release");
        self.session.delete_protected(&self.created.path).await?;
        if lost {
            metrics::counter!("dlock_losses_total", &labels).increment(1);
            Err(self.lost_error())
        } else {
            Ok(())
        }
    }
}
