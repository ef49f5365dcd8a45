//! The watcher that keeps a [`SharedValue`](super::SharedValue)'s copy
//! fresh.

use std::sync::Arc;

use super::value::{Cache, ValueCodec};
use crate::error::Error;
use crate::recipes::lifecycle::Backoff;
use crate::session::Session;
use crate::store::{SessionState, Watch, WatchEvent};

/// Keeps the cache fresh: waits for the watch, re-reads (re-arming it) on
/// every node or session event, and follows the node through deletion and
/// re-creation. Ends when the session is closed (or the task is aborted).
pub(super) async fn watch_loop<T: ValueCodec>(
    session: Session,
    path: String,
    cache: Arc<Cache<T>>,
    mut watch: Option<Watch>,
) {
    let mut backoff = Backoff::default();
    loop {
        if let Some(w) = watch.take() {
            if w.changed().await == WatchEvent::Session(SessionState::Closed) {
                return;
            }
        }
        match session.retrying(|| session.get_data_watch(&path)).await {
            Ok((data, stat, w)) => {
                backoff.reset();
                match T::from_bytes(&path, &data) {
                    Ok(value) => cache.update(&stat, value),
                    Err(e) => {
                        tracing::warn!(error = %e, kind = T::KIND, "keeping the last good value")
                    }
                }
                watch = Some(w);
            }
            Err(Error::NoNode { .. }) => match session.exists_watch(&path).await {
                // Deleted: wait until someone creates it again.
                Ok((None, w)) => watch = Some(w),
                // Created again meanwhile: read it at once.
                Ok((Some(_), _)) => {}
                Err(Error::Closed) => return,
                Err(e) => {
                    tracing::warn!(%path, error = %e, kind = T::KIND, "watching failed");
                    backoff.pause(&session, std::future::pending::<()>()).await;
                }
            },
            Err(Error::Closed) => return,
            Err(e) => {
                tracing::warn!(%path, error = %e, kind = T::KIND, "reading failed");
                backoff.pause(&session, std::future::pending::<()>()).await;
            }
        }
    }
}
