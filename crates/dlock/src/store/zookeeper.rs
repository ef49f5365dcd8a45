//! The ZooKeeper backend: a [`Store`] on Apache ZooKeeper (3.5+), through the
//! [`zookeeper_client`] crate, wire-compatible with what Curator 5.4 does.
//!
//! Connect with an endpoint URL, `zk://host:port[,host:port...][/chroot]`,
//! optionally with digest credentials (`zk://user:password@host:port`):
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
//! let session = dlock::connect("zk://127.0.0.1:2181/app").await?;
//! println!("session {:#x}", session.session_id());
//! session.close().await;
//! # Ok(()) }
//! ```
//!
//! How it maps the contract onto ZooKeeper:
//! - **Sessions** follow Curator's connection states: the first connection
//!   is `Connected`; a dropped connection is `Suspended`; back on the same
//!   session it is `Reconnected`; an expired session, or a suspension that
//!   lasts the negotiated session timeout (Curator's simulated expiry), is
//!   `Lost`. After `Lost` the next operation opens a new session (new
//!   client, credentials applied again) and the status becomes
//!   `Reconnected` with the new session id. Operations issued while
//!   `Suspended` wait for the connection (or the loss); operations in flight
//!   when the connection drops fail with
//!   [`Error::ConnectionLoss`].
//! - **Creates** use `create2` (or `createContainer`), so the full [`Stat`]
//!   — and with it the fencing token `czxid` — comes back with the reply.
//!   Missing parents are created as containers only after a create failed
//!   with `NoNode`, top-down, as Curator's `mkdirs` does.
//! - [`Store::create_and_list`] pipelines the create and the listing on the
//!   connection: an uncontended lock acquisition costs one round trip.
//! - **Credentials**: with `user:password`, every new session authenticates
//!   with the `digest` scheme and every node it creates (parents and the
//!   chroot included) gets the ACL `auth` (creator only); without, nodes are
//!   open to anyone (`world:anyone`), as Curator's default ACL provider does.
//!   `digest` takes any password: a mistyped one is another identity, not
//!   an error, until it meets a node the right one made (`NoAuth`) — and
//!   the parents it made itself refuse the right one likewise.
//! - **Chroot**: a missing chroot node is created (persistent) on connect,
//!   as Curator creates its namespace; every path stays relative to it.
//!
//! # A limit of the client crate: 128 KiB of watched paths per session
//!
//! On a reconnect, `zookeeper-client` (0.11.2, the newest there is)
//! registers the session's watches again with `SetWatches`, in batches of
//! at most 128 KiB of paths, each sent with the fixed xid -8 — and it files
//! sent requests by xid, so a second batch overwrites the first and the
//! second reply finds no request. Past 128 KiB of watched paths (about
//! 1,300 watches on 100-byte paths: a `ChildrenCache` or an `observe` of a
//! group that large, or that many waiters in one process) a reconnect
//! wedges: measured with 2,500 watches on 90-byte paths and a 1 s cut of
//! the connection, the status read `Reconnected` and the next request went
//! unanswered for more than 10 s, while 1,000 watches came back whole.
//! Until the crate is fixed, keep a ZooKeeper session's watches below that
//! (one session per large cache).
//!
//! # Faults
//!
//! [`Session::faults`](crate::Session::faults) is available; what each hook does on ZooKeeper:
//! - [`Faults::expire`] ends the session **on the server** now, as an
//!   expiry would: the server deletes the session's ephemeral nodes in one
//!   transaction and other sessions' watches fire. It returns once the
//!   server has confirmed, with the status `Lost` (this session's watches
//!   wake with `Session(Lost)`); the next operation opens a new session.
//!   The session is ended with `closeSession` through its own client rather
//!   than from a second connection joining it: ZooKeeper drops a session's
//!   older connection whenever another joins, and the client reconnects at
//!   once, so the second connection loses that race again and again.
//! - [`Faults::suspend`] cannot cut one client's connection, so it acts on
//!   the client side: it publishes `Suspended` at once and holds every
//!   operation issued meanwhile until the suspension ends (operations
//!   already in flight complete; the real connection keeps the session
//!   alive). After `duration` it publishes `Reconnected` (when the real
//!   connection is up). If `duration` reaches the negotiated session
//!   timeout, then after that timeout the session is ended on the server
//!   as by `expire` and `Lost` is published; the held operations then run
//!   in a new session.
//! - [`Faults::lose_next_create_reply`]: the next create (or
//!   create-and-list) is applied by the server, but its result is
//!   discarded: the caller gets `ConnectionLoss` and the status blips
//!   `Suspended` → `Reconnected` (same session), as after a connection that
//!   dropped before the reply arrived.
//! - [`Faults::lose_next_delete_reply`]: the same for the next delete.

mod nodelay;
mod state;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use zookeeper_client as zk;

use self::state::{Config, Inner};
use super::create::CreateRequest;
use super::status::SessionMachine;
use super::{BackendKind, Child, CreateMode, Created, Faults, Op, OpResult, Stat, Store, Watch};
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::options::SessionOptions;
use crate::path;

/// How many times a create with parents makes missing ancestors and tries
/// again, while the container reaper keeps removing one.
const PARENT_TRIES: u32 = 5;

/// Opens a client of the ZooKeeper ensemble of `endpoint` (an
/// [`Endpoint::ZooKeeper`]), asking for `options.session_timeout`.
///
/// # Errors
///
/// [`Error::Unreachable`] (naming the hosts) if no server answers within
/// about the session timeout; [`Error::AuthFailed`] if the server rejects
/// the authentication (ZooKeeper's `digest` scheme takes any password: a
/// wrong one makes another identity, refused with [`Error::NoAuth`] on the
/// nodes the right one made); [`Error::InvalidEndpoint`] for another kind
/// of endpoint.
pub async fn open(endpoint: &Endpoint, options: &SessionOptions) -> Result<Arc<dyn Store>> {
    let config = Config::from_endpoint(endpoint, options.session_timeout).await?;
    let client = state::open(&config).await?;
    Ok(Arc::new(ZooKeeperStore {
        inner: Inner::start(config, client)?,
    }))
}

/// One client of a ZooKeeper ensemble: one session at a time, renewed after
/// it is lost. Dropping it closes the session.
struct ZooKeeperStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ZooKeeperStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Drop for ZooKeeperStore {
    fn drop(&mut self) {
        // Dropping the (last) client makes its session task close the
        // session on the server.
        let (client, _) = self.inner.shut();
        drop(client);
    }
}

fn zk_mode(mode: CreateMode) -> zk::CreateMode {
    match mode {
        CreateMode::Persistent => zk::CreateMode::Persistent,
        CreateMode::Ephemeral => zk::CreateMode::Ephemeral,
        CreateMode::PersistentSequential => zk::CreateMode::PersistentSequential,
        CreateMode::EphemeralSequential => zk::CreateMode::EphemeralSequential,
        CreateMode::Container => zk::CreateMode::Container,
    }
}

fn stat(s: &zk::Stat) -> Stat {
    Stat {
        czxid: s.czxid,
        mzxid: s.mzxid,
        version: s.version,
        cversion: s.cversion,
        ephemeral_owner: s.ephemeral_owner,
        num_children: s.num_children,
        data_length: s.data_length,
    }
}

/// The result of a create: the full path (with the sequence the server
/// appended, formatted as ZooKeeper does) and the stat.
fn created(path: &str, mode: CreateMode, s: &zk::Stat, sequence: zk::CreateSequence) -> Created {
    let path = if mode.is_sequential() {
        format!("{path}{sequence}")
    } else {
        path.to_string()
    };
    Created {
        path,
        stat: stat(s),
    }
}

fn children(names: Vec<String>) -> Vec<Child> {
    names.into_iter().map(Child::named).collect()
}

type ZkResult<T> = std::result::Result<T, zk::Error>;
type CreateResult = ZkResult<(zk::Stat, zk::CreateSequence)>;

impl ZooKeeperStore {
    fn options(&self, mode: CreateMode) -> zk::CreateOptions<'static> {
        zk_mode(mode).with_acls(self.inner.config.acls())
    }

    /// Creates the missing ancestors of `path` as containers, top-down,
    /// ignoring those that appear meanwhile (Curator's `mkdirs`). Two round
    /// trips at most: the existence checks are pipelined, then the creates.
    async fn mkdirs(&self, client: &zk::Client, path: &str) -> Result<()> {
        let ancestors: Vec<&str> = path::ancestors(path).collect();
        let checks: Vec<_> = ancestors.iter().map(|a| client.check_stat(a)).collect();
        let mut missing = Vec::new();
        for (ancestor, found) in ancestors
            .iter()
            .zip(futures::future::join_all(checks).await)
        {
            match found {
                Ok(Some(_)) => {}
                Ok(None) => missing.push(*ancestor),
                Err(e) => return Err(self.inner.error(client, e, ancestor)),
            }
        }
        let options = self.options(CreateMode::Container);
        // Sent in this order on the one connection, so each finds its parent.
        let creates: Vec<_> = missing
            .iter()
            .map(|a| client.create(a, &[], &options))
            .collect();
        for (ancestor, result) in missing.iter().zip(futures::future::join_all(creates).await) {
            match result {
                Ok(_) | Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(self.inner.create_error(client, e, ancestor)),
            }
        }
        Ok(())
    }

    /// A read with the session's client: `plain` without a watch, else
    /// `watched`, whose watcher is armed. Errors name `path`.
    async fn read<T>(
        &self,
        path: &str,
        watch: bool,
        plain: impl AsyncFnOnce(&zk::Client) -> ZkResult<T>,
        watched: impl AsyncFnOnce(&zk::Client) -> ZkResult<(T, zk::OneshotWatcher)>,
    ) -> Result<(T, Option<Watch>)> {
        let client = self.inner.client().await?;
        let result = match watch {
            true => {
                // Subscribed before the read: a suspension while it runs
                // (its reply in, the connection gone before we resume)
                // fires the watch.
                let status = self.inner.machine.subscribe();
                watched(&client)
                    .await
                    .map(|(found, w)| (found, Some(self.inner.arm(w, status))))
            }
            false => plain(&client).await.map(|found| (found, None)),
        };
        result.map_err(|e| self.inner.error(&client, e, path))
    }

    fn finish_create(
        &self,
        client: &zk::Client,
        path: &str,
        mode: CreateMode,
        result: CreateResult,
    ) -> Result<Created> {
        match result {
            Ok((s, sequence)) => Ok(created(path, mode, &s, sequence)),
            Err(e) => Err(self.inner.create_error(client, e, path)),
        }
    }

    /// The create and, with a listing asked for, the listing, sent back to
    /// back without waiting in between (the client sends each request when
    /// it is made): ZooKeeper answers a session's requests in order, so the
    /// listing sees the create.
    async fn send_create(
        &self,
        client: &zk::Client,
        request: CreateRequest<'_>,
    ) -> (
        CreateResult,
        Option<std::result::Result<Vec<String>, zk::Error>>,
    ) {
        let options = self.options(request.opts.mode);
        let create = client.create(request.path, request.data, &options);
        let listing = request.list.map(|list| client.list_children(list));
        let created = create.await;
        let listed = match listing {
            Some(listing) => Some(listing.await),
            None => None,
        };
        (created, listed)
    }
}

#[async_trait]
impl Store for ZooKeeperStore {
    fn backend(&self) -> BackendKind {
        BackendKind::ZooKeeper
    }

    fn machine(&self) -> &dyn SessionMachine {
        &self.inner.machine
    }

    async fn create_in(&self, request: CreateRequest<'_>) -> Result<(Created, Option<Vec<Child>>)> {
        let client = self.inner.client().await?;
        let (mut create, mut listing) = self.send_create(&client, request).await;
        // The container reaper may remove an empty ancestor between our
        // check of it and the create below it: a few more tries.
        for tries in 1..=PARENT_TRIES {
            if !(matches!(create, Err(zk::Error::NoNode)) && request.opts.create_parents) {
                break;
            }
            match self.mkdirs(&client, request.path).await {
                Err(Error::NoNode { .. }) if tries < PARENT_TRIES => continue,
                made => made?,
            }
            (create, listing) = self.send_create(&client, request).await;
        }
        let created = self.finish_create(&client, request.path, request.opts.mode, create)?;
        let listed = match (listing, request.list) {
            (Some(listing), Some(list)) => Some(children(
                listing.map_err(|e| self.inner.error(&client, e, list))?,
            )),
            _ => None,
        };
        Ok((created, listed))
    }

    async fn delete(&self, path: &str, version: Option<i32>) -> Result<()> {
        self.inner.machine.lost_replies.failing_delete()?;
        let client = self.inner.client().await?;
        client
            .delete(path, version)
            .await
            .map_err(|e| self.inner.error(&client, e, path))?;
        self.inner.machine.lost_delete_reply()
    }

    async fn set_data(&self, path: &str, data: &[u8], version: Option<i32>) -> Result<Stat> {
        self.inner.machine.lost_replies.failing_set()?;
        let client = self.inner.client().await?;
        match client.set_data(path, data, version).await {
            Ok(s) => Ok(stat(&s)),
            Err(e) => Err(self.inner.error(&client, e, path)),
        }
    }

    async fn get_data(&self, path: &str, watch: bool) -> Result<(Vec<u8>, Stat, Option<Watch>)> {
        self.inner.machine.lost_replies.failing_read()?;
        let plain = async |client: &zk::Client| client.get_data(path).await;
        let watched = async |client: &zk::Client| {
            let (data, s, w) = client.get_and_watch_data(path).await?;
            Ok(((data, s), w))
        };
        let ((data, s), w) = self.read(path, watch, plain, watched).await?;
        Ok((data, stat(&s), w))
    }

    async fn exists(&self, path: &str, watch: bool) -> Result<(Option<Stat>, Option<Watch>)> {
        self.inner.machine.lost_replies.failing_read()?;
        let plain = async |client: &zk::Client| client.check_stat(path).await;
        let watched = async |client: &zk::Client| client.check_and_watch_stat(path).await;
        let (s, w) = self.read(path, watch, plain, watched).await?;
        Ok((s.as_ref().map(stat), w))
    }

    async fn children(&self, path: &str, watch: bool) -> Result<(Vec<Child>, Option<Watch>)> {
        self.inner.machine.lost_replies.failing_read()?;
        let plain = async |client: &zk::Client| client.list_children(path).await;
        let watched = async |client: &zk::Client| client.list_and_watch_children(path).await;
        let (names, w) = self.read(path, watch, plain, watched).await?;
        Ok((children(names), w))
    }

    async fn multi(&self, ops: &[Op]) -> Result<Vec<OpResult>> {
        let client = self.inner.client().await?;
        let acls = self.inner.config.acls();
        let mut writer = client.new_multi_writer();
        for (index, op) in ops.iter().enumerate() {
            let added = match op {
                Op::Check { path, version } => {
                    writer.add_check_version(path, version.unwrap_or(-1))
                }
                Op::Create { path, data, mode } => {
                    writer.add_create(path, data, &zk_mode(*mode).with_acls(acls))
                }
                Op::SetData {
                    path,
                    data,
                    version,
                } => writer.add_set_data(path, data, *version),
                Op::Delete { path, version } => writer.add_delete(path, *version),
            };
            if let Err(e) = added {
                return Err(Error::MultiFailed {
                    index,
                    source: Box::new(self.inner.error(&client, e, op.path())),
                });
            }
        }
        let results = match writer.commit().await {
            Ok(results) => results,
            Err(zk::MultiWriteError::OperationFailed { index, source }) => {
                let source = match ops.get(index) {
                    Some(Op::Create { path, .. }) => self.inner.create_error(&client, source, path),
                    Some(op) => self.inner.error(&client, source, op.path()),
                    None => self.inner.error(&client, source, ""),
                };
                return Err(Error::MultiFailed {
                    index,
                    source: Box::new(source),
                });
            }
            Err(zk::MultiWriteError::RequestFailed { source }) => {
                return Err(self
                    .inner
                    .error(&client, source, ops.first().map_or("/", Op::path)));
            }
        };
        if results.len() != ops.len() {
            return Err(Error::Backend(format!(
                "multi: {} results for {} operations",
                results.len(),
                ops.len()
            )));
        }
        results
            .into_iter()
            .map(|r| match r {
                zk::MultiWriteResult::Check => Ok(OpResult::Checked),
                zk::MultiWriteResult::Delete => Ok(OpResult::Deleted),
                zk::MultiWriteResult::Create { path, stat: s } => Ok(OpResult::Created(Created {
                    path,
                    stat: stat(&s),
                })),
                zk::MultiWriteResult::SetData { stat: s } => Ok(OpResult::Set(stat(&s))),
                #[allow(unreachable_patterns)]
                other => Err(Error::Backend(format!(
                    "multi: unexpected result {other:?}"
                ))),
            })
            .collect()
    }

    fn faults(&self) -> Option<&dyn Faults> {
        Some(self)
    }

    async fn close(&self) {
        self.inner.close().await;
    }
}

/// ZooKeeper offers no way to drop one client's connection or one reply, so
/// only `expire` acts purely on the server; `suspend` and the
/// `lose_next_*_reply` hooks act on this client's view, with the server-side
/// effects a real fault would have (see the module docs).
#[async_trait]
impl Faults for ZooKeeperStore {
    /// Publishes `Suspended` at once and holds every operation issued
    /// meanwhile until the suspension ends (operations already in flight
    /// complete, and the real connection keeps the session alive). After
    /// `duration` it publishes `Reconnected` (if the real connection is up;
    /// else when it is back). If `duration` reaches the negotiated session
    /// timeout, then after that timeout the session is ended on the server
    /// (as [`expire`](Faults::expire) does: its ephemeral nodes vanish,
    /// other sessions' watches fire) and `Lost` is published; the held
    /// operations then run in a new session.
    fn suspend(&self, duration: Duration) {
        self.inner.suspend(duration);
    }

    /// Ends the session on the server as an expiry would (see the module
    /// docs) and returns with the status `Lost`.
    ///
    /// # Errors
    ///
    /// [`Error::Unreachable`] if the server did not confirm within twice the
    /// session timeout (the session is lost to this client all the same);
    /// [`Error::Closed`] after `close()`.
    async fn expire(&self) -> Result<()> {
        self.inner.expire().await
    }

    /// The server closes an ended session's connection: the client learns
    /// at once, as from [`expire`](Faults::expire).
    async fn end_on_server(&self) -> Result<()> {
        self.inner.expire().await
    }

    /// The next create (or create-and-list) is applied by the server, but
    /// its result is discarded: the caller gets `ConnectionLoss`, and the
    /// status blips `Suspended` → `Reconnected` (same session), as after a
    /// connection that dropped before the reply arrived.
    fn lose_next_create_reply(&self) {
        self.inner.machine.lost_replies.create.arm();
    }

    /// The next delete is applied by the server, but its result is
    /// discarded: the caller gets `ConnectionLoss`, and the status blips
    /// `Suspended` → `Reconnected` (same session).
    fn lose_next_delete_reply(&self) {
        self.inner.machine.lost_replies.delete.arm();
    }

    fn fail_next_reads(&self, n: u32) {
        self.inner.machine.lost_replies.fail_reads(n);
    }

    fn fail_next_sets(&self, n: u32) {
        self.inner.machine.lost_replies.fail_sets(n);
    }

    fn fail_next_deletes(&self, n: u32) {
        self.inner.machine.lost_replies.fail_deletes(n);
    }

    fn fail_next_creates(&self, n: u32) {
        self.inner.machine.lost_replies.fail_creates(n);
    }
}
