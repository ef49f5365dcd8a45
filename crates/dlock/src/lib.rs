//! # dlock — distributed locks, semaphores and leader election
//!
//! What Apache Curator's recipes are to Java, for Rust, on ZooKeeper, etcd
//! and an embedded in-process store — wire-compatible with Curator 5.4 on
//! ZooKeeper, with a fencing token and a lost signal on every acquisition.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
//! let session = dlock::connect("embedded").await?;
//! let mutex = dlock::Mutex::new(&session, "/locks/doc-example")?;
//! let guard = mutex.acquire().await?;
//! println!("holding {} with fencing token {}", guard.node(), guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub mod blocking;
pub mod endpoint;
pub mod error;
pub mod path;
pub mod recipes;
pub mod session;
pub mod store;

pub use endpoint::{connect, connect_endpoint, connect_with, Credentials, Endpoint};
pub use error::{Error, Result};
pub use recipes::guard::LockGuard;
pub use recipes::multi_lock::{Hold, Lockable, MultiGuard, MultiLock};
pub use recipes::mutex::{Mutex, MutexGuard};
pub use recipes::revocation::revoke;
pub use recipes::rwlock::{ReadGuard, ReadWriteLock, WriteGuard};
pub use recipes::error_policy::ErrorPolicy;
pub use recipes::kv_semaphore::{KvLease, KvSemaphore};
pub use recipes::leader_latch::{CloseMode, LatchState, LeaderLatch, LeaderParticipant, Leadership, LeadershipEvent};
pub use recipes::leader_selector::{LeaderSelector, SelectorState};
pub use recipes::semaphore::{Lease, Semaphore};
pub use recipes::semaphore_mutex::{SemaphoreMutex, SemaphoreMutexGuard};
pub use recipes::shared_count::{SharedCount, VersionedValue};
pub use recipes::Participant;
pub use session::{RetryPolicy, Session, SessionOptions};
pub use store::{FencingToken, SessionState};
