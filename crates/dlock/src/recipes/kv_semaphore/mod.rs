//! [`KvSemaphore`]: the session + compare-and-set semaphore of the Consul
//! design (Consul's `api.Semaphore`, `consul lock -n N`), on any backend.
//!
//! # Layout (a compatibility contract)
//!
//! - `<path>/<holder-id>`: each contender's **ephemeral** entry, named after
//!   its session (the session id as 16 hex digits): alive exactly as long
//!   as the session, it is the proof that a holder lives.
//! - `<path>/.lock`: a persistent [`Record`], JSON
//!   `{"limit":N,"holders":["<holder-id>",...]}` (no holders once nobody
//!   holds: see below).
//!
//! With [`Layout::Consul`] the nodes are exactly those of Consul's
//! `api.Semaphore`, stated with Consul's other layout in
//! [`layout`](crate::recipes::layout): entries named after the Consul
//! session's UUID ([`Session::native_session_id`]), alive only while a
//! session owns them. dlock's own layout stays the default on every
//! backend, Consul included: the two layouts do not see each other's
//! holders, so a default that changed with the backend would break the
//! exclusion with earlier dlock clients (and recipes never choose by
//! backend).
//!
//! # Algorithm
//!
//! A contender creates its entry, then reads the record and the entries:
//! holders without a live entry are dead and are **pruned**; if fewer than
//! `limit` remain, it joins by a compare-and-set of the record on the
//! version it read (or creates the record). If the slots are full, it
//! waits on a watch of the record and of the entries: any release or any
//! holder's death wakes it, with no polling. Release leaves the record by
//! compare-and-set (pruning again), then deletes the entry. Every contender
//! states the limit; a record with another is [`Error::InvalidArgument`]
//! naming both.
//!
//! The last holder to leave writes the record **with no holders**; it never
//! deletes it. A record made again would start again at version 0, so a
//! contender's compare-and-set on the version it read from the old record
//! could land on the new one and drop its holders (ABA): more holders than
//! the limit. Kept, every write moves its version on. Consul's
//! `api.Semaphore` keeps its record the same way (`{"Limit":N,"Holders":{}}`
//! after the last release; its `Destroy`, which `consul lock -n` calls on
//! exit, deletes it), and earlier dlock clients read a record without
//! holders as any other. A record without live holders states no limit: a
//! contender with another one writes its own.
//!
//! Unlike [`Semaphore`](super::semaphore::Semaphore) (Curator's: fair, one
//! watcher at a time) it is not fair and every waiter wakes on every
//! change, but the record tells at a glance who holds. A session holds at
//! most one lease of a semaphore (its entry is named after it), as in
//! Consul.

mod contender;
mod record;

use std::time::Duration;

use self::contender::any_change;
pub use self::contender::KvLease;
pub use self::record::Record;
use self::record::{raced, Unanswered};
use super::deadline::{timed_acquire, Deadline};
pub use super::layout::Layout;
use super::revocation::{Listener, REVOKE_MESSAGE};
use crate::error::{Error, Result};
use crate::path;
use crate::session::Session;
use crate::store::{FencingToken, SessionId};

/// The name of the record node under the semaphore's path.
pub const RECORD: &str = ".lock";

/// The holder id of a session: its id as 16 lower-case hex digits.
///
/// ```
/// assert_eq!(dlock::recipes::kv_semaphore::holder_id(0x1f), "000000000000001f");
/// ```
pub fn holder_id(session_id: SessionId) -> String {
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
pub(crate) fn is_entry(name: &str, data: &[u8], owner: SessionId) -> bool {
    let token = || std::str::from_utf8(data).is_ok_and(|t| uuid::Uuid::parse_str(t).is_ok());
    owner != 0 && name == holder_id(owner) && (data == REVOKE_MESSAGE || token())
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

    /// Makes the slot revocable, as [`Mutex::revocable`](crate::Mutex::revocable)
    /// does a lock: `__REVOKE__` written into our entry calls `listener`
    /// with its path, while we hold or wait. Only owners read an entry's
    /// data, so the request changes nobody's view of the semaphore;
    /// `consul lock -n` holders (no revocation in `api.Semaphore`) carry on.
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

    /// Limits every slot to `max_hold`, as
    /// [`Mutex::with_max_hold`](crate::Mutex::with_max_hold) does a lock:
    /// the library deletes our entry, and waiting contenders, who watch the
    /// entries, prune us from the record and take the slot at once.
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
    /// entry), in the order they joined, without taking a slot
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
        let held = look.live_holders();
        let limit = match &look.record {
            Some((record, _)) if !held.is_empty() => record.limit,
            _ => self.limit,
        };
        let held = u32::try_from(held.len()).unwrap_or(u32::MAX);
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
    /// [`enter`](Self::enter); or the session was lost while we waited):
    /// then we start over in the live session, as the wait queue does.
    pub(crate) async fn acquire_until(&self, deadline: Deadline) -> Result<Option<KvLease>> {
        let session = &self.session;
        session.retrying_reaped(|| self.attempt(deadline)).await
    }

    async fn attempt(&self, deadline: Deadline) -> Result<Option<KvLease>> {
        let Some(entry) = self.enter(deadline).await? else {
            return Ok(None);
        };
        // Watches are armed only once the slots were found full: on
        // Consul each is a query of its own, which a free slot never needs.
        let mut watching = false;
        let mut unanswered = Unanswered::default();
        loop {
            let patient = !deadline.passed();
            // On an error our entry goes before we answer (not in the
            // background), so that the session can try again at once.
            let look = match self.look(patient && watching).await {
                Ok(look) if look.has(&entry) => look,
                // Taken away (deleted by force): we go again at once with
                // an entry of the same name, which a leaving by name in
                // the background could delete. So leave now, pruning only.
                Ok(_) => {
                    let gone = Error::NoNode {
                        path: path::join(&self.dir, &entry.id),
                    };
                    return Err(entry.taken_away().leave_after(gone).await);
                }
                Err(e) => return Err(entry.leave_after(e).await),
            };
            let mut holders = look.live_holders();
            let version = match &look.record {
                None => None,
                Some((record, _)) if record.limit != self.limit && !holders.is_empty() => {
                    let conflict = Error::InvalidArgument(format!(
                        "semaphore limit conflict at {}: its holders use a limit of {}, this contender {}",
                        self.dir, record.limit, self.limit
                    ));
                    return Err(entry.leave_after(conflict).await);
                }
                // Our join landed, though its reply was lost.
                Some((_, stat)) if unanswered.any() && holders.contains(&entry.id) => {
                    return Ok(Some(entry.into_lease(FencingToken(stat.mzxid))));
                }
                Some((_, stat)) => Some(stat.version),
            };
            // Our id listed with no join of ours sent: the place of an
            // earlier entry of our session, deleted by force. Ours now, but
            // written again: the lease's token must be a new one, larger
            // than the earlier lease's.
            let listed = holders.contains(&entry.id);
            if !listed && holders.len() >= self.limit as usize {
                if patient && !watching {
                    // Look again, watching what we read.
                    watching = true;
                    continue;
                }
                // Full: wait for a release or a holder's death.
                let changed = patient && deadline.race(any_change(look.watches)).await.is_some();
                if !changed {
                    entry.leave().await?;
                    return Ok(None);
                }
                continue;
            }
            if !listed {
                holders.push(entry.id.clone());
            }
            let limit = self.limit;
            match self.write(&Record { limit, holders }, version).await {
                Ok(stat) => return Ok(Some(entry.into_lease(FencingToken(stat.mzxid)))),
                // Unanswered, it may land yet (the next look tells); but it
                // is not tried again past the deadline: we leave, holding
                // nothing, as any acquire that timed out.
                Err(Error::ConnectionLoss) if deadline.passed() => {
                    entry.leave().await?;
                    return Ok(None);
                }
                Err(e) if raced(&e) => {
                    let paused = deadline.race(unanswered.pause(&self.session, &e)).await;
                    if paused == Some(false) {
                        return Err(entry.leave_after(e).await);
                    }
                }
                Err(e) => return Err(entry.leave_after(e).await),
            }
        }
    }
}
