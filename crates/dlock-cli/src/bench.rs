//! `dlock bench`: the peer harnesses' workloads (shared/peers), with their
//! output line, so results compare side by side.

use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use dlock::store::{CreateMode, CreateOptions};
use dlock::{FencingToken, LockGuard, Mutex, ReadGuard, ReadWriteLock, Session, WriteGuard};

use crate::exit::Exit;
use crate::Global;

/// The workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// Each client acquires and releases the Mutex in a loop.
    Mutex,
    /// Each client takes the ReadWriteLock's read half, or its write half
    /// every --write-every acquisitions, in a loop.
    Rwlock,
    /// Each client takes one lease of a Semaphore (--leases) in a loop.
    Semaphore,
    /// Each client joins a LeaderLatch, waits to lead, and leaves: one
    /// leadership change per op (etcd's Campaign + Resign).
    Election,
    /// Each client adds 1 to an AtomicCounter, --rounds times (Curator's
    /// DistributedAtomicLong; promoted to a Mutex at --lock-path if given).
    /// A violation: the counter did not grow by exactly the successes.
    Counter,
    /// Clients (--members of them, default all) enter a DoubleBarrier and
    /// leave it, cycle after cycle (each cycle on a path of its own), for
    /// --seconds. A violation: a member in before all arrived, or out
    /// before all left.
    DoubleBarrier,
    /// No recipe: create + delete pairs of one node per client, the fewest
    /// writes any lock cycle needs — the server's ceiling for lock cycles.
    Raw,
}

/// Arguments of `bench`.
#[derive(Debug, Args)]
pub struct Bench {
    /// What to measure.
    #[arg(value_enum)]
    workload: Workload,
    /// Clients, each with its own session.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    clients: u32,
    /// How long to run.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// The recipe's path (default /bench/WORKLOAD, e.g. /bench/mutex).
    #[arg(long)]
    path: Option<String>,
    /// rwlock: one write in this many acquisitions.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    write_every: u32,
    /// semaphore: how many leases.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    leases: u32,
    /// counter: increments per client (as Curator's PeerBench --rounds);
    /// the run ends when all are done, whatever --seconds says.
    #[arg(long, default_value_t = 100)]
    rounds: u32,
    /// counter: the lock the optimistic tries fall back to.
    #[arg(long)]
    lock_path: Option<String>,
    /// double-barrier: how many members open the barrier (default: --clients).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    members: Option<u32>,
    /// double-barrier: how long each member stays in, in milliseconds.
    #[arg(long, default_value_t = 0)]
    hold_ms: u64,
    /// raw: concurrent create+delete pairs per client.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    inflight: u32,
}

/// Runs a benchmark and prints its one result line.
pub async fn run(global: &Global, args: Bench) -> Result<()> {
    let name = match args.workload {
        Workload::Mutex => "mutex",
        Workload::Rwlock => "rwlock",
        Workload::Semaphore => "semaphore",
        Workload::Election => "election",
        Workload::Raw => "raw",
        Workload::Counter => "counter",
        Workload::DoubleBarrier => "double-barrier",
    };
    let path = args
        .path
        .clone()
        .unwrap_or_else(|| format!("/bench/{name}"));
    dlock::path::validate(&path)?;
    // Checked as a Duration, which the runs below make of it.
    let seconds = Duration::try_from_secs_f64(args.seconds).ok();
    if seconds.is_none_or(|s| s.is_zero() || s > crate::duration::CENTURY) {
        let why = format!(
            "--seconds must be a positive number of at most 100 years, got {}",
            args.seconds
        );
        return Err(Exit::Usage.with(why).into());
    }
    let members = args.members.unwrap_or(args.clients);
    if members > args.clients {
        return Err(Exit::Usage
            .with(format!(
                "--members {members} cannot open with only --clients {}: the barrier would never open",
                args.clients
            ))
            .into());
    }
    // Sessions are set up before the clock starts, as the peers do.
    let mut sessions = Vec::new();
    for _ in 0..args.clients {
        sessions.push(global.connect().await?);
    }
    match args.workload {
        Workload::Counter => return counter_bench(&args, &path, sessions).await,
        Workload::DoubleBarrier => return double_barrier_bench(&args, &path, sessions).await,
        _ => {}
    }
    let shared = Arc::new(Shared::default());
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(args.seconds);
    let mut tasks = Vec::new();
    for (id, session) in sessions.iter().enumerate() {
        let client = Client {
            session: session.clone(),
            path: path.clone(),
            id,
            deadline,
            shared: shared.clone(),
        };
        let (workload, write_every, inflight, leases) =
            (args.workload, args.write_every, args.inflight, args.leases);
        tasks.push(tokio::spawn(async move {
            match workload {
                Workload::Mutex => client.mutex().await,
                Workload::Rwlock => client.rwlock(write_every).await,
                Workload::Raw => client.raw(inflight).await,
                Workload::Semaphore => client.semaphore(leases).await,
                Workload::Election => client.election().await,
                Workload::Counter | Workload::DoubleBarrier => unreachable!("run on their own"),
            }
        }));
    }
    let (latencies, elapsed) = gather(tasks, started, &sessions).await?;
    let ops = latencies.len();
    let latency = if args.workload == Workload::Raw {
        "cycle"
    } else {
        "acquire"
    };
    println!(
        "peer=dlock recipe={name} clients={} seconds={elapsed:.2} ops={ops} ops_per_s={:.1} {} violations={}",
        args.clients,
        ops as f64 / elapsed,
        percentiles(latency, &latencies),
        shared.violations.load(Ordering::SeqCst),
    );
    Ok(())
}

/// Every client's latencies, sorted, and the seconds from `started` until
/// the last client finished; then the sessions are closed.
async fn gather(
    tasks: Vec<tokio::task::JoinHandle<Result<Vec<Duration>>>>,
    started: Instant,
    sessions: &[Session],
) -> Result<(Vec<Duration>, f64)> {
    let laps = join_clients(tasks, sessions).await?;
    let elapsed = started.elapsed().as_secs_f64();
    for s in sessions {
        s.close().await;
    }
    let mut latencies: Vec<Duration> = laps.into_iter().flatten().collect();
    latencies.sort_unstable();
    Ok((latencies, elapsed))
}

/// Every client's result, once all finished. At the first failure, as it
/// happens, the others are stopped and every session is closed — else the
/// others could wait for ever (a double barrier's member that never comes)
/// and their nodes hold up the next run on the path — and it is returned.
async fn join_clients<T>(
    tasks: Vec<tokio::task::JoinHandle<Result<T>>>,
    sessions: &[Session],
) -> Result<Vec<T>> {
    use futures::StreamExt as _;
    let mut running: futures::stream::FuturesUnordered<_> = tasks.into_iter().collect();
    let mut done = Vec::with_capacity(running.len());
    while let Some(joined) = running.next().await {
        match joined
            .context("a client panicked")
            .and_then(|client| client)
        {
            Ok(result) => done.push(result),
            Err(e) => {
                for task in running.iter() {
                    task.abort();
                }
                for s in sessions {
                    s.close().await;
                }
                return Err(e);
            }
        }
    }
    Ok(done)
}

/// Who is inside the critical section, checked across all clients.
#[derive(Default)]
struct Shared {
    writers: AtomicI64,
    readers: AtomicI64,
    leased: AtomicI64,
    /// The largest fencing token of an exclusive hold so far.
    fence: AtomicI64,
    violations: AtomicU64,
}

impl Shared {
    /// An exclusive hold fenced by `token`. Two holders inside at once are
    /// caught only if their checks meet; a holder whose token is not
    /// larger than every earlier exclusive holder's is caught whenever it
    /// holds: it was let in out of order, while or after a later one held.
    fn enter_exclusive(&self, token: FencingToken) {
        let before = self.fence.fetch_max(token.0, Ordering::SeqCst);
        if self.writers.fetch_add(1, Ordering::SeqCst) != 0
            || self.readers.load(Ordering::SeqCst) != 0
            || before >= token.0
        {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        self.writers.fetch_sub(1, Ordering::SeqCst);
    }

    fn enter_shared(&self) {
        self.readers.fetch_add(1, Ordering::SeqCst);
        if self.writers.load(Ordering::SeqCst) != 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        self.readers.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Shared {
    fn enter_lease(&self, leases: u32) {
        if self.leased.fetch_add(1, Ordering::SeqCst) >= i64::from(leases) {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        self.leased.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One client of a workload: its session, the recipe's
/// path, when to stop, and the check of the critical section shared by all.
struct Client {
    session: Session,
    path: String,
    id: usize,
    deadline: Instant,
    shared: Arc<Shared>,
}

impl Client {
    async fn mutex(self) -> Result<Vec<Duration>> {
        let mutex = Mutex::new(&self.session, &self.path)?;
        let mut laps = Laps::until(self.deadline);
        while laps.go_on() {
            let inside = |held: &LockGuard| self.shared.enter_exclusive(held.token());
            laps.hold(mutex.acquire(), inside, LockGuard::release)
                .await?;
        }
        Ok(laps.latencies)
    }

    async fn rwlock(self, write_every: u32) -> Result<Vec<Duration>> {
        let rw = ReadWriteLock::new(&self.session, &self.path)?;
        let mut laps = Laps::until(self.deadline);
        // A fixed pseudo-random pattern per client, like the peers' seeded Random.
        let mut x = 0x9e37_79b9_u32.wrapping_mul(self.id as u32 + 1);
        while laps.go_on() {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            if x % write_every == 0 {
                let inside = |held: &WriteGuard| self.shared.enter_exclusive(held.token());
                laps.hold(rw.write(), inside, WriteGuard::release).await?;
            } else {
                let inside = |_: &ReadGuard| self.shared.enter_shared();
                laps.hold(rw.read(), inside, ReadGuard::release).await?;
            }
        }
        Ok(laps.latencies)
    }

    async fn semaphore(self, leases: u32) -> Result<Vec<Duration>> {
        let semaphore = dlock::Semaphore::new(&self.session, &self.path, leases)?;
        let mut laps = Laps::until(self.deadline);
        while laps.go_on() {
            let inside = |_: &dlock::Lease| self.shared.enter_lease(leases);
            laps.hold(semaphore.acquire_one(), inside, dlock::Lease::release)
                .await?;
        }
        Ok(laps.latencies)
    }

    async fn election(self) -> Result<Vec<Duration>> {
        let mut laps = Laps::until(self.deadline);
        while laps.go_on() {
            let latch =
                dlock::LeaderLatch::new(&self.session, &self.path)?.with_id(self.id.to_string());
            let lead = async {
                latch.start()?;
                latch.await_leadership().await
            };
            let inside = |term: &dlock::Leadership| self.shared.enter_exclusive(term.epoch());
            laps.hold(lead, inside, |_leadership| latch.close()).await?;
        }
        Ok(laps.latencies)
    }

    /// Creates and deletes a node, `inflight` at a time: no recipe.
    async fn raw(self, inflight: u32) -> Result<Vec<Duration>> {
        let options = CreateOptions::new(CreateMode::Ephemeral).with_parents();
        let mut workers = Vec::new();
        for w in 0..inflight {
            let (session, node) = (
                self.session.clone(),
                format!("{}/{}-{w}", self.path, self.id),
            );
            let deadline = self.deadline;
            workers.push(tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let t0 = Instant::now();
                    session.create(&node, b"x", options).await?;
                    session.delete(&node, None).await?;
                    latencies.push(t0.elapsed());
                }
                anyhow::Ok(latencies)
            }));
        }
        let mut all = Vec::new();
        for w in workers {
            all.extend(w.await??);
        }
        Ok(all)
    }
}

/// A client's timed acquisitions, until its deadline.
struct Laps {
    deadline: Instant,
    latencies: Vec<Duration>,
}

impl Laps {
    fn until(deadline: Instant) -> Self {
        Laps {
            deadline,
            latencies: Vec::new(),
        }
    }

    fn go_on(&self) -> bool {
        Instant::now() < self.deadline
    }

    /// One timed hold: how long `acquire` took is kept; while held,
    /// `inside` checks the hold against the other clients; then `release`.
    async fn hold<H, Released>(
        &mut self,
        acquire: impl Future<Output = dlock::Result<H>>,
        inside: impl FnOnce(&H),
        release: impl FnOnce(H) -> Released,
    ) -> Result<()>
    where
        Released: Future<Output = dlock::Result<()>>,
    {
        let t0 = Instant::now();
        let held = acquire.await?;
        self.latencies.push(t0.elapsed());
        inside(&held);
        release(held).await?;
        Ok(())
    }
}

/// `<what>_p50_ms=… <what>_p99_ms=…` of `sorted`, as the peers print them.
fn percentiles(what: &str, sorted: &[Duration]) -> String {
    format!(
        "{what}_p50_ms={:.3} {what}_p99_ms={:.3}",
        percentile(sorted, 0.50),
        percentile(sorted, 0.99)
    )
}

/// The peers' percentile: the element at `p × n`.
fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p * sorted.len() as f64) as usize).min(sorted.len() - 1);
    sorted[i].as_secs_f64() * 1000.0
}

/// `bench counter`: every client adds 1, `--rounds` times, as Curator's
/// PeerBench `counter` does (with its retry policies: 100 optimistic tries
/// 1 ms apart, or 10 then the lock with 100).
async fn counter_bench(args: &Bench, path: &str, sessions: Vec<Session>) -> Result<()> {
    let every_ms = |max_retries| dlock::RetryPolicy {
        base_sleep: Duration::from_millis(1),
        max_sleep: Duration::from_millis(1),
        max_retries,
    };
    let make = |session: &Session| -> Result<dlock::AtomicCounter> {
        let counter = dlock::AtomicCounter::new(session, path)?;
        Ok(match &args.lock_path {
            Some(lock) => counter
                .with_retry(every_ms(10))
                .promoted_to_lock(dlock::PromotedToLock::new(lock)?.with_retry(every_ms(100))),
            None => counter.with_retry(every_ms(100)),
        })
    };
    let before = make(&sessions[0])?.get().await?.post_value;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for session in &sessions {
        let (counter, rounds) = (make(session)?, args.rounds);
        tasks.push(tokio::spawn(async move {
            let (mut latencies, mut failed) = (Vec::new(), 0u64);
            for _ in 0..rounds {
                let t0 = Instant::now();
                if counter.increment().await?.succeeded {
                    latencies.push(t0.elapsed());
                } else {
                    failed += 1;
                }
            }
            anyhow::Ok((latencies, failed))
        }));
    }
    let (mut latencies, mut failed) = (Vec::new(), 0);
    for (l, f) in join_clients(tasks, &sessions).await? {
        latencies.extend(l);
        failed += f;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let value = make(&sessions[0])?.get().await?.post_value;
    for s in &sessions {
        s.close().await;
    }
    latencies.sort_unstable();
    let ops = latencies.len();
    let violations = u64::from(value - before != ops as i64);
    println!(
        "peer=dlock recipe=counter clients={} seconds={elapsed:.2} ops={ops} ops_per_s={:.1} failed={failed} value={value} {} violations={violations}",
        args.clients,
        ops as f64 / elapsed,
        percentiles("op", &latencies),
    );
    Ok(())
}

/// Per cycle of `bench double-barrier`: who arrived and who started to
/// leave, and when the members got in and out.
#[derive(Default)]
struct Cycle {
    arrived: u32,
    leaving: u32,
    entered: Vec<Instant>,
    left: Vec<Instant>,
}

/// `bench double-barrier`: cycles of enter + hold + leave by every member,
/// each cycle at `PATH/<n>` (a member that left early must not count in
/// the next cycle of the others).
async fn double_barrier_bench(args: &Bench, path: &str, sessions: Vec<Session>) -> Result<()> {
    use std::collections::HashMap;
    use std::sync::Mutex as StdMutex;

    let members = args.members.unwrap_or(args.clients);
    let cycles: Arc<StdMutex<HashMap<u64, Cycle>>> = Arc::default();
    let violations = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(args.seconds);
    let hold = Duration::from_millis(args.hold_ms);
    let mut tasks = Vec::new();
    for session in sessions.iter().take(members as usize) {
        let (session, path) = (session.clone(), path.to_string());
        let (cycles, violations) = (cycles.clone(), violations.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            // Every member runs the same cycles: all stop after the cycle
            // in which the deadline passed for the first of them.
            for n in 0u64.. {
                let barrier =
                    dlock::DoubleBarrier::new(&session, &format!("{path}/{n}"), members as usize)?;
                let t0 = Instant::now();
                cycles.lock().unwrap().entry(n).or_default().arrived += 1;
                let member = barrier.enter().await?;
                {
                    let mut all = cycles.lock().unwrap();
                    let cycle = all.entry(n).or_default();
                    cycle.entered.push(Instant::now());
                    if cycle.arrived != members {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                }
                tokio::time::sleep(hold).await;
                cycles.lock().unwrap().entry(n).or_default().leaving += 1;
                member.leave().await?;
                let last = {
                    let mut all = cycles.lock().unwrap();
                    let cycle = all.entry(n).or_default();
                    cycle.left.push(Instant::now());
                    if cycle.leaving != members {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    cycle.entered[0] >= deadline
                };
                latencies.push(t0.elapsed());
                if last {
                    break;
                }
            }
            anyhow::Ok(latencies)
        }));
    }
    let (latencies, elapsed) = gather(tasks, started, &sessions).await?;
    // From the first member in to the last one out, per cycle: what
    // Curator's PeerBench `doublebarrier` prints (entered=, left=).
    let mut spans: Vec<Duration> = cycles
        .lock()
        .unwrap()
        .values()
        .filter_map(|c| Some(*c.left.iter().max()? - *c.entered.iter().min()?))
        .collect();
    spans.sort_unstable();
    let ops = spans.len();
    println!(
        "peer=dlock recipe=double-barrier members={members} clients={} seconds={elapsed:.2} ops={ops} ops_per_s={:.1} {} {} violations={}",
        args.clients,
        ops as f64 / elapsed,
        percentiles("cycle", &latencies),
        percentiles("span", &spans),
        violations.load(Ordering::SeqCst),
    );
    Ok(())
}
