//! ZooKeeper ACLs (Curator's TestLockACLs, and issue #10's security cases):
//! a session with digest credentials creates its lock nodes and their
//! parent directories creator-only; a client without the credentials can
//! neither delete nor revoke the lock, nor queue on it.

use anyhow::{ensure, Result};
use dlock::{Error, Mutex};
use dlock_testkit::shared_zk;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_protect_the_lock_and_its_directories() -> Result<()> {
    let hosts = shared_zk().connect_string();
    let root = format!("/acl-{}", uuid::Uuid::new_v4().simple());
    let owner = dlock::connect(&format!("zk://alice:secret@{hosts}")).await?;
    let stranger = dlock::connect(&format!("zk://{hosts}")).await?;
    let impostor = dlock::connect(&format!("zk://alice:wrong@{hosts}")).await?;
    let path = format!("{root}/locks/a");
    let guard = Mutex::new(&owner, &path)?.acquire().await?;

    for (who, session) in [
        ("no credentials", &stranger),
        ("a wrong password", &impostor),
    ] {
        let err = session.delete(guard.node(), None).await.unwrap_err();
        ensure!(
            matches!(err, Error::NoAuth { .. }),
            "{who}: delete gave {err}"
        );
        let err = dlock::revoke(session, guard.node()).await.unwrap_err();
        ensure!(
            matches!(err, Error::NoAuth { .. }),
            "{who}: revoke gave {err}"
        );
        let err = Mutex::new(session, &path)?.try_acquire().await.err();
        ensure!(
            matches!(err, Some(Error::NoAuth { .. })),
            "{who}: queueing gave {err:?}"
        );
    }
    // The same user in another session may act (Curator's creator ACL is
    // the user, not the session).
    let colleague = dlock::connect(&format!("zk://alice:secret@{hosts}")).await?;
    ensure!(
        Mutex::new(&colleague, &path)?
            .try_acquire()
            .await?
            .is_none(),
        "held"
    );
    dlock::revoke(&colleague, guard.node()).await?;
    guard.release().await?;
    for dir in [path.clone(), format!("{root}/locks"), root.clone()] {
        match owner.delete(&dir, None).await {
            Ok(()) | Err(Error::NoNode { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    for s in [owner, stranger, impostor, colleague] {
        s.close().await;
    }
    Ok(())
}
