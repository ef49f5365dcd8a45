//! The Consul backend: a [`Store`] on Consul's KV store and sessions
//! (tested with Consul 1.8), through its HTTP API. Built with the `consul`
//! feature (in the default build: it needs no system library).
//!
//! Connect with `consul://host:8500[,host:8500...][/prefix][?token=...]`
//! (`consuls://...?cacert=...` for TLS; see [`Endpoint`]).
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
//! let session = dlock::connect("consul://127.0.0.1:8500/app").await?;
//! println!("TTL {:?}", session.session_timeout());
//! session.close().await;
//! # Ok(()) }
//! ```
//!
//! # Key layout (a compatibility contract)
//!
//! Clients of other versions, and operators with `consul kv`, rely on it:
//! - **A node is the key of its path without the leading `/`**, below the
//!   prefix if the endpoint has one: `/shop/stock` is the key `shop/stock`,
//!   or `app/shop/stock` with `consul://host:8500/app`. The root (the
//!   prefix) has no key. The node's data is the key's value, unchanged.
//! - **The data version is the key's `Flags`**: 0 at creation, +1 by every
//!   `set_data` (a compare-and-set on `ModifyIndex` that writes `Flags + 1`).
//!   Writing a key by other means (`consul kv put` sets `Flags` to 0) resets
//!   it. **Except for tagged keys**: `Flags` of at least 2^32
//!   ([`TAG_MIN`]) are a tag
//!   ([`CreateOptions::with_tag`](super::CreateOptions::with_tag)) — such as
//!   `api.Lock`'s `0x2ddccbc058a50c18` and `api.Semaphore`'s
//!   `0xe0f69a2baa414de0`, which Consul's tools require on their keys and
//!   keep on every write — and every write keeps them; the version of such
//!   a key is its `ModifyIndex` modulo 2^31 (a write moves `ModifyIndex`,
//!   so compare-and-set on it is exact; and the index only grows
//!   store-wide, so a key deleted and made again — `consul lock -n`'s exit
//!   deletes a semaphore's record — never shows a version read from the
//!   old one, within 2^31 writes). So keys that
//!   `consul lock` writes read as tagged nodes, and ours as theirs. `czxid` is `CreateIndex` — Consul's Raft index, so it only grows,
//!   store-wide: the fencing token — and `mzxid` is `ModifyIndex`.
//! - **Ephemeral nodes** are keys acquired by the client's Consul session
//!   (the `Session` field); `ephemeral_owner` is the session's id (the
//!   first 63 bits of its UUID), and
//!   [`native_session_id`](Store::native_session_id) the UUID itself.
//! - **Parents are implicit**, as on etcd (see `store::etcd`): a path
//!   exists if it is a key or keys exist below `key/`; parents made by
//!   `create_parents` write nothing and vanish with their last descendant
//!   (a container reaped at once). A create without `create_parents` reads
//!   its parent first (`NoNode` if it does not exist); a create below an
//!   ephemeral key fails with `NoChildrenForEphemerals` (checked by a read
//!   before the create: Consul's transactions cannot compare "absent or not
//!   locked").
//! - **Sequential nodes** get a 10-digit suffix, unique among this client's
//!   nodes (a counter from a random start; the create is
//!   `check-not-exists`, and another suffix is drawn if another client
//!   drew the same). The digits carry no order: a queue is ordered by
//!   `CreateIndex`, which listings report as [`Child::created`].
//! - **Position markers** (the read-write lock's downgrade, as on etcd): a
//!   non-sequential node named with the suffix of a sequential sibling this
//!   session created takes that sibling's place: the create also writes
//!   the key `<node>/\x01pos/<sibling's CreateIndex>` (acquired by the same
//!   session), which listings read and never show, and deletes remove.
//!
//! # Sessions
//!
//! A store session is a Consul session with a TTL, `Behavior=delete` (its
//! keys are deleted when it ends) and no health checks. The TTL is the
//! session timeout rounded up to whole seconds, **at least 10 s**: Consul
//! refuses shorter TTLs. [`session_timeout`](Store::session_timeout)
//! reports the TTL asked for. Consul may keep a session up to twice its
//! TTL; this client renews every third of it, reports `Suspended` when a
//! renewal fails, and `Lost` when Consul answers 404 or no renewal was
//! answered for a whole TTL (then it destroys the session, which may still
//! live on the server). After `Lost` the next operation creates a new
//! session. Opening a store while the servers elect a leader (they answer
//! a session create with 500 meanwhile) tries again for up to 15 s.
//!
//! **Agents:** requests go to the endpoint's first agent, and to the next
//! one when an agent refuses the connection, leaves a request unanswered
//! (an agent that hangs still accepts connections) or answers that it
//! cannot serve (5xx, such as a client agent cut off from its servers, or
//! 429): the session's renewals carry on through the others, and a store
//! opens on the next agent when the first is silent or broken
//! (`tests/faults.rs`, `a_consul_session_outlives_a_frozen_agent`;
//! `tests/consul_backend.rs`, `an_agent_that_cannot_serve_is_left_for_the_next`).
//! A Consul session lives on the node of the agent that made it, though:
//! if that node leaves the cluster, Consul invalidates the session, and the
//! holds in it are lost whichever agent renews it. A client agent leaves
//! not only when stopped for good: one stopped with SIGTERM (a plain
//! `systemctl restart consul`) leaves gracefully by default
//! (`leave_on_terminate`), and the leader then deletes its node's sessions
//! at once; the holder learns at its next renewal, up to a third of the
//! TTL later, while a waiter may already hold (fencing tokens still tell
//! the two apart). So name servers in the endpoint, or agents that run
//! with `leave_on_terminate = false`.
//!
//! **A holder that dies without closing** (killed, partitioned) keeps its
//! keys until Consul invalidates the session: Consul waits twice the TTL
//! before it does, so the next acquirer gets in after about 2 × TTL —
//! **20 s with the 10 s minimum** (measured: 20.0 s from the kill to the
//! next acquisition, `tests/consul_backend.rs`,
//! `a_killed_holder_loses_its_slot_when_the_ttl_runs_out`). The holder
//! itself reports `Lost` after one TTL without an answered renewal, well
//! before Consul frees its keys; a close, or a session destroyed from
//! outside, frees them at once.
//!
//! **Lock delay: 0 s by default** (`?lock-delay=15s` to change it). Consul's
//! own default, 15 s, forbids acquiring the keys of an invalidated session
//! for that long; this backend gives every node a new name anyway, and a
//! node named again after a loss (an expiry retried) must be creatable at
//! once. Fencing tokens, not lock delays, protect resources. With a lock
//! delay, a session that ends (expiry, destroy, `Lost`) also keeps its
//! keys' names from being acquired again for that long: an expired
//! holder's hand-over takes 2 × TTL plus nothing (new names), but a retry
//! that recreates a node under the same name (a leader latch's or a
//! lease's node after a loss) waits out the delay. A create that Consul
//! refuses for a lock delay fails with [`Error::LockDelay`] (Consul does
//! not say how long is left); [`ConsulLock`](crate::ConsulLock) waits
//! it out.
//!
//! # Operations
//!
//! - Consul's key URLs refuse characters Go does not count as printable
//!   (non-ASCII spaces such as U+00A0 or U+3000, format characters such as
//!   U+200B, unassigned code points), which dlock's path rules accept: such
//!   a path is refused with [`Error::InvalidPath`] before anything is
//!   written (a create of a non-ASCII path reads its key first to find
//!   out). Values over 512 KiB (about 384 KiB through a transaction, where
//!   they travel in base64) are [`Error::InvalidArgument`] naming the node.
//! - ACL denials are [`Error::NoAuth`] naming the node, from the KV
//!   endpoint (403) as from a transaction (a 409 "Permission denied").
//! - Creates are one transaction (`check-not-exists` + `set` or `lock`);
//!   [`create_and_list`](Store::create_and_list) adds a `get-tree` of the
//!   directory to it, so it is one round trip after the ancestor reads.
//! - Listings read the directory recursively (`?recurse`): the create
//!   indexes of the children are needed for the queue order, which
//!   `?keys&separator=/` does not tell.
//! - Versioned writes read the key and compare-and-set on its
//!   `ModifyIndex`. A delete of one of this session's ephemeral nodes is
//!   one transaction that holds only while our session holds the key
//!   (`check-session`), so a retried delete never removes another
//!   session's newer node of the same name (etcd#22082), while ours goes,
//!   also one whose create lost its reply. A multi's check or delete of
//!   such a node without a version fails the same way once the key is
//!   held by another session (or none): a guarded write fails once
//!   another session's node took the name. A fence outlives its session
//!   (for the next 8): a check or delete of "our node" at the name of a
//!   node of an earlier session holds while that session holds the key
//!   (Consul may keep a session the client gave up on) or — a delete —
//!   ours does, so a guarded write or delete that waited out the renewal
//!   fails the same way.
//! - `num_children` counts every key below a node; `cversion` is 0.
//! - **A delete does not fence against a child created at that moment**:
//!   Consul's transactions cannot check that a prefix is empty, so the
//!   delete reads the node's children first and pins only the node's own
//!   key. A child created between the two survives the delete (the node
//!   is then an implicit directory, without its data) rather than making
//!   it fail with `NotEmpty`. No recipe deletes a node that may get a
//!   child meanwhile but through the container reaper, whose directories
//!   hold no data.
//! - Multi is one `/v1/txn` after reading the paths it touches:
//!   preconditions are checked on the reads and pinned in the transaction
//!   by `check-index`/`check-not-exists`; if the store moved meanwhile it
//!   is tried again. At most 64 transaction operations (about 21 ops).
//! - Watches are blocking queries on the watched key, or on the prefix of
//!   the watched node's children (see the module `watch`).
//! - **Every read is `?consistent`** (key reads, listings, transactions,
//!   blocking queries). In Consul's default mode a server that has just
//!   become leader answers from its state before it has applied what the
//!   old leader committed, so a read right after a leader change can miss
//!   a node that exists or show one already deleted. Found by the leader-
//!   kill fault tests: a create retried after a lost reply looked for its
//!   node, missed it, and made a second one, which then held the
//!   semaphore's internal lock for its live session forever; and a leader
//!   selector adopted its already-released node as a new one and led with
//!   an old epoch. A consistent read waits until the leader has caught up
//!   and confirms its leadership with a quorum (one heartbeat round to the
//!   other servers; nothing on a single server).
//!
//! # Faults
//!
//! [`Faults::expire`] destroys the session (Consul deletes its keys at
//! once); [`Faults::suspend`] stops renewals and holds operations for its
//! duration; the lost-reply faults apply the operation and report
//! `ConnectionLoss`.

mod http;
mod keeper;
mod keys;
mod watch;

use std::collections::HashMap;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use hyper::Method;
use serde::Deserialize;
use serde_json::{json, Value};

use self::http::{encode_key, Http, Response};
use self::keeper::{ttl_for, Keeper};
use self::keys::{Entry, Layout};
use self::watch::Kind;
use super::create::CreateRequest;
use super::keepalive::Kept;
use super::owned::{Owned, OwnedNodes, Sequence};
use super::status::SessionMachine;
use super::{
    BackendKind, Child, Created, Faults, Op, OpResult, SessionId, Stat, Store, Watch, TAG_MIN,
};
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::options::SessionOptions;
use crate::path;

/// Opens a client of the Consul agents of `endpoint` (an
/// [`Endpoint::Consul`]) and creates its session.
///
/// # Errors
///
/// [`Error::Unreachable`] if no agent answers; [`Error::AuthFailed`] if the
/// token may not create sessions; [`Error::InvalidEndpoint`] for another
/// kind of endpoint or unreadable TLS files.
pub async fn open(endpoint: &Endpoint, options: &SessionOptions) -> Result<Arc<dyn Store>> {
    let Endpoint::Consul {
        prefix, lock_delay, ..
    } = endpoint
    else {
        return Err(Error::InvalidEndpoint {
            url: endpoint.to_string(),
            reason: "not a Consul endpoint".into(),
        });
    };
    let http = Http::new(endpoint)?;
    let keeper = Kept(
        Keeper::open(
            http.clone(),
            ttl_for(options.session_timeout),
            lock_delay.unwrap_or(Duration::ZERO),
        )
        .await?,
    );
    Ok(Arc::new(ConsulStore {
        keeper,
        http,
        layout: Layout::new(prefix.as_deref()),
        owned: OwnedNodes::default(),
        sequence: Sequence::new(),
    }))
}

/// How often a sequential create draws another suffix after a collision.
const SEQUENCE_ATTEMPTS: usize = 16;
/// How often a compare-and-set is tried again when the key moved meanwhile.
const CAS_ATTEMPTS: usize = 32;
/// Consul's limit of operations in one transaction.
const MAX_TXN_OPS: usize = 64;

struct ConsulStore {
    keeper: Kept<Keeper>,
    http: Arc<Http>,
    layout: Layout,
    /// The ephemeral nodes this client created in the current session, by
    /// their create index.
    owned: OwnedNodes<u64>,
    sequence: Sequence,
}

impl std::fmt::Debug for ConsulStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.keeper.fmt(f)
    }
}

/// Why a transaction was refused: the first failing operation.
#[derive(Debug)]
struct TxnFailure {
    index: usize,
    what: String,
}

impl TxnFailure {
    /// Consul's message in lower case, without its quoted parts: they name
    /// keys and sessions, and a key such as `a/not found` must not read as
    /// a reason.
    fn reason(&self) -> String {
        let mut reason = String::with_capacity(self.what.len());
        let (mut quoted, mut escaped) = (false, false);
        for c in self.what.chars() {
            match (quoted, escaped, c) {
                (true, false, '\\') => escaped = true,
                (true, true, _) => escaped = false,
                (_, _, '"') => quoted = !quoted,
                (false, _, c) => reason.push(c.to_ascii_lowercase()),
                (true, false, _) => {}
            }
        }
        reason
    }
}

/// Whether a transaction's failure `reason` says that our session is gone.
fn session_gone(reason: &str) -> bool {
    reason.contains("invalid session") || reason.contains("session") && reason.contains("not found")
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct TxnAnswer {
    #[serde(default)]
    results: Option<Vec<TxnResult>>,
    #[serde(default)]
    errors: Option<Vec<TxnError>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct TxnResult {
    #[serde(rename = "KV")]
    kv: Option<Entry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct TxnError {
    #[serde(default)]
    op_index: usize,
    #[serde(default)]
    what: String,
}

/// One KV operation of a transaction.
fn kv(verb: &str, key: &str) -> Value {
    json!({ "KV": { "Verb": verb, "Key": key } })
}

fn with(mut op: Value, field: &str, value: Value) -> Value {
    op["KV"][field] = value;
    op
}

fn write(verb: &str, key: &str, data: &[u8], flags: u64) -> Value {
    let op = with(
        kv(verb, key),
        "Value",
        base64::engine::general_purpose::STANDARD
            .encode(data)
            .into(),
    );
    with(op, "Flags", flags.into())
}

/// Deletes `key` (and its position markers) if its modify index is still
/// `index`. Not `delete-cas`: Consul takes that as done when the key is
/// gone, and a fenced delete must tell that it found nothing.
fn fenced_delete(key: &str, index: u64) -> [Value; 3] {
    [
        with(kv("check-index", key), "Index", index.into()),
        kv("delete", key),
        kv("delete-tree", &keys::markers(key)),
    ]
}

fn first_entry<'e>(entries: &'e [Entry], key: &str) -> Option<&'e Entry> {
    entries.iter().find(|e| e.key == key)
}

/// Whether a transaction operation answers with an entry: Consul's writes,
/// checks of an index or session and `get` do (a check with the entry as
/// it was before any later write); deletes and `check-not-exists` do not.
fn answers_with_an_entry(op: &Value) -> bool {
    let verb = op["KV"]["Verb"].as_str().unwrap_or_default();
    matches!(
        verb,
        "set" | "cas" | "lock" | "unlock" | "check-session" | "check-index" | "get"
    )
}

impl ConsulStore {
    fn op_timeout(&self) -> Duration {
        self.keeper.op_timeout()
    }

    /// An answer that is no success, as an error about `path`.
    fn refused(&self, resp: &Response, path: &str) -> Error {
        match resp.status {
            403 => Error::NoAuth {
                path: path.to_string(),
            },
            // A value over Consul's limit (512 KiB a key, and as much for
            // a transaction's body, where values travel in base64).
            413 => Error::InvalidArgument(format!(
                "{path}: the value is too large for Consul (at most 512 KiB a key, \
                 about 384 KiB in one transaction): {}",
                resp.text()
            )),
            // Consul's HTTP server answers a bare 400 to a URL whose path
            // has a character Go does not count as printable (a non-ASCII
            // space, a format character, an unassigned code point): dlock's
            // path rules accept those, Consul's key URLs do not.
            400 if resp.text().trim().is_empty() => Error::InvalidPath {
                path: path.to_string(),
                reason: "Consul refuses keys with characters Go does not count as printable \
                         (non-ASCII spaces, format characters, unassigned code points)"
                    .into(),
            },
            // 429: a server's request rate limit (`limits.request_limits` in
            // newer Consul): retried with backoff, as Consul asks of its
            // clients.
            429 | 500..=599 => {
                tracing::debug!(endpoint = %self.http.endpoint, "Consul answered {}: {}", resp.status, resp.text());
                Error::ConnectionLoss
            }
            status => Error::Backend(format!(
                "Consul at {} answered {status} about {path}: {}",
                self.http.endpoint,
                resp.text()
            )),
        }
    }

    /// GETs `path_and_query` and reads its JSON answer; `None` for a 404
    /// (nothing there), other refusals as errors about `path`.
    async fn read_json<T: serde::de::DeserializeOwned>(
        &self,
        path_and_query: &str,
        path: &str,
        what: &str,
    ) -> Result<Option<T>> {
        let resp = self
            .http
            .send(Method::GET, path_and_query, None, self.op_timeout())
            .await?;
        match resp.status {
            200 => resp.json(what).map(Some),
            404 => Ok(None),
            _ => Err(self.refused(&resp, path)),
        }
    }

    /// Reads the entries at and below `key` (`?recurse`: siblings whose
    /// key extends `key` come along, and callers filter them).
    async fn recurse(&self, key: &str, path: &str) -> Result<Vec<Entry>> {
        let query = format!("/v1/kv/{}?recurse&consistent", encode_key(key));
        Ok(self
            .read_json(&query, path, "a read")
            .await?
            .unwrap_or_default())
    }

    /// `path`'s own entry, if it has a key.
    async fn entry(&self, path: &str) -> Result<Option<Entry>> {
        let key = self.layout.key(path);
        let query = format!("/v1/kv/{}?consistent", encode_key(&key));
        let entries: Vec<Entry> = self
            .read_json(&query, path, "a read")
            .await?
            .unwrap_or_default();
        Ok(entries.into_iter().find(|e| e.key == key))
    }

    /// `path`'s own entry and how many keys are below it.
    async fn read(&self, path: &str) -> Result<(Option<Entry>, usize)> {
        let below = self.layout.below(path);
        // The root has no key of its own: all it reads is below it.
        let key = (path != "/").then(|| self.layout.key(path));
        let entries = self.recurse(key.as_ref().unwrap_or(&below), path).await?;
        let n = entries
            .iter()
            .filter(|e| keys::is_descendant(&below, &e.key))
            .count();
        Ok((
            key.and_then(|key| entries.into_iter().find(|e| e.key == key)),
            n,
        ))
    }

    /// Runs a transaction: the entries it returned, or its first failure.
    /// A failure because the session is gone makes it `Lost` and is
    /// `SessionExpired`.
    async fn txn(
        &self,
        ops: &[Value],
        path: &str,
        session: SessionId,
    ) -> Result<std::result::Result<Vec<Entry>, TxnFailure>> {
        if ops.len() > MAX_TXN_OPS {
            return Err(Error::InvalidArgument(format!(
                "a Consul transaction holds at most {MAX_TXN_OPS} operations, this one needs {}",
                ops.len()
            )));
        }
        let body = serde_json::to_vec(ops)
            .map_err(|e| Error::Backend(format!("cannot encode a transaction: {e}")))?;
        let resp = self
            .http
            .send(
                Method::PUT,
                "/v1/txn?consistent",
                Some(body),
                self.op_timeout(),
            )
            .await?;
        match resp.status {
            200 => {
                let answer: TxnAnswer = resp.json("a transaction")?;
                Ok(Ok(answer
                    .results
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|r| r.kv)
                    .collect()))
            }
            409 => {
                let answer: TxnAnswer = resp.json("a refused transaction")?;
                let failure = answer
                    .errors
                    .unwrap_or_default()
                    .into_iter()
                    .next()
                    .map(|e| TxnFailure {
                        index: e.op_index,
                        what: e.what,
                    })
                    .ok_or_else(|| {
                        Error::Backend(format!(
                            "Consul refused a transaction on {path} without saying why"
                        ))
                    })?;
                let reason = failure.reason();
                if session_gone(&reason) {
                    self.keeper.machine.lose(session);
                    return Err(Error::SessionExpired);
                }
                // The key of an invalidated session with a lock delay:
                // "failed to lock key ... due to lock delay".
                if reason.contains("lock delay") {
                    return Err(Error::LockDelay {
                        path: path.to_string(),
                    });
                }
                // ACLs deny a transaction's operation as its failure (409),
                // not as a 403 like the KV endpoint.
                if reason.contains("permission denied") {
                    return Err(Error::NoAuth {
                        path: path.to_string(),
                    });
                }
                Ok(Err(failure))
            }
            _ => Err(self.refused(&resp, path)),
        }
    }

    fn owned(&self, session: SessionId) -> MutexGuard<'_, Owned<u64>> {
        self.owned.of(session, || self.newest())
    }

    /// The store's newest session (its status's).
    fn newest(&self) -> SessionId {
        self.keeper.machine.snapshot().session_id
    }

    fn remember(&self, session: SessionId, path: &str, e: &Entry, suffix: Option<&str>) {
        let fence = e.create_index;
        self.owned(session).remember(session, path, fence, suffix);
    }

    fn forget(&self, session: SessionId, path: &str) {
        self.owned(session).forget(session, path);
    }

    /// The sequential sibling whose place a non-sequential create of
    /// `full` takes, and its create index.
    fn position_of(&self, session: SessionId, full: &str) -> Option<(String, u64)> {
        let owned = self.owned(session);
        owned
            .sibling_of(full)
            .map(|(sibling, &created)| (sibling, created))
    }

    fn next_suffix(&self) -> String {
        self.sequence.next_suffix()
    }

    /// The session's status channel, subscribed before a read that arms a
    /// watch: a change while the read is in flight (the session lost
    /// meanwhile: a Consul read does not need it) still fires the watch.
    fn status_before_read(
        &self,
        watch: bool,
    ) -> Option<tokio::sync::watch::Receiver<crate::store::SessionStatus>> {
        watch.then(|| self.keeper.machine.subscribe())
    }

    fn arm(
        &self,
        kind: Kind,
        status: tokio::sync::watch::Receiver<crate::store::SessionStatus>,
    ) -> Watch {
        Watch::since_read(watch::spawn(self.http.clone(), kind), status)
    }

    /// Deletes one of this session's ephemeral nodes in one transaction,
    /// only while our session holds its key: a retried delete never
    /// removes another session's newer node of that name (etcd#22082),
    /// while ours — also one whose create lost its reply — goes.
    async fn delete_owned(&self, path: &str, session: SessionId, uuid: &str) -> Result<()> {
        let key = self.layout.key(path);
        let ops = [
            with(kv("check-session", &key), "Session", uuid.into()),
            kv("delete", &key),
            kv("delete-tree", &keys::markers(&key)),
        ];
        match self.txn(&ops, path, session).await? {
            Ok(_) => {
                self.keeper.machine.lost_delete_reply()?;
                self.forget(session, path);
                Ok(())
            }
            Err(_) => Err(Error::NoNode {
                path: path.to_string(),
            }),
        }
    }

    /// Deletes our node at `path`, in the name of one made in the earlier
    /// session `made_in`: the node that session still holds (Consul may
    /// keep a session the client gave up on), or one our session holds.
    /// One read, then a delete that holds only while the holder read still
    /// holds the key. `NoNode` if another session's node (or none) has the
    /// name.
    async fn delete_gone(
        &self,
        path: &str,
        (session, uuid): (SessionId, &str),
        made_in: SessionId,
    ) -> Result<()> {
        // Twice at most: the earlier session's key may go, and one of ours
        // take its name, between the read and the delete.
        for _ in 0..2 {
            let (entry, _) = self.read(path).await?;
            let owner = entry.as_ref().map(Entry::owner);
            if owner == Some(session) {
                return self.delete_owned(path, session, uuid).await;
            }
            let holder = entry
                .and_then(|e| e.session)
                .filter(|_| owner == Some(made_in));
            let Some(holder) = holder else { break };
            match self.delete_owned(path, made_in, &holder).await {
                Ok(()) => {
                    self.owned(session).forget_gone(session, path, made_in);
                    return Ok(());
                }
                Err(Error::NoNode { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(Error::NoNode {
            path: path.to_string(),
        })
    }
}

#[async_trait]
impl Store for ConsulStore {
    fn backend(&self) -> BackendKind {
        BackendKind::Consul
    }

    fn has_implicit_parents(&self) -> bool {
        true
    }

    fn machine(&self) -> &dyn SessionMachine {
        &self.keeper.machine
    }

    /// The Consul session's UUID, as `consul lock` writes it in a
    /// semaphore's record.
    fn native_session_id(&self) -> (SessionId, String) {
        // The id comes from the UUID, so the two always match.
        let uuid = self.keeper.machine.lock().backend.uuid.clone();
        (keys::session_id(&uuid), uuid)
    }

    fn learn_created(&self, request: &CreateRequest<'_>, created: &Created) {
        let fence = created.stat.czxid as u64;
        self.owned.learn(request, created, fence, || self.newest());
    }

    /// Creates the node and, with a listing asked for, lists that
    /// directory in the same transaction.
    async fn create_in(&self, request: CreateRequest<'_>) -> Result<(Created, Option<Vec<Child>>)> {
        let (session, uuid) = self.keeper.current().await?;
        let path = request.path;
        let parent = path::parent(path);
        let ancestors: Vec<&str> = path::ancestors(path).collect();
        // Consul takes any key in a transaction but refuses some in URLs
        // (see `refused`): a node created with such a name could never be
        // read, watched or deleted by key. Reading the key itself first
        // refuses it before anything is written; only non-ASCII paths need
        // it (every ASCII character dlock accepts is printable).
        let probe = async {
            match path.is_ascii() {
                true => Ok(None),
                false => self.entry(path).await,
            }
        };
        let (found, _) = futures::future::try_join(
            futures::future::try_join_all(ancestors.iter().map(|a| self.entry(a))),
            probe,
        )
        .await?;
        for (ancestor, entry) in ancestors.iter().zip(&found) {
            if entry.as_ref().is_some_and(|e| e.session.is_some()) {
                return Err(Error::NoChildrenForEphemerals {
                    path: ancestor.to_string(),
                });
            }
        }
        if !request.opts.create_parents && parent != "/" && found.last().is_none_or(Option::is_none)
        {
            let below = self.layout.below(parent);
            let entries = self.recurse(&below, parent).await?;
            if !entries.iter().any(|e| keys::is_descendant(&below, &e.key)) {
                return Err(Error::NoNode {
                    path: parent.to_string(),
                });
            }
        }
        let ephemeral = request.opts.mode.is_ephemeral();
        let sequential = request.opts.mode.is_sequential();
        for attempt in 1.. {
            let suffix = sequential.then(|| self.next_suffix());
            let full = format!("{path}{}", suffix.as_deref().unwrap_or(""));
            let key = self.layout.key(&full);
            let position = (!sequential)
                .then(|| self.position_of(session, &full))
                .flatten();
            let flags = request.opts.tag.unwrap_or(0);
            let mut ops = vec![kv("check-not-exists", &key)];
            ops.push(match ephemeral {
                true => with(
                    write("lock", &key, request.data, flags),
                    "Session",
                    uuid.clone().into(),
                ),
                false => write("set", &key, request.data, flags),
            });
            if let Some((sibling, created)) = &position {
                ops.push(with(
                    kv("check-session", &self.layout.key(sibling)),
                    "Session",
                    uuid.clone().into(),
                ));
                ops.push(with(
                    write("lock", &keys::marker(&key, *created), b"", 0),
                    "Session",
                    uuid.clone().into(),
                ));
            }
            let below = request.list.map(|l| self.layout.below(l));
            if let Some(below) = &below {
                ops.push(kv("get-tree", below));
            }
            match self.txn(&ops, &full, session).await? {
                Ok(entries) => {
                    let Some(entry) = first_entry(&entries, &key) else {
                        return Err(Error::Backend(format!(
                            "Consul created {full} but did not return its entry"
                        )));
                    };
                    let mut stat = keys::stat(entry, 0);
                    stat.ephemeral_owner = if ephemeral { session } else { 0 };
                    stat.data_length = request.data.len().min(i32::MAX as usize) as i32;
                    let children = below.map(|b| keys::children(&b, &entries));
                    return Ok((Created { path: full, stat }, children));
                }
                Err(failure) if failure.index == 0 => {
                    if sequential && attempt < SEQUENCE_ATTEMPTS {
                        continue;
                    }
                    return Err(Error::NodeExists { path: full });
                }
                Err(failure) if failure.index == 2 && position.is_some() => {
                    return Err(Error::NoNode {
                        path: position.map(|p| p.0).unwrap_or_default(),
                    });
                }
                Err(failure) => {
                    return Err(Error::Backend(format!(
                        "Consul refused to create {full}: {}",
                        failure.what
                    )))
                }
            }
        }
        unreachable!("the loop returns")
    }

    async fn delete(&self, path: &str, version: Option<i32>) -> Result<()> {
        if path == "/" {
            return Err(Error::InvalidArgument("the root cannot be deleted".into()));
        }
        self.keeper.machine.lost_replies.failing_delete()?;
        let (session, uuid) = self.keeper.current().await?;
        let holder = version
            .is_none()
            .then(|| self.owned(session).holder(session, path))
            .flatten();
        match holder {
            Some(ours) if ours == session => return self.delete_owned(path, session, &uuid).await,
            Some(made_in) => return self.delete_gone(path, (session, &uuid), made_in).await,
            None => {}
        }
        let key = self.layout.key(path);
        for _ in 0..CAS_ATTEMPTS {
            let (own, below) = self.read(path).await?;
            let entry = match own {
                None if below > 0 => {
                    return Err(Error::NotEmpty {
                        path: path.to_string(),
                    })
                }
                None => {
                    return Err(Error::NoNode {
                        path: path.to_string(),
                    })
                }
                Some(_) if below > 0 => {
                    return Err(Error::NotEmpty {
                        path: path.to_string(),
                    })
                }
                Some(e) if version.is_some_and(|v| e.version() != v) => {
                    return Err(Error::BadVersion {
                        path: path.to_string(),
                    })
                }
                Some(e) => e,
            };
            let ops = fenced_delete(&key, entry.modify_index);
            if self.txn(&ops, path, session).await?.is_ok() {
                self.keeper.machine.lost_delete_reply()?;
                self.forget(session, path);
                return Ok(());
            }
        }
        Err(Error::Backend(format!(
            "{path} kept changing while it was deleted"
        )))
    }

    async fn set_data(&self, path: &str, data: &[u8], version: Option<i32>) -> Result<Stat> {
        self.keeper.machine.lost_replies.failing_set()?;
        let (session, _) = self.keeper.current().await?;
        let key = self.layout.key(path);
        for _ in 0..CAS_ATTEMPTS {
            let Some(entry) = self.entry(path).await? else {
                return Err(Error::NoNode {
                    path: path.to_string(),
                });
            };
            if version.is_some_and(|v| entry.version() != v) {
                return Err(Error::BadVersion {
                    path: path.to_string(),
                });
            }
            let op = with(
                write("cas", &key, data, entry.next_flags()),
                "Index",
                entry.modify_index.into(),
            );
            if let Ok(entries) = self.txn(&[op], path, session).await? {
                let Some(set) = first_entry(&entries, &key) else {
                    return Err(Error::Backend(format!(
                        "Consul set {path} but did not return its entry"
                    )));
                };
                let mut stat = keys::stat(set, 0);
                stat.data_length = data.len().min(i32::MAX as usize) as i32;
                return Ok(stat);
            }
        }
        Err(Error::Backend(format!(
            "{path} kept changing while its data was set"
        )))
    }

    async fn get_data(&self, path: &str, watch: bool) -> Result<(Vec<u8>, Stat, Option<Watch>)> {
        self.keeper.machine.lost_replies.failing_read()?;
        self.keeper.current().await?;
        let status = self.status_before_read(watch);
        let (own, below) = self.read(path).await?;
        let key = self.layout.key(path);
        match own {
            Some(e) => {
                let w = status.map(|status| {
                    let (created, modified) = (e.create_index, e.modify_index);
                    self.arm(
                        Kind::Data {
                            key,
                            created,
                            modified,
                        },
                        status,
                    )
                });
                Ok((e.data(), keys::stat(&e, below), w))
            }
            // The root, which has no key, is never deleted.
            None if path == "/" => {
                let w = status.map(Watch::session_only);
                Ok((Vec::new(), keys::implicit_stat(below), w))
            }
            None if below > 0 => {
                let w = status.map(|status| self.arm(Kind::Implicit { key }, status));
                Ok((Vec::new(), keys::implicit_stat(below), w))
            }
            None => Err(Error::NoNode {
                path: path.to_string(),
            }),
        }
    }

    async fn exists(&self, path: &str, watch: bool) -> Result<(Option<Stat>, Option<Watch>)> {
        self.keeper.machine.lost_replies.failing_read()?;
        self.keeper.current().await?;
        let status = self.status_before_read(watch);
        let (own, below) = self.read(path).await?;
        let key = self.layout.key(path);
        let (stat, kind) = match own {
            Some(e) => (
                Some(keys::stat(&e, below)),
                Kind::Data {
                    key,
                    created: e.create_index,
                    modified: e.modify_index,
                },
            ),
            // The root, which has no key, is never deleted.
            None if path == "/" => {
                return Ok((
                    Some(keys::implicit_stat(below)),
                    status.map(Watch::session_only),
                ));
            }
            None if below > 0 => (Some(keys::implicit_stat(below)), Kind::Implicit { key }),
            None => (None, Kind::Absent { key }),
        };
        Ok((stat, status.map(|status| self.arm(kind, status))))
    }

    async fn children(&self, path: &str, watch: bool) -> Result<(Vec<Child>, Option<Watch>)> {
        self.keeper.machine.lost_replies.failing_read()?;
        self.keeper.current().await?;
        let status = self.status_before_read(watch);
        let below = self.layout.below(path);
        let entries = self.recurse(&below, path).await?;
        let children = keys::children(&below, &entries);
        if children.is_empty() && path != "/" && self.entry(path).await?.is_none() {
            return Err(Error::NoNode {
                path: path.to_string(),
            });
        }
        let w = status.map(|status| {
            let key = (path != "/").then(|| self.layout.key(path));
            let digest = keys::digest(&children);
            self.arm(Kind::Children { key, below, digest }, status)
        });
        Ok((children, w))
    }

    async fn tag(&self, path: &str) -> Result<Option<u64>> {
        self.keeper.current().await?;
        match self.entry(path).await? {
            Some(entry) => Ok(entry.is_tagged().then_some(entry.flags)),
            None => Err(Error::NoNode {
                path: path.to_string(),
            }),
        }
    }

    async fn foreign_owner(&self, path: &str) -> Result<Option<String>> {
        self.keeper.current().await?;
        let Some(uuid) = self.entry(path).await?.and_then(|e| e.session) else {
            return Ok(None);
        };
        #[derive(Deserialize)]
        struct Info {
            #[serde(rename = "Name", default)]
            name: String,
        }
        let query = format!("/v1/session/info/{}", encode_key(&uuid));
        // An empty list: the session ended since the read, and its key
        // with it (`Behavior=delete`).
        let sessions: Vec<Info> = self
            .read_json(&query, path, "a session read")
            .await?
            .unwrap_or_default();
        let name = sessions.into_iter().next().map(|info| info.name);
        Ok(name.filter(|name| name != keeper::SESSION_NAME))
    }

    fn deletes_only_created(&self, path: &str, czxid: i64) -> Option<bool> {
        // A delete of our node checks that our session holds its key.
        let session = self.newest();
        let created = u64::try_from(czxid).ok()?;
        self.owned(session).made_with(session, path, &created)
    }

    async fn multi(&self, ops: &[Op]) -> Result<Vec<OpResult>> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        let (session, uuid) = self.keeper.current().await?;
        let mut last = None;
        for _ in 0..CAS_ATTEMPTS {
            match self.multi_once(ops, session, &uuid).await? {
                Ok(results) => return Ok(results),
                Err(Some((index, error))) => {
                    return Err(Error::MultiFailed {
                        index,
                        source: Box::new(error),
                    })
                }
                // The store moved between the reads and the transaction.
                Err(None) => last = Some(()),
            }
        }
        let _ = last;
        Err(Error::Backend(
            "the nodes of a multi kept changing while it was applied".into(),
        ))
    }

    fn faults(&self) -> Option<&dyn Faults> {
        Some(&self.keeper)
    }

    async fn close(&self) {
        self.keeper.close().await;
    }
}

/// A node as a multi sees it while planning.
#[derive(Debug, Clone, Default)]
struct Planned {
    /// It exists, as a key or an implicit directory (or will, by then).
    /// An implicit directory emptied by the multi still exists until the
    /// multi deletes it, as a ZooKeeper node would.
    exists: bool,
    /// Its key exists (or will, by then).
    key: bool,
    /// Keys below it.
    below: usize,
    /// Its `Flags` (a version, or a tag: see `Entry::is_tagged`).
    flags: u64,
    /// Its data version; `None` once a multi set a tagged key (its next
    /// version is only known after the transaction).
    version: Option<i32>,
    ephemeral: bool,
    /// The session holding the key read (0: none); `None` without one.
    owner: Option<SessionId>,
    /// The modify index read, while the multi has not touched it yet.
    pinned: Option<u64>,
    /// Touched by an earlier operation of the multi.
    touched: bool,
}

impl ConsulStore {
    /// Whether `path`, a node of ours (it has a fence), is no longer ours
    /// as read for a multi's check or delete without a version: its key is
    /// held by another session, or by none. A guarded write then fails, as
    /// etcd's fenced check does. (A create or delete earlier in the multi
    /// leaves no key read to judge by.)
    fn replaced(&self, session: SessionId, path: &str, version: Option<i32>, n: &Planned) -> bool {
        if version.is_some() {
            return false;
        }
        // Who holds our node there: this session, or the earlier one it
        // was made in (in a multi, as on etcd, only that one's node).
        let Some(holder) = self.owned(session).holder(session, path) else {
            return false;
        };
        n.owner.is_some_and(|owner| owner != holder)
    }

    /// One attempt at a multi: the results, or the failing operation, or
    /// `Err(None)` if the store moved since the reads (try again).
    async fn multi_once(
        &self,
        ops: &[Op],
        session: SessionId,
        uuid: &str,
    ) -> Result<std::result::Result<Vec<OpResult>, Option<(usize, Error)>>> {
        let mut paths: Vec<String> = Vec::new();
        for op in ops {
            let p = match op {
                Op::Check { path, .. } | Op::SetData { path, .. } | Op::Delete { path, .. } => path,
                Op::Create { path, mode, .. } => {
                    if !mode.is_sequential() {
                        paths.push(path.clone());
                    }
                    let parent = path::parent(path);
                    if parent == "/" {
                        continue;
                    }
                    parent
                }
            };
            paths.push(p.to_string());
        }
        paths.sort();
        paths.dedup();
        let reads = futures::future::try_join_all(paths.iter().map(|p| self.read(p))).await?;
        let mut view: HashMap<String, Planned> = paths
            .iter()
            .zip(reads)
            .map(|(p, (own, below))| {
                let planned = match own {
                    Some(e) => Planned {
                        exists: true,
                        key: true,
                        below,
                        flags: e.flags,
                        version: Some(e.version()),
                        ephemeral: e.session.is_some(),
                        owner: Some(e.owner()),
                        pinned: Some(e.modify_index),
                        touched: false,
                    },
                    // An implicit directory (or the root) is at version
                    // 0, as `exists` tells it.
                    None => Planned {
                        exists: below > 0,
                        below,
                        version: (below > 0 || p == "/").then_some(0),
                        ..Planned::default()
                    },
                };
                (p.clone(), planned)
            })
            .collect();
        let fail = |index: usize, error: Error| Ok(Err(Some((index, error))));
        let no_node = |p: &str| Error::NoNode {
            path: p.to_string(),
        };
        let mut txn: Vec<Value> = Vec::new();
        // For each transaction operation, the multi operation it serves.
        let mut owner_of: Vec<usize> = Vec::new();
        let mut fulls: Vec<String> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let before = txn.len();
            match op {
                Op::Check { path, version } => {
                    let n = view.get(path.as_str()).cloned().unwrap_or_default();
                    if !n.exists && path != "/" {
                        return fail(i, no_node(path));
                    }
                    if version.is_some_and(|v| n.version != Some(v)) {
                        return fail(i, Error::BadVersion { path: path.clone() });
                    }
                    if self.replaced(session, path, *version, &n) {
                        return fail(i, no_node(path));
                    }
                    if let (Some(index), false) = (n.pinned, n.touched) {
                        let key = self.layout.key(path);
                        txn.push(with(kv("check-index", &key), "Index", index.into()));
                    }
                    fulls.push(path.clone());
                }
                Op::Create { path, data, mode } => {
                    let parent = path::parent(path);
                    if parent != "/" {
                        let p = view.get(parent).cloned().unwrap_or_default();
                        if !p.exists {
                            return fail(i, no_node(parent));
                        }
                        if p.ephemeral {
                            return fail(
                                i,
                                Error::NoChildrenForEphemerals {
                                    path: parent.to_string(),
                                },
                            );
                        }
                    }
                    let full = match mode.is_sequential() {
                        true => format!("{path}{}", self.next_suffix()),
                        false => path.clone(),
                    };
                    if view.get(&full).is_some_and(|n| n.key) {
                        return fail(i, Error::NodeExists { path: full });
                    }
                    let key = self.layout.key(&full);
                    txn.push(kv("check-not-exists", &key));
                    txn.push(match mode.is_ephemeral() {
                        true => with(write("lock", &key, data, 0), "Session", uuid.into()),
                        false => write("set", &key, data, 0),
                    });
                    view.insert(
                        full.clone(),
                        Planned {
                            exists: true,
                            key: true,
                            version: Some(0),
                            ephemeral: mode.is_ephemeral(),
                            touched: true,
                            ..Planned::default()
                        },
                    );
                    if let Some(p) = view.get_mut(parent) {
                        p.below += 1;
                        p.exists = true;
                    }
                    fulls.push(full);
                }
                Op::SetData {
                    path,
                    data,
                    version,
                } => {
                    let n = view.get(path.as_str()).cloned().unwrap_or_default();
                    if !n.key {
                        return fail(i, no_node(path));
                    }
                    if version.is_some_and(|v| n.version != Some(v)) {
                        return fail(i, Error::BadVersion { path: path.clone() });
                    }
                    let key = self.layout.key(path);
                    let next = match n.flags >= TAG_MIN {
                        true => n.flags,
                        false => n.flags + 1,
                    };
                    txn.push(match (n.pinned, n.touched) {
                        (Some(index), false) => {
                            with(write("cas", &key, data, next), "Index", index.into())
                        }
                        _ => write("set", &key, data, next),
                    });
                    if let Some(n) = view.get_mut(path.as_str()) {
                        n.flags = next;
                        n.version = (next < TAG_MIN).then_some(next.min(i32::MAX as u64) as i32);
                        n.touched = true;
                    }
                    fulls.push(path.clone());
                }
                Op::Delete { path, version } => {
                    let n = view.get(path.as_str()).cloned().unwrap_or_default();
                    if !n.exists {
                        return fail(i, no_node(path));
                    }
                    if n.below > 0 {
                        return fail(i, Error::NotEmpty { path: path.clone() });
                    }
                    if version.is_some_and(|v| n.version != Some(v)) {
                        return fail(i, Error::BadVersion { path: path.clone() });
                    }
                    if self.replaced(session, path, *version, &n) {
                        return fail(i, no_node(path));
                    }
                    let key = self.layout.key(path);
                    if let (Some(index), false) = (n.pinned, n.touched) {
                        txn.push(with(kv("check-index", &key), "Index", index.into()));
                    }
                    // An emptied implicit directory has no key to delete.
                    if n.key {
                        txn.push(kv("delete", &key));
                    }
                    if n.ephemeral {
                        txn.push(kv("delete-tree", &keys::markers(&key)));
                    }
                    view.insert(
                        path.clone(),
                        Planned {
                            touched: true,
                            ..Planned::default()
                        },
                    );
                    if let Some(p) = view.get_mut(path::parent(path)) {
                        p.below = p.below.saturating_sub(1);
                    }
                    fulls.push(path.clone());
                }
            }
            owner_of.extend(std::iter::repeat_n(i, txn.len() - before));
        }
        let first = fulls.first().cloned().unwrap_or_else(|| "/".into());
        let answered = match txn.is_empty() {
            true => Ok(Vec::new()),
            false => self.txn(&txn, &first, session).await?,
        };
        let entries = match answered {
            Ok(entries) => entries,
            Err(failure) => {
                tracing::debug!(
                    "a multi failed at transaction operation {} (operation {:?}): {}; trying again",
                    failure.index,
                    owner_of.get(failure.index),
                    failure.what
                );
                return Ok(Err(None));
            }
        };
        // Each operation's own entry: the last its transaction operations
        // answered with. Not the first entry of its key: an earlier
        // operation's check, or the node a delete before it removed, has
        // that key too (a takeover's create would carry the old fence).
        let mut own_entry: Vec<Option<&Entry>> = vec![None; ops.len()];
        let answering = txn
            .iter()
            .zip(&owner_of)
            .filter(|(t, _)| answers_with_an_entry(t));
        for ((_, &owner), entry) in answering.zip(&entries) {
            own_entry[owner] = Some(entry);
        }
        let mut results = Vec::with_capacity(ops.len());
        for (i, (op, full)) in ops.iter().zip(&fulls).enumerate() {
            let entry = own_entry[i].filter(|e| e.key == self.layout.key(full));
            let stat = || entry.map(|e| keys::stat(e, 0)).unwrap_or_default();
            results.push(match op {
                Op::Check { .. } => OpResult::Checked,
                Op::Create { mode, data, .. } => {
                    let mut stat = stat();
                    stat.data_length = data.len().min(i32::MAX as usize) as i32;
                    if mode.is_ephemeral() {
                        stat.ephemeral_owner = session;
                        if let Some(e) = entry {
                            let suffix = mode
                                .is_sequential()
                                .then(|| keys::sequence_suffix(path::node_name(full)))
                                .flatten();
                            self.remember(session, full, e, suffix);
                        }
                    } else {
                        // A persistent node of ours has the name now: its
                        // fence ends (as `learn_created`'s does).
                        self.forget(session, full);
                    }
                    OpResult::Created(Created {
                        path: full.clone(),
                        stat,
                    })
                }
                Op::SetData { data, .. } => {
                    let mut stat = stat();
                    stat.data_length = data.len().min(i32::MAX as usize) as i32;
                    OpResult::Set(stat)
                }
                Op::Delete { .. } => {
                    self.forget(session, full);
                    OpResult::Deleted
                }
            });
        }
        Ok(Ok(results))
    }
}
