//! The recipes for code without an async runtime.
//!
//! A [`blocking::Session`](Session) owns a small tokio runtime (one worker
//! thread) that keeps the session alive between calls — heartbeats, watches
//! and background deletes run there — and every method blocks the calling
//! thread until its operation completes. When the last handle on it goes
//! (its clones, and the recipes and guards made from it), it finishes the
//! deletes that dropped guards left, and closes the session: so a guard
//! dropped with its session frees the lock at once, not at the session's
//! timeout. (A last handle dropped inside an async runtime — by a task,
//! or in `spawn_blocking` — may not wait there: a thread of its own
//! finishes the clean-up, which a process that exits at once cuts short;
//! then the session's nodes go at its timeout.) Do not call these from
//! inside an async runtime; use the async API there.
//!
//! ```
//! let session = dlock::blocking::connect("embedded")?;
//! let mutex = session.mutex("/doc/blocking")?;
//! let guard = mutex.acquire()?;
//! println!("holding with token {}", guard.token());
//! guard.release()?;
//! # Ok::<(), dlock::Error>(())
//! ```

use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::store::{FencingToken, Op, OpResult};
use crate::SessionOptions;

/// A session with its own runtime. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Session {
    runtime: Arc<Runtime>,
}

/// The runtime of a blocking session, which ends the session with it.
#[derive(Debug)]
struct Runtime {
    tokio: Option<tokio::runtime::Runtime>,
    session: crate::Session,
}

impl Runtime {
    fn tokio(&self) -> &tokio::runtime::Runtime {
        self.tokio.as_ref().expect("present until dropped")
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let Some(tokio) = self.tokio.take() else {
            return;
        };
        // The last handle: guards dropped with it (a `let _guard` dropped
        // before its session, say) left their deletes to this runtime, which
        // would cancel them on its way out. Finish them and close the
        // session, so its nodes go now, not at its timeout; bounded by that
        // timeout, which would take them anyway, and by a process's patience
        // at exit (Consul's sessions may live for a day).
        let session = self.session.clone();
        let bound = session.session_timeout().min(LAST_DROP_BOUND);
        let finish = move || {
            tokio.block_on(async move {
                let ended = async {
                    session.background_idle().await;
                    session.close().await;
                };
                let _ = tokio::time::timeout(bound, ended).await;
            });
        };
        // Inside an async runtime (the last handle dropped by a task), which
        // must not block — nor start, or drop, a runtime: a thread of its
        // own finishes.
        match tokio::runtime::Handle::try_current() {
            Ok(_) => drop(std::thread::spawn(finish)),
            Err(_) => finish(),
        }
    }
}

/// How long the last handle's drop waits at most for the deletes that
/// dropped guards left, and the session's close.
const LAST_DROP_BOUND: Duration = Duration::from_secs(30);

/// Connects a new session to `endpoint` (see [`Endpoint`](crate::Endpoint)).
pub fn connect(endpoint: &str) -> Result<Session> {
    connect_with(endpoint, SessionOptions::default())
}

/// Connects a new session to `endpoint` with `options`.
pub fn connect_with(endpoint: &str, options: SessionOptions) -> Result<Session> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("dlock-blocking")
        .enable_all()
        .build()
        .map_err(|e| Error::Backend(format!("cannot start a runtime: {e}")))?;
    let session = runtime.block_on(crate::connect_with(endpoint, options))?;
    let runtime = Runtime {
        tokio: Some(runtime),
        session,
    };
    Ok(Session {
        runtime: Arc::new(runtime),
    })
}

impl Session {
    /// The async session inside, for recipes without a blocking wrapper yet
    /// (run them with [`block_on`](Self::block_on)).
    pub fn session(&self) -> &crate::Session {
        &self.runtime.session
    }

    /// Runs any async dlock operation to completion on this session's
    /// runtime.
    ///
    /// ```
    /// let session = dlock::blocking::connect("embedded")?;
    /// let latch_free = session.block_on(async {
    ///     let rw = dlock::ReadWriteLock::new(session.session(), "/doc/block-on")?;
    ///     rw.try_write().await.map(|g| g.is_some())
    /// })?;
    /// assert!(latch_free);
    /// # Ok::<(), dlock::Error>(())
    /// ```
    pub fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.tokio().block_on(future)
    }

    /// A [`Mutex`] at `path`.
    pub fn mutex(&self, path: &str) -> Result<Mutex> {
        Ok(Mutex {
            inner: crate::Mutex::new(self.session(), path)?,
            session: self.clone(),
        })
    }

    /// A [`ReadWriteLock`] at `path`.
    pub fn read_write_lock(&self, path: &str) -> Result<ReadWriteLock> {
        Ok(ReadWriteLock {
            inner: crate::ReadWriteLock::new(self.session(), path)?,
            session: self.clone(),
        })
    }

    /// A [`Semaphore`] at `path` with `max` leases.
    pub fn semaphore(&self, path: &str, max: u32) -> Result<Semaphore> {
        Ok(Semaphore {
            inner: crate::Semaphore::new(self.session(), path, max)?,
            session: self.clone(),
        })
    }

    /// A started [`LeaderLatch`] at `path` with participant id `id`.
    pub fn leader_latch(&self, path: &str, id: &str) -> Result<LeaderLatch> {
        let _enter = self.runtime.tokio().enter();
        let inner = crate::LeaderLatch::new(self.session(), path)?.with_id(id);
        inner.start()?;
        Ok(LeaderLatch {
            inner,
            session: self.clone(),
        })
    }

    /// Closes the session.
    pub fn close(&self) {
        self.block_on(self.session().close())
    }
}

/// The blocking [`crate::Mutex`].
#[derive(Clone, Debug)]
pub struct Mutex {
    inner: crate::Mutex,
    session: Session,
}

impl Mutex {
    /// Blocks until the lock is ours.
    pub fn acquire(&self) -> Result<Guard> {
        self.session.hold(self.inner.acquire())
    }

    /// Blocks at most `timeout`.
    pub fn acquire_timeout(&self, timeout: Duration) -> Result<Guard> {
        self.session.hold(self.inner.acquire_timeout(timeout))
    }

    /// Takes the lock only if it is free now.
    pub fn try_acquire(&self) -> Result<Option<Guard>> {
        let guard = self.session.block_on(self.inner.try_acquire())?;
        Ok(guard.map(|g| self.session.guard(g)))
    }
}

/// The blocking [`crate::ReadWriteLock`] (the guards of its halves are
/// [`Guard`]s too; downgrading is for the async API).
#[derive(Clone, Debug)]
pub struct ReadWriteLock {
    inner: crate::ReadWriteLock,
    session: Session,
}

impl ReadWriteLock {
    /// Blocks until the read lock is ours.
    pub fn read(&self) -> Result<Guard> {
        let session = &self.session;
        let guard = session.block_on(self.inner.read())?;
        Ok(session.guard_from(Box::new(guard)))
    }

    /// Blocks until the write lock is ours.
    pub fn write(&self) -> Result<Guard> {
        let session = &self.session;
        let guard = session.block_on(self.inner.write())?;
        Ok(session.guard_from(Box::new(guard)))
    }
}

impl Session {
    fn hold(
        &self,
        acquire: impl std::future::Future<Output = Result<crate::LockGuard>>,
    ) -> Result<Guard> {
        Ok(self.guard(self.block_on(acquire)?))
    }

    fn guard(&self, guard: crate::LockGuard) -> Guard {
        self.guard_from(Box::new(guard))
    }

    fn guard_from(&self, hold: Box<dyn crate::Hold>) -> Guard {
        Guard {
            hold: Some(hold),
            session: self.clone(),
        }
    }
}

/// What a blocking hold tells of its acquisition (through `acquisition()`,
/// blocking on `session`): whether it is lost, waiting for that, and
/// writes guarded by it. Written once for [`Guard`] and [`Leadership`].
macro_rules! held_signals {
    ($what:literal, $(#[$wait_lost_example:meta])*) => {
        #[doc = concat!("Whether the ", $what, " is lost (its session is over, or its node was")]
        /// taken away): stop the protected work.
        pub fn is_lost(&self) -> bool {
            self.acquisition().is_lost()
        }

        #[doc = concat!("Blocks until the ", $what, " is lost, or at most `timeout`; returns")]
        /// whether it was lost.
        ///
        $(#[$wait_lost_example])*
        pub fn wait_lost(&self, timeout: Duration) -> bool {
            let lost = self.acquisition().lost();
            self.session
                .block_on(async { tokio::time::timeout(timeout, lost).await.is_ok() })
        }

        #[doc = concat!("Applies `ops` only while the ", $what, " is held (see")]
        /// [`Acquisition::guarded`](crate::Acquisition::guarded)).
        pub fn guarded(&self, ops: &[Op]) -> Result<Vec<OpResult>> {
            self.session.block_on(self.acquisition().guarded(ops))
        }
    };
}

/// A held lock. Dropping it releases in the background.
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock"]
pub struct Guard {
    hold: Option<Box<dyn crate::Hold>>,
    session: Session,
}

impl Guard {
    fn acquisition(&self) -> &crate::Acquisition {
        self.hold
            .as_ref()
            .expect("held until released")
            .acquisition()
    }

    /// The acquisition's fencing token.
    pub fn token(&self) -> FencingToken {
        self.acquisition().token()
    }

    /// Whether the connection is down right now.
    pub fn is_suspended(&self) -> bool {
        self.acquisition().is_suspended()
    }

    /// The node that stands for this hold, to name it to
    /// [`revoke`](crate::revoke) or [`revoke_forced`](crate::revoke_forced).
    ///
    /// ```
    /// use std::time::Duration;
    /// let session = dlock::blocking::connect("embedded")?;
    /// let guard = session.mutex("/doc/blocking-node")?.acquire()?;
    /// assert!(guard.node().starts_with("/doc/blocking-node/"));
    /// session.block_on(dlock::revoke_forced(session.session(), guard.node()))?;
    /// assert!(guard.wait_lost(Duration::from_secs(5)));
    /// # drop(guard);
    /// # Ok::<(), dlock::Error>(())
    /// ```
    pub fn node(&self) -> &str {
        self.acquisition().node()
    }

    held_signals! {
        "lock",
        /// ```
        /// use std::time::Duration;
        /// let session = dlock::blocking::connect("embedded")?;
        /// let guard = session.mutex("/doc/blocking-lost")?.acquire()?;
        /// assert!(!guard.wait_lost(Duration::from_millis(10)));
        /// session.block_on(session.session().faults().unwrap().expire())?;
        /// assert!(guard.wait_lost(Duration::from_secs(5)) && guard.is_lost());
        /// # drop(guard);
        /// # Ok::<(), dlock::Error>(())
        /// ```
    }

    /// Releases the lock (see [`LockGuard::release`](crate::LockGuard::release)).
    pub fn release(mut self) -> Result<()> {
        let hold = self.hold.take().expect("held until released");
        self.session.block_on(hold.release())
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(hold) = self.hold.take() {
            // The guard's own drop schedules the delete on the runtime.
            let _enter = self.session.runtime.tokio().enter();
            drop(hold);
        }
    }
}

/// The blocking [`crate::Semaphore`]: each lease is a [`Guard`].
///
/// ```
/// let session = dlock::blocking::connect("embedded")?;
/// let sem = session.semaphore("/doc/blocking-sem", 2)?;
/// let (a, b) = (sem.acquire()?, sem.acquire()?);
/// assert!(sem.try_acquire()?.is_none());
/// a.release()?;
/// b.release()?;
/// # Ok::<(), dlock::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Semaphore {
    inner: crate::Semaphore,
    session: Session,
}

impl Semaphore {
    /// Blocks until a lease is ours.
    pub fn acquire(&self) -> Result<Guard> {
        let lease = self.session.block_on(self.inner.acquire_one())?;
        Ok(self.session.guard_from(Box::new(lease)))
    }

    /// Blocks at most `timeout` for a lease.
    pub fn acquire_timeout(&self, timeout: Duration) -> Result<Guard> {
        let mut leases = self
            .session
            .block_on(self.inner.acquire_timeout(1, timeout))?;
        let lease = leases.pop().expect("one lease asked for");
        Ok(self.session.guard_from(Box::new(lease)))
    }

    /// Takes a lease only if one is free now.
    pub fn try_acquire(&self) -> Result<Option<Guard>> {
        let leases = self.session.block_on(self.inner.try_acquire(1))?;
        Ok(leases
            .and_then(|mut l| l.pop())
            .map(|lease| self.session.guard_from(Box::new(lease))))
    }
}

/// The blocking [`crate::LeaderLatch`] (started when made).
///
/// ```
/// let session = dlock::blocking::connect("embedded")?;
/// let latch = session.leader_latch("/doc/blocking-latch", "me")?;
/// let term = latch.await_leadership()?;
/// assert!(latch.has_leadership() && term.epoch() > dlock::FencingToken(0));
/// latch.close()?;
/// assert!(term.is_cancelled());
/// # Ok::<(), dlock::Error>(())
/// ```
#[derive(Debug)]
pub struct LeaderLatch {
    inner: crate::LeaderLatch,
    session: Session,
}

impl LeaderLatch {
    /// Blocks until this participant leads; returns the term.
    pub fn await_leadership(&self) -> Result<Leadership> {
        let term = self.session.block_on(self.inner.await_leadership())?;
        Ok(self.term(term))
    }

    /// Blocks at most `timeout` to lead; returns the term.
    pub fn await_leadership_timeout(&self, timeout: Duration) -> Result<Leadership> {
        let term = (self.session).block_on(self.inner.await_leadership_timeout(timeout))?;
        Ok(self.term(term))
    }

    fn term(&self, term: crate::Leadership) -> Leadership {
        Leadership {
            term,
            session: self.session.clone(),
        }
    }

    /// Whether this participant leads now.
    pub fn has_leadership(&self) -> bool {
        self.inner.has_leadership()
    }

    /// Leaves the election.
    pub fn close(self) -> Result<()> {
        self.session.block_on(self.inner.close())
    }
}

/// One term of leadership, as a blocking [`LeaderLatch`] gives it: the
/// blocking [`crate::Leadership`] — its epoch (a fencing token), its end,
/// its loss, and writes guarded by it. Cheap to clone. It keeps its
/// session (and the session's runtime) alive while kept: to keep only the
/// epoch, keep [`epoch`](Self::epoch).
///
/// ```
/// use dlock::store::{CreateMode, CreateOptions, Op};
/// let session = dlock::blocking::connect("embedded")?;
/// let config = "/doc/blocking-term/config";
/// let opts = CreateOptions::new(CreateMode::Persistent).with_parents();
/// session.block_on(session.session().create(config, b"v1", opts))?;
/// let latch = session.leader_latch("/doc/blocking-term/election", "me")?;
/// let term = latch.await_leadership()?;
/// let set = Op::SetData { path: config.into(), data: b"v2".to_vec(), version: None };
/// term.guarded(&[set.clone()])?;
/// latch.close()?;
/// assert!(term.wait_cancelled(std::time::Duration::from_secs(5)));
/// assert!(matches!(term.guarded(&[set]), Err(dlock::Error::Lost { .. })));
/// # session.block_on(session.session().delete(config, None))?;
/// # Ok::<(), dlock::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Leadership {
    term: crate::Leadership,
    session: Session,
}

impl Leadership {
    fn acquisition(&self) -> &crate::Acquisition {
        &self.term
    }

    /// The term's epoch: the fencing token to pass to what the leader
    /// writes to.
    pub fn epoch(&self) -> FencingToken {
        self.term.epoch()
    }

    /// The leader node of this term.
    pub fn node(&self) -> &str {
        self.acquisition().node()
    }

    /// Whether the term is over, or is being cancelled: the leader must
    /// stop now.
    pub fn is_cancelled(&self) -> bool {
        self.term.is_cancelled()
    }

    /// Blocks until the term is over (or is being cancelled), or at most
    /// `timeout`; returns whether it is.
    pub fn wait_cancelled(&self, timeout: Duration) -> bool {
        let ended = self.term.cancelled();
        self.session
            .block_on(async { tokio::time::timeout(timeout, ended).await.is_ok() })
    }

    held_signals! {
        "leadership",
        /// ```
        /// use std::time::Duration;
        /// let session = dlock::blocking::connect("embedded")?;
        /// let latch = session.leader_latch("/doc/blocking-term-lost", "me")?;
        /// let term = latch.await_leadership()?;
        /// assert!(!term.wait_lost(Duration::from_millis(10)));
        /// session.block_on(session.session().faults().unwrap().expire())?;
        /// assert!(term.wait_lost(Duration::from_secs(5)) && term.is_lost());
        /// # latch.close()?;
        /// # Ok::<(), dlock::Error>(())
        /// ```
    }
}
