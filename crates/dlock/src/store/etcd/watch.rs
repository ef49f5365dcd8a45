//! One-shot watches on etcd: every watch of a store shares one etcd watch
//! stream (multiplexed by watch id), run by one dispatcher task.
//!
//! A watch must see every change after the read that armed it (at revision
//! `R`). Asking etcd for a watch from `R + 1` does that, but whenever the
//! store has moved past `R` by the time the watch is registered — always,
//! under contention — etcd files it as *unsynced* and only catches it up
//! every 100 ms: exactly the delay that limits etcd's own
//! `concurrency.Mutex` to a few handoffs per 100 ms. So a watch is created
//! *synced* ("from now") instead, and the gap is closed from the other side:
//! its `created` answer tells the revision `H` it starts after; if `H > R`,
//! the node is read again, and the watch fires at once if what it watches
//! differs from what the arming read saw. No gap, no 100 ms wait; the extra
//! read only happens when the store moved in between.
//!
//! That holds for every watch created, and under contention a creation can
//! still land a moment late and be filed unsynced (measured: 8 contending
//! clients saw an unsynced watcher on the server in one sample out of six,
//! and waits of 100 ms at the 99th percentile). So the watches a wait
//! queue arms most — a waiter's, on the node ahead of it, for its deletion
//! ([`Store::watch_child`](crate::store::Store::watch_child)) — are not
//! created per wait: each directory gets one *shared* watch on the
//! deletions of every key below it (etcd's `NOPUT` filter), which serves
//! all such watches there and stays open for a few seconds after the last
//! one fires, for the next. A node watch joining it needs no request at
//! all: the deletions it delivered after the arming read are replayed from
//! the recent ones it keeps (if those no longer reach back that far, the
//! node is read again, as above). What it delivered also keeps a copy of
//! the directory up to date ([`super::mirror`], which records both), so a
//! woken waiter usually needs no read at all. Other watches on a queued
//! node (a revocation request written into it, its holder's lost signal)
//! are watches of their own: they are armed once per hold, not per wait.
//!
//! The price is paid by the server, per waiting client: a shared watch
//! delivers every deletion in its directory, so each handoff of a lock
//! costs one watch message per client with a waiter there, and the lead
//! over etcd's own recipe (whose rate grows with its clients) shrinks as
//! waiters are added (BENCHMARKS.md, "how it scales"). Creations are not
//! delivered (that halved the messages: BENCHMARKS.md, "Session 15"): a
//! waiter waits for nodes created before its own, which the listing it
//! queued with has (a queue where a node can join ahead in another's
//! place lists when woken: `store::etcd::mirror`). Watching only the predecessor, from far
//! back in the queue, was measured and refused: those watches land
//! unsynced again (etcd reads the current revision and registers the watch
//! in two steps, and a write in between files a "from now" watch as
//! catching up), and the 100 ms waits return.
//!
//! - A watch fires once, on the first event its kind cares about, and is
//!   then cancelled on the server (a shared one stays).
//! - A broken stream is opened again and every pending watch is created
//!   again the same way (from now, with a gap check back to the last
//!   revision it had covered).
//! - A watch the server cancels because its start was compacted away (only
//!   possible for explicit start revisions, which etcd may still use for a
//!   catching-up watcher) reads again, fires if what it watched changed,
//!   or is armed again from the read.
//! - With authentication on, etcd checks a new watch against the token its
//!   stream was opened with, which expires unused (`--auth-token-ttl`),
//!   while unary requests take a fresh one (etcd#12385). etcd 3.4.23
//!   answers a refused watch as watch -1, not by the id it was asked for,
//!   and its watcher waited for ever: the stream is opened again with a
//!   fresh token, and a watch refused again soon after (for what it
//!   watches) is named by the order of the creates still unanswered, and
//!   its watcher looks again.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use etcd_client::{
    Client, EventType, GetOptions, Txn, TxnOp, TxnOpResponse, WatchFilterType, WatchOptions,
    WatchRequestSender, WatchResponse, WatchResponseStream,
};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::keys::{self, Relation};
use super::mirror::{Mirrors, Missed};
use crate::store::WatchEvent;

/// What a watch waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A node that exists as a key: `DataChanged` when it is written,
    /// `NodeDeleted` when it is deleted.
    Data,
    /// A path that does not exist: `NodeCreated` when its key or anything
    /// below it appears.
    Absent,
    /// An implicit directory (no key, but keys below): `DataChanged` if its
    /// key is written, `NodeDeleted` once nothing is left below it.
    Implicit,
    /// A node's children: `ChildrenChanged` when a child key is created or
    /// deleted, `NodeDeleted` when the node's own key is deleted.
    Children,
}

/// A watch to arm, with what the arming read saw.
#[derive(Debug, Clone)]
pub(super) struct Request {
    pub path: String,
    pub kind: Kind,
    /// The header revision of the read that armed it.
    pub read_revision: i64,
    /// [`Kind::Data`]: the key's mod revision as read — or, for a shared
    /// watch (the key's deletion alone), its create revision.
    pub revision: i64,
    /// [`Kind::Children`]: the listing's [`keys::digest`].
    pub digest: u64,
    /// The path is a namespace's root: it has no key of its own (a role
    /// limited to the namespace may not even read it), only keys below.
    pub keyless: bool,
    /// [`Kind::Data`] on a queued node, for its deletion alone: served by
    /// its directory's shared watch (see the module docs). A data change
    /// fires it only if a gap check reads the node again.
    pub shared: bool,
}

enum Cmd {
    Add(Request, oneshot::Sender<WatchEvent>),
    Shutdown,
}

/// Results of the dispatcher's own background reads.
enum Internal {
    /// Fire watch `id` (if still pending) with this event.
    Fire(i64, WatchEvent),
    /// Arm this watch again (after a compaction).
    Rearm(Pending),
}

/// The handle the store keeps: arms watches, shuts the dispatcher down.
#[derive(Debug)]
pub(super) struct Hub {
    tx: mpsc::UnboundedSender<Cmd>,
    /// What the shared watches have seen.
    pub mirrors: Mirrors,
}

impl Hub {
    /// Starts the dispatcher for `client` on `runtime`.
    pub fn start(client: Client, runtime: &tokio::runtime::Handle) -> Hub {
        let (tx, rx) = mpsc::unbounded_channel();
        let mirrors = Mirrors::default();
        runtime.spawn(Dispatcher::new(client, mirrors.clone()).run(rx));
        Hub { tx, mirrors }
    }

    /// Arms a watch; the receiver gets its one event. If the store is
    /// closed, the sender is dropped at once.
    pub fn arm(&self, request: Request) -> oneshot::Receiver<WatchEvent> {
        let (tx, rx) = oneshot::channel();
        let _ = self.tx.send(Cmd::Add(request, tx));
        rx
    }

    /// Stops the dispatcher: pending watches are dropped (they wake with
    /// the session's state).
    pub fn shutdown(&self) {
        let _ = self.tx.send(Cmd::Shutdown);
    }
}

/// A pending watch.
struct Pending {
    armed: Request,
    /// The last revision whose events this watch has certainly seen (the
    /// arming read's, then the last event's).
    covered: i64,
    /// Created "from now" and not yet confirmed: once the server says from
    /// which revision, the changes after `covered` must be checked.
    unconfirmed: bool,
    tx: oneshot::Sender<WatchEvent>,
}

impl Pending {
    fn options(&self, id: i64) -> (Vec<u8>, WatchOptions) {
        let options = WatchOptions::new().with_watch_id(id);
        match self.armed.kind {
            Kind::Data => (self.armed.path.as_bytes().to_vec(), options),
            Kind::Absent | Kind::Implicit | Kind::Children => {
                let (start, end) = if self.armed.keyless {
                    keys::below(&self.armed.path)
                } else {
                    keys::subtree(&self.armed.path)
                };
                (start, options.with_range(end))
            }
        }
    }

    /// The event to fire when the watch is given up on (a failed read, a
    /// cancel by the server): one that makes the watcher look again.
    fn look_again(&self) -> WatchEvent {
        match self.armed.kind {
            Kind::Data | Kind::Implicit => WatchEvent::DataChanged,
            Kind::Absent => WatchEvent::NodeCreated,
            Kind::Children => WatchEvent::ChildrenChanged,
        }
    }
}

/// One etcd watch on the deletions of every key below a directory, serving
/// the deletion watches of the directory's queued nodes (its subscribers),
/// and kept for [`LINGER`] after the last one fired, for the next. What it
/// delivered is recorded in the [`Mirrors`].
struct Shared {
    dir: String,
    /// The last revision delivered on this stream (its start, once open).
    delivered: i64,
    subscribers: HashMap<i64, Pending>,
    /// When the last subscriber left.
    idle_since: Option<Instant>,
}

/// How long a shared watch without subscribers stays open.
const LINGER: Duration = Duration::from_secs(2);

impl Shared {
    fn options(&self, id: i64) -> (Vec<u8>, WatchOptions) {
        let (start, end) = keys::below(&self.dir);
        let options = WatchOptions::new().with_watch_id(id).with_range(end);
        (start, options.with_filters([WatchFilterType::NoPut]))
    }

    /// Whether the deletion of `key` at `revision` fires subscriber `sub`.
    fn fires(sub: &Pending, revision: i64, key: &[u8]) -> bool {
        revision > sub.covered && key == sub.armed.path.as_bytes()
    }
}

/// What one etcd event means for a watch.
enum Verdict {
    Fire(WatchEvent),
    /// An implicit directory lost a descendant: is anything left?
    CheckGone(i64),
    Ignore,
}

fn judge(kind: Kind, path: &str, event: &etcd_client::Event) -> Verdict {
    let Some(kv) = event.kv() else {
        return Verdict::Ignore;
    };
    let put = event.event_type() == EventType::Put;
    let relation = keys::relation(path, kv.key());
    match (kind, relation) {
        (_, Relation::Outside) => Verdict::Ignore,
        (Kind::Data, Relation::Itself) => Verdict::Fire(data_event(put)),
        (Kind::Data, _) => Verdict::Ignore,
        (Kind::Absent, Relation::Itself) if put => Verdict::Fire(WatchEvent::NodeCreated),
        (Kind::Absent, _) if put && keys::is_descendant(path, kv.key()) => {
            Verdict::Fire(WatchEvent::NodeCreated)
        }
        (Kind::Absent, _) => Verdict::Ignore,
        (Kind::Implicit, Relation::Itself) if put => Verdict::Fire(WatchEvent::DataChanged),
        (Kind::Implicit, _) if !put && keys::is_descendant(path, kv.key()) => {
            Verdict::CheckGone(kv.mod_revision())
        }
        (Kind::Implicit, _) => Verdict::Ignore,
        (Kind::Children, Relation::Itself) if !put => Verdict::Fire(WatchEvent::NodeDeleted),
        (Kind::Children, Relation::Child) if !put || kv.version() == 1 => {
            Verdict::Fire(WatchEvent::ChildrenChanged)
        }
        (Kind::Children, _) => Verdict::Ignore,
    }
}

/// Whether etcd cancelled a watch for want of permission: for the stream's
/// expired or outdated token, or for what it watches.
fn refused(response: &WatchResponse) -> bool {
    let reason = response.cancel_reason().to_ascii_lowercase();
    let refusals = [
        "permission denied",
        "auth token",
        "revision of auth store is old",
        "user name is empty",
    ];
    response.canceled() && refusals.iter().any(|r| reason.contains(r))
}

/// What a put or a delete of a watched node's own key means.
fn data_event(put: bool) -> WatchEvent {
    if put {
        WatchEvent::DataChanged
    } else {
        WatchEvent::NodeDeleted
    }
}

/// Reads what `armed` watches, now: the read's revision, and the event to
/// fire if it differs from what the arming read saw (`None`: unchanged).
async fn look(
    client: &Client,
    armed: &Request,
) -> Result<(i64, Option<WatchEvent>), etcd_client::Error> {
    let below = match armed.kind {
        Kind::Children => {
            let (start, end) = keys::below(&armed.path);
            TxnOp::get(
                start,
                Some(GetOptions::new().with_range(end).with_keys_only()),
            )
        }
        _ => {
            let (start, end) = keys::descendants(&armed.path);
            TxnOp::get(
                start,
                Some(GetOptions::new().with_range(end).with_count_only()),
            )
        }
    };
    let own = TxnOp::get(
        keys::own_key(&armed.path, armed.keyless),
        Some(GetOptions::new().with_keys_only()),
    );
    let resp = client
        .kv_client()
        .txn(Txn::new().and_then([own, below]))
        .await?;
    let revision = resp.header().map_or(0, |h| h.revision());
    let gets: Vec<_> = resp
        .op_responses()
        .into_iter()
        .filter_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g),
            _ => None,
        })
        .collect();
    let key = gets.first().and_then(|g| g.kvs().first());
    let below = gets.get(1);
    let below_count = below.map_or(0, |g| g.count());
    let changed = match armed.kind {
        // Gone, or another node of its name.
        Kind::Data if armed.shared => key
            .is_none_or(|kv| kv.create_revision() != armed.revision)
            .then_some(WatchEvent::NodeDeleted),
        Kind::Data => match key {
            None => Some(WatchEvent::NodeDeleted),
            // Made again since the read: the node read was deleted (as
            // ZooKeeper tells it), not changed.
            Some(kv) if kv.create_revision() > armed.read_revision => Some(WatchEvent::NodeDeleted),
            Some(kv) if kv.mod_revision() != armed.revision => Some(WatchEvent::DataChanged),
            Some(_) => None,
        },
        Kind::Absent => (key.is_some() || below_count > 0).then_some(WatchEvent::NodeCreated),
        Kind::Implicit if key.is_some() => Some(WatchEvent::DataChanged),
        Kind::Implicit => (below_count == 0).then_some(WatchEvent::NodeDeleted),
        Kind::Children => {
            let below = below.map_or(&[][..], |g| g.kvs());
            let children = keys::children(&armed.path, below);
            if keys::digest(&children) != armed.digest {
                Some(WatchEvent::ChildrenChanged)
            } else if key.is_none() && below.is_empty() && !armed.keyless {
                // The node itself gone, its children as they were (none):
                // what the stream would have told as its deletion.
                Some(WatchEvent::NodeDeleted)
            } else {
                None
            }
        }
    };
    Ok((revision, changed))
}

struct Stream {
    sender: WatchRequestSender,
    responses: WatchResponseStream,
}

struct Dispatcher {
    client: Client,
    pending: HashMap<i64, Pending>,
    /// Shared directory watches by watch id, their ids by directory, and
    /// the watch id of each subscriber.
    shared: HashMap<i64, Shared>,
    shared_by_dir: HashMap<String, i64>,
    subscribed_to: HashMap<i64, i64>,
    next_id: i64,
    stream: Option<Stream>,
    /// When to try opening the stream again after a failure.
    retry_at: Option<Instant>,
    backoff: Duration,
    internal_tx: mpsc::UnboundedSender<Internal>,
    internal_rx: mpsc::UnboundedReceiver<Internal>,
    /// Kept up to date with every shared watch's events.
    mirrors: Mirrors,
    /// When the stream was last opened again with a fresh auth token.
    token_renewed: Option<Instant>,
    /// The watches asked for on the stream and not yet answered, in the
    /// order asked: etcd answers creates in that order, and a refused one
    /// as watch -1 (3.4.23), which only this order names.
    unanswered: VecDeque<i64>,
}

const OPEN_LIMIT: Duration = Duration::from_secs(5);
/// A watch refused again this soon after the stream's token was renewed
/// is refused for what it watches, not for the token.
const TOKEN_RETRY: Duration = Duration::from_secs(10);
const SWEEP_EVERY: Duration = Duration::from_secs(1);

impl Dispatcher {
    fn new(client: Client, mirrors: Mirrors) -> Self {
        let (internal_tx, internal_rx) = mpsc::unbounded_channel();
        Dispatcher {
            client,
            pending: HashMap::new(),
            shared: HashMap::new(),
            shared_by_dir: HashMap::new(),
            subscribed_to: HashMap::new(),
            next_id: 1,
            stream: None,
            retry_at: None,
            backoff: Duration::from_millis(50),
            internal_tx,
            internal_rx,
            mirrors,
            token_renewed: None,
            unanswered: VecDeque::new(),
        }
    }

    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Cmd>) {
        enum Wake {
            Command(Option<Cmd>),
            Internal(Option<Internal>),
            Response(Result<Option<WatchResponse>, etcd_client::Error>),
            Reopen,
            Sweep,
        }
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let reopen_at = match (
                self.stream.is_none() && !(self.pending.is_empty() && self.shared.is_empty()),
                self.retry_at,
            ) {
                (true, Some(at)) => Some(at),
                (true, None) => Some(Instant::now()),
                (false, _) => None,
            };
            let wake = {
                let stream = &mut self.stream;
                let internal = &mut self.internal_rx;
                let response = async {
                    match stream {
                        Some(stream) => stream.responses.message().await,
                        None => std::future::pending().await,
                    }
                };
                let reopen = async {
                    match reopen_at {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    command = commands.recv() => Wake::Command(command),
                    message = internal.recv() => Wake::Internal(message),
                    response = response => Wake::Response(response),
                    () = reopen => Wake::Reopen,
                    _ = sweep.tick() => Wake::Sweep,
                }
            };
            match wake {
                Wake::Command(Some(Cmd::Add(request, tx))) => {
                    let watch = Pending {
                        covered: request.read_revision,
                        armed: request,
                        unconfirmed: true,
                        tx,
                    };
                    if watch.armed.shared {
                        self.subscribe(watch).await;
                    } else {
                        self.insert(watch).await;
                    }
                }
                Wake::Command(Some(Cmd::Shutdown) | None) | Wake::Internal(None) => return,
                Wake::Internal(Some(Internal::Fire(id, event))) => self.fire(id, event).await,
                Wake::Internal(Some(Internal::Rearm(watch))) => self.insert(watch).await,
                Wake::Response(Ok(Some(response))) => self.on_response(response).await,
                Wake::Response(Ok(None)) => self.broken("the watch stream ended"),
                Wake::Response(Err(e)) => self.broken(&e.to_string()),
                Wake::Reopen => self.reopen().await,
                Wake::Sweep => self.sweep().await,
            }
        }
    }

    /// Registers `watch` under a new id and asks the server for it (opening
    /// the stream if there is none).
    async fn insert(&mut self, watch: Pending) {
        if watch.tx.is_closed() {
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        let request = watch.options(id);
        self.pending.insert(id, watch);
        self.open(id, request).await;
    }

    /// Adds a node watch to its directory's shared watch, opening that if
    /// there is none. Events the shared watch delivered after the arming
    /// read are replayed from the recent ones; if they are no longer all
    /// there, the node is read again (a gap check).
    async fn subscribe(&mut self, mut watch: Pending) {
        if watch.tx.is_closed() {
            return;
        }
        let dir = crate::path::parent(&watch.armed.path).to_string();
        let sub_id = self.next_id;
        self.next_id += 1;
        let id = match self.shared_by_dir.get(&dir) {
            Some(&id) => id,
            None => {
                let id = self.next_id;
                self.next_id += 1;
                self.shared.insert(
                    id,
                    Shared {
                        dir: dir.clone(),
                        delivered: 0,
                        subscribers: HashMap::new(),
                        idle_since: None,
                    },
                );
                self.mirrors.reset(&dir);
                self.shared_by_dir.insert(dir, id);
                self.open(id, self.shared[&id].options(id)).await;
                id
            }
        };
        let Some(shared) = self.shared.get_mut(&id) else {
            return;
        };
        shared.idle_since = None;
        let missed = self.mirrors.missed(&watch.armed.path, watch.covered);
        if missed == Missed::Deleted {
            let _ = watch.tx.send(WatchEvent::NodeDeleted);
            return;
        }
        // Unknown: the shared watch's `created` answer checks the gap.
        watch.unconfirmed = missed == Missed::Unknown;
        if missed == Missed::Nothing {
            watch.covered = watch.covered.max(shared.delivered);
        }
        let gap_check = (missed == Missed::Gap).then(|| watch.armed.clone());
        shared.subscribers.insert(sub_id, watch);
        self.subscribed_to.insert(sub_id, id);
        if let Some(armed) = gap_check {
            self.spawn_gap_check(sub_id, armed);
        }
    }

    /// Asks the server for a watch (already registered, pending or shared)
    /// on the open stream, or opens the stream.
    async fn open(&mut self, id: i64, (key, options): (Vec<u8>, WatchOptions)) {
        match &mut self.stream {
            Some(stream) => match stream.sender.watch(key, Some(options)).await {
                Ok(()) => self.unanswered.push_back(id),
                Err(e) => self.broken(&e.to_string()),
            },
            None if self.retry_at.is_none() => self.reopen().await,
            // A reopen is scheduled; it will include this watch.
            None => {}
        }
    }

    /// Handles an answer for shared watch `id`.
    async fn on_shared_response(&mut self, id: i64, response: WatchResponse) {
        let Some(shared) = self.shared.get_mut(&id) else {
            return;
        };
        if response.compact_revision() != 0 || response.canceled() {
            // Every subscriber looks again (and arms anew).
            tracing::debug!(dir = %shared.dir, "etcd ended a shared watch; its watchers look again");
            let shared = self.remove_shared(id);
            for (_, sub) in shared.subscribers {
                let event = sub.look_again();
                let _ = sub.tx.send(event);
            }
            return;
        }
        if response.created() {
            let start = response.header().map_or(0, |h| h.revision());
            self.mirrors.started(&shared.dir, start);
            shared.delivered = shared.delivered.max(start);
            let mut gaps = Vec::new();
            for (sub_id, sub) in shared.subscribers.iter_mut() {
                if std::mem::take(&mut sub.unconfirmed) && start > sub.covered {
                    gaps.push((*sub_id, sub.armed.clone()));
                }
            }
            for (sub_id, armed) in gaps {
                self.spawn_gap_check(sub_id, armed);
            }
        }
        let Some(shared) = self.shared.get_mut(&id) else {
            return;
        };
        let mut fired = Vec::new();
        let mut deletions = Vec::with_capacity(response.events().len());
        // Deletions only: the watch filters out puts.
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            let revision = kv.mod_revision();
            deletions.push((revision, kv.key().to_vec()));
            let subscribers = shared.subscribers.iter();
            fired.extend(subscribers.filter_map(|(&sub_id, sub)| {
                Shared::fires(sub, revision, kv.key()).then_some(sub_id)
            }));
            shared.delivered = shared.delivered.max(revision);
        }
        // Before the wakeups: a woken waiter reads the copy.
        self.mirrors.deliver(&shared.dir, deletions);
        for sub_id in fired {
            self.fire(sub_id, WatchEvent::NodeDeleted).await;
        }
    }

    fn remove_shared(&mut self, id: i64) -> Shared {
        let shared = self.shared.remove(&id).expect("a shared watch");
        self.shared_by_dir.remove(&shared.dir);
        self.mirrors.remove(&shared.dir);
        for sub_id in shared.subscribers.keys() {
            self.subscribed_to.remove(sub_id);
        }
        shared
    }

    /// Opens a new stream with every pending watch (each from now, with a
    /// gap check back to what it had covered).
    async fn reopen(&mut self) {
        self.retry_at = None;
        self.stream = None;
        self.unanswered.clear();
        self.pending.retain(|_, w| !w.tx.is_closed());
        let mut ids: Vec<i64> = self
            .pending
            .keys()
            .chain(self.shared.keys())
            .copied()
            .collect();
        if ids.is_empty() {
            return;
        }
        ids.sort_unstable();
        for id in &ids {
            if let Some(w) = self.pending.get_mut(id) {
                w.unconfirmed = true;
            }
        }
        for shared in self.shared.values_mut() {
            // What was delivered before the break was seen by every
            // subscriber; the new stream's start is checked against it.
            self.mirrors.reset(&shared.dir);
            for sub in shared.subscribers.values_mut() {
                sub.covered = sub.covered.max(shared.delivered);
                sub.unconfirmed = true;
            }
            // A later subscriber is covered only as far as the new stream
            // delivers: a member behind the old one replays revisions the
            // old stream delivered, and one of them may be the deletion
            // that subscriber waits for (its arming read came after the
            // old stream's delivery but before the deletion's).
            shared.delivered = 0;
        }
        let options = |this: &Self, id: i64| match this.pending.get(&id) {
            Some(w) => w.options(id),
            None => this.shared[&id].options(id),
        };
        let (first_key, first_options) = options(self, ids[0]);
        let mut watches = self.client.watch_client();
        let opened =
            tokio::time::timeout(OPEN_LIMIT, watches.watch(first_key, Some(first_options))).await;
        let stream = match opened {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return self.broken(&e.to_string()),
            Err(_) => return self.broken("opening the watch stream timed out"),
        };
        let (mut sender, responses) = stream.split();
        self.unanswered.push_back(ids[0]);
        for id in &ids[1..] {
            let (key, options) = options(self, *id);
            if let Err(e) = sender.watch(key, Some(options)).await {
                return self.broken(&e.to_string());
            }
            self.unanswered.push_back(*id);
        }
        self.stream = Some(Stream { sender, responses });
        self.backoff = Duration::from_millis(50);
    }

    /// After a watch was refused for the stream's token: etcd checks a new
    /// watch against the token the stream was opened with (etcd#12385),
    /// which expires when unused (`--auth-token-ttl`, 5 minutes by
    /// default; renewals of the session's lease do not use it), while the
    /// unary requests renew theirs. Takes a fresh token and opens the
    /// stream again with every watch, which resume as after a break.
    /// `false` (the watch was refused for what it watches) if that was done
    /// within [`TOKEN_RETRY`] already, or the token could not be had.
    async fn renew_token(&mut self) -> bool {
        if self
            .token_renewed
            .is_some_and(|at| at.elapsed() < TOKEN_RETRY)
        {
            return false;
        }
        self.token_renewed = Some(Instant::now());
        let renewed = tokio::time::timeout(OPEN_LIMIT, self.client.refresh_token()).await;
        if !matches!(renewed, Ok(Ok(()))) {
            return false;
        }
        tracing::debug!("etcd refused a watch for the stream's auth token; opening it again");
        self.reopen().await;
        true
    }

    /// The stream failed: open it again after a backoff; watches resume
    /// from where they were.
    fn broken(&mut self, why: &str) {
        if self.stream.is_some() || self.retry_at.is_none() {
            tracing::debug!(
                "etcd watch stream broken ({why}); resuming {} watches",
                self.pending.len()
            );
        }
        self.stream = None;
        self.retry_at = Some(Instant::now() + self.backoff);
        self.backoff = (self.backoff * 2).min(Duration::from_secs(2));
    }

    async fn cancel(&mut self, id: i64) {
        if let Some(stream) = &mut self.stream {
            if let Err(e) = stream.sender.cancel(id).await {
                self.broken(&e.to_string());
            }
        }
    }

    async fn fire(&mut self, id: i64, event: WatchEvent) {
        if let Some(watch) = self.pending.remove(&id) {
            let _ = watch.tx.send(event);
            self.cancel(id).await;
        } else if let Some(shared_id) = self.subscribed_to.remove(&id) {
            // The shared watch stays open for the directory's next watch.
            if let Some(shared) = self.shared.get_mut(&shared_id) {
                if let Some(sub) = shared.subscribers.remove(&id) {
                    let _ = sub.tx.send(event);
                }
                if shared.subscribers.is_empty() {
                    shared.idle_since = Some(Instant::now());
                }
            }
        }
    }

    /// Drops the watches nobody waits for any more.
    async fn sweep(&mut self) {
        let gone: Vec<i64> = self
            .pending
            .iter()
            .filter(|(_, w)| w.tx.is_closed())
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.pending.remove(&id);
            self.cancel(id).await;
        }
        let mut idle = Vec::new();
        for (id, shared) in self.shared.iter_mut() {
            shared.subscribers.retain(|sub_id, sub| {
                let open = !sub.tx.is_closed();
                if !open {
                    self.subscribed_to.remove(sub_id);
                }
                open
            });
            if shared.subscribers.is_empty() {
                let since = *shared.idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= LINGER {
                    idle.push(*id);
                }
            }
        }
        for id in idle {
            self.remove_shared(id);
            self.cancel(id).await;
        }
    }

    async fn on_response(&mut self, response: WatchResponse) {
        let mut id = response.watch_id();
        if response.created() {
            if let Some(at) = self.unanswered.iter().position(|&asked| asked == id) {
                self.unanswered.remove(at);
            }
        }
        if refused(&response) {
            if self.renew_token().await {
                return;
            }
            // Refused as watch -1 (etcd 3.4.23; earlier 3.4 releases
            // answered with our id): the oldest create still unanswered,
            // which ends as any watch the server cancels.
            if !(self.pending.contains_key(&id) || self.shared.contains_key(&id)) {
                let Some(asked) = self.unanswered.pop_front() else {
                    return;
                };
                tracing::debug!(
                    watch = asked,
                    reason = response.cancel_reason(),
                    "etcd refused a watch"
                );
                id = asked;
            }
        }
        if self.shared.contains_key(&id) {
            return self.on_shared_response(id, response).await;
        }
        if response.compact_revision() != 0 {
            if let Some(watch) = self.pending.remove(&id) {
                tracing::debug!(path = %watch.armed.path, compacted = response.compact_revision(), "etcd watch start compacted; reading again");
                self.spawn_recheck(watch);
            }
            return;
        }
        if response.canceled() {
            // Cancelled by the server for another reason (we only cancel
            // watches we no longer hold): make the watcher look again.
            if let Some(watch) = self.pending.remove(&id) {
                tracing::debug!(path = %watch.armed.path, reason = response.cancel_reason(), "etcd cancelled a watch");
                let event = watch.look_again();
                let _ = watch.tx.send(event);
            }
            return;
        }
        if response.created() {
            let start = response.header().map_or(0, |h| h.revision());
            if let Some(watch) = self.pending.get_mut(&id) {
                if std::mem::take(&mut watch.unconfirmed) && start > watch.covered {
                    // The store moved between the arming read and the
                    // watch: did what we watch change meanwhile?
                    let armed = watch.armed.clone();
                    self.spawn_gap_check(id, armed);
                }
            }
        }
        for event in response.events() {
            let Some(watch) = self.pending.get_mut(&id) else {
                return;
            };
            if let Some(kv) = event.kv() {
                // Already seen by the arming read (a member that lags
                // behind may start the watch a little in the past).
                if kv.mod_revision() <= watch.covered {
                    continue;
                }
                watch.covered = kv.mod_revision();
            }
            match judge(watch.armed.kind, &watch.armed.path, event) {
                Verdict::Fire(fired) => {
                    self.fire(id, fired).await;
                    return;
                }
                Verdict::CheckGone(revision) => {
                    let path = watch.armed.path.clone();
                    self.spawn_gone_check(id, path, revision);
                }
                Verdict::Ignore => {}
            }
        }
    }

    /// Fires watch `id` if what it watches changed since it was armed.
    fn spawn_gap_check(&self, id: i64, armed: Request) {
        let client = self.client.clone();
        let results = self.internal_tx.clone();
        tokio::spawn(async move {
            let event = match look(&client, &armed).await {
                Ok((_, changed)) => changed,
                Err(_) => Some(match armed.kind {
                    Kind::Data | Kind::Implicit => WatchEvent::DataChanged,
                    Kind::Absent => WatchEvent::NodeCreated,
                    Kind::Children => WatchEvent::ChildrenChanged,
                }),
            };
            if let Some(event) = event {
                let _ = results.send(Internal::Fire(id, event));
            }
        });
    }

    /// Whether an implicit directory has anything left below it at
    /// `revision` (or now, if that was compacted): if not, it is deleted.
    fn spawn_gone_check(&self, id: i64, path: String, revision: i64) {
        let mut kv = self.client.kv_client();
        let results = self.internal_tx.clone();
        tokio::spawn(async move {
            let (start, end) = keys::descendants(&path);
            let count = |revision: i64| {
                let mut options = GetOptions::new().with_range(end.clone()).with_count_only();
                if revision > 0 {
                    options = options.with_revision(revision);
                }
                options
            };
            let mut read = kv.get(start.clone(), Some(count(revision))).await;
            if read.is_err() {
                read = kv.get(start.clone(), Some(count(0))).await;
            }
            let Ok(below) = read else {
                let _ = results.send(Internal::Fire(id, WatchEvent::DataChanged));
                return;
            };
            if below.count() == 0 {
                let _ = results.send(Internal::Fire(id, WatchEvent::NodeDeleted));
            }
        });
    }

    /// After a compaction: reads what `watch` watches and fires if it
    /// changed since the watch was armed, else arms it again (covered up to
    /// the read).
    fn spawn_recheck(&self, mut watch: Pending) {
        let client = self.client.clone();
        let results = self.internal_tx.clone();
        tokio::spawn(async move {
            match look(&client, &watch.armed).await {
                Ok((_, Some(event))) => {
                    let _ = watch.tx.send(event);
                }
                Ok((revision, None)) => {
                    watch.covered = revision;
                    watch.unconfirmed = true;
                    let _ = results.send(Internal::Rearm(watch));
                }
                Err(_) => {
                    let event = watch.look_again();
                    let _ = watch.tx.send(event);
                }
            }
        });
    }
}
