//! A store seen from below a path: every path the caller names lives under
//! a fixed prefix, as in a ZooKeeper chroot or etcd's `namespace` package.
//!
//! The wrapped store must treat the prefix as its root (it always exists,
//! cannot be deleted, and is the parent of top-level nodes); the wrapper
//! only moves paths in and out: arguments down, created paths and the paths
//! errors name back up. Watches and children carry no absolute paths.

use async_trait::async_trait;

use super::create::CreateRequest;
use super::status::SessionMachine;
use super::{BackendKind, Child, Created, Faults, Op, OpResult, Stat, Store, Watch};
use crate::error::{Error, Result};

/// `inner`, with every path below `prefix` (a valid path other than `/`).
#[derive(Debug)]
pub(crate) struct Namespaced<S> {
    inner: S,
    prefix: String,
}

impl<S: Store> Namespaced<S> {
    pub fn new(inner: S, prefix: String) -> Self {
        debug_assert!(prefix.starts_with('/') && prefix.len() > 1 && !prefix.ends_with('/'));
        Namespaced { inner, prefix }
    }

    /// The inner path of the caller's `path`.
    fn inside(&self, path: &str) -> String {
        if path == "/" {
            self.prefix.clone()
        } else {
            format!("{}{path}", self.prefix)
        }
    }

    /// The caller's path of the inner `path` (paths outside the prefix,
    /// which the inner store never names, are passed through).
    fn outside(&self, path: String) -> String {
        match path.strip_prefix(self.prefix.as_str()) {
            Some("") => "/".to_string(),
            Some(rest) if rest.starts_with('/') => rest.to_string(),
            _ => path,
        }
    }

    fn created(&self, created: Created) -> Created {
        Created {
            path: self.outside(created.path),
            ..created
        }
    }

    /// `e` with the paths it names moved back up.
    fn error(&self, e: Error) -> Error {
        match e {
            Error::MultiFailed { index, source } => Error::MultiFailed {
                index,
                source: Box::new(self.error(*source)),
            },
            Error::Several(errors) => {
                Error::Several(errors.into_iter().map(|e| self.error(e)).collect())
            }
            mut named => {
                if let Error::InvalidPath { path, .. }
                | Error::NoNode { path }
                | Error::NodeExists { path }
                | Error::BadVersion { path }
                | Error::NotEmpty { path }
                | Error::NoChildrenForEphemerals { path }
                | Error::NoAuth { path }
                | Error::Lost { path, .. }
                | Error::MalformedData { path, .. } = &mut named
                {
                    *path = self.outside(std::mem::take(path));
                }
                named
            }
        }
    }

    /// The inner paths of a create's node and listing.
    fn inside_request(&self, request: &CreateRequest<'_>) -> (String, Option<String>) {
        (
            self.inside(request.path),
            request.list.map(|l| self.inside(l)),
        )
    }

    fn op(&self, op: &Op) -> Op {
        let mut op = op.clone();
        match &mut op {
            Op::Check { path, .. }
            | Op::Create { path, .. }
            | Op::SetData { path, .. }
            | Op::Delete { path, .. } => *path = self.inside(path),
        }
        op
    }
}

#[async_trait]
impl<S: Store> Store for Namespaced<S> {
    fn backend(&self) -> BackendKind {
        self.inner.backend()
    }

    fn has_implicit_parents(&self) -> bool {
        self.inner.has_implicit_parents()
    }

    fn machine(&self) -> &dyn SessionMachine {
        self.inner.machine()
    }

    async fn create_in(&self, request: CreateRequest<'_>) -> Result<(Created, Option<Vec<Child>>)> {
        let (path, list) = self.inside_request(&request);
        let inner = CreateRequest {
            path: &path,
            list: list.as_deref(),
            ..request
        };
        match self.inner.create_in(inner).await {
            Ok((created, children)) => Ok((self.created(created), children)),
            Err(e) => Err(self.error(e)),
        }
    }

    fn learn_created(&self, request: &CreateRequest<'_>, created: &Created) {
        let (path, list) = self.inside_request(request);
        let inner = CreateRequest {
            path: &path,
            list: list.as_deref(),
            ..*request
        };
        let created = Created {
            path: self.inside(&created.path),
            stat: created.stat,
        };
        self.inner.learn_created(&inner, &created);
    }

    async fn delete(&self, path: &str, version: Option<i32>) -> Result<()> {
        let result = self.inner.delete(&self.inside(path), version).await;
        result.map_err(|e| self.error(e))
    }

    async fn set_data(&self, path: &str, data: &[u8], version: Option<i32>) -> Result<Stat> {
        let result = self.inner.set_data(&self.inside(path), data, version).await;
        result.map_err(|e| self.error(e))
    }

    async fn get_data(&self, path: &str, watch: bool) -> Result<(Vec<u8>, Stat, Option<Watch>)> {
        let result = self.inner.get_data(&self.inside(path), watch).await;
        result.map_err(|e| self.error(e))
    }

    async fn exists(&self, path: &str, watch: bool) -> Result<(Option<Stat>, Option<Watch>)> {
        let result = self.inner.exists(&self.inside(path), watch).await;
        result.map_err(|e| self.error(e))
    }

    async fn children(&self, path: &str, watch: bool) -> Result<(Vec<Child>, Option<Watch>)> {
        let result = self.inner.children(&self.inside(path), watch).await;
        result.map_err(|e| self.error(e))
    }

    async fn children_seen(&self, path: &str, since: i64) -> Result<Vec<Child>> {
        let result = self.inner.children_seen(&self.inside(path), since).await;
        result.map_err(|e| self.error(e))
    }

    async fn watch_child(&self, dir: &str, child: &Child) -> Result<Option<Watch>> {
        let result = self.inner.watch_child(&self.inside(dir), child).await;
        result.map_err(|e| self.error(e))
    }

    async fn foreign_owner(&self, path: &str) -> Result<Option<String>> {
        let result = self.inner.foreign_owner(&self.inside(path)).await;
        result.map_err(|e| self.error(e))
    }

    async fn tag(&self, path: &str) -> Result<Option<u64>> {
        let result = self.inner.tag(&self.inside(path)).await;
        result.map_err(|e| self.error(e))
    }

    fn deletes_only_created(&self, path: &str, czxid: i64) -> Option<bool> {
        self.inner.deletes_only_created(&self.inside(path), czxid)
    }

    async fn multi(&self, ops: &[Op]) -> Result<Vec<OpResult>> {
        let ops: Vec<Op> = ops.iter().map(|op| self.op(op)).collect();
        match self.inner.multi(&ops).await {
            Ok(results) => Ok(results
                .into_iter()
                .map(|r| match r {
                    OpResult::Created(created) => OpResult::Created(self.created(created)),
                    other => other,
                })
                .collect()),
            Err(e) => Err(self.error(e)),
        }
    }

    fn faults(&self) -> Option<&dyn Faults> {
        self.inner.faults()
    }

    async fn close(&self) {
        self.inner.close().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::embedded::EmbeddedServer;
    use crate::store::{CreateMode, CreateOptions};

    #[tokio::test]
    async fn paths_move_in_and_out() -> Result<()> {
        let server = EmbeddedServer::new();
        let outer = server.connect(crate::SessionOptions::default()).await?;
        let ns = Namespaced::new(server.open_store(), "/ns".into());
        outer
            .create("/ns", b"", CreateOptions::new(CreateMode::Persistent))
            .await?;

        let created = ns
            .create("/a", b"x", CreateOptions::new(CreateMode::Persistent))
            .await?;
        assert_eq!(created.path, "/a");
        assert_eq!(outer.get_data("/ns/a").await?.0, b"x");
        let (children, _) = ns.children("/", false).await?;
        assert_eq!(children.len(), 1);
        assert_eq!(children[0].name, "a");
        let err = ns.delete("/missing", None).await.unwrap_err();
        assert_eq!(
            err,
            Error::NoNode {
                path: "/missing".into()
            }
        );
        let err = ns
            .multi(&[Op::Delete {
                path: "/a".into(),
                version: Some(7),
            }])
            .await
            .unwrap_err();
        assert_eq!(
            err,
            Error::MultiFailed {
                index: 0,
                source: Box::new(Error::BadVersion { path: "/a".into() })
            }
        );
        ns.delete("/a", None).await?;
        outer.delete("/ns", None).await?;
        ns.close().await;
        outer.close().await;
        Ok(())
    }
}
