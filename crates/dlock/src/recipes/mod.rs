//! The recipes, each written once over the store contract.

pub mod mutex;
pub(crate) mod queue;

pub use queue::Participant;
