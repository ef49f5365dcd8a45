//! The one wait queue every queueing recipe shares (Curator's
//! `LockInternals`): a participant creates an ephemeral-sequential node in a
//! directory, and waits until a per-recipe [`Predicate`] over the sorted
//! siblings says it holds. It watches only what the predicate names (its
//! predecessor, normally), so a release wakes exactly one waiter.

mod names;
mod node;
mod predicate;
mod wait;

use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Instrument;

pub(crate) use self::names::{
    is_kazoo_node, is_sequenced, NodeNames, CURATOR_LOCK, KAZOO_READ_LOCK, MUTEX_SORT_NAMES,
};
pub(crate) use self::node::{lost_by_release, HeldNode, PendingNode};
pub(crate) use self::predicate::{position, FirstN, Predicate, Verdict};
pub(crate) use self::wait::Stop;
use super::deadline::Deadline;
use super::layout::Layout;
use crate::error::{Error, Found, Result};
use crate::path;
use crate::session::Session;
use crate::store::{sort_sequenced, Child, CreateMode, CreateOptions, Created, Watch};

/// A directory of sequenced participants.
#[derive(Debug, Clone)]
pub(crate) struct WaitQueue {
    pub session: Session,
    pub dir: String,
    /// The recipe's node name (`lock-`, `lease-`, `latch-`, ...).
    pub lock_name: &'static str,
    /// Lock names stripped, in turn, to find the sort key.
    pub sort_names: &'static [&'static str],
    /// kazoo's node name for this recipe, if kazoo has it.
    kazoo_name: Option<&'static str>,
    /// Whose node names we write.
    layout: Layout,
    /// Whether `dir` was made sure of as a persistent node (kazoo's layout).
    assured: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Called with our node's path when someone asks us to give it up.
    pub revocation: Option<super::revocation::Listener>,
    /// The longest a hold may last before the library ends it.
    pub max_hold: Option<std::time::Duration>,
    /// Whether a woken waiter lists the queue rather than trusting
    /// `Store::children_seen`, which may miss nodes created after ours: a
    /// node may join ahead of ours in another's place ([`Child::created`]:
    /// the read-write lock's downgrade), or the predicate counts the nodes
    /// behind ours too (the semaphore's leases).
    lists_when_woken: bool,
    /// `dir` as a metrics label value, shared (not copied) by every
    /// acquisition's metrics.
    path_label: metrics::SharedString,
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
impl WaitQueue {
    pub fn new(
        session: &Session,
        dir: &str,
        lock_name: &'static str,
        sort_names: &'static [&'static str],
    ) -> Result<Self> {
        path::validate_recipe(dir, "a recipe")?;
        Ok(WaitQueue {
            session: session.clone(),
            dir: dir.to_string(),
            lock_name,
            sort_names,
            kazoo_name: None,
            layout: Layout::Curator,
            assured: Default::default(),
            revocation: None,
            max_hold: None,
            lists_when_woken: false,
            path_label: metrics::SharedString::from_shared(std::sync::Arc::from(dir)),
        })
    }

    /// A queue whose woken waiters list it (see `lists_when_woken`).
    pub fn listing_when_woken(mut self) -> Self {
        self.lists_when_woken = true;
        self
    }

    /// The hold of our node `created`, as `what` of the recipe at
    /// `recipe_path`, limited to the queue's maximum hold time if it has
    /// one.
    pub fn hold(
        &self,
        recipe_path: &str,
        what: &'static str,
        created: Created,
    ) -> std::sync::Arc<HeldNode> {
        HeldNode::new(&self.session, recipe_path, what, created).limited(self.max_hold)
    }

    /// A queue of mutex shape (a mutex, a leader selector, a semaphore's
    /// internal lock): Curator's `lock-` nodes, and kazoo's lock nodes
    /// ordered among them.
    pub fn mutex(session: &Session, dir: &str) -> Result<Self> {
        let names = NodeNames::MUTEX;
        let mut queue = Self::new(session, dir, names.curator, names.sort)?;
        queue.kazoo_name = names.kazoo;
        Ok(queue)
    }

    fn names(&self) -> NodeNames {
        NodeNames {
            curator: self.lock_name,
            sort: self.sort_names,
            kazoo: self.kazoo_name,
        }
    }

    /// Writes `layout`'s node names from now on; an error if this recipe
    /// has no such layout.
    pub fn with_layout(mut self, layout: Layout) -> Result<Self> {
        self.names()
            .check_layout(layout, self.recipe(), &self.dir)?;
        self.layout = layout;
        Ok(self)
    }

    /// Whose node names the queue writes.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// kazoo makes sure of a lock's directory once (`ensure_path`: a
    /// persistent node) and then takes it for granted; a container, which
    /// ZooKeeper removes once empty, would make its next create fail. So
    /// in kazoo's layout the directory is made persistent, as kazoo would —
    /// where directories are nodes: where they are implicit (etcd, Consul:
    /// no kazoo there) one made would be a key left behind for good.
    async fn assure_dir(&self) -> Result<()> {
        use std::sync::atomic::Ordering;
        if self.layout != Layout::Kazoo
            || self.assured.load(Ordering::Relaxed)
            || self.session.store().has_implicit_parents()
        {
            return Ok(());
        }
        let persistent = CreateOptions::new(CreateMode::Persistent).with_parents();
        let created = self
            .session
            .retrying(|| self.session.create(&self.dir, b"", persistent))
            .await;
        match created {
            Ok(_) | Err(Error::NodeExists { .. }) => {
                self.assured.store(true, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => Err(e),
        }
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

    /// Whether an acquire by `deadline` may give up at once, before making
    /// a node: the deadline has passed (a try) and someone is queued
    /// already, who `excludes` us — so spare the store a create and a
    /// delete.
    pub async fn taken_now(
        &self,
        deadline: Deadline,
        excludes: fn(&Child) -> bool,
    ) -> Result<bool> {
        Ok(deadline.passed() && self.sorted_children(false).await?.0.iter().any(excludes))
    }

    /// The children in queue order, as of a moment no earlier than our
    /// node's creation (`since`), perhaps behind the latest changes: what a
    /// waiter needs after a wakeup, often without a round trip (see
    /// [`Store::children_seen`]).
    ///
    /// [`Store::children_seen`]: crate::store::Store::children_seen
    pub async fn sorted_children_seen(&self, since: i64) -> Result<Vec<Child>> {
        if self.lists_when_woken {
            return Ok(self.sorted_children(false).await?.0);
        }
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
        let (mut children, w) = listed.found()?.unwrap_or_default();
        sort_sequenced(&mut children, self.sort_names);
        Ok((children, w))
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
        deadline: Deadline,
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
        // Attempts until one ends other than "our node is gone": the parent
        // reaped before our create, or our node with a lost session while we
        // waited. Then we go again with a new node, as Curator does.
        let attempt = || async {
            let (pending, created, children) = self.enter(data, mode).await?;
            let at_once =
                predicate.check(&children, created.name()).ok() == Some(Verdict::Acquired);
            let queued = Instant::now();
            let waited = self.wait(&created, children, predicate, deadline, wake);
            match waited.await {
                Ok(()) => {
                    pending.disarm();
                    if !at_once {
                        metrics::counter!("dlock_handoffs_total", &labels).increment(1);
                        metrics::histogram!("dlock_wait_seconds", &labels)
                            .record(queued.elapsed().as_secs_f64());
                    }
                    Ok(Some(created))
                }
                // A delete failing on the connection goes on in the
                // background; past the deadline its error is a timeout
                // (`Deadline::run`).
                Err(Stop::TimedOut) => {
                    pending.delete().await?;
                    Ok(None)
                }
                // Our node went with its session or its directory; the
                // store removes whatever is left of it.
                Err(Stop::Failed(gone @ Error::NoNode { .. })) => {
                    pending.disarm();
                    Err(gone)
                }
                Err(Stop::Failed(e)) => {
                    // Keep the primary error; the node goes in the background.
                    drop(pending);
                    Err(e)
                }
            }
        };
        let attempts = self.session.retrying_reaped(attempt);
        let result = attempts.instrument(span.clone()).await;
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

    /// What a node of ours holds: `data`, or nothing in a revocable queue
    /// (as Curator: a revocation request is written over it).
    pub fn node_data<'a>(&self, data: &'a [u8]) -> &'a [u8] {
        match self.revocation {
            Some(_) => &[],
            None => data,
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
        let data = self.node_data(data);
        self.assure_dir().await?;
        let (prefix, name) = self
            .names()
            .for_new_node(self.layout, || self.session.protection_prefix());
        let (created, children) = self
            .session
            .create_protected(&self.dir, &prefix, name, data, mode, true)
            .await?;
        let pending = PendingNode::new(&self.session, &created.path);
        if let Some(listener) = &self.revocation {
            super::revocation::watch(&self.session, &created, listener.clone());
        }
        let mut children = children.unwrap_or_default();
        sort_sequenced(&mut children, self.sort_names);
        Ok((pending, created, children))
    }
}
