//! The nodes of the wait queue: one still queueing ([`PendingNode`], gone
//! unless kept) and one that holds ([`HeldNode`], what guards point at).

use std::sync::Arc;

use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::session::Session;
use crate::store::{Created, SessionId, SessionState};

/// A node in the queue that is deleted (in the background) unless
/// [`disarm`](Self::disarm)ed: makes acquisition cancellation-safe — a
/// dropped, timed-out or failed acquire leaves nothing behind. (A create
/// still in flight is the protected create's to clean up.)
pub(crate) struct PendingNode {
    session: Session,
    path: String,
    armed: bool,
}

impl PendingNode {
    /// Our node at `path`, armed.
    pub fn new(session: &Session, path: &str) -> Self {
        PendingNode {
            session: session.clone(),
            path: path.to_string(),
            armed: true,
        }
    }

    pub fn disarm(mut self) {
        self.armed = false;
    }

    /// Deletes the node now (retrying), instead of in the background.
    pub async fn delete(mut self) -> Result<()> {
        // Disarmed only once done: if this future is dropped midway, the
        // drop deletes the node in the background.
        let result = self.session.delete_protected(&self.path).await;
        self.armed = false;
        result
    }
}

impl Drop for PendingNode {
    fn drop(&mut self) {
        if self.armed {
            self.session
                .delete_in_background(std::mem::take(&mut self.path));
        }
    }
}

/// Shared state of a held node: what guards point at.
#[derive(Debug)]
pub(crate) struct HeldNode {
    pub session: Session,
    /// Shared with the metrics labels of the release.
    pub recipe_path: Arc<str>,
    pub what: &'static str,
    pub created: Created,
    pub session_id: SessionId,
    pub acquired_at: Instant,
}

impl HeldNode {
    pub fn new(
        session: &Session,
        recipe_path: &str,
        what: &'static str,
        created: Created,
    ) -> Arc<Self> {
        // The node's owner is the session it was acquired in, even if the
        // client has moved to a new session since (then it is lost already).
        let session_id = match created.stat.ephemeral_owner {
            0 => session.session_id(),
            owner => owner,
        };
        Arc::new(HeldNode {
            session: session.clone(),
            recipe_path: Arc::from(recipe_path),
            what,
            session_id,
            created,
            acquired_at: Instant::now(),
        })
    }

    /// Whether the session that created the node is over.
    pub fn is_lost(&self) -> bool {
        let s = self.session.status();
        s.session_id != self.session_id
            || matches!(s.state, SessionState::Lost | SessionState::Closed)
    }

    pub fn lost_error(&self) -> Error {
        Error::Lost {
            what: self.what,
            path: self.recipe_path.to_string(),
        }
    }

    /// Deletes the node; reports [`Error::Lost`] if it was lost before.
    pub async fn release(&self) -> Result<()> {
        let lost = self.is_lost();
        let labels = [
            ("recipe", metrics::SharedString::const_str(self.what)),
            (
                "path",
                metrics::SharedString::from_shared(self.recipe_path.clone()),
            ),
        ];
        metrics::histogram!("dlock_hold_seconds", &labels)
            .record(self.acquired_at.elapsed().as_secs_f64());
        tracing::debug!(node = %self.created.path, token = self.created.token().0, lost, "release");
        self.session.delete_protected(&self.created.path).await?;
        if lost {
            metrics::counter!("dlock_losses_total", &labels).increment(1);
            Err(self.lost_error())
        } else {
            Ok(())
        }
    }
}
