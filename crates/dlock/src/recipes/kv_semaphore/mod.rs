//! [`KvSemaphore`]: the session + compare-and-set semaphore of the Consul
//! design (Consul's `api.Semaphore`, `consul lock -n N`), on any backend.
//!
//! Layout, for a semaphore at `<path>`:
//! - `<path>/<holder-id>`: each contender's **ephemeral** entry, named after
//!   its session (`<holder-id>` = the session id as 16 hex digits). It lives
//!   exactly as long as the session, so it is the proof that a holder is
//!   alive.
//! - `<path>/.lock`: a persistent record, JSON
//!   `{"limit":N,"holders":["<holder-id>",...]}`.
//!
//! A contender creates its entry, then reads the record and the entries:
//! holders without a live entry are dead and are **pruned** (the clean-up the
//! design asks for); if fewer than `limit` remain, it adds itself and writes
//! the record with a compare-and-set on the version it read (or creates the
//! record if there is none). If the slots are full, it waits on a watch of the
//! record and of the entries — any release or any holder's death wakes it; no
//! polling. Release removes the holder by compare-and-set (pruning again),
//! deletes the record when no holder is left, and deletes the entry.
//!
//! # Consul's layout
//!
//! With [`KvSemaphore::with_layout`]`(`[`Layout::Consul`]`)` the nodes are
//! exactly those of Consul's `api.Semaphore` (`consul lock -n N <path>`),
//! entries named after [`Session::native_session_id`] (the Consul session
//! UUID): the compatibility contract is stated with Consul's other layout
//! in [`layout`](crate::recipes::layout). dlock's own layout stays the
//! default on every backend, Consul included: dlock clients of earlier
//! versions on Consul use it, and a contender in one layout does not see
//! the other's holders — a default that changed with the backend would
//! break that exclusion (and recipes never choose by backend).
//!
//! Every contender states the limit; a record with a different limit is a
//! configuration error and fails with [`Error::InvalidArgument`] naming both.
//!
//! Compared with [`Semaphore`](super::semaphore::Semaphore) (Curator's
//! layout, fair, one watcher at a time), this design is simpler and the
//! record tells at a glance who holds, but it is not fair and every waiter
//! wakes on every change. One session holds at most one lease of a given
//! `KvSemaphore` (its entry is named after the session), as in Consul.

mod contender;
mod record;

use std::time::Duration;

use self::contender::raced;
pub use self::contender::KvLease;
pub use self::record::Record;
use super::deadline::{timed_acquire, Deadline};
pub use super::layout::Layout;
use super::revocation::Listener;
use crate::error::{Error, Result};
use crate::path;
use crate::session::Session;
use crate::store::FencingToken;

/// The name of the record node under the semaphore's path.
pub const RECORD: &str = ".lock";

/// The holder id of a session: its id as 16 lower-case hex digits.
///
/// ```
/// assert_eq!(dlock::recipes::kv_semaphore::holder_id(0x1f), "000000000000001f");
/// ```
pub fn holder_id(session_id: crate::store::SessionId) -> String {
    format!("{:016x}", session_id as u64)
}

/// Whether children named `names` are a KvSemaphore's: its record is there
/// (while anyone holds).
pub(crate) fn is_layout(names: &[&str]) -> bool {
    names.contains(&RECORD)
}

/// Whether a child `name` with `data`, owned by the session `owner`, is a
/// contender's entry: named after its owner, holding the entry's UUID
/// token (or a revocation request, which replaced it). Both are checked,
/// because an etcd lease id in hex can also be a foreign key's name.
pub(crate) fn is_entry(name: &str, data: &[u8], owner: crate::store::SessionId) -> bool {
    owner != 0
        && name == holder_id(owner)
        && (data == super::revocation::REVOKE_MESSAGE
            || std::str::from_utf8(data).is_ok_and(|t| uuid::Uuid::parse_str(t).is_ok()))
}

/// A counting semaphore in the Consul design: at most `limit` sessions hold
/// it at once. See the [module docs](self) for the layout and algorithm.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// use dlock::recipes::kv_semaphore::KvSemaphore;
/// let (a, b) = (dlock::connect("embedded").await?, dlock::connect("embedded").await?);
/// let lot_a = KvSemaphore::new(&a, "/doc/kv-semaphore", 1)?;
/// let lot_b = KvSemaphore::new(&b, "/doc/kv-semaphore", 1)?;
/// let lease = lot_a.acquire().await?;
/// assert_eq!(lot_b.holders().await?, [lease.holder()]);
/// assert!(lot_b.try_acquire().await?.is_none(), "the one slot is taken");
/// lease.release().await?;
/// let lease = lot_b.acquire().await?;
/// # lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct KvSemaphore {
    session: Session,
    dir: String,
    record: String,
    layout: Layout,
    limit: u32,
    /// Told our entry's path when someone asks for our slot.
    revocation: Option<Listener>,
    /// The longest a slot may be held before the library ends it.
    max_hold: Option<Duration>,
}

impl KvSemaphore {
    /// A semaphore at `path` admitting `limit` holders. Fails with
    /// [`Error::InvalidArgument`] if `limit` is 0.
    pub fn new(session: &Session, path: &str, limit: u32) -> Result<Self> {
        path::validate_recipe(path, "a semaphore")?;
        if limit == 0 {
            return Err(Error::InvalidArgument(format!(
                "the semaphore at {path} needs a limit of at least 1 holder, got 0"
            )));
        }
        Ok(KvSemaphore {
            session: session.clone(),
            dir: path.to_string(),
            record: path::join(path, RECORD),
            layout: Layout::Curator,
            limit,
            revocation: None,
            max_hold: None,
        })
    }

    /// Uses `layout`'s nodes: [`Layout::Consul`] for Consul's
    /// `api.Semaphore` (see the [module docs](self)). kazoo has no such
    /// semaphore: [`Layout::Kazoo`] writes dlock's own record, as
    /// [`Layout::Curator`] does.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// use dlock::{KvSemaphore, Layout};
    /// let session = dlock::connect("embedded").await?;
    /// let sem = KvSemaphore::new(&session, "/doc/kv-consul", 2)?.with_layout(Layout::Consul);
    /// let lease = sem.acquire().await?;
    /// assert_eq!(lease.holder(), session.native_session_id().1);
    /// let (data, _) = session.get_data("/doc/kv-consul/.lock").await?;
    /// assert!(String::from_utf8(data).unwrap().starts_with(r#"{"Limit":2,"Holders":{"#));
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn with_layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    /// Makes the slot revocable: `listener` is called with our entry's path
    /// whenever someone asks for it with [`revoke`](crate::revoke) — while
    /// we hold a slot or wait for one. Cooperative: the holder decides to
    /// give the slot back.
    ///
    /// The request is Curator's `Revoker` protocol applied to the entry:
    /// `__REVOKE__` is written into `<path>/<holder-id>`, which its owner
    /// watches. Nothing else reads an entry's data — holders are judged
    /// alive by the entry's owner alone — so the request changes nobody's
    /// view of the semaphore. In [`Layout::Consul`], `consul lock -n`
    /// holders see the same: their contender key's value changes and they
    /// carry on (Consul's `api.Semaphore` has no revocation); only dlock
    /// holders listen.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// let session = dlock::connect("embedded").await?;
    /// let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    /// let sem = dlock::KvSemaphore::new(&session, "/doc/kv-revocable", 2)?
    ///     .revocable(move |entry: &str| { let _ = tx.send(entry.to_string()); });
    /// let lease = sem.acquire().await?;
    /// dlock::revoke(&session, lease.node()).await?;
    /// assert_eq!(rx.recv().await.as_deref(), Some(lease.node()));
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn revocable(mut self, listener: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.revocation = Some(Listener::new(listener));
        self
    }

    /// Limits every slot to `max_hold` (Redisson's
    /// `PermitExpirableSemaphore`): at the limit the library deletes our
    /// entry from a task of its own, the lease's
    /// [`lost`](crate::Acquisition::lost) signal fires, its guarded writes
    /// are refused, and waiting contenders — who watch the entries — prune
    /// us from the record and take the slot at once.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// use std::time::Duration;
    /// let (a, b) = (dlock::connect("embedded").await?, dlock::connect("embedded").await?);
    /// let sem_a = dlock::KvSemaphore::new(&a, "/doc/kv-max-hold", 1)?.with_max_hold(Duration::from_millis(50));
    /// let lease = sem_a.acquire().await?;
    /// let next = dlock::KvSemaphore::new(&b, "/doc/kv-max-hold", 1)?.acquire().await?;
    /// assert!(lease.is_lost());
    /// # next.release().await?; let _ = lease.release().await;
    /// # Ok(()) }
    /// ```
    pub fn with_max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// The layout this semaphore uses.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The semaphore's path.
    pub fn path(&self) -> &str {
        &self.dir
    }

    /// The session this semaphore uses.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The limit this contender states.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The live holders in the record (those whose session still has its
    /// entry), in the order they joined — without taking a slot
    /// (CURATOR-230).
    pub async fn holders(&self) -> Result<Vec<String>> {
        Ok(self.look(false).await?.live_holders())
    }

    /// How many slots are free now, without taking one (CURATOR-230): the
    /// limit the holders' record states (this contender's, if nobody
    /// holds) less the live holders. One round of reads.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// let session = dlock::connect("embedded").await?;
    /// let sem = dlock::KvSemaphore::new(&session, "/doc/kv-available", 3)?;
    /// assert_eq!(sem.available_permits().await?, 3);
    /// let lease = sem.acquire().await?;
    /// assert_eq!(sem.available_permits().await?, 2);
    /// # lease.release().await?; Ok(()) }
    /// ```
    pub async fn available_permits(&self) -> Result<u32> {
        let look = self.look(false).await?;
        let limit = look.record.as_ref().map_or(self.limit, |(r, _)| r.limit);
        let held = u32::try_from(look.live_holders().len()).unwrap_or(u32::MAX);
        Ok(limit.saturating_sub(held))
    }

    timed_acquire! {
        /// Waits as long as it takes for a slot.
        ///
        /// Cancellation-safe: dropping the future removes our entry (and our
        /// place in the record, if the join had landed).
        acquire,
        /// Waits at most `timeout`; fails with [`Error::Timeout`] (leaving no
        /// entry behind) if no slot came free in time.
        acquire_timeout,
        /// Takes a slot only if one is free now.
        try_acquire
        => acquire_until() -> KvLease
    }

    /// Attempts until one ends other than "our entry is gone" (see
    /// [`enter`](Self::enter); or the session was lost while we waited): then we
    /// start over in the live session, as the wait queue does.
    async fn acquire_until(&self, deadline: Deadline) -> Result<Option<KvLease>> {
        let session = &self.session;
        session.retrying_reaped(|| self.attempt(deadline)).await
    }

    async fn attempt(&self, deadline: Deadline) -> Result<Option<KvLease>> {
        let entry = self.enter().await?;
        loop {
            let patient = !deadline.passed();
            let look = match self.look(patient).await {
                Ok(look) => look,
                Err(e) => {
                    // Remove our entry before answering (not in the
                    // background), so that the session can try again at
                    // once. The primary error wins.
                    let _ = entry.leave().await;
                    return Err(e);
                }
            };
            if !look.live.contains(&entry.id) {
                return Err(Error::NoNode {
                    path: path::join(&self.dir, &entry.id),
                });
            }
            let mut holders = look.live_holders();
            let version = match &look.record {
                None => None,
                Some((record, _)) if record.limit != self.limit => {
                    entry.leave().await?;
                    return Err(Error::InvalidArgument(format!(
                        "semaphore limit conflict at {}: its holders use a limit of {}, this contender {}",
                        self.dir, record.limit, self.limit
                    )));
                }
                // Our join landed, though its reply was lost.
                Some((_, stat)) if holders.contains(&entry.id) => {
                    return Ok(Some(entry.into_lease(FencingToken(stat.mzxid))));
                }
                Some((_, stat)) => Some(stat.version),
            };
            if holders.len() >= self.limit as usize {
                // Full: wait for a release or a holder's death.
                if !patient
                    || deadline
                        .race(contender::any_change(look.watches))
                        .await
                        .is_none()
                {
                    entry.leave().await?;
                    return Ok(None);
                }
                continue;
            }
            holders.push(entry.id.clone());
            let record = Record {
                limit: self.limit,
                holders,
            };
            match self.write(&record, version).await {
                Ok(stat) => return Ok(Some(entry.into_lease(FencingToken(stat.mzxid)))),
                Err(e) if raced(&e) => {}
                Err(e) => {
                    let _ = entry.leave().await;
                    return Err(e);
                }
            }
        }
    }
}
