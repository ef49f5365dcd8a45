//! The background side of a [`ChildrenCache`](super::ChildrenCache): reads
//! what the watches name and applies it to the copy.

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};

use super::view::Shared;
use super::CachedChild;
use crate::error::{Error, Result};
use crate::path;
use crate::recipes::lifecycle::{lock, Backoff};
use crate::session::Session;
use crate::store::{sequence_suffix, Child, SessionState, Watch, WatchEvent};

/// What woke the syncer.
enum Wake {
    Listing(WatchEvent),
    Child(String, u64, WatchEvent),
}

/// The background side: reads what the watches name and applies it.
pub(super) struct Syncer {
    session: Session,
    dir: String,
    shared: Arc<Shared>,
    /// One armed data watch per child, each tagged with its generation.
    watches: FuturesUnordered<BoxFuture<'static, (String, u64, WatchEvent)>>,
    /// The generation of each child's live watch: a watch of an older one
    /// (a child read again since) is left to fire unheeded.
    armed: HashMap<String, u64>,
    generation: u64,
    /// Each child's creation as the last listing told it, by the node's
    /// creation (where the listing tells it): for a child made again at
    /// its name, whose data watch may be heard after the listing that
    /// showed it (on etcd a name comes back on a newer node).
    listed: HashMap<String, (Option<i64>, i64)>,
}

impl Syncer {
    pub(super) fn new(session: &Session, dir: &str, shared: &Arc<Shared>) -> Self {
        Syncer {
            session: session.clone(),
            dir: dir.to_string(),
            shared: shared.clone(),
            watches: FuturesUnordered::new(),
            armed: HashMap::new(),
            generation: 0,
            listed: HashMap::new(),
        }
    }

    /// Follows the directory until the session is closed (or the task is
    /// aborted).
    pub(super) async fn run(mut self, dir_watch: Watch) {
        let mut listing: BoxFuture<'static, WatchEvent> = Box::pin(dir_watch.changed());
        let mut backoff = Backoff::default();
        loop {
            let wake = tokio::select! {
                event = &mut listing => Wake::Listing(event),
                Some((name, generation, event)) = self.watches.next(), if !self.watches.is_empty() => {
                    Wake::Child(name, generation, event)
                }
            };
            let outcome = match wake {
                Wake::Listing(WatchEvent::Session(SessionState::Closed))
                | Wake::Child(_, _, WatchEvent::Session(SessionState::Closed)) => return,
                Wake::Listing(WatchEvent::Session(_))
                | Wake::Child(_, _, WatchEvent::Session(_)) => self.resync().await.map(Some),
                Wake::Listing(_) => self.relist().await.map(Some),
                Wake::Child(name, generation, _) if self.armed.get(&name) == Some(&generation) => {
                    self.armed.remove(&name);
                    // Even after a deletion: a newer node may have the name
                    // already, and a listing made meanwhile took it for the
                    // old one (whose watch was still armed).
                    self.read_child(&name, None).await.map(|()| None)
                }
                // A watch of a child read again since: the newer one counts.
                Wake::Child(..) => Ok(None),
            };
            match outcome {
                Ok(Some(watch)) => {
                    backoff.reset();
                    listing = Box::pin(watch.changed());
                }
                Ok(None) => backoff.reset(),
                Err(Error::Closed) => return,
                Err(e) => {
                    self.failed(e, &mut backoff).await;
                    // Start over: a resync re-arms the listing watch.
                    listing = Box::pin(async { WatchEvent::Session(SessionState::Reconnected) });
                }
            }
        }
    }

    async fn failed(&mut self, error: Error, backoff: &mut Backoff) {
        tracing::warn!(path = %self.dir, %error, "children cache: reading failed; trying again");
        backoff
            .pause(&self.session, std::future::pending::<()>())
            .await;
    }

    /// Forgets every watch, then lists and reads everything again.
    pub(super) async fn resync(&mut self) -> Result<Watch> {
        self.watches = FuturesUnordered::new();
        self.armed.clear();
        self.relist().await
    }

    /// Lists the directory (watching it), drops the children that are
    /// gone, and reads those without a live watch. A missing directory is
    /// watched for its creation.
    async fn relist(&mut self) -> Result<Watch> {
        let session = &self.session;
        loop {
            match session.retrying(|| session.children_watch(&self.dir)).await {
                Ok((mut children, watch)) => {
                    // New children are read, and so announced, in the order
                    // they were made: a follower of an election must never
                    // see a later candidate before an earlier one listed
                    // with it (it would name the later one leader).
                    children.sort_by(|a, b| creation_order(a).cmp(&creation_order(b)));
                    let names: std::collections::HashSet<&str> =
                        children.iter().map(|c| c.name.as_str()).collect();
                    self.shared.retain(&|name| names.contains(name));
                    self.armed.retain(|name, _| names.contains(name.as_str()));
                    let created = |c: &Child| Some((c.name.clone(), (c.czxid, c.created?)));
                    self.listed = children.iter().filter_map(created).collect();
                    for child in &children {
                        if self.armed.contains_key(&child.name) {
                            self.shared.listed(child);
                        } else {
                            self.read_child(&child.name, child.created).await?;
                        }
                    }
                    return Ok(watch);
                }
                Err(Error::NoNode { .. }) => {
                    self.shared.retain(&|_| false);
                    self.armed.clear();
                    match session.retrying(|| session.exists_watch(&self.dir)).await? {
                        (None, watch) => return Ok(watch),
                        // Created meanwhile: list it.
                        (Some(_), _) => continue,
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads one child (arming its data watch) and applies it; a child gone
    /// meanwhile is dropped.
    async fn read_child(&mut self, name: &str, created: Option<i64>) -> Result<()> {
        let node = path::join(&self.dir, name);
        let session = &self.session;
        match session.retrying(|| session.get_data_watch(&node)).await {
            Ok((data, stat, watch)) => {
                let listed = self.listed.get(name);
                let created = created
                    .or_else(|| {
                        lock(&self.shared.view)
                            .children
                            .get(name)
                            .filter(|c| c.stat.czxid == stat.czxid)
                            .and_then(|c| c.created)
                    })
                    .or_else(|| {
                        listed
                            .filter(|(czxid, _)| *czxid == Some(stat.czxid))
                            .map(|(_, created)| *created)
                    });
                self.shared.put(CachedChild {
                    name: name.to_string(),
                    path: node,
                    data,
                    stat,
                    created,
                });
                self.generation += 1;
                let generation = self.generation;
                self.armed.insert(name.to_string(), generation);
                let name = name.to_string();
                self.watches.push(Box::pin(async move {
                    (name, generation, watch.changed().await)
                }));
                Ok(())
            }
            Err(Error::NoNode { .. }) => {
                self.shared.remove(name);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

/// A child's place in the order the recipes give a queue
/// ([`sort_sequenced`](crate::store::sort_sequenced)): the store's creation
/// order where it has one, ties by name; else its sequence suffix.
fn creation_order(child: &Child) -> (Option<i64>, Option<&str>, &str) {
    let sequence = match child.created {
        Some(_) => None,
        None => sequence_suffix(&child.name),
    };
    (child.created, sequence, &child.name)
}
