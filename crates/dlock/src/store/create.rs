//! The store contract's one create: what a backend implements
//! ([`Store::create_in`]) and what every create goes through after it (the
//! lost-reply fault), whether it comes from [`Store::create`],
//! [`Store::create_and_list`] or the session's protected creates.

use super::{Child, CreateOptions, Created, Store};
use crate::error::Result;

/// One create: the node, and the directory to list right after it (one
/// round trip where the backend can: ZooKeeper pipelines the two, etcd and
/// Consul run one transaction, the embedded store one step). The listing
/// reflects the create.
#[derive(Debug, Clone, Copy)]
pub struct CreateRequest<'a> {
    /// The node (a prefix, if sequential).
    pub path: &'a str,
    /// Its data.
    pub data: &'a [u8],
    /// Its mode, parents and tag.
    pub opts: CreateOptions,
    /// The directory to list after the create, if any.
    pub list: Option<&'a str>,
}

impl<'a> CreateRequest<'a> {
    /// A create of `path` that lists nothing.
    pub fn new(path: &'a str, data: &'a [u8], opts: CreateOptions) -> Self {
        CreateRequest {
            path,
            data,
            opts,
            list: None,
        }
    }

    /// The same create, listing `list` after it (if `Some`).
    pub fn listing(self, list: Option<&'a str>) -> Self {
        CreateRequest { list, ..self }
    }
}

/// Runs `request` on `store`; a reply the backend was told to lose
/// (`Faults::lose_next_create_reply`) turns into `ConnectionLoss` here,
/// once for every backend, after the server applied the create and before
/// the store learned from its reply.
pub(crate) async fn run<S: Store + ?Sized>(
    store: &S,
    request: CreateRequest<'_>,
) -> Result<(Created, Option<Vec<Child>>)> {
    store.machine().failing_create()?;
    let done = store.create_in(request).await?;
    store.machine().lost_create_reply()?;
    store.learn_created(&request, &done.0);
    Ok(done)
}
