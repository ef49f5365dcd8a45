//! The wait: until the predicate says our node holds, watching only what
//! it names.

use tokio::sync::Notify;

use super::{Predicate, Verdict, WaitQueue};
use crate::error::{Error, Result};
use crate::recipes::deadline::Deadline;
use crate::store::{Child, Created, SessionState, Watch};

/// How a wait ended without acquiring.
#[derive(Debug)]
pub(crate) enum Stop {
    TimedOut,
    Failed(Error),
}
impl WaitQueue {
    /// Waits until `predicate` says our node holds. `children` is a fresh
    /// sorted listing to start from. Wakes on the watched node or siblings,
    /// on any session event, and on `wake` (a recipe's own trigger, such as
    /// a changed semaphore limit).
    pub async fn wait(
        &self,
        ours: &Created,
        mut children: Vec<Child>,
        predicate: &dyn Predicate,
        deadline: Deadline,
        wake: Option<&Notify>,
    ) -> Result<(), Stop> {
        // Our node lives only as long as the session it was created in; reads
        // renew a lost session transparently, so the session is checked,
        // not inferred from the listing. A lost lease's keys may still be
        // listed for a moment (etcd's lessor removes them up to half a
        // second late: not ours to hold, CURATOR-604), and a watch armed
        // after the loss belongs to the new session and would never fire
        // for it. Either way: start over with a node of the live session.
        let owner = ours.stat.ephemeral_owner;
        let session_gone = || {
            (owner != 0 && !self.session_owns(owner)).then(|| {
                Stop::Failed(Error::NoNode {
                    path: ours.path.clone(),
                })
            })
        };
        let name = ours.name();
        // Worked out once: every listing of the wait is checked for twins.
        let prefix = super::names::creation_prefix(name);
        let since = ours.stat.czxid;
        let mut children_watch: Option<Watch> = None;
        loop {
            if let Some(stop) = session_gone() {
                return Err(stop);
            }
            let twins = self.delete_twins(&children, name, prefix);
            if twins.await.map_err(Stop::Failed)? {
                children = self
                    .sorted_children_seen(since)
                    .await
                    .map_err(Stop::Failed)?;
                continue;
            }
            let watch = match predicate.check(&children, name).map_err(Stop::Failed)? {
                Verdict::Acquired => return Ok(()),
                Verdict::WatchNode(sibling) => {
                    match self.watch_sibling(&sibling).await {
                        Ok(Some(watch)) => watch,
                        // Already gone: look again at once.
                        Ok(None) => {
                            children = self
                                .sorted_children_seen(since)
                                .await
                                .map_err(Stop::Failed)?;
                            continue;
                        }
                        Err(e) => return Err(Stop::Failed(e)),
                    }
                }
                Verdict::WatchChildren => match children_watch.take() {
                    Some(watch) => watch,
                    None => {
                        let (fresh, watch) =
                            self.sorted_children(true).await.map_err(Stop::Failed)?;
                        children = fresh;
                        children_watch = watch;
                        if children_watch.is_none() {
                            // The directory is gone, and our node with it.
                            return Err(Stop::Failed(Error::NoNode {
                                path: self.dir.clone(),
                            }));
                        }
                        continue;
                    }
                },
            };
            if let Some(stop) = session_gone() {
                return Err(stop);
            }
            let woke = async {
                tokio::select! {
                    _ = watch.changed() => {}
                    () = wait_notify(wake) => {}
                }
            };
            if deadline.race(woke).await.is_none() {
                return Err(Stop::TimedOut);
            }
            children = self
                .sorted_children_seen(since)
                .await
                .map_err(Stop::Failed)?;
        }
    }
    /// Watches `sibling`, as a listing showed it, for a change. `None` if
    /// it is gone already — also when its name is back on a newer node
    /// (etcd reuses names): that one came after the listing, so it is not
    /// the node we queued behind.
    pub async fn watch_sibling(&self, sibling: &Child) -> Result<Option<Watch>> {
        let store = self.session.store();
        self.session
            .retrying(|| store.watch_child(&self.dir, sibling))
            .await
    }

    /// Deletes the twins of our node `name` among `children`: nodes of our
    /// session with its protection prefix (`prefix`, if it has one), made by an earlier try of the
    /// create whose reply was lost and which landed late (etcd and Consul
    /// do not order one client's requests; such a try's node is found by
    /// no look made before it lands). Nobody else would ever delete one: a
    /// twin before us, we would wait behind for good; after us, whoever
    /// comes next. Whether any was deleted.
    async fn delete_twins(
        &self,
        children: &[Child],
        name: &str,
        prefix: Option<&str>,
    ) -> Result<bool> {
        let Some(prefix) = prefix else {
            return Ok(false);
        };
        let mut deleted = false;
        let twins = children
            .iter()
            .filter(|c| c.name != name && c.name.starts_with(prefix));
        for twin in twins {
            let path = self.node_path(&twin.name);
            let session = &self.session;
            let Some(stat) = session.retrying(|| session.exists(&path)).await? else {
                continue;
            };
            // (One of an earlier session goes with that session.)
            if stat.ephemeral_owner == session.session_id() {
                tracing::debug!(%path, "deleting a late twin of our node");
                session.delete_created(&path, stat.czxid).await?;
                deleted = true;
            }
        }
        Ok(deleted)
    }

    /// Whether `owner` is the session's current, live session.
    fn session_owns(&self, owner: crate::store::SessionId) -> bool {
        let status = self.session.status();
        status.session_id == owner
            && !matches!(status.state, SessionState::Lost | SessionState::Closed)
    }
}

async fn wait_notify(wake: Option<&Notify>) {
    match wake {
        Some(n) => n.notified().await,
        None => std::future::pending().await,
    }
}
