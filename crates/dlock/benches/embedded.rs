//! The embedded store against the in-process floor, `tokio::sync::Mutex`:
//! an uncontended acquire + release, and handoffs between 8 sessions.
//!
//!     cargo bench -p dlock --bench embedded

use std::sync::Arc;

use dlock::store::embedded::EmbeddedServer;

fn main() {
    divan::main();
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// One dlock Mutex cycle on the embedded store (create ‖ list, delete).
#[divan::bench]
fn dlock_uncontended(bencher: divan::Bencher) {
    let rt = runtime();
    let mutex = rt.block_on(async {
        let session = EmbeddedServer::new().connect_default().await.unwrap();
        dlock::Mutex::new(&session, "/bench/uncontended").unwrap()
    });
    bencher.bench_local(|| {
        rt.block_on(async { mutex.acquire().await.unwrap().release().await.unwrap() })
    });
}

/// The floor: tokio's in-process mutex, lock + unlock.
#[divan::bench]
fn tokio_mutex_uncontended(bencher: divan::Bencher) {
    let rt = runtime();
    let mutex = tokio::sync::Mutex::new(0u64);
    bencher.bench_local(|| rt.block_on(async { *mutex.lock().await += 1 }));
}

/// 8 sessions hand one lock around; one sample = 800 handoffs.
#[divan::bench(sample_count = 20)]
fn dlock_handoffs_8_sessions(bencher: divan::Bencher) {
    let rt = runtime();
    let server = EmbeddedServer::new();
    let mutexes: Vec<dlock::Mutex> = rt.block_on(async {
        let mut all = Vec::new();
        for _ in 0..8 {
            let session = server.connect_default().await.unwrap();
            all.push(dlock::Mutex::new(&session, "/bench/handoffs").unwrap());
        }
        all
    });
    bencher
        .counter(divan::counter::ItemsCount::new(800usize))
        .bench_local(|| {
            rt.block_on(async {
                let tasks: Vec<_> = mutexes
                    .iter()
                    .cloned()
                    .map(|m| {
                        tokio::spawn(async move {
                            for _ in 0..100 {
                                m.acquire().await.unwrap().release().await.unwrap()
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.unwrap();
                }
            })
        });
}

/// The floor for handoffs: 8 tasks and tokio's mutex.
#[divan::bench(sample_count = 20)]
fn tokio_mutex_handoffs_8_tasks(bencher: divan::Bencher) {
    let rt = runtime();
    let mutex = Arc::new(tokio::sync::Mutex::new(0u64));
    bencher
        .counter(divan::counter::ItemsCount::new(800usize))
        .bench_local(|| {
            rt.block_on(async {
                let tasks: Vec<_> = (0..8)
                    .map(|_| {
                        let m = mutex.clone();
                        tokio::spawn(async move {
                            for _ in 0..100 {
                                let mut g = m.lock().await;
                                *g += 1;
                                tokio::task::yield_now().await;
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.unwrap();
                }
            })
        });
}
