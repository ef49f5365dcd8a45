//! The blocking API, from plain threads, on every backend: the embedded
//! store and the test binary's shared ZooKeeper, etcd and Consul servers
//! (`<backend>::<case>`). Every case works under a fresh root and ends with
//! nothing left under it.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn threads_exclude_each_other_through_the_blocking_api(endpoint: &str, root: &str) {
    let path = format!("{root}/lock");
    let inside = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (endpoint, path, inside) = (endpoint.to_string(), path.clone(), inside.clone());
            std::thread::spawn(move || {
                let session = dlock::blocking::connect(&endpoint).unwrap();
                let mutex = session.mutex(&path).unwrap();
                for _ in 0..20 {
                    let guard = mutex.acquire().unwrap();
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders");
                    std::thread::yield_now();
                    inside.store(false, Ordering::SeqCst);
                    guard.release().unwrap();
                }
                session.close();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

fn timeouts_try_and_dropped_guards(endpoint: &str, root: &str) {
    let path = format!("{root}/lock");
    let a = dlock::blocking::connect(endpoint).unwrap();
    let b = dlock::blocking::connect(endpoint).unwrap();
    let held = a.mutex(&path).unwrap().acquire().unwrap();
    let err = b
        .mutex(&path)
        .unwrap()
        .acquire_timeout(Duration::from_millis(100))
        .unwrap_err();
    assert!(matches!(err, dlock::Error::Timeout(_)), "{err}");
    assert!(b.mutex(&path).unwrap().try_acquire().unwrap().is_none());
    drop(held); // released in the background
    let again = b
        .mutex(&path)
        .unwrap()
        .acquire_timeout(Duration::from_secs(5))
        .unwrap();
    assert!(again.token() > dlock::FencingToken(0));
    again.release().unwrap();
    // Readers share, writers wait.
    let rw = a.read_write_lock(&format!("{path}-rw")).unwrap();
    let r1 = rw.read().unwrap();
    let r2 = b
        .read_write_lock(&format!("{path}-rw"))
        .unwrap()
        .read()
        .unwrap();
    r1.release().unwrap();
    r2.release().unwrap();
    rw.write().unwrap().release().unwrap();
    assert_eq!(
        a.block_on(a.session().children(&format!("{path}-rw")))
            .map(|c| c.len())
            .unwrap_or(0),
        0
    );
    a.close();
    b.close();
}

/// A guard dropped with the last handle on its session (a `let _guard`
/// in a function that made the session, say: the guard goes first, then
/// the session) frees the lock at once — not at the session's timeout, as
/// when the runtime went and took the guard's pending delete with it. So
/// does a latch's leadership.
fn a_guard_dropped_with_its_session_frees_the_lock_at_once(endpoint: &str, root: &str) {
    let path = format!("{root}/lock");
    let waiter = dlock::blocking::connect(endpoint).unwrap();
    // Well inside the session's timeout: only a prompt release makes it.
    let bound = waiter.session().session_timeout() / 2;
    {
        let holder = dlock::blocking::connect(endpoint).unwrap();
        let _guard = holder.mutex(&path).unwrap().acquire().unwrap();
    }
    let again = waiter.mutex(&path).unwrap().acquire_timeout(bound).unwrap();
    again.release().unwrap();
    let election = format!("{root}/latch");
    {
        let leader = dlock::blocking::connect(endpoint).unwrap();
        let latch = leader.leader_latch(&election, "first").unwrap();
        latch.await_leadership().unwrap();
    }
    let next = waiter.leader_latch(&election, "next").unwrap();
    next.await_leadership_timeout(bound).unwrap();
    next.close().unwrap();
    waiter.close();
}

/// The last handle of a blocking session dropped by an async task (it may
/// not block there, nor drop a runtime) still frees its lock at once, and
/// does not panic: a thread of its own finishes it.
fn a_session_dropped_inside_an_async_runtime_still_frees_its_lock(endpoint: &str, root: &str) {
    let path = format!("{root}/lock");
    let waiter = dlock::blocking::connect(endpoint).unwrap();
    let bound = waiter.session().session_timeout() / 2;
    let holder = dlock::blocking::connect(endpoint).unwrap();
    let guard = holder.mutex(&path).unwrap().acquire().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async move {
        drop(guard);
        drop(holder);
    });
    let again = waiter.mutex(&path).unwrap().acquire_timeout(bound).unwrap();
    again.release().unwrap();
    waiter.close();
}

fn semaphores_and_latches_from_threads(endpoint: &str, root: &str) {
    let path = root;
    let a = dlock::blocking::connect(endpoint).unwrap();
    let b = dlock::blocking::connect(endpoint).unwrap();
    let sem_a = a.semaphore(&format!("{path}/sem"), 2).unwrap();
    let sem_b = b.semaphore(&format!("{path}/sem"), 2).unwrap();
    let l1 = sem_a.acquire().unwrap();
    let l2 = sem_b.acquire().unwrap();
    assert!(sem_a.try_acquire().unwrap().is_none());
    let err = sem_b
        .acquire_timeout(Duration::from_millis(50))
        .unwrap_err();
    assert!(matches!(err, dlock::Error::Timeout(_)), "{err}");
    l1.release().unwrap();
    let l3 = sem_b.acquire_timeout(Duration::from_secs(5)).unwrap();
    l2.release().unwrap();
    l3.release().unwrap();
    // Two latches: one leads; when it leaves, the other leads with a larger
    // epoch. A term's guarded writes land while it lasts only.
    let first = a.leader_latch(&format!("{path}/latch"), "a").unwrap();
    let t1 = first.await_leadership().unwrap();
    let second = b.leader_latch(&format!("{path}/latch"), "b").unwrap();
    assert!(second
        .await_leadership_timeout(Duration::from_millis(100))
        .is_err());
    let config = format!("{path}/config");
    let set = |data: &[u8]| dlock::store::Op::SetData {
        path: config.clone(),
        data: data.to_vec(),
        version: None,
    };
    let opts = dlock::store::CreateOptions::new(dlock::store::CreateMode::Persistent);
    a.block_on(a.session().create(&config, b"v0", opts))
        .unwrap();
    t1.guarded(&[set(b"v1")]).unwrap();
    assert!(!t1.is_cancelled() && !t1.is_lost());
    first.close().unwrap();
    assert!(t1.wait_cancelled(Duration::from_secs(5)));
    let refused = t1.guarded(&[set(b"late")]);
    assert!(
        matches!(refused, Err(dlock::Error::Lost { .. })),
        "{refused:?}"
    );
    let t2 = second.await_leadership().unwrap();
    assert!(t2.epoch() > t1.epoch());
    t2.guarded(&[set(b"v2")]).unwrap();
    let (data, _) = b.block_on(b.session().get_data(&config)).unwrap();
    assert_eq!(data, b"v2");
    b.block_on(b.session().delete(&config, None)).unwrap();
    second.close().unwrap();
    a.close();
    b.close();
}

/// Ends a case: nothing ephemeral and nothing holding data is left under
/// `root` (the harness's check, through a blocking session); the empty
/// skeleton is then removed.
/// A suspension injected from a plain thread (no runtime there; the
/// embedded store's used to panic): the session is suspended, then comes
/// back, and locks work again.
fn a_fault_injected_from_a_plain_thread(endpoint: &str, root: &str) {
    let session = dlock::blocking::connect(endpoint).unwrap();
    let faults = session.session().faults().expect("faults");
    faults.suspend(Duration::from_millis(300));
    assert_eq!(session.session().state(), dlock::SessionState::Suspended);
    let mut status = session.session().watch_status();
    let back = session.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(20),
            status.wait_for(|s| s.state != dlock::SessionState::Suspended),
        )
        .await
        .map(|s| s.map(|s| s.state))
    });
    assert!(
        matches!(back, Ok(Ok(dlock::SessionState::Reconnected))),
        "{back:?}"
    );
    let mutex = session.mutex(&format!("{root}/lock")).unwrap();
    mutex.acquire().unwrap().release().unwrap();
    session.close();
}

fn finish(endpoint: &str, root: &str) {
    let checker = dlock::blocking::connect(endpoint).unwrap();
    let left = checker
        .block_on(common::collect_leftovers(checker.session(), root))
        .unwrap();
    assert!(left.is_empty(), "left behind under {root}: {left:#?}");
    checker
        .block_on(common::remove_tree(checker.session(), root))
        .unwrap();
    checker.close();
}

/// Every case on one backend, as `<module>::<case>`.
macro_rules! cases {
    ($(#[$attr:meta])* $module:ident => $endpoint:expr) => {
        $(#[$attr])*
        mod $module {
            cases!(@each $endpoint;
                threads_exclude_each_other_through_the_blocking_api,
                timeouts_try_and_dropped_guards,
                a_guard_dropped_with_its_session_frees_the_lock_at_once,
                a_session_dropped_inside_an_async_runtime_still_frees_its_lock,
                semaphores_and_latches_from_threads,
                a_fault_injected_from_a_plain_thread);
        }
    };
    (@each $endpoint:expr; $($case:ident),+) => {
        $(
            #[test]
            fn $case() {
                let endpoint: String = $endpoint;
                let root = format!("/blocking-{}", uuid::Uuid::new_v4().simple());
                super::$case(&endpoint, &root);
                super::finish(&endpoint, &root);
            }
        )+
    };
}

cases!(embedded => "embedded".to_string());
cases!(#[cfg(feature = "zookeeper")] zookeeper =>
    format!("zk://{}", dlock_testkit::shared_zk().connect_string()));
cases!(#[cfg(feature = "etcd")] etcd =>
    format!("etcd://{}", dlock_testkit::shared_etcd().endpoint()));
cases!(#[cfg(feature = "consul")] consul =>
    format!("consul://{}", dlock_testkit::shared_consul().endpoint()));
