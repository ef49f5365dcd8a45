//! The recipes, each written once over the store contract.

pub mod atomic_counter;
pub mod barrier;
pub mod children_cache;
pub mod consul_lock;
pub(crate) mod deadline;
pub mod double_barrier;
pub mod election;
pub(crate) mod entry;
pub mod error_policy;
pub(crate) mod etcd_go;
pub mod group_member;
pub mod guard;
pub mod inspect;
pub mod kv_semaphore;
pub mod layout;
pub mod leader_latch;
pub mod leader_selector;
pub mod lifecycle;
pub mod multi_lock;
pub mod mutex;
pub mod observe;
pub(crate) mod queue;
pub mod revocation;
pub mod rwlock;
pub mod semaphore;
pub mod semaphore_mutex;
pub mod shared_count;
pub mod shared_value;

pub use queue::Participant;
