//! One-shot watches on Consul blocking queries.
//!
//! A watch remembers what the read that armed it saw, and a task asks
//! Consul about exactly the watched key (or the watched node's children's
//! prefix) — never a wider range, so a lock waiter wakes only for its
//! predecessor (no herd). The first query is not blocking, so whatever
//! happened between the read and the arming is seen; then it blocks on the
//! `X-Consul-Index` of the last answer. Every answer is compared with what
//! was armed: Consul may answer a blocking query early or for changes next
//! to the key, and those are not events.

use std::sync::Arc;
use std::time::Duration;

use hyper::Method;
use tokio::sync::oneshot;

use super::http::{encode_key, Http};
use super::keys::{self, Entry};
use crate::store::WatchEvent;

/// How long one blocking query waits at most.
const WAIT: Duration = Duration::from_secs(30);

/// What a watch waits for, and what the arming read saw.
#[derive(Debug, Clone)]
pub(super) enum Kind {
    /// A key that existed with these create and modify indexes.
    Data {
        key: String,
        created: u64,
        modified: u64,
    },
    /// A path that did not exist (no key, nothing below).
    Absent { key: String },
    /// A path that exists — keys below it (an implicit directory), and
    /// perhaps a key of its own: it ends when neither is left.
    Implicit { key: String },
    /// The children below `below` (the node's key is `key`; the root's
    /// is `None`), with this digest.
    Children {
        key: Option<String>,
        below: String,
        digest: u64,
    },
}

/// Starts the task of a watch; it ends once it fired or the watch was
/// dropped.
pub(super) fn spawn(http: Arc<Http>, kind: Kind) -> oneshot::Receiver<WatchEvent> {
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let mut tx = tx;
        tokio::select! {
            event = run(&http, &kind) => { let _ = tx.send(event); }
            () = tx.closed() => {}
        }
    });
    rx
}

async fn run(http: &Http, kind: &Kind) -> WatchEvent {
    match kind {
        // A prefix's index follows the keys below it and the tombstones
        // there, not the node's own key: with a tombstone below, the
        // deletion of that key moved nothing the query blocks on, and was
        // heard only when the query's wait ran out. So the node is also
        // followed as a path, its key included, which ends when neither
        // the key nor anything below it is left.
        Kind::Children { key: Some(key), .. } => {
            let node = Kind::Implicit { key: key.clone() };
            tokio::select! {
                event = follow(http, kind) => event,
                gone = follow(http, &node) => gone,
            }
        }
        _ => follow(http, kind).await,
    }
}

/// Probes until what `kind` waits for happens.
async fn follow(http: &Http, kind: &Kind) -> WatchEvent {
    let mut index = 0u64;
    let mut pause = Duration::from_millis(50);
    loop {
        match probe(http, kind, index).await {
            Ok((Some(event), _)) => return event,
            Ok((None, next)) => {
                pause = Duration::from_millis(50);
                // Consul's rules: an index that went back is reset; never
                // block on 0 (it would not block).
                index = if next < index { 0 } else { next.max(1) };
            }
            // The session's status tells the watcher about the connection.
            Err(()) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// One query: the event, if what the watch waits for happened, and the
/// index to block on next.
async fn probe(http: &Http, kind: &Kind, index: u64) -> Result<(Option<WatchEvent>, u64), ()> {
    let blocking = if index > 0 {
        format!("consistent&index={index}&wait={}s", WAIT.as_secs())
    } else {
        "consistent".to_string()
    };
    let timeout = WAIT + WAIT / 16 + Duration::from_secs(5);
    let get = |key: &str, recurse: bool| {
        let mut query = blocking.clone();
        if recurse {
            query = if query.is_empty() {
                "recurse".into()
            } else {
                format!("recurse&{query}")
            };
        }
        let sep = if query.is_empty() { "" } else { "?" };
        format!("/v1/kv/{}{sep}{query}", encode_key(key))
    };
    let entries = |resp: &super::http::Response| -> Result<Vec<Entry>, ()> {
        match resp.status {
            200 => resp.json::<Vec<Entry>>("a read").map_err(|_| ()),
            404 => Ok(Vec::new()),
            _ => Err(()),
        }
    };
    match kind {
        Kind::Data {
            key,
            created,
            modified,
        } => {
            let resp = http
                .send(Method::GET, &get(key, false), None, timeout)
                .await
                .map_err(|_| ())?;
            let found = entries(&resp)?.into_iter().find(|e| &e.key == key);
            let event = match found {
                None => Some(WatchEvent::NodeDeleted),
                Some(e) if e.create_index != *created => Some(WatchEvent::NodeDeleted),
                Some(e) if e.modify_index != *modified => Some(WatchEvent::DataChanged),
                Some(_) => None,
            };
            Ok((event, resp.index))
        }
        Kind::Absent { key } | Kind::Implicit { key } => {
            let resp = http
                .send(Method::GET, &get(key, true), None, timeout)
                .await
                .map_err(|_| ())?;
            let below = format!("{key}/");
            let found = entries(&resp)?;
            let exists = found
                .iter()
                .any(|e| &e.key == key || keys::is_descendant(&below, &e.key));
            let event = match (kind, exists) {
                (Kind::Absent { .. }, true) => Some(WatchEvent::NodeCreated),
                (Kind::Implicit { .. }, false) => Some(WatchEvent::NodeDeleted),
                _ => None,
            };
            Ok((event, resp.index))
        }
        Kind::Children { key, below, digest } => {
            let resp = http
                .send(Method::GET, &get(below, true), None, timeout)
                .await
                .map_err(|_| ())?;
            let found = entries(&resp)?;
            let children = keys::children(below, &found);
            if children.is_empty() {
                if let Some(key) = key {
                    let own = http
                        .send(
                            Method::GET,
                            &format!("/v1/kv/{}?consistent", encode_key(key)),
                            None,
                            timeout,
                        )
                        .await
                        .map_err(|_| ())?;
                    if own.status == 404 {
                        return Ok((Some(WatchEvent::NodeDeleted), resp.index));
                    }
                }
            }
            let event = (keys::digest(&children) != *digest).then_some(WatchEvent::ChildrenChanged);
            Ok((event, resp.index))
        }
    }
}
