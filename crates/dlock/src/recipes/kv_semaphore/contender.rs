//! A [`KvSemaphore`]'s contender: its moves (enter, look, write the
//! record, leave) and its entry, which becomes a [`KvLease`]'s.

use std::collections::HashMap;
use std::sync::Arc;

use super::record::{raced, Unanswered};
use super::{holder_id, KvSemaphore, Record, RECORD};
use crate::error::{Error, Found, Result};
use crate::path;
use crate::recipes::deadline::Deadline;
use crate::recipes::entry::{in_background, Claim, Entry};
use crate::recipes::guard::{deref_hold, Acquisition};
use crate::recipes::layout::{Layout, CONSUL_SEMAPHORE_FLAGS};
use crate::recipes::queue::{lost_by_release, HeldNode};
use crate::session::Gone;
use crate::store::{CreateMode, CreateOptions, Created, FencingToken, Stat, Watch};

/// What a contender saw in one look.
pub(super) struct Look {
    pub(super) record: Option<(Record, Stat)>,
    /// The live entries' names, with their creation where the listing
    /// tells it.
    pub(super) live: HashMap<String, Option<i64>>,
    pub(super) watches: Vec<Watch>,
}

impl Look {
    /// The record's holders that are alive, in the order they joined.
    pub(super) fn live_holders(&self) -> Vec<String> {
        let holders = self.record.iter().flat_map(|(r, _)| &r.holders);
        holders
            .filter(|h| self.live.contains_key(*h))
            .cloned()
            .collect()
    }

    /// Whether `contender`'s own entry is among the live ones — not just an
    /// entry of its name: after ours was deleted by force, another handle
    /// of our session may have made one again. Where the listing tells no
    /// creation (ZooKeeper), the name is all there is to go by.
    pub(super) fn has(&self, contender: &Contender) -> bool {
        let ours = contender.created.stat.czxid;
        self.live
            .get(&contender.id)
            .is_some_and(|czxid| czxid.is_none_or(|listed| listed == ours))
    }
}

impl KvSemaphore {
    /// Creates our contender entry, named after the session that owns it;
    /// `None` if `deadline` passed while an earlier entry of this session
    /// was on its way out. `NoNode` if the caller should go again: the
    /// container reaper removed the empty directory between its creation
    /// and ours, that earlier entry is gone now, or the session was renewed
    /// between naming the entry and creating it (then that entry goes, by
    /// its token, in the background).
    pub(super) async fn enter(&self, deadline: Deadline) -> Result<Option<Contender>> {
        let (owner, id) = match self.layout {
            Layout::Curator | Layout::Kazoo => {
                let owner = self.session.session_id();
                (owner, holder_id(owner))
            }
            Layout::Consul => self.session.native_session_id(),
        };
        let mut entry = Entry::new(&self.session, path::join(&self.dir, &id));
        let opts = self.options(CreateMode::Ephemeral).with_parents();
        let created = match entry.claim(opts, owner).await {
            Ok(Claim::Ours(created)) => created,
            Ok(Claim::Other { stale: true, .. }) => {
                return Err(Error::NoNode {
                    path: entry.path.clone(),
                })
            }
            // This session's entry of a lease dropped, or of an acquire
            // cancelled, on its way out in the background: wait for it to
            // go, then go again.
            Ok(Claim::Other {
                stat,
                watch: Some(watch),
                ..
            }) if self.session.is_departing(&entry.path, stat.czxid) => {
                return match deadline.race(watch.changed()).await {
                    None => Ok(None),
                    Some(_) => Err(Error::NoNode {
                        path: entry.path.clone(),
                    }),
                };
            }
            // Gone since, with its leaving (the mark goes after the node):
            // go again. Still there: another handle's lease.
            Ok(Claim::Other { stat, .. }) => {
                let now = self.session.exists(&entry.path).await?;
                return Err(match now.is_some_and(|now| now.czxid == stat.czxid) {
                    true => self.one_lease_per_session(&id),
                    false => Error::NoNode {
                        path: entry.path.clone(),
                    },
                });
            }
            Err(e) => {
                // Nothing of ours was created: nothing to remove.
                if matches!(e, Error::NoNode { .. }) {
                    entry.keep();
                }
                return Err(e);
            }
        };
        entry.keep();
        if let Some(listener) = &self.revocation {
            crate::recipes::revocation::watch(&self.session, &created, listener.clone());
        }
        let sem = self.clone();
        Ok(Some(Contender {
            sem,
            id,
            created,
            node: None,
            taken: false,
            left: false,
        }))
    }

    /// Session `id` holds or waits already, with another handle.
    fn one_lease_per_session(&self, id: &str) -> Error {
        Error::InvalidArgument(format!(
            "session {id} already holds or waits for the semaphore at {}: \
             a KvSemaphore admits one lease per session (use another session)",
            self.dir
        ))
    }

    /// Options to create a node of ours with `mode`, tagged as the layout
    /// asks.
    fn options(&self, mode: CreateMode) -> CreateOptions {
        match self.layout {
            Layout::Curator | Layout::Kazoo => CreateOptions::new(mode),
            Layout::Consul => CreateOptions::new(mode).with_tag(CONSUL_SEMAPHORE_FLAGS),
        }
    }

    /// Reads the record, then the live entries: in that order, so that a
    /// holder missing from the entries really is gone (it had its entry
    /// before it joined). With `watch`, arms a watch on both.
    pub(super) async fn look(&self, watch: bool) -> Result<Look> {
        let (session, store) = (&self.session, self.session.store());
        let read = session
            .retrying(|| store.get_data(&self.record, watch))
            .await;
        let (record, mut watches) = match read.found()? {
            Some((data, stat, w)) => {
                let record = Record::decode(self.layout, &self.record, &data)?;
                (Some((record, stat)), Vec::from_iter(w))
            }
            None => (None, Vec::new()),
        };
        let listed = session.retrying(|| store.children(&self.dir, watch)).await;
        let (children, w) = listed.found()?.unwrap_or_default();
        watches.extend(w);
        // An entry nobody's session holds (on Consul, a session that ended
        // with behavior `release` leaves its key) proves no holder lives.
        let live = children
            .into_iter()
            .filter(|c| c.name != RECORD && c.owner != Some(0))
            .map(|c| (c.name, c.czxid))
            .collect();
        Ok(Look {
            record,
            live,
            watches,
        })
    }

    /// Writes `record` by compare-and-set on `version`, or creates it.
    pub(super) async fn write(&self, record: &Record, version: Option<i32>) -> Result<Stat> {
        let (session, data) = (&self.session, record.encode(self.layout).into_bytes());
        match version {
            Some(_) => session.set_data(&self.record, &data, version).await,
            None => {
                let opts = self.options(CreateMode::Persistent);
                Ok(session.create(&self.record, &data, opts).await?.stat)
            }
        }
    }

    /// Takes holder `id` out of the record, then deletes our `entry` (its
    /// path and creation), which goes even if the record could not be
    /// updated (then the others prune us). No entry (one taken away), or
    /// an entry at our name that is not ours, only prunes the dead,
    /// removing nobody by name: after ours was deleted by force, another
    /// handle of our session may have entered again, with an entry of the
    /// same name that holds a slot under the same id. [`Gone`] if our entry
    /// was gone before we deleted it.
    async fn leave(&self, id: &str, entry: Option<(String, i64)>) -> Result<Gone> {
        let Some((path, czxid)) = entry else {
            return self.leave_record("").await.map(|()| Gone(false));
        };
        let (session, store) = (&self.session, self.session.store());
        // Known where the store fences our session's nodes; else read
        // (and the version read serves the delete).
        let ours = match store.deletes_only_created(&path, czxid) {
            Some(ours) => Ok((ours, None)),
            None => session
                .retrying(|| session.exists(&path))
                .await
                .map(|now| match now {
                    Some(now) if now.czxid == czxid => (true, Some(now.version)),
                    _ => (false, None),
                }),
        };
        let ours_now = matches!(ours, Ok((true, _)));
        let left = self.leave_record(if ours_now { id } else { "" }).await;
        let deleted = match ours {
            Ok((false, _)) => Ok(Gone(true)),
            Ok((true, Some(version))) => session.delete_created_read(&path, czxid, version).await,
            _ => session.delete_created(&path, czxid).await,
        };
        left.and(deleted)
    }

    /// Writes the record without `id` and the dead by compare-and-set —
    /// with no holders if nobody is left: it is never deleted (see the
    /// module docs).
    async fn leave_record(&self, id: &str) -> Result<()> {
        let mut unanswered = Unanswered::default();
        loop {
            let look = match self.look(false).await {
                // Nothing we can fix in the record: just leave.
                Err(Error::MalformedData { .. }) => return Ok(()),
                look => look?,
            };
            let mut holders = look.live_holders();
            holders.retain(|h| h != id);
            let Some((record, stat)) = look.record else {
                return Ok(());
            };
            let version = Some(stat.version);
            if holders == record.holders {
                return Ok(());
            }
            let limit = record.limit;
            let written = self.write(&Record { limit, holders }, version).await;
            match written {
                Err(e) if raced(&e) => {
                    if !unanswered.pause(&self.session, &e).await {
                        return Err(e);
                    }
                }
                written => return written.map(drop),
            }
        }
    }
}

/// Resolves when any of `watches` fires; at once if there are none (then
/// look again).
pub(super) async fn any_change(watches: Vec<Watch>) {
    if !watches.is_empty() {
        futures::future::select_all(watches.into_iter().map(|w| Box::pin(w.changed()))).await;
    }
}

/// Our contender entry, created: unless it [`leave`](Self::leave)s, it is
/// removed (with our place in the record, if any) in the background when
/// dropped, after the lease's node is let go.
#[derive(Debug)]
pub(super) struct Contender {
    sem: KvSemaphore,
    pub(super) id: String,
    created: Created,
    /// The lease's node, once we hold.
    node: Option<Arc<HeldNode>>,
    /// The lease was taken away (revoked by force, or ended by the limit):
    /// our entry is gone, and leaving only prunes the record.
    taken: bool,
    left: bool,
}

impl Contender {
    /// Gives up our place in the record and our entry now; [`Gone`] if
    /// someone else had deleted the entry.
    pub(super) async fn leave(mut self) -> Result<Gone> {
        let (id, entry) = self.departure();
        let left = self.sem.leave(&id, entry).await;
        // Done only once left: if cancelled meanwhile, Drop finishes it.
        self.left = true;
        left
    }

    /// Leaves now, and answers `e` (the primary error) whatever leaving
    /// says: the entry goes before the caller tries again.
    pub(super) async fn leave_after(self, e: Error) -> Error {
        let _ = self.leave().await;
        e
    }

    /// Our entry was deleted by someone else: leaving only prunes the
    /// record, deleting nothing by name.
    pub(super) fn taken_away(mut self) -> Self {
        self.taken = true;
        self
    }

    /// Stands the lease's hold down.
    fn let_go(&mut self) {
        self.taken |= self.node.take().is_some_and(|node| node.let_go().taken());
    }

    /// Stands the hold down; whom to take out of the record, and the entry
    /// to delete (its path and creation).
    fn departure(&mut self) -> (String, Option<(String, i64)>) {
        self.let_go();
        match self.taken {
            false => (
                self.id.clone(),
                Some((self.created.path.clone(), self.created.stat.czxid)),
            ),
            true => (String::new(), None),
        }
    }

    /// A slot fenced by `token`: our entry becomes the lease's node.
    pub(super) fn into_lease(mut self, token: FencingToken) -> KvLease {
        let (sem, created) = (&self.sem, self.created.clone());
        // Our session's entry has one name: one made again after ours was
        // deleted by force has it too, so guarded writes check it is ours.
        let node = HeldNode::at_shared_name(&sem.session, &sem.dir, "semaphore lease", created);
        let node = node.limited(sem.max_hold);
        self.node = Some(node.clone());
        let acquisition = Acquisition::with_token(node, token);
        KvLease {
            acquisition,
            contender: self,
        }
    }
}

impl Drop for Contender {
    fn drop(&mut self) {
        if !self.left {
            let what = format!("giving back the semaphore slot of {}", self.created.path);
            let ((id, entry), sem) = (self.departure(), self.sem.clone());
            let (path, czxid) = (&self.created.path, self.created.stat.czxid);
            let departing = entry
                .as_ref()
                .map(|_| self.sem.session.departing(path, czxid));
            let leave = async move {
                let left = sem.leave(&id, entry).await;
                drop(departing);
                left.map(drop)
            };
            in_background(&self.sem.session, what, leave);
        }
    }
}

/// A slot of a [`KvSemaphore`]: an owned object, free to move between
/// tasks. Give it back with [`release`](Self::release); dropping it gives it
/// back in the background. If the session is lost, so is the slot: the
/// others prune it ([`lost`](crate::Acquisition::lost) tells).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// let session = dlock::connect("embedded").await?;
/// let sem = dlock::KvSemaphore::new(&session, "/doc/kv-lease", 1)?;
/// let lease: dlock::KvLease = sem.acquire().await?;
/// assert_eq!(lease.holder(), dlock::recipes::kv_semaphore::holder_id(session.session_id()));
/// lease.release().await?;
/// assert!(sem.holders().await?.is_empty());
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "dropping the lease gives it back"]
pub struct KvLease {
    acquisition: Acquisition,
    contender: Contender,
}

deref_hold!(
    /// The slot's acquisition. Its [`token`](Acquisition::token) is the
    /// transaction id of the record write that admitted us, larger than that
    /// of every earlier admission (and every earlier write) in the store; its
    /// node is our contender entry, and guarded writes land only while the
    /// entry (so the slot) is still ours.
    KvLease => acquisition: Acquisition
);

impl KvLease {
    /// Our holder id (the session id in hex), as listed in the record.
    pub fn holder(&self) -> &str {
        &self.contender.id
    }

    /// Gives the slot back: removes us from the record (by compare-and-set,
    /// pruning dead holders) and deletes our entry. Reports [`Error::Lost`]
    /// if the slot had been lost before — [`Error::Closed`] if its session
    /// was closed (which took the entry; the others prune the record).
    ///
    /// Cancellation-safe: if this future is dropped before it is done, the
    /// slot is given back in the background.
    pub async fn release(self) -> Result<()> {
        let KvLease {
            acquisition,
            mut contender,
        } = self;
        contender.let_go();
        let lost = acquisition.is_lost();
        match lost_by_release(lost, contender.leave().await)? {
            true => Err(acquisition.lost_error()),
            false => Ok(()),
        }
    }
}
