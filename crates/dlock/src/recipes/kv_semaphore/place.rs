//! Where a [`KvSemaphore`](super::KvSemaphore) lives, and the contender's
//! moves there: enter, look, write the record, leave.

use std::collections::HashSet;

use super::{holder_id, KvLease, Record, RECORD};
use crate::error::{Error, Result};
use crate::path;
use crate::recipes::guard::Acquisition;
use crate::recipes::layout::{Layout, CONSUL_SEMAPHORE_FLAGS};
use crate::recipes::queue::HeldNode;
use crate::session::Session;
use crate::store::{CreateMode, CreateOptions, Created, FencingToken, Stat, Watch};

/// Where a semaphore lives.
#[derive(Debug, Clone)]
pub(super) struct Place {
    pub(super) session: Session,
    pub(super) dir: String,
    pub(super) record: String,
    pub(super) layout: Layout,
    /// Told our entry's path when someone asks for our slot.
    pub(super) revocation: Option<crate::recipes::revocation::Listener>,
    /// The longest a slot may be held before the library ends it.
    pub(super) max_hold: Option<std::time::Duration>,
}

/// What a contender saw in one look.
pub(super) struct Look {
    pub(super) record: Option<(Record, Stat)>,
    pub(super) live: HashSet<String>,
    pub(super) watches: Vec<Watch>,
}

impl Look {
    /// The record's holders that are alive, in the order they joined.
    pub(super) fn live_holders(&self) -> Vec<String> {
        let holders = self.record.iter().flat_map(|(r, _)| &r.holders);
        holders
            .filter(|h| self.live.contains(*h))
            .cloned()
            .collect()
    }
}

impl Place {
    /// Creates our contender entry, named after the session that owns it.
    /// `NoNode` if the caller should go again: the container reaper removed
    /// the empty directory between its creation and ours, an earlier entry
    /// of this session was on its way out, or the session was renewed
    /// between naming the entry and creating it.
    pub(super) async fn enter(&self) -> Result<Entry> {
        let session = &self.session;
        // Consul's contenders are named after the session's UUID, ours after
        // its number; either way the entry must end up owned by `owner`.
        let (owner, id) = match self.layout {
            Layout::Curator | Layout::Kazoo => {
                let owner = session.session_id();
                (owner, holder_id(owner))
            }
            Layout::Consul => session.native_session_id(),
        };
        let token = uuid::Uuid::new_v4().to_string().into_bytes();
        // Armed before the create: if we are cancelled while it is in
        // flight, an entry it made is found by its token and removed.
        let mut entry = Entry {
            place: self.clone(),
            path: path::join(&self.dir, &id),
            id,
            token,
            created: None,
            armed: true,
        };
        let opts = self.tagged(CreateOptions::new(CreateMode::Ephemeral).with_parents());
        let created = session.retrying(|| session.create(&entry.path, &entry.token, opts));
        let created = match created.await {
            Err(Error::NodeExists { .. }) => {
                match session.retrying(|| session.get_data(&entry.path)).await {
                    // Our own create, whose reply was lost.
                    Ok((data, stat)) if data == entry.token => Ok(Created {
                        path: entry.path.clone(),
                        stat,
                    }),
                    Ok(_) => Err(Error::InvalidArgument(format!(
                        "session {} already holds or waits for the semaphore at {}: \
                         a KvSemaphore admits one lease per session (use another session)",
                        entry.id, self.dir
                    ))),
                    Err(e) => Err(e),
                }
            }
            created => created,
        };
        match created {
            Ok(created) if created.stat.ephemeral_owner == owner => {
                if let Some(listener) = &self.revocation {
                    let path = created.path.clone();
                    crate::recipes::revocation::watch(session, path, listener.clone());
                }
                entry.created = Some(created);
                Ok(entry)
            }
            // Made by the new session under the old one's name: it goes, by
            // its token, in the background.
            Ok(created) => Err(Error::NoNode { path: created.path }),
            // Nothing of ours was created: nothing to remove.
            Err(e) => {
                entry.armed = !matches!(e, Error::NoNode { .. });
                Err(e)
            }
        }
    }

    /// `opts` with the layout's tag, if it has one.
    fn tagged(&self, opts: CreateOptions) -> CreateOptions {
        match self.layout {
            Layout::Curator | Layout::Kazoo => opts,
            Layout::Consul => opts.with_tag(CONSUL_SEMAPHORE_FLAGS),
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
    pub(super) async fn look(&self, watch: bool) -> Result<Look> {
        let store = self.session.store();
        let mut watches = Vec::new();
        let record = match self.found(|| store.get_data(&self.record, watch)).await? {
            Some((data, stat, w)) => {
                watches.extend(w);
                Some((Record::decode(self.layout, &self.record, &data)?, stat))
            }
            None => None,
        };
        let (children, w) = self
            .found(|| store.children(&self.dir, watch))
            .await?
            .unzip();
        watches.extend(w.flatten());
        let names = children.into_iter().flatten().map(|c| c.name);
        let mut live: HashSet<String> = names.filter(|n| n != RECORD).collect();
        if self.layout == Layout::Consul {
            // Consul's sessions release (not delete) their keys when they
            // end: an entry is alive only while a session owns it.
            let entries: Vec<String> = live.iter().cloned().collect();
            let owners = futures::future::try_join_all(entries.iter().map(|name| {
                let node = path::join(&self.dir, name);
                async move { self.found(|| store.exists(&node, false)).await }
            }))
            .await?;
            for (name, found) in entries.iter().zip(owners) {
                let owned = found
                    .and_then(|(stat, _)| stat)
                    .is_some_and(|s| s.ephemeral_owner != 0);
                if !owned {
                    live.remove(name);
                }
            }
        }
        Ok(Look {
            record,
            live,
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
    pub(super) async fn write(&self, record: &Record, version: Option<i32>) -> Result<Stat> {
        let (session, data) = (&self.session, record.encode(self.layout).into_bytes());
        match version {
            Some(_) => session.set_data(&self.record, &data, version).await,
            None => {
                let opts = self.tagged(CreateOptions::new(CreateMode::Persistent));
                Ok(session.create(&self.record, &data, opts).await?.stat)
            }
        }
    }

    /// Removes holder `id` from the record by compare-and-set, pruning dead
    /// holders too, and deletes the record if nobody is left; then deletes
    /// our entry at `path`. `None` (an entry taken away) prunes the dead
    /// only, removing nobody else: the session may have entered again since.
    pub(super) async fn leave(&self, ours: Option<(&str, &str)>) -> Result<()> {
        let Some((id, entry)) = ours else {
            return self.leave_record("").await;
        };
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

/// Whether a write lost a race (someone wrote first, or our reply was lost):
/// then look again.
pub(super) fn raced(e: &Error) -> bool {
    matches!(
        e,
        Error::BadVersion { .. }
            | Error::NodeExists { .. }
            | Error::NoNode { .. }
            | Error::ConnectionLoss
    )
}

/// Our contender entry: unless turned into a lease, it is removed — with our
/// place in the record, if any — in the background when dropped; if dropped
/// while its create is in flight, whatever that create made is removed.
pub(super) struct Entry {
    place: Place,
    pub(super) id: String,
    path: String,
    token: Vec<u8>,
    created: Option<Created>,
    armed: bool,
}

impl Entry {
    /// Removes the entry (and our place in the record) now.
    pub(super) async fn delete(mut self) -> Result<()> {
        // Disarmed only once done: if cancelled meanwhile, Drop finishes it.
        let left = self.place.leave(Some((&self.id, &self.path))).await;
        self.armed = false;
        left
    }

    pub(super) fn into_lease(mut self, token: FencingToken) -> KvLease {
        self.armed = false;
        let created = self.created.take().expect("an entry");
        let place = &self.place;
        let node = HeldNode::new(&place.session, &place.dir, "semaphore lease", created)
            .limited(place.max_hold);
        KvLease {
            acquisition: Acquisition::with_token(node, token),
            place: place.clone(),
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
            self.place.leave_in_background(Some((id, path)));
        } else {
            let (place, token) = (self.place.clone(), std::mem::take(&mut self.token));
            let what = format!("removing the semaphore entry {path}");
            in_background(&self.place, what, async move {
                place.delete_if_ours(&path, &token).await
            });
        }
    }
}

impl Place {
    /// [`leave`](Self::leave) in the background.
    pub(super) fn leave_in_background(&self, ours: Option<(String, String)>) {
        let what = match &ours {
            Some((_, entry)) => format!("giving back the semaphore slot of {entry}"),
            None => format!("pruning the semaphore record {}", self.record),
        };
        let place = self.clone();
        in_background(self, what, async move {
            let ours = ours
                .as_ref()
                .map(|(id, entry)| (id.as_str(), entry.as_str()));
            place.leave(ours).await
        });
    }
}

/// Runs a clean-up in the background; a closed session took its nodes
/// already, anything else is worth a warning.
fn in_background(
    place: &Place,
    what: String,
    cleanup: impl std::future::Future<Output = Result<()>> + Send + 'static,
) {
    place.session.spawn_background(async move {
        match cleanup.await {
            Ok(()) | Err(Error::Closed) => {}
            Err(e) => tracing::warn!(error = %e, "{what} failed"),
        }
    });
}
