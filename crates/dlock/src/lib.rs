//! # dlock — distributed locks, semaphores and leader election
//!
//! What Apache Curator's recipes are to Java, for Rust, on ZooKeeper, etcd,
//! Consul and an embedded in-process store — wire-compatible with Curator 5.4
//! on ZooKeeper (and with etcd's Go recipes, kazoo and `consul lock` where
//! asked), with a fencing token and a lost signal on every acquisition.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
//! let session = dlock::connect("embedded").await?; // or "zk://host:2181", "etcd://host:2379"
//! let mutex = dlock::Mutex::new(&session, "/locks/doc-example")?;
//! let guard = mutex.acquire().await?;
//! println!("holding {} with fencing token {}", guard.node(), guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## Which recipe do I need?
//!
//! | You want | dlock | Curator 5.4 | Guarantee |
//! |---|---|---|---|
//! | one holder at a time, fair, re-entrant | [`Mutex`] | `InterProcessMutex` | FIFO; one watch per waiter |
//! | one holder, released from any task, not re-entrant | [`SemaphoreMutex`] | `InterProcessSemaphoreMutex` | semaphore layout, 1 lease |
//! | many readers or one writer | [`ReadWriteLock`] | `InterProcessReadWriteLock` | fair; downgrade yes, upgrade refused |
//! | several locks as one, all or nothing | [`MultiLock`] | `InterProcessMultiLock` | ordered; rollback on failure |
//! | at most N holders | [`Semaphore`] | `InterProcessSemaphoreV2` | leases; limit from a number or a [`SharedCount`] |
//! | at most N holders, Consul style | [`KvSemaphore`] | (Consul `api.Semaphore`) | CAS on a `.lock` record; dead holders pruned |
//! | a shared counter | [`SharedCount`] | `SharedCount` | 4-byte big-endian; versioned compare-and-set |
//! | one leader, stays in the race | [`LeaderLatch`] | `LeaderLatch` | leader = first; epoch per term |
//! | one leader at a time, taking turns | [`LeaderSelector`] | `LeaderSelector` | run a task while leader; requeue |
//! | ask a holder to let go | [`revoke`] + `.revocable(..)` | `Revoker`, `makeRevocable` | cooperative |
//! | take a hold away, any recipe | [`revoke_forced`] | (CURATOR-150) | deletes its node; holder's lost signal fires |
//! | cap how long a hold lasts | `.with_max_hold(d)` | (CURATOR-28; Redisson `leaseTime`) | released by the library, even if the holder is stuck |
//! | hold everyone until a flag is lowered | [`Barrier`] | `DistributedBarrier` | persistent node; waiters watch it |
//! | start together, finish together | [`DoubleBarrier`] | `DistributedDoubleBarrier` | ephemeral members + `ready` |
//! | share a lock with `consul lock` | [`ConsulLock`] | (Consul `api.Lock`) | one `.lock` key held by a session |
//! | see who holds and waits, any recipe | [`inspect`] | `getParticipantNodes` | reads each recipe's layout; names etcd Go, kazoo and `consul lock` holders (Curator's are ours, node for node) |
//! | group membership with a payload each | [`GroupMember`] | `GroupMember` | ephemeral `<path>/<id>`; re-created if it vanishes |
//! | a directory's children and data, as events | [`ChildrenCache`] | `CuratorCache` (children) | watches, re-sync after a blip; no polling |
//! | follow an election without joining | [`observe`] | (etcd `Election.Observe`) | leader changes in order (a term too short to be seen may be skipped) |
//! | free permits and holders of a semaphore | [`Semaphore::available_permits`], [`KvSemaphore::available_permits`] | (CURATOR-230) | reads only, no acquire |
//! | share a lock or an election with Go services on etcd | [`Mutex`], [`ReadWriteLock`], [`LeaderLatch`], [`LeaderSelector`] | (etcd's Go `concurrency.Mutex`, `Election`) | one create-revision queue; a Go holder is a writer |
//! | a 64-bit counter, updated atomically | [`AtomicCounter`] | `DistributedAtomicLong` | 8-byte big-endian; CAS tries, then a lock |
//! | versioned bytes everyone sees | [`SharedValue`] | `SharedValue` | persistent node; watch-fed copy; CAS on the version |
//! | share a lock, election or semaphore with kazoo (Python) | [`Mutex`], [`LeaderSelector`], [`Semaphore`] `.with_layout(`[`Layout::Kazoo`]`)` | (kazoo `Lock`, `Election`, `Semaphore`) | kazoo's nodes; a kazoo lock or election holder keeps a dlock `Mutex` or `LeaderSelector` out in any layout, a semaphore is shared only in `Layout::Kazoo` |
//!
//! Every recipe runs on every backend: [`store::embedded`] (in-process, with
//! fault injection — the default for demos and tests), ZooKeeper 3.5+
//! (`zk://`, the same nodes as Curator: a dlock lock and a Java Curator lock
//! on one path exclude each other), etcd v3 (`etcd://`) and Consul 1.8+
//! (`consul://`, speaking `consul lock`'s formats where asked). Code without
//! an async runtime uses [`blocking`].
//!
//! ## Safety, in one paragraph
//!
//! A lock is only as good as its session: if the holder stalls longer than
//! the session timeout, the server hands the lock to the next waiter while
//! the stalled holder may still believe it holds. Every hold therefore is an
//! [`Acquisition`] with a **lost signal** ([`Acquisition::lost`]), a
//! **fencing token** that only grows ([`Acquisition::token`]), and **guarded
//! writes** that land only while it is held ([`Acquisition::guarded`]).
//! SAFETY.md in the repository says what each recipe guarantees and when.
//!
//! ## Architecture, in two minutes
//!
//! Five layers, each knowing only the ones below it:
//!
//! 1. **The store contract** — `src/store/mod.rs`: [`store::Store`], one
//!    client session of a store with ZooKeeper's data model (nodes,
//!    ephemeral and sequential modes, one-shot watches, atomic multi).
//!    Backends implement it and nothing else: `store/embedded/`,
//!    `store/zookeeper.rs`, `store/etcd.rs`, `store/consul.rs`. The trait
//!    is sealed: a backend supplies one combined create-and-maybe-list
//!    (`create_in`, and `learn_created` for what it keeps from a reply;
//!    the lost-reply fault is injected once, in `store/create.rs`, between
//!    the two) and its session machine, and the trait provides
//!    `create`, `create_and_list`, `status` and `session_timeout`. Each
//!    feeds its connection events into the one session-status machine,
//!    `store/status.rs` (connected → suspended → reconnected | lost,
//!    renewal after a loss, fault injection), and supplies only how it
//!    keeps a session alive; the two that renew a lease or session
//!    themselves (etcd, Consul) share one keep-alive loop and its life,
//!    `store/keepalive.rs`. The conformance suite (`tests/conformance.rs`)
//!    pins the contract on every backend.
//! 2. **The session** — `src/session.rs`: [`connect`] parses an
//!    [`Endpoint`] (`src/endpoint.rs`, parsing only), asks the backend's
//!    `open` for its store and wraps it in a [`Session`], which adds what is
//!    the same everywhere: path checks, retries, Curator's protected creates
//!    and guaranteed deletes.
//! 3. **The wait queue and the hold** — `recipes/queue/` is the one wait
//!    loop (Curator's `LockInternals`): create a sequential node, list,
//!    let a per-recipe predicate decide "hold" or "watch this
//!    predecessor". `recipes/guard.rs` is the one hold type,
//!    [`Acquisition`]; `recipes/deadline.rs` the one deadline and the
//!    acquire trio (wait, wait at most, only now) every lock shares; and
//!    `recipes/entry.rs` the one named ephemeral entry (Consul's lock and
//!    the KV semaphore).
//! 4. **The recipes** — `recipes/*`: each is its predicate and its
//!    node layout (a compatibility contract with Curator — or with
//!    Consul's, kazoo's or etcd's Go clients, `recipes/layout.rs` — stated
//!    in its module docs), over the queue and the hold.
//! 5. **The CLI** — `crates/dlock-cli`: runs a command under any hold,
//!    inspects, revokes, benchmarks; it holds no recipe logic of its own.
#![deny(missing_docs)]

pub mod blocking;
pub mod endpoint;
pub mod error;
mod options;
pub mod path;
pub mod recipes;
pub mod session;
pub mod store;

pub use endpoint::{Credentials, Endpoint, TlsFiles};
pub use error::{Error, Result};
pub use recipes::atomic_counter::{AtomicCounter, AtomicStats, AtomicValue, PromotedToLock};
pub use recipes::barrier::Barrier;
pub use recipes::children_cache::{CacheEvent, CachedChild, ChildrenCache};
pub use recipes::consul_lock::ConsulLock;
pub use recipes::double_barrier::{BarrierMember, DoubleBarrier};
pub use recipes::election::Candidate;
pub use recipes::error_policy::ErrorPolicy;
pub use recipes::group_member::{GroupMember, MemberEvent};
pub use recipes::guard::{Acquisition, LockGuard};
pub use recipes::inspect::{inspect, Access, Contender, Foreign, Inspection, RecipeKind, Role};
pub use recipes::kv_semaphore::{KvLease, KvSemaphore};
pub use recipes::layout::Layout;
pub use recipes::leader_latch::{
    CloseMode, LatchState, LeaderLatch, LeaderParticipant, Leadership, LeadershipEvent,
};
pub use recipes::leader_selector::{LeaderSelector, SelectorState};
pub use recipes::multi_lock::{Hold, Lockable, MultiGuard, MultiLock};
pub use recipes::mutex::{Mutex, MutexGuard};
pub use recipes::observe::{observe, LeaderObserver, Observation};
pub use recipes::revocation::{revoke, revoke_forced};
pub use recipes::rwlock::{ReadGuard, ReadWriteLock, WriteGuard};
pub use recipes::semaphore::{Lease, Semaphore};
pub use recipes::semaphore_mutex::{SemaphoreMutex, SemaphoreMutexGuard};
pub use recipes::shared_count::{SharedCount, VersionedValue};
pub use recipes::shared_value::{SharedValue, ValueCodec};
pub use recipes::Participant;
pub use session::{connect, connect_endpoint, connect_with, RetryPolicy, Session, SessionOptions};
pub use store::{FencingToken, SessionState};
