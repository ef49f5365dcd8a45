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
//! Every contender states the limit; a record with a different limit is a
//! configuration error and fails with [`Error::InvalidArgument`] naming both.
//!
//! Compared with [`Semaphore`](super::semaphore::Semaphore) (Curator's
//! layout, fair, one watcher at a time), this design is simpler and the
//! record tells at a glance who holds, but it is not fair and every waiter
//! wakes on every change. One session holds at most one lease of a given
//! `KvSemaphore` (its entry is named after the session), as in Consul.

use std::collections::HashSet;
use std::ops::Deref;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use super::guard::Acquisition;
use super::queue::{deadline, HeldNode};
use crate::error::{Error, Result};
use crate::path;
use crate::session::Session;
use crate::store::{Child, CreateMode, CreateOptions, Created, FencingToken, Stat, Watch};

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
/// token. Both are checked, because an etcd lease id in hex can also be a
/// foreign key's name.
pub(crate) fn is_entry(name: &str, data: &[u8], owner: crate::store::SessionId) -> bool {
    owner != 0
        && name == holder_id(owner)
        && std::str::from_utf8(data).is_ok_and(|t| uuid::Uuid::parse_str(t).is_ok())
}

/// The decoded `.lock` record.
///
/// ```
/// use dlock::recipes::kv_semaphore::Record;
/// let r = Record { limit: 3, holders: vec!["00000000000000a1".into()] };
/// let json = r.to_json();
/// assert_eq!(json, r#"{"limit":3,"holders":["00000000000000a1"]}"#);
/// assert_eq!(Record::parse("/s/.lock", json.as_bytes()).unwrap(), r);
/// assert!(Record::parse("/s/.lock", b"{\"limit\":0,\"holders\":[]}").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// How many holders at most.
    pub limit: u32,
    /// The holders' ids.
    pub holders: Vec<String>,
}

/// The record as stored. Private, so that `Record` makes no promise about
/// serde; the derive writes the fields in this order with no spaces.
#[derive(serde::Serialize)]
struct Stored<'a> {
    limit: u32,
    holders: &'a [String],
}

impl Record {
    /// The record as JSON.
    pub fn to_json(&self) -> String {
        let stored = Stored {
            limit: self.limit,
            holders: &self.holders,
        };
        serde_json::to_string(&stored).expect("a number and strings always serialize")
    }

    /// Decodes a record stored at `path`: a JSON object with a positive
    /// integer `limit` and an array of strings `holders` (other keys are
    /// ignored but must be valid JSON; duplicate holders count once).
    /// Anything else is [`Error::MalformedData`].
    pub fn parse(path: &str, data: &[u8]) -> Result<Record> {
        let bad = |reason: String| Error::MalformedData {
            path: path.to_string(),
            reason,
        };
        let text = std::str::from_utf8(data).map_err(|_| bad("the record is not UTF-8".into()))?;
        // Into a `Value` rather than a derived struct: each problem then gets
        // its own message, and unknown keys are checked too.
        let value: Value = serde_json::from_str(text).map_err(|e| bad(not_json(&e, text)))?;
        let Value::Object(fields) = value else {
            return Err(bad("the record is not a JSON object".into()));
        };
        let limit = fields
            .get("limit")
            .ok_or_else(|| bad("the record has no \"limit\"".into()))?;
        // Through f64, as before serde: `3.0` is a limit of 3.
        let positive = |f: &f64| f.fract() == 0.0 && (1.0..=f64::from(u32::MAX)).contains(f);
        let Some(whole) = limit.as_f64().filter(positive) else {
            return Err(bad(format!(
                "\"limit\" must be a positive integer, found {limit}"
            )));
        };
        let items = match fields.get("holders") {
            Some(Value::Array(items)) => items,
            Some(other) => return Err(bad(format!("\"holders\" must be an array, found {other}"))),
            None => return Err(bad("the record has no \"holders\"".into())),
        };
        let mut holders: Vec<String> = Vec::with_capacity(items.len());
        for item in items {
            let h = item
                .as_str()
                .ok_or_else(|| bad(format!("\"holders\" must hold strings, found {item}")))?;
            if !holders.iter().any(|known| known == h) {
                holders.push(h.to_owned());
            }
        }
        Ok(Record {
            limit: whole as u32,
            holders,
        })
    }
}

/// Why `text` is not JSON: serde_json's message, in the words of the
/// hand-written parser it replaced where the two differ (callers and tests
/// look for those words).
fn not_json(e: &serde_json::Error, text: &str) -> String {
    let message = e.to_string();
    let what = message.split(" at line ").next().unwrap_or_default();
    // Where serde_json stopped: just after the escape it refused.
    let before = text.split('\n').take(e.line().saturating_sub(1));
    let end = before.map(|l| l.len() + 1).sum::<usize>() + e.column();
    let escape = text.as_bytes().get(..end.saturating_sub(4));
    let unicode = escape.is_some_and(|s| s.ends_with(b"\\u"));
    let ours = match what {
        "recursion limit exceeded" => "nested too deeply",
        "unexpected end of hex escape" | "lone leading surrogate in hex escape" => {
            "unpaired surrogate"
        }
        // Such as 1e999: the old parser read infinity, then refused it as
        // a limit.
        "number out of range" => "number out of range (a \"limit\" must be a positive integer)",
        "invalid escape" if unicode => "invalid \\u escape",
        other => other,
    };
    format!("the record is not JSON: {ours}{}", &message[what.len()..])
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
    place: Place,
    limit: u32,
}

/// Where a semaphore lives.
#[derive(Clone)]
struct Place {
    session: Session,
    dir: String,
    record: String,
}

/// What a contender saw in one look.
struct Look {
    record: Option<(Record, Stat)>,
    live: HashSet<String>,
    watches: Vec<Watch>,
}

impl Look {
    /// The record's holders that are alive, in the order they joined.
    fn live_holders(&self) -> Vec<String> {
        let holders = self.record.iter().flat_map(|(r, _)| &r.holders);
        holders
            .filter(|h| self.live.contains(*h))
            .cloned()
            .collect()
    }
}

impl KvSemaphore {
    /// A semaphore at `path` admitting `limit` holders. Fails with
    /// [`Error::InvalidArgument`] if `limit` is 0.
    pub fn new(session: &Session, path: &str, limit: u32) -> Result<Self> {
        path::validate(path)?;
        if path == "/" {
            return Err(Error::InvalidPath {
                path: path.into(),
                reason: "a semaphore cannot live at the root".into(),
            });
        }
        if limit == 0 {
            return Err(Error::InvalidArgument(format!(
                "the semaphore at {path} needs a limit of at least 1 holder, got 0"
            )));
        }
        Ok(KvSemaphore {
            place: Place {
                session: session.clone(),
                dir: path.to_string(),
                record: path::join(path, RECORD),
            },
            limit,
        })
    }

    /// The semaphore's path.
    pub fn path(&self) -> &str {
        &self.place.dir
    }

    /// The session this semaphore uses.
    pub fn session(&self) -> &Session {
        &self.place.session
    }

    /// The limit this contender states.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The live holders in the record (those whose session still has its
    /// entry), in the order they joined.
    pub async fn holders(&self) -> Result<Vec<String>> {
        Ok(self.place.look(false).await?.live_holders())
    }

    /// Waits as long as it takes for a slot.
    ///
    /// Cancellation-safe: dropping the future removes our entry (and our
    /// place in the record, if the join had landed).
    pub async fn acquire(&self) -> Result<KvLease> {
        self.acquire_until(Wait::Forever)
            .await?
            .ok_or_else(|| Error::Backend("acquire without deadline timed out".into()))
    }

    /// Waits at most `timeout`; fails with [`Error::Timeout`] (leaving no
    /// entry behind) if no slot came free in time.
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<KvLease> {
        self.acquire_until(Wait::Until(deadline(Some(timeout)).expect("a deadline")))
            .await?
            .ok_or(Error::Timeout(timeout))
    }

    /// Takes a slot only if one is free now.
    pub async fn try_acquire(&self) -> Result<Option<KvLease>> {
        self.acquire_until(Wait::No).await
    }

    async fn acquire_until(&self, wait: Wait) -> Result<Option<KvLease>> {
        let max_retries = self.place.session.options().retry.max_retries;
        let mut retry = 0;
        'enter: loop {
            let entry = self.place.enter().await?;
            loop {
                let look = match self.place.look(wait != Wait::No).await {
                    Ok(look) => look,
                    Err(e) => {
                        // Remove our entry before answering (not in the
                        // background), so that the session can try again at
                        // once. The primary error wins.
                        let _ = entry.delete().await;
                        return Err(e);
                    }
                };
                if !look.live.contains(&entry.id) {
                    // Our entry is gone: the session was lost meanwhile.
                    // Start over in the new session, as the wait queue does.
                    drop(entry);
                    if retry >= max_retries {
                        return Err(Error::Lost {
                            what: "semaphore entry",
                            path: self.place.dir.clone(),
                        });
                    }
                    retry += 1;
                    continue 'enter;
                }
                let mut holders = look.live_holders();
                let version = match &look.record {
                    None => None,
                    Some((record, _)) if record.limit != self.limit => {
                        entry.delete().await?;
                        return Err(Error::InvalidArgument(format!(
                            "semaphore limit conflict at {}: its holders use a limit of {}, this contender {}",
                            self.place.dir, record.limit, self.limit
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
                    if wait == Wait::No || !wait_any(look.watches, wait).await {
                        entry.delete().await?;
                        return Ok(None);
                    }
                    continue;
                }
                holders.push(entry.id.clone());
                let record = Record {
                    limit: self.limit,
                    holders,
                };
                match self.place.write(&record, version).await {
                    Ok(stat) => return Ok(Some(entry.into_lease(FencingToken(stat.mzxid)))),
                    Err(e) if raced(&e) => {}
                    Err(e) => {
                        let _ = entry.delete().await;
                        return Err(e);
                    }
                }
            }
        }
    }
}

/// Whether a write lost a race (someone wrote first, or our reply was lost):
/// then look again.
fn raced(e: &Error) -> bool {
    matches!(
        e,
        Error::BadVersion { .. }
            | Error::NodeExists { .. }
            | Error::NoNode { .. }
            | Error::ConnectionLoss
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    No,
    Forever,
    Until(Instant),
}

/// Waits for any watch to fire; false if the deadline passed first.
async fn wait_any(watches: Vec<Watch>, wait: Wait) -> bool {
    if watches.is_empty() {
        return true;
    }
    let any = futures::future::select_all(watches.into_iter().map(|w| Box::pin(w.changed())));
    let deadline = async {
        match wait {
            Wait::Until(d) => tokio::time::sleep_until(d).await,
            Wait::No | Wait::Forever => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = any => true,
        _ = deadline => false,
    }
}

impl Place {
    /// Creates our contender entry, named after the session that owns it.
    async fn enter(&self) -> Result<Entry> {
        let session = &self.session;
        let max_retries = session.options().retry.max_retries;
        let token = uuid::Uuid::new_v4().to_string().into_bytes();
        let opts = CreateOptions::new(CreateMode::Ephemeral).with_parents();
        let mut retry = 0;
        loop {
            let id = holder_id(session.session_id());
            // Armed before the create: if we are cancelled while it is in
            // flight, an entry it made is found by its token and removed.
            let mut entry = Entry {
                place: self.clone(),
                path: path::join(&self.dir, &id),
                id,
                token: token.clone(),
                created: None,
                armed: true,
            };
            let created = match session
                .retrying(|| session.create(&entry.path, &token, opts))
                .await
            {
                Err(Error::NodeExists { .. }) => {
                    match session.retrying(|| session.get_data(&entry.path)).await {
                        // Our own create, whose reply was lost.
                        Ok((data, stat)) if data == token => Ok(Created {
                            path: entry.path.clone(),
                            stat,
                        }),
                        Ok(_) => Err(Error::InvalidArgument(format!(
                            "session {} already holds or waits for the semaphore at {}: \
                             a KvSemaphore admits one lease per session (use another session)",
                            entry.id, self.dir
                        ))),
                        // NoNode: gone meanwhile (an earlier entry of this
                        // session being removed), handled below.
                        Err(e) => Err(e),
                    }
                }
                created => created,
            };
            match created {
                Ok(created) if holder_id(created.stat.ephemeral_owner) == entry.id => {
                    entry.created = Some(created);
                    return Ok(entry);
                }
                // The session was renewed between naming and creating: the
                // entry belongs to the new session under the old name. Drop
                // it (by its token) and redo.
                Ok(_) => {
                    drop(entry);
                    retry += 1;
                    if retry > max_retries {
                        return Err(Error::Lost {
                            what: "semaphore entry",
                            path: self.dir.clone(),
                        });
                    }
                }
                // The container reaper removed the empty directory between
                // its creation and ours, or our earlier entry went: go again.
                // Nothing was created, and the entry must not be removed by
                // its token in the background, which the next create reuses.
                Err(Error::NoNode { .. }) if retry < max_retries => {
                    retry += 1;
                    entry.armed = false;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Deletes the entry at `path` if it is the one we created (it holds
    /// our `token`).
    async fn delete_if_ours(&self, path: &str, token: &[u8]) -> Result<()> {
        let session = &self.session;
        match session.retrying(|| session.get_data(path)).await {
            Ok((data, stat)) if data == token => {
                match session.delete(path, Some(stat.version)).await {
                    Ok(()) | Err(Error::NoNode { .. } | Error::BadVersion { .. }) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Ok(_) | Err(Error::NoNode { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Reads the record, then the live entries — in that order, so that a
    /// holder missing from the entries really is gone (it had its entry
    /// before it joined). With `watch`, arms a watch on both.
    async fn look(&self, watch: bool) -> Result<Look> {
        let session = &self.session;
        let mut watches = Vec::new();
        let record = if watch {
            let found = self.found(|| session.get_data_watch(&self.record)).await?;
            found.map(|(data, stat, w)| {
                watches.push(w);
                (data, stat)
            })
        } else {
            self.found(|| session.get_data(&self.record)).await?
        };
        let record = record
            .map(|(data, stat)| Ok((Record::parse(&self.record, &data)?, stat)))
            .transpose()?;
        let children: Option<Vec<Child>> = if watch {
            let found = self.found(|| session.children_watch(&self.dir)).await?;
            found.map(|(children, w)| {
                watches.push(w);
                children
            })
        } else {
            self.found(|| session.children(&self.dir)).await?
        };
        let names = children.into_iter().flatten().map(|c| c.name);
        Ok(Look {
            record,
            live: names.filter(|n| n != RECORD).collect(),
            watches,
        })
    }

    /// Runs the read `op`, retried on a lost connection; `None` if the node
    /// is not there.
    async fn found<T, F, Fut>(&self, op: F) -> Result<Option<T>>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        match self.session.retrying(op).await {
            Ok(found) => Ok(Some(found)),
            Err(Error::NoNode { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes `record` by compare-and-set on `version`, or creates it.
    async fn write(&self, record: &Record, version: Option<i32>) -> Result<Stat> {
        let data = record.to_json();
        match version {
            Some(version) => {
                let session = &self.session;
                session
                    .set_data(&self.record, data.as_bytes(), Some(version))
                    .await
            }
            None => {
                let opts = CreateOptions::new(CreateMode::Persistent);
                let created = self.session.create(&self.record, data.as_bytes(), opts);
                created.await.map(|created| created.stat)
            }
        }
    }

    /// Removes holder `id` from the record by compare-and-set, pruning dead
    /// holders too, and deletes the record if nobody is left; then deletes
    /// the entry at `entry`.
    async fn leave(&self, id: &str, entry: &str) -> Result<()> {
        let left = self.leave_record(id).await;
        // The entry goes even if the record could not be updated: then the
        // others prune us from it.
        let deleted = self.session.delete_guaranteed(entry).await;
        left.and(deleted)
    }

    async fn leave_record(&self, id: &str) -> Result<()> {
        loop {
            let look = match self.look(false).await {
                Ok(look) => look,
                // Nothing we can fix in the record: just leave.
                Err(Error::MalformedData { .. }) => return Ok(()),
                Err(e) => return Err(e),
            };
            let mut holders = look.live_holders();
            holders.retain(|h| h != id);
            let Some((record, stat)) = look.record else {
                return Ok(());
            };
            if holders == record.holders && !holders.is_empty() {
                return Ok(());
            }
            let written = if holders.is_empty() {
                self.session.delete(&self.record, Some(stat.version)).await
            } else {
                let record = Record {
                    limit: record.limit,
                    holders,
                };
                self.write(&record, Some(stat.version)).await.map(|_| ())
            };
            match written {
                Ok(()) => return Ok(()),
                Err(e) if raced(&e) => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Our contender entry: unless turned into a lease, it is removed — with our
/// place in the record, if any — in the background when dropped; if dropped
/// while its create is in flight, whatever that create made is removed.
struct Entry {
    place: Place,
    id: String,
    path: String,
    token: Vec<u8>,
    created: Option<Created>,
    armed: bool,
}

impl Entry {
    /// Removes the entry (and our place in the record) now.
    async fn delete(mut self) -> Result<()> {
        // Disarmed only once done: if cancelled meanwhile, Drop finishes it.
        let left = self.place.leave(&self.id, &self.path).await;
        self.armed = false;
        left
    }

    fn into_lease(mut self, token: FencingToken) -> KvLease {
        self.armed = false;
        let created = self.created.take().expect("an entry");
        let node = HeldNode::new(
            &self.place.session,
            &self.place.dir,
            "semaphore lease",
            created,
        );
        KvLease {
            acquisition: Acquisition::with_token(node, token),
            place: self.place.clone(),
            id: std::mem::take(&mut self.id),
            released: false,
        }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (id, path) = (std::mem::take(&mut self.id), std::mem::take(&mut self.path));
        if self.created.is_some() {
            leave_in_background(&self.place, id, path);
        } else {
            let (place, token) = (self.place.clone(), std::mem::take(&mut self.token));
            self.place.session.spawn_background(async move {
                if let Err(e) = place.delete_if_ours(&path, &token).await {
                    if !matches!(e, Error::Closed) {
                        tracing::warn!(%path, error = %e, "removing a semaphore entry failed");
                    }
                }
            });
        }
    }
}

fn leave_in_background(place: &Place, id: String, entry: String) {
    let place2 = place.clone();
    place.session.spawn_background(async move {
        if let Err(e) = place2.leave(&id, &entry).await {
            if !matches!(e, Error::Closed) {
                tracing::warn!(%entry, error = %e, "giving back a semaphore slot failed");
            }
        }
    });
}

/// A slot of a [`KvSemaphore`]: an owned object, free to move between
/// tasks. Give it back with [`release`](Self::release); dropping it gives it
/// back in the background. If the session is lost, so is the slot: the
/// others prune it ([`lost`](Self::lost) tells).
#[derive(Debug)]
#[must_use = "dropping the lease gives it back"]
pub struct KvLease {
    acquisition: Acquisition,
    place: Place,
    id: String,
    released: bool,
}

impl std::fmt::Debug for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Place")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// The slot's acquisition. Its [`token`](Acquisition::token) is the
/// transaction id of the record write that admitted us, larger than that
/// of every earlier admission (and every earlier write) in the store; its
/// node is our contender entry, and guarded writes land only while the
/// entry (so the slot) is still ours.
impl Deref for KvLease {
    type Target = Acquisition;

    fn deref(&self) -> &Acquisition {
        &self.acquisition
    }
}

impl KvLease {
    /// Our holder id (the session id in hex), as listed in the record.
    pub fn holder(&self) -> &str {
        &self.id
    }

    /// Gives the slot back: removes us from the record (by compare-and-set,
    /// pruning dead holders) and deletes our entry. Reports [`Error::Lost`]
    /// if the slot had been lost before — [`Error::Closed`] if its session
    /// was closed (which took the entry; the others prune the record).
    ///
    /// Cancellation-safe: if this future is dropped before it is done, the
    /// slot is given back in the background.
    pub async fn release(mut self) -> Result<()> {
        let lost = self.is_lost();
        let left = self.place.leave(&self.id, self.node()).await;
        self.released = true;
        left?;
        if lost {
            Err(self.lost_error())
        } else {
            Ok(())
        }
    }
}

impl Drop for KvLease {
    fn drop(&mut self) {
        if !self.released {
            leave_in_background(&self.place, self.id.clone(), self.node().to_string());
        }
    }
}
