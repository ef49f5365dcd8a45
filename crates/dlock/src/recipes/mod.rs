//! The recipes, each written once over the store contract.

pub mod guard;
pub mod multi_lock;
pub mod mutex;
pub(crate) mod queue;
pub mod revocation;
pub mod rwlock;

pub use queue::Participant;
