//! The keeper of a member's node (Curator's `PersistentNode`): there while
//! the member is.

use std::sync::{Arc, Mutex as StdMutex};

use crate::error::{Error, Result};
use crate::recipes::lifecycle::{lock, Backoff};
use crate::session::Session;
use crate::store::{CreateMode, CreateOptions, Created, SessionState, Watch, WatchEvent};

/// Makes sure the member's node exists, creating it with the payload if it
/// does not, and returns a watch on it.
pub(super) async fn ensure_node(
    session: &Session,
    node: &str,
    payload: &StdMutex<Vec<u8>>,
) -> Result<Watch> {
    let opts = CreateOptions::new(CreateMode::Ephemeral).with_parents();
    loop {
        let (stat, watch) = session.retrying(|| session.exists_watch(node)).await?;
        if let Some(stat) = stat {
            // Ours, if a create's reply was lost: the store learns it.
            let path = node.to_string();
            session.adopt(opts, &Created { path, stat });
            return Ok(watch);
        }
        let data = lock(payload).clone();
        // A NoNode is the container reaper removing an empty parent between
        // its creation and ours.
        let created = session
            .retrying_reaped(|| session.create_or_undo(node, &data, opts))
            .await;
        match created {
            Ok(_) => {
                // The payload changed while we created: write the latest.
                let latest = lock(payload).clone();
                if latest != data {
                    match session
                        .retrying(|| session.set_data(node, &latest, None))
                        .await
                    {
                        Ok(_) | Err(Error::NoNode { .. }) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            // Ours after a lost reply, or another member's of the same id:
            // either way, watch it.
            Err(Error::NodeExists { .. }) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Keeps the member's node (Curator's `PersistentNode`): after any event on
/// it — its deletion, the session's loss or reconnection — makes sure it
/// exists again. Ends when the session is closed (or the task is aborted).
pub(super) async fn keep_node(
    session: Session,
    node: String,
    payload: Arc<StdMutex<Vec<u8>>>,
    mut watch: Watch,
) {
    let mut backoff = Backoff::default();
    loop {
        if watch.changed().await == WatchEvent::Session(SessionState::Closed) {
            return;
        }
        loop {
            match ensure_node(&session, &node, &payload).await {
                Ok(w) => {
                    backoff.reset();
                    watch = w;
                    break;
                }
                Err(Error::Closed) => return,
                Err(e) => {
                    tracing::warn!(%node, error = %e, "group member: keeping the node failed");
                    backoff.pause(&session, std::future::pending::<()>()).await;
                }
            }
        }
    }
}
