//! [`ReadWriteLock`]: many readers or one writer, fair — Curator's
//! `InterProcessReadWriteLock`, node for node.
//!
//! Layout (a compatibility contract with Curator 5.4): one directory holding
//! `_c_<uuid>-__READ__<seq>` and `_c_<uuid>-__WRIT__<seq>` ephemeral-
//! sequential nodes, ordered together by their sequence. A writer holds when
//! it is first; a reader holds when no writer is ahead of it and watches the
//! first writer otherwise. A downgrading writer's read node takes its write
//! node's sequence (Curator 5.5's fix of CURATOR-621), so a writer queued
//! behind cannot slip in between.
//!
//! On etcd, a contender of etcd's Go `Mutex` (`etcdctl lock`, a Go service)
//! on the lock's path — a key `<path>/<lease hex>` — counts as a writer
//! (the layout: `recipes/etcd_go.rs`): readers queued after it wait for it,
//! writers queue with it, and Go waits for every dlock node ahead of its
//! own — except a downgrade's read node, which Go sorts by its own key's
//! creation, after a Go contender that queued while we held the write
//! lock (so do not downgrade where Go contenders wait).

mod owners;

use std::sync::Arc;
use std::time::Duration;

use super::deadline::{timed_acquire, Deadline};
use super::etcd_go;
use super::guard::{deref_hold, Acquisition, LockGuard};
use super::queue::{position, FirstN, Participant, Predicate, Verdict, WaitQueue};
use crate::error::{Error, Result};
use crate::session::Session;
use crate::store::{sequence_key, Child, CreateMode};

use self::owners::{Half, Holds};

/// Curator's node name for readers.
pub const READ_LOCK_NAME: &str = "__READ__";
/// Curator's node name for writers (the same length as the reader's).
pub const WRITE_LOCK_NAME: &str = "__WRIT__";
const SORT_NAMES: &[&str] = &[READ_LOCK_NAME, WRITE_LOCK_NAME];

/// Whether `name` is a writer's queue node (`Some(true)`), a reader's
/// (`Some(false)`), or no node of a read-write lock (`None`). The write
/// name is tested first, as [`ByKind`] does.
pub(crate) fn is_writer(name: &str) -> Option<bool> {
    if name.contains(WRITE_LOCK_NAME) {
        Some(true)
    } else if name.contains(READ_LOCK_NAME) {
        Some(false)
    } else {
        None
    }
}

/// Whether a listed child excludes readers: a writer's node, or a
/// contender of etcd's Go `Mutex`, which has no shared mode.
fn excludes_readers(child: &Child) -> bool {
    child.name.contains(WRITE_LOCK_NAME) || etcd_go::is_contender(child)
}

/// A reader holds when no writer is queued ahead of it; it watches the
/// first writer (not the nearest), as Curator does.
struct NoWriterAhead;

impl Predicate for NoWriterAhead {
    fn check(&self, sorted: &[Child], ours: &str) -> Result<Verdict> {
        let index = position(sorted, ours)?;
        Ok(match sorted[..index].iter().find(|c| excludes_readers(c)) {
            None => Verdict::Acquired,
            Some(writer) => Verdict::WatchNode(writer.clone()),
        })
    }
}

/// Either rule, by the node's kind: for listing who holds.
struct ByKind;

impl Predicate for ByKind {
    fn check(&self, sorted: &[Child], ours: &str) -> Result<Verdict> {
        let index = position(sorted, ours)?;
        if excludes_readers(&sorted[index]) {
            FirstN(1).check(sorted, ours)
        } else {
            NoWriterAhead.check(sorted, ours)
        }
    }
}

/// A fair read-write lock shared by every session that names the same path.
///
/// A hold belongs to the task that took it (outside a task, the thread), as
/// Curator's belong to threads: through one value and its clones, a task
/// is refused the write lock while it holds the read lock, the read lock
/// again while it holds it (use [`ReadGuard::reenter`]), and either lock
/// while it holds the write lock, because each would wait for itself
/// forever; another task waits. A guard moved to another task still counts
/// for the one that took it: a task that hands its guard over and then
/// waits for the lock itself does so through a value of its own
/// ([`ReadWriteLock::new`]; clones share what they hold). Values and clones
/// cost no round trip. Both halves are re-entrant through their guards, and a writer may
/// downgrade: [`WriteGuard::read`] then release the write guard.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// let session = dlock::connect("embedded").await?;
/// let rw = dlock::ReadWriteLock::new(&session, "/doc/rw")?;
/// let other = dlock::ReadWriteLock::new(&session, "/doc/rw")?;
/// let r1 = rw.read().await?;
/// let r2 = other.read().await?;                 // readers share
/// let writer = dlock::ReadWriteLock::new(&session, "/doc/rw")?;
/// assert!(writer.try_write().await?.is_none()); // the writer waits for them
/// r1.release().await?;
/// r2.release().await?;
/// let w = writer.write().await?;
/// let r = w.read().await?;                      // downgrade: write → read
/// w.release().await?;                           // now only reading
/// r.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ReadWriteLock {
    readers: WaitQueue,
    writers: WaitQueue,
    data: Option<Vec<u8>>,
    holds: Arc<Holds>,
}

impl ReadWriteLock {
    /// A read-write lock at `path`, used through `session`.
    pub fn new(session: &Session, path: &str) -> Result<Self> {
        Ok(ReadWriteLock {
            readers: WaitQueue::new(session, path, READ_LOCK_NAME, SORT_NAMES)?,
            // A downgrade's read node takes its write node's place, ahead
            // of the writers queued behind (readers wait for writers only).
            writers: WaitQueue::new(session, path, WRITE_LOCK_NAME, SORT_NAMES)?
                .listing_when_woken(),
            data: None,
            holds: Arc::default(),
        })
    }

    /// Stores `data` in both kinds of node (Curator's `lockData`).
    pub fn with_data(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.data = Some(data.into());
        self
    }

    /// Makes both halves revocable (see [`Mutex::revocable`](crate::Mutex::revocable)).
    pub fn revocable(mut self, listener: impl Fn(&str) + Send + Sync + 'static) -> Self {
        let listener = super::revocation::Listener::new(listener);
        self.readers.revocation = Some(listener.clone());
        self.writers.revocation = Some(listener);
        self
    }

    /// Limits every hold of either half to `max_hold` (see
    /// [`Mutex::with_max_hold`](crate::Mutex::with_max_hold)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// use std::time::Duration;
    /// let session = dlock::connect("embedded").await?;
    /// let lock = dlock::ReadWriteLock::new(&session, "/doc/rw-max-hold")?.with_max_hold(Duration::from_millis(50));
    /// let writing = lock.write().await?;
    /// writing.lost().await;
    /// let reading = lock.read().await?;            // the writer's hold ended
    /// # reading.release().await?; let _ = writing.release().await;
    /// # Ok(()) }
    /// ```
    pub fn with_max_hold(mut self, max_hold: Duration) -> Self {
        self.readers.max_hold = Some(max_hold);
        self.writers.max_hold = Some(max_hold);
        self
    }

    /// The lock's path.
    pub fn path(&self) -> &str {
        &self.readers.dir
    }

    /// The session this lock uses.
    pub fn session(&self) -> &Session {
        &self.readers.session
    }

    fn data(&self) -> &[u8] {
        self.data
            .as_deref()
            .unwrap_or(&self.readers.session.options().default_data)
    }

    timed_acquire! {
        /// Waits as long as it takes to acquire the write lock.
        write,
        /// Waits at most `timeout` for the write lock.
        write_timeout,
        /// Takes the write lock only if it is free now.
        try_write
        => write_until() -> WriteGuard
    }

    /// Takes the write lock by `deadline`; `None` if it passed first.
    pub(crate) async fn write_until(&self, deadline: Deadline) -> Result<Option<WriteGuard>> {
        self.holds
            .refuse_waiting_for_itself(Half::Write, self.path())?;
        if self.writers.taken_now(deadline, |_| true).await? {
            return Ok(None);
        }
        let q = &self.writers;
        let created = q
            .acquire(
                self.data(),
                CreateMode::EphemeralSequential,
                &FirstN(1),
                deadline,
                None,
            )
            .await?;
        Ok(created.map(|created| {
            let node = q.hold(self.path(), "write lock", created);
            self.holds.note(Half::Write, &node);
            WriteGuard {
                guard: LockGuard::new(node),
                lock: self.clone(),
            }
        }))
    }

    timed_acquire! {
        /// Waits as long as it takes to acquire the read lock.
        read,
        /// Waits at most `timeout` for the read lock.
        read_timeout,
        /// Takes the read lock only if no writer holds or waits now.
        try_read
        => read_until() -> ReadGuard
    }

    /// Takes the read lock by `deadline`; `None` if it passed first.
    pub(crate) async fn read_until(&self, deadline: Deadline) -> Result<Option<ReadGuard>> {
        self.holds
            .refuse_waiting_for_itself(Half::Read, self.path())?;
        if self.readers.taken_now(deadline, excludes_readers).await? {
            return Ok(None);
        }
        let q = &self.readers;
        let created = q
            .acquire(
                self.data(),
                CreateMode::EphemeralSequential,
                &NoWriterAhead,
                deadline,
                None,
            )
            .await?;
        let hold = |created| Acquisition::new(q.hold(self.path(), "read lock", created));
        Ok(created.map(|created| self.read_guard(hold(created))))
    }

    fn read_guard(&self, acquisition: Acquisition) -> ReadGuard {
        self.holds.note(Half::Read, acquisition.held_node());
        ReadGuard {
            guard: LockGuard::of(acquisition),
        }
    }

    /// Every participant (readers and writers) in queue order, marking those
    /// that hold.
    pub async fn participants(&self) -> Result<Vec<Participant>> {
        self.readers.participants(&ByKind).await
    }
}

/// A hold of the write lock. Dereferences to [`LockGuard`] for the fencing
/// token, the lost signal and guarded writes.
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock"]
pub struct WriteGuard {
    guard: LockGuard,
    lock: ReadWriteLock,
}

deref_hold!(WriteGuard => guard: LockGuard);

impl WriteGuard {
    /// Takes the read lock while holding the write lock, at once: the first
    /// step of a downgrade (then release the write guard). The read node
    /// takes our write node's sequence, so no writer queued behind us can
    /// get in before our read lock is released. Fails with
    /// [`Error::Lost`] if the write lock was lost, before or while the read
    /// node is made (then it is deleted).
    pub async fn read(&self) -> Result<ReadGuard> {
        let held = self.guard.held_node();
        if self.guard.is_lost() {
            return Err(held.lost_error());
        }
        let sequence = sequence_key(held.created.name(), SORT_NAMES).to_string();
        let q = &self.lock.readers;
        let prefix = q.session.protection_prefix();
        let name = format!("{READ_LOCK_NAME}{sequence}");
        let made = q
            .session
            .create_protected(
                &q.dir,
                &prefix,
                &name,
                q.node_data(self.lock.data()),
                CreateMode::Ephemeral,
                false,
            )
            .await;
        let (created, _) = match made {
            // Where the read node takes its place from the write node
            // (etcd, Consul), a write node gone makes it fail so.
            Err(Error::NoNode { path }) if path == held.created.path => {
                held.found_gone();
                return Err(held.lost_error());
            }
            made => made?,
        };
        let same_session = created.stat.ephemeral_owner == held.created.stat.ephemeral_owner;
        // Ours from here: dropped (this future cancelled), it goes in the
        // background.
        let node = q.hold(q.dir.as_str(), "read lock", created.clone());
        // Fenced by the write hold's token (see `Acquisition::token`).
        let guard = self
            .lock
            .read_guard(Acquisition::with_token(node, self.guard.token()));
        // The read node has taken the write node's place only if that node
        // was still there when it was made, so still there after: deleted
        // before (revoked by force, or at its hold limit), a writer queued
        // behind it may hold already. Made in a later session, it never
        // stood in the write node's place.
        let write_node = q.session.exists(&held.created.path).await?;
        let in_place = write_node.is_some_and(|stat| stat.czxid == held.created.stat.czxid);
        if !same_session || !in_place || self.guard.is_lost() {
            if same_session && !in_place {
                held.found_gone();
            }
            // Gone before we answer (a cancelled answer leaves it to the
            // guard's drop).
            let _ = guard.release().await;
            return Err(held.lost_error());
        }
        if let Some(listener) = &q.revocation {
            super::revocation::watch(&q.session, &created, listener.clone());
        }
        Ok(guard)
    }

    /// Acquires the write lock again without a round trip.
    pub fn reenter(&self) -> Result<WriteGuard> {
        Ok(WriteGuard {
            guard: self.guard.reenter()?,
            lock: self.lock.clone(),
        })
    }

    /// Releases this hold (see [`LockGuard::release`]).
    pub async fn release(self) -> Result<()> {
        self.guard.release().await
    }
}

/// A hold of the read lock. Dereferences to [`LockGuard`].
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock"]
pub struct ReadGuard {
    guard: LockGuard,
}

deref_hold!(ReadGuard => guard: LockGuard);

impl ReadGuard {
    /// Acquires the read lock again without a round trip.
    pub fn reenter(&self) -> Result<ReadGuard> {
        Ok(ReadGuard {
            guard: self.guard.reenter()?,
        })
    }

    /// Releases this hold (see [`LockGuard::release`]).
    pub async fn release(self) -> Result<()> {
        self.guard.release().await
    }
}
