//! [`MultiLock`]: several locks of any kind taken as one, all or nothing —
//! Curator's `InterProcessMultiLock`. It creates no nodes of its own.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use super::consul_lock::ConsulLock;
use super::deadline::Deadline;
use super::guard::{guarded_by, Acquisition, LockGuard};
use super::kv_semaphore::{KvLease, KvSemaphore};
use super::mutex::Mutex;
use super::rwlock::{ReadGuard, ReadWriteLock, WriteGuard};
use super::semaphore::{Lease, Semaphore};
use super::semaphore_mutex::SemaphoreMutex;
use crate::error::{Error, Result};
use crate::store::{FencingToken, Op, OpResult};

/// A lock [`MultiLock`] can take. Implemented by [`Mutex`], the halves of a
/// [`ReadWriteLock`] ([`ReadWriteLock::read_half`],
/// [`ReadWriteLock::write_half`]), [`SemaphoreMutex`], [`ConsulLock`], and
/// for one slot each by [`Semaphore`] and [`KvSemaphore`]; implement it
/// for your own kinds.
#[async_trait]
pub trait Lockable: Send + Sync + fmt::Debug {
    /// Acquires, waiting at most `timeout` (forever if `None`); `Ok(None)`
    /// on timeout.
    async fn lock_for(&self, timeout: Option<Duration>) -> Result<Option<Box<dyn Hold>>>;
}

/// One acquired lock, as [`Lockable::lock_for`] returns it: an
/// [`Acquisition`] (token, lost signal, guarded writes) and how to release
/// it.
#[async_trait]
pub trait Hold: Send + Sync + fmt::Debug {
    /// The acquisition behind the hold.
    fn acquisition(&self) -> &Acquisition;

    /// The acquisition's fencing token.
    fn token(&self) -> FencingToken {
        self.acquisition().token()
    }

    /// Applies `ops` only while the lock is still held (see
    /// [`Acquisition::guarded`]).
    async fn guarded(&self, ops: &[Op]) -> Result<Vec<OpResult>> {
        self.acquisition().guarded(ops).await
    }

    /// Releases the lock.
    async fn release(self: Box<Self>) -> Result<()>;
}

/// The guards a [`MultiLock`] can hold; each releases as its own type does.
macro_rules! holds {
    ($($guard:ty),*) => {$(
        #[async_trait]
        impl Hold for $guard {
            fn acquisition(&self) -> &Acquisition {
                self
            }

            async fn release(self: Box<Self>) -> Result<()> {
                <$guard>::release(*self).await
            }
        }
    )*};
}

holds!(LockGuard, ReadGuard, WriteGuard, Lease, KvLease);

/// The read half of a [`ReadWriteLock`], as a [`Lockable`].
#[derive(Debug, Clone)]
pub struct ReadHalf(pub ReadWriteLock);

/// The write half of a [`ReadWriteLock`], as a [`Lockable`].
#[derive(Debug, Clone)]
pub struct WriteHalf(pub ReadWriteLock);

/// The recipes' own locks: each waits by a [`Deadline`] (in its session,
/// which cuts it off if the connection is down past it) without turning a
/// timeout into an error and back.
macro_rules! lockable {
    ($($lock:ty => |$l:ident, $deadline:ident| $until:expr, in $session:expr;)*) => {$(
        #[async_trait]
        impl Lockable for $lock {
            async fn lock_for(&self, timeout: Option<Duration>) -> Result<Option<Box<dyn Hold>>> {
                let ($l, $deadline) = (self, Deadline::after(timeout));
                let got = $deadline.run($session, $until).await?;
                Ok(got.map(|hold| Box::new(hold) as Box<dyn Hold>))
            }
        }
    )*};
}

lockable! {
    Mutex => |lock, deadline| lock.acquire_until(deadline), in lock.session();
    ConsulLock => |lock, deadline| lock.acquire_until(deadline), in lock.session();
    SemaphoreMutex => |lock, deadline| lock.acquire_until(deadline), in lock.session();
    ReadHalf => |half, deadline| half.0.read_until(deadline), in half.0.session();
    WriteHalf => |half, deadline| half.0.write_until(deadline), in half.0.session();
    Semaphore => |sem, deadline| sem.acquire_one_until(deadline), in sem.session();
    KvSemaphore => |sem, deadline| sem.acquire_until(deadline), in sem.session();
}

impl ReadWriteLock {
    /// The read half, for a [`MultiLock`].
    pub fn read_half(&self) -> ReadHalf {
        ReadHalf(self.clone())
    }

    /// The write half, for a [`MultiLock`].
    pub fn write_half(&self) -> WriteHalf {
        WriteHalf(self.clone())
    }
}

/// Several locks taken together: all of them, in the order given, or none.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
/// use dlock::{MultiLock, Mutex, ReadWriteLock};
/// let session = dlock::connect("embedded").await?;
/// let both = MultiLock::new(vec![
///     Box::new(Mutex::new(&session, "/doc/multi/orders")?),
///     Box::new(ReadWriteLock::new(&session, "/doc/multi/catalog")?.write_half()),
/// ]);
/// let guard = both.acquire().await?;
/// assert_eq!(guard.tokens().len(), 2);
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct MultiLock {
    locks: Vec<Box<dyn Lockable>>,
}

impl MultiLock {
    /// Takes `locks` in this order (give the same order everywhere, or two
    /// multi-locks can wait for each other forever). A multi-lock of no locks
    /// protects nothing: acquiring it fails with [`Error::InvalidArgument`].
    pub fn new(locks: Vec<Box<dyn Lockable>>) -> Self {
        MultiLock { locks }
    }

    /// Waits as long as it takes to acquire every lock.
    pub async fn acquire(&self) -> Result<MultiGuard> {
        self.acquire_for(None).await
    }

    /// Gives each lock up to `timeout` (as Curator, per lock, not in total);
    /// if one is not had in time, releases the others and fails with
    /// [`Error::Timeout`].
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<MultiGuard> {
        self.acquire_for(Some(timeout)).await
    }

    async fn acquire_for(&self, timeout: Option<Duration>) -> Result<MultiGuard> {
        if self.locks.is_empty() {
            return Err(Error::InvalidArgument(
                "a MultiLock of no locks protects nothing: give it at least one lock".into(),
            ));
        }
        let mut taken = MultiGuard {
            holds: Vec::with_capacity(self.locks.len()),
        };
        for lock in &self.locks {
            match lock.lock_for(timeout).await {
                Ok(Some(hold)) => taken.holds.push(hold),
                Ok(None) => {
                    let _ = taken.release().await;
                    // Per lock: each had the whole `timeout`.
                    return Err(Deadline::after(timeout).timed_out_error());
                }
                Err(e) => {
                    // The primary error wins; the rollback's are secondary.
                    let _ = taken.release().await;
                    return Err(e);
                }
            }
        }
        Ok(taken)
    }
}

/// The holds of a [`MultiLock`]; dropping it releases each in the background.
#[derive(Debug)]
#[must_use = "dropping the guard releases the locks"]
pub struct MultiGuard {
    holds: Vec<Box<dyn Hold>>,
}

impl MultiGuard {
    /// The fencing token of each lock, in the order given.
    pub fn tokens(&self) -> Vec<FencingToken> {
        self.holds.iter().map(|h| h.token()).collect()
    }

    /// The acquisition of each lock, in the order given.
    pub fn acquisitions(&self) -> Vec<&Acquisition> {
        self.holds.iter().map(|h| h.acquisition()).collect()
    }

    /// Whether any of the locks is lost: then the set no longer protects.
    pub fn is_lost(&self) -> bool {
        self.holds.iter().any(|h| h.acquisition().is_lost())
    }

    /// Whether the connection of any of the locks is down right now.
    pub fn is_suspended(&self) -> bool {
        self.holds.iter().any(|h| h.acquisition().is_suspended())
    }

    /// Resolves as soon as any of the locks is lost.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// use dlock::{MultiLock, Mutex};
    /// let session = dlock::connect("embedded").await?;
    /// let both = MultiLock::new(vec![
    ///     Box::new(Mutex::new(&session, "/doc/multi-lost/a")?),
    ///     Box::new(Mutex::new(&session, "/doc/multi-lost/b")?),
    /// ]);
    /// let guard = both.acquire().await?;
    /// session.faults().unwrap().expire().await?;
    /// guard.lost().await; // at once: the session that held them is over
    /// assert!(guard.is_lost());
    /// # drop(guard); Ok(()) }
    /// ```
    pub async fn lost(&self) {
        let lost = self.holds.iter().map(|h| Box::pin(h.acquisition().lost()));
        futures::future::select_all(lost).await;
    }

    /// Applies `ops` atomically only while every lock is still held: one
    /// multi-operation that checks each lock's node first. The locks must be
    /// held in one session (a multi-operation runs in one); otherwise
    /// [`Error::InvalidArgument`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
    /// use dlock::store::{CreateMode, CreateOptions, Op};
    /// use dlock::{MultiLock, Mutex};
    /// let session = dlock::connect("embedded").await?;
    /// session.create("/doc/multi-guarded/stock", b"5", CreateOptions::new(CreateMode::Persistent).with_parents()).await?;
    /// let both = MultiLock::new(vec![
    ///     Box::new(Mutex::new(&session, "/doc/multi-guarded/a")?),
    ///     Box::new(Mutex::new(&session, "/doc/multi-guarded/b")?),
    /// ]);
    /// let guard = both.acquire().await?;
    /// let set = Op::SetData { path: "/doc/multi-guarded/stock".into(), data: b"4".to_vec(), version: None };
    /// guard.guarded(&[set]).await?;
    /// guard.release().await?;
    /// # session.delete("/doc/multi-guarded/stock", None).await?; Ok(()) }
    /// ```
    pub async fn guarded(&self, ops: &[Op]) -> Result<Vec<OpResult>> {
        guarded_by(&self.acquisitions(), ops).await
    }

    /// Releases every lock, in reverse order, even if some fail; reports all
    /// failures.
    pub async fn release(mut self) -> Result<()> {
        let mut errors = Vec::new();
        while let Some(hold) = self.holds.pop() {
            if let Err(e) = hold.release().await {
                errors.push(e);
            }
        }
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(Error::Several(errors)),
        }
    }
}
