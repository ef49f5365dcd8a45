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

impl Record {
    /// The record as JSON.
    pub fn to_json(&self) -> String {
        let mut out = format!("{{\"limit\":{},\"holders\":[", self.limit);
        for (i, h) in self.holders.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            json::write_string(&mut out, h);
        }
        out.push_str("]}");
        out
    }

    /// Decodes a record stored at `path`: a JSON object with a positive
    /// integer `limit` and an array of strings `holders` (other keys are
    /// ignored; duplicate holders count once). Anything else is
    /// [`Error::MalformedData`].
    pub fn parse(path: &str, data: &[u8]) -> Result<Record> {
        let bad = |reason: String| Error::MalformedData {
            path: path.to_string(),
            reason,
        };
        let text = std::str::from_utf8(data).map_err(|_| bad("the record is not UTF-8".into()))?;
        let value = json::parse(text).map_err(|e| bad(format!("the record is not JSON: {e}")))?;
        let json::Value::Object(fields) = value else {
            return Err(bad("the record is not a JSON object".into()));
        };
        let field = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v);
        let limit = match field("limit") {
            Some(json::Value::Number(n))
                if n.fract() == 0.0 && *n >= 1.0 && *n <= f64::from(u32::MAX) =>
            {
                *n as u32
            }
            Some(other) => {
                return Err(bad(format!(
                    "\"limit\" must be a positive integer, found {other:?}"
                )))
            }
            None => return Err(bad("the record has no \"limit\"".into())),
        };
        let holders = match field("holders") {
            Some(json::Value::Array(items)) => {
                let mut holders: Vec<String> = Vec::with_capacity(items.len());
                for item in items {
                    let json::Value::String(h) = item else {
                        return Err(bad(format!(
                            "\"holders\" must hold strings, found {item:?}"
                        )));
                    };
                    if !holders.contains(h) {
                        holders.push(h.clone());
                    }
                }
                holders
            }
            Some(other) => {
                return Err(bad(format!(
                    "\"holders\" must be an array, found {other:?}"
                )))
            }
            None => return Err(bad("the record has no \"holders\"".into())),
        };
        Ok(Record { limit, holders })
    }
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
        let look = self.place.look(false).await?;
        Ok(match look.record {
            Some((record, _)) => record
                .holders
                .into_iter()
                .filter(|h| look.live.contains(h))
                .collect(),
            None => Vec::new(),
        })
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
        let retry_policy = self.place.session.options().retry;
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
                    if retry >= retry_policy.max_retries {
                        return Err(Error::Lost {
                            what: "semaphore entry",
                            path: self.place.dir.clone(),
                        });
                    }
                    retry += 1;
                    continue 'enter;
                }
                let written = match look.record {
                    None => {
                        let record = Record {
                            limit: self.limit,
                            holders: vec![entry.id.clone()],
                        };
                        let opts = CreateOptions::new(CreateMode::Persistent);
                        self.place
                            .session
                            .create(&self.place.record, record.to_json().as_bytes(), opts)
                            .await
                            .map(|created| created.stat)
                    }
                    Some((record, stat)) => {
                        if record.limit != self.limit {
                            entry.delete().await?;
                            return Err(Error::InvalidArgument(format!(
                                "semaphore limit conflict at {}: its holders use a limit of {}, this contender {}",
                                self.place.dir, record.limit, self.limit
                            )));
                        }
                        let mut holders: Vec<String> = record
                            .holders
                            .into_iter()
                            .filter(|h| look.live.contains(h))
                            .collect();
                        if holders.contains(&entry.id) {
                            // Our join landed, though its reply was lost.
                            Ok(stat)
                        } else if holders.len() < self.limit as usize {
                            holders.push(entry.id.clone());
                            let record = Record {
                                limit: self.limit,
                                holders,
                            };
                            self.place
                                .session
                                .set_data(
                                    &self.place.record,
                                    record.to_json().as_bytes(),
                                    Some(stat.version),
                                )
                                .await
                        } else {
                            // Full: wait for a release or a holder's death.
                            match wait {
                                Wait::No => {
                                    entry.delete().await?;
                                    return Ok(None);
                                }
                                Wait::Forever | Wait::Until(_) => {}
                            }
                            if !wait_any(look.watches, wait).await {
                                entry.delete().await?;
                                return Ok(None);
                            }
                            continue;
                        }
                    }
                };
                match written {
                    Ok(stat) => return Ok(Some(entry.into_lease(FencingToken(stat.mzxid)))),
                    // Someone wrote first (or the reply was lost): look again.
                    Err(
                        Error::BadVersion { .. }
                        | Error::NodeExists { .. }
                        | Error::NoNode { .. }
                        | Error::ConnectionLoss,
                    ) => {}
                    Err(e) => {
                        let _ = entry.delete().await;
                        return Err(e);
                    }
                }
            }
        }
    }
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
                Ok(created) => created,
                Err(Error::NodeExists { .. }) => {
                    let (data, stat) =
                        match session.retrying(|| session.get_data(&entry.path)).await {
                            Ok(found) => found,
                            // Gone meanwhile (an earlier entry of this session
                            // being removed): nothing of ours is there; create
                            // it again.
                            Err(Error::NoNode { .. })
                                if retry < session.options().retry.max_retries =>
                            {
                                retry += 1;
                                entry.armed = false;
                                continue;
                            }
                            Err(e) => return Err(e),
                        };
                    if data != token {
                        return Err(Error::InvalidArgument(format!(
                            "session {} already holds or waits for the semaphore at {}: \
                             a KvSemaphore admits one lease per session (use another session)",
                            entry.id, self.dir
                        )));
                    }
                    // Our own create, whose reply was lost.
                    Created {
                        path: entry.path.clone(),
                        stat,
                    }
                }
                // The container reaper removed the empty directory between
                // its creation and ours: go again. Nothing was created, and
                // the entry must not be removed by its token in the
                // background, which the next create reuses.
                Err(Error::NoNode { .. }) if retry < session.options().retry.max_retries => {
                    retry += 1;
                    entry.armed = false;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if holder_id(created.stat.ephemeral_owner) == entry.id {
                entry.created = Some(created);
                return Ok(entry);
            }
            // The session was renewed between naming and creating: the entry
            // belongs to the new session under the old name. Drop it (by its
            // token) and redo.
            drop(entry);
            retry += 1;
            if retry > session.options().retry.max_retries {
                return Err(Error::Lost {
                    what: "semaphore entry",
                    path: self.dir.clone(),
                });
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
            match session
                .retrying(|| session.get_data_watch(&self.record))
                .await
            {
                Ok((data, stat, w)) => {
                    watches.push(w);
                    Some((data, stat))
                }
                Err(Error::NoNode { .. }) => None,
                Err(e) => return Err(e),
            }
        } else {
            match session.retrying(|| session.get_data(&self.record)).await {
                Ok(found) => Some(found),
                Err(Error::NoNode { .. }) => None,
                Err(e) => return Err(e),
            }
        };
        let record = match record {
            Some((data, stat)) => Some((Record::parse(&self.record, &data)?, stat)),
            None => None,
        };
        let children: Vec<Child> = if watch {
            match session.retrying(|| session.children_watch(&self.dir)).await {
                Ok((children, w)) => {
                    watches.push(w);
                    children
                }
                Err(Error::NoNode { .. }) => Vec::new(),
                Err(e) => return Err(e),
            }
        } else {
            match session.retrying(|| session.children(&self.dir)).await {
                Ok(children) => children,
                Err(Error::NoNode { .. }) => Vec::new(),
                Err(e) => return Err(e),
            }
        };
        let live = children
            .into_iter()
            .map(|c| c.name)
            .filter(|n| n != RECORD)
            .collect();
        Ok(Look {
            record,
            live,
            watches,
        })
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
        let session = &self.session;
        loop {
            let look = match self.look(false).await {
                Ok(look) => look,
                // Nothing we can fix in the record: just leave.
                Err(Error::MalformedData { .. }) => return Ok(()),
                Err(e) => return Err(e),
            };
            let Some((record, stat)) = look.record else {
                return Ok(());
            };
            let holders: Vec<String> = record
                .holders
                .iter()
                .filter(|h| h.as_str() != id && look.live.contains(h.as_str()))
                .cloned()
                .collect();
            if holders == record.holders && !holders.is_empty() {
                return Ok(());
            }
            let written = if holders.is_empty() {
                session.delete(&self.record, Some(stat.version)).await
            } else {
                let record = Record {
                    limit: record.limit,
                    holders,
                };
                session
                    .set_data(
                        &self.record,
                        record.to_json().as_bytes(),
                        Some(stat.version),
                    )
                    .await
                    .map(|_| ())
            };
            match written {
                Ok(()) => return Ok(()),
                // Someone wrote first (or the reply was lost): look again.
                Err(Error::BadVersion { .. } | Error::NoNode { .. } | Error::ConnectionLoss) => {}
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

/// Just enough JSON for the record: a strict parser of RFC 8259 values and
/// a string writer.
mod json {
    use std::fmt;

    /// A JSON value.
    #[derive(Debug, Clone, PartialEq)]
    pub enum Value {
        Null,
        Bool(bool),
        Number(f64),
        String(String),
        Array(Vec<Value>),
        Object(Vec<(String, Value)>),
    }

    /// Where and why parsing failed.
    #[derive(Debug)]
    pub struct ParseError {
        at: usize,
        what: &'static str,
    }

    impl fmt::Display for ParseError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{} at byte {}", self.what, self.at)
        }
    }

    /// Parses one JSON value (with surrounding whitespace).
    pub fn parse(text: &str) -> Result<Value, ParseError> {
        let mut p = Parser {
            s: text.as_bytes(),
            i: 0,
            depth: 0,
        };
        let v = p.value()?;
        p.ws();
        if p.i != p.s.len() {
            return Err(p.err("trailing characters"));
        }
        Ok(v)
    }

    /// Appends `s` as a JSON string.
    pub fn write_string(out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('"');
    }

    struct Parser<'a> {
        s: &'a [u8],
        i: usize,
        depth: usize,
    }

    impl Parser<'_> {
        fn err(&self, what: &'static str) -> ParseError {
            ParseError { at: self.i, what }
        }

        fn ws(&mut self) {
            while matches!(self.s.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
                self.i += 1;
            }
        }

        fn eat(&mut self, b: u8) -> bool {
            self.ws();
            if self.s.get(self.i) == Some(&b) {
                self.i += 1;
                true
            } else {
                false
            }
        }

        fn literal(&mut self, word: &str, v: Value) -> Result<Value, ParseError> {
            if self.s[self.i..].starts_with(word.as_bytes()) {
                self.i += word.len();
                Ok(v)
            } else {
                Err(self.err("unknown literal"))
            }
        }

        fn value(&mut self) -> Result<Value, ParseError> {
            self.ws();
            self.depth += 1;
            if self.depth > 64 {
                return Err(self.err("nested too deeply"));
            }
            let v = match self.s.get(self.i) {
                None => Err(self.err("unexpected end")),
                Some(b'{') => self.object(),
                Some(b'[') => self.array(),
                Some(b'"') => self.string().map(Value::String),
                Some(b't') => self.literal("true", Value::Bool(true)),
                Some(b'f') => self.literal("false", Value::Bool(false)),
                Some(b'n') => self.literal("null", Value::Null),
                Some(b'-' | b'0'..=b'9') => self.number(),
                Some(_) => Err(self.err("unexpected character")),
            };
            self.depth -= 1;
            v
        }

        fn object(&mut self) -> Result<Value, ParseError> {
            self.i += 1;
            let mut fields = Vec::new();
            if self.eat(b'}') {
                return Ok(Value::Object(fields));
            }
            loop {
                self.ws();
                if self.s.get(self.i) != Some(&b'"') {
                    return Err(self.err("expected a key"));
                }
                let key = self.string()?;
                if !self.eat(b':') {
                    return Err(self.err("expected ':'"));
                }
                fields.push((key, self.value()?));
                if self.eat(b',') {
                    continue;
                }
                if self.eat(b'}') {
                    return Ok(Value::Object(fields));
                }
                return Err(self.err("expected ',' or '}'"));
            }
        }

        fn array(&mut self) -> Result<Value, ParseError> {
            self.i += 1;
            let mut items = Vec::new();
            if self.eat(b']') {
                return Ok(Value::Array(items));
            }
            loop {
                items.push(self.value()?);
                if self.eat(b',') {
                    continue;
                }
                if self.eat(b']') {
                    return Ok(Value::Array(items));
                }
                return Err(self.err("expected ',' or ']'"));
            }
        }

        fn string(&mut self) -> Result<String, ParseError> {
            self.i += 1;
            let mut out = String::new();
            loop {
                let start = self.i;
                while let Some(&b) = self.s.get(self.i) {
                    if b == b'"' || b == b'\\' || b < 0x20 {
                        break;
                    }
                    self.i += 1;
                }
                // The input is a &str, so this run is valid UTF-8.
                out.push_str(
                    std::str::from_utf8(&self.s[start..self.i])
                        .map_err(|_| self.err("invalid UTF-8"))?,
                );
                match self.s.get(self.i) {
                    Some(b'"') => {
                        self.i += 1;
                        return Ok(out);
                    }
                    Some(b'\\') => {
                        self.i += 1;
                        let c = match self.s.get(self.i) {
                            Some(b'"') => '"',
                            Some(b'\\') => '\\',
                            Some(b'/') => '/',
                            Some(b'b') => '\u{8}',
                            Some(b'f') => '\u{c}',
                            Some(b'n') => '\n',
                            Some(b'r') => '\r',
                            Some(b't') => '\t',
                            Some(b'u') => {
                                let hi = self.hex4()?;
                                if (0xd800..0xdc00).contains(&hi) {
                                    if self.s.get(self.i + 1..self.i + 3) != Some(b"\\u") {
                                        return Err(self.err("unpaired surrogate"));
                                    }
                                    self.i += 2;
                                    let lo = self.hex4()?;
                                    if !(0xdc00..0xe000).contains(&lo) {
                                        return Err(self.err("unpaired surrogate"));
                                    }
                                    char::from_u32(0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00))
                                        .ok_or_else(|| self.err("invalid escape"))?
                                } else {
                                    char::from_u32(hi)
                                        .ok_or_else(|| self.err("unpaired surrogate"))?
                                }
                            }
                            _ => return Err(self.err("invalid escape")),
                        };
                        out.push(c);
                        self.i += 1;
                    }
                    Some(_) => return Err(self.err("control character in string")),
                    None => return Err(self.err("unterminated string")),
                }
            }
        }

        /// Reads the 4 hex digits after `\u` (self.i at the `u`); leaves
        /// self.i at the last digit.
        fn hex4(&mut self) -> Result<u32, ParseError> {
            let digits = self
                .s
                .get(self.i + 1..self.i + 5)
                .ok_or_else(|| self.err("short \\u escape"))?;
            // Exactly 4 hex digits (from_str_radix alone would take a sign).
            if !digits.iter().all(u8::is_ascii_hexdigit) {
                return Err(self.err("invalid \\u escape"));
            }
            let text = std::str::from_utf8(digits).map_err(|_| self.err("invalid \\u escape"))?;
            let v = u32::from_str_radix(text, 16).map_err(|_| self.err("invalid \\u escape"))?;
            self.i += 4;
            Ok(v)
        }

        fn number(&mut self) -> Result<Value, ParseError> {
            let start = self.i;
            if self.s.get(self.i) == Some(&b'-') {
                self.i += 1;
            }
            let digits = |p: &mut Self| {
                let from = p.i;
                while matches!(p.s.get(p.i), Some(b'0'..=b'9')) {
                    p.i += 1;
                }
                p.i > from
            };
            if !digits(self) {
                return Err(self.err("expected digits"));
            }
            if self.s.get(self.i) == Some(&b'.') {
                self.i += 1;
                if !digits(self) {
                    return Err(self.err("expected digits"));
                }
            }
            if matches!(self.s.get(self.i), Some(b'e' | b'E')) {
                self.i += 1;
                if matches!(self.s.get(self.i), Some(b'+' | b'-')) {
                    self.i += 1;
                }
                if !digits(self) {
                    return Err(self.err("expected digits"));
                }
            }
            let text = std::str::from_utf8(&self.s[start..self.i]).expect("ASCII");
            text.parse()
                .map(Value::Number)
                .map_err(|_| self.err("invalid number"))
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn parses_and_rejects() {
            let v = parse(r#" { "limit" : 3 , "holders" : [ "a\u00e9\"", "b" ], "x": [null, true, -1.5e2] } "#).unwrap();
            let Value::Object(f) = v else { panic!() };
            assert_eq!(f[0], ("limit".into(), Value::Number(3.0)));
            assert_eq!(
                f[1].1,
                Value::Array(vec![
                    Value::String("aé\"".into()),
                    Value::String("b".into())
                ])
            );
            for bad in [
                "",
                "{",
                "{\"a\"}",
                "[1,]",
                "\"abc",
                "01x",
                "{\"a\":1} x",
                "\"\\ud800\"",
                "tru",
            ] {
                assert!(parse(bad).is_err(), "{bad:?}");
            }
            let mut out = String::new();
            write_string(&mut out, "q\"\\\n\u{1}");
            assert_eq!(out, r#""q\"\\\n\u0001""#);
            assert_eq!(parse(&out).unwrap(), Value::String("q\"\\\n\u{1}".into()));
        }
    }
}
