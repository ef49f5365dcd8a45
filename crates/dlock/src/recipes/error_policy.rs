//! [`ErrorPolicy`]: which connection states count as losing leadership —
//! Curator's `ConnectionStateErrorPolicy`.
//!
//! Only the leader-election recipes ([`LeaderLatch`](super::leader_latch::LeaderLatch)
//! and [`LeaderSelector`](super::leader_selector::LeaderSelector)) consult it,
//! as in Curator 5.4, where locks, semaphores and shared values ignore it.

use crate::store::{SessionState, SessionStatus};

/// Which session states a leader must treat as the end of its leadership.
///
/// - [`Standard`](Self::Standard) (the default, Curator's
///   `StandardConnectionStateErrorPolicy`): `Suspended` already counts. The
///   conservative choice: while the connection is down nobody can tell
///   whether the session still lives, so a leader stops at once and
///   re-checks after reconnecting.
/// - [`Session`](Self::Session) (Curator's
///   `SessionConnectionStateErrorPolicy`): only a lost (expired) session
///   counts. A leader keeps leading through short disconnections, at the
///   risk of overlapping with a successor if the server expired the session
///   meanwhile.
///
/// A `Closed` session ends leadership under both policies.
///
/// ```
/// use dlock::recipes::error_policy::ErrorPolicy;
/// use dlock::SessionState;
/// assert_eq!(ErrorPolicy::default(), ErrorPolicy::Standard);
/// assert!(ErrorPolicy::Standard.is_error_state(SessionState::Suspended));
/// assert!(!ErrorPolicy::Session.is_error_state(SessionState::Suspended));
/// assert!(ErrorPolicy::Session.is_error_state(SessionState::Lost));
/// assert!(!ErrorPolicy::Standard.is_error_state(SessionState::Reconnected));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ErrorPolicy {
    /// `Suspended` and `Lost` both end leadership (Curator's default).
    #[default]
    Standard,
    /// Only `Lost` ends leadership.
    Session,
}

impl ErrorPolicy {
    /// Whether entering `state` ends leadership under this policy (Curator's
    /// `isErrorState`).
    pub fn is_error_state(self, state: SessionState) -> bool {
        match state {
            SessionState::Lost | SessionState::Closed => true,
            SessionState::Suspended => self == ErrorPolicy::Standard,
            SessionState::Connected | SessionState::Reconnected => false,
        }
    }

    /// Whether a leader that saw the session as `since` must give up its
    /// leadership now that it is `now`. Unlike
    /// [`is_error_state`](Self::is_error_state) this also catches what
    /// happened between two snapshots: a new session (the old one, and its
    /// nodes, are gone), or — under `Standard` — a suspension that came and
    /// went unobserved.
    pub(crate) fn ends_leadership(self, since: &SessionStatus, now: &SessionStatus) -> bool {
        if now.session_id != since.session_id || self.is_error_state(now.state) {
            return true;
        }
        // From a connected state, any change that ends connected again went
        // through a suspension; from a suspended one, it takes two changes.
        let changes = now.changes.saturating_sub(since.changes);
        self == ErrorPolicy::Standard
            && now.state.is_connected()
            && (changes >= 2 || (changes >= 1 && since.state.is_connected()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(state: SessionState, session_id: i64, changes: u64) -> SessionStatus {
        SessionStatus {
            state,
            session_id,
            changes,
        }
    }

    #[test]
    fn unobserved_transitions_end_leadership() {
        use SessionState::*;
        let start = status(Connected, 1, 0);
        let blip = status(Reconnected, 1, 2);
        assert!(ErrorPolicy::Standard.ends_leadership(&start, &blip));
        assert!(!ErrorPolicy::Session.ends_leadership(&start, &blip));
        let renewed = status(Reconnected, 2, 2);
        assert!(ErrorPolicy::Session.ends_leadership(&start, &renewed));
        assert!(!ErrorPolicy::Standard.ends_leadership(&start, &start));
        // Seen suspended, then back: the suspension was already handled.
        let suspended = status(Suspended, 1, 1);
        assert!(!ErrorPolicy::Standard.ends_leadership(&suspended, &status(Reconnected, 1, 2)));
        assert!(ErrorPolicy::Standard.ends_leadership(&suspended, &status(Reconnected, 1, 4)));
        assert!(ErrorPolicy::Standard.ends_leadership(&start, &suspended));
        assert!(!ErrorPolicy::Session.ends_leadership(&start, &suspended));
    }
}
