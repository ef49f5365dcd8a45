//! `dlock demo parking-lot`: the semaphore scenario of the design documents
//! (停车场): a lot with few spaces, many cars; a semaphore is the attendant.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use dlock::recipes::kv_semaphore::{KvLease, KvSemaphore};
use dlock::recipes::semaphore::{Lease, Semaphore};
use dlock::{Layout, Session};

use tokio::sync::watch;

use super::probe::Probe;
use super::until_stopped;
use crate::Global;

/// Which semaphore guards the lot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SemaphoreKind {
    /// Curator's InterProcessSemaphoreV2 layout (`<path>/locks`,
    /// `<path>/leases`): shares the lot with Curator clients.
    V2,
    /// The Consul design: session entries and a compare-and-set `.lock`
    /// record.
    Kv,
}

impl SemaphoreKind {
    fn name(self) -> &'static str {
        match self {
            SemaphoreKind::V2 => "v2",
            SemaphoreKind::Kv => "kv",
        }
    }
}

/// Arguments of `demo parking-lot`.
#[derive(Debug, Args)]
pub struct ParkingLot {
    /// How many cars, each with its own session.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u32).range(1..))]
    cars: u32,
    /// How many spaces: the semaphore's limit.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=i32::MAX as i64))]
    spaces: u32,
    /// Which semaphore guards the lot.
    #[arg(long, value_enum, default_value_t = SemaphoreKind::V2)]
    semaphore: SemaphoreKind,
    /// Whose layout the KvSemaphore uses: `curator` (dlock's own record)
    /// or `consul` (Consul's `api.Semaphore`: the lot is shared with
    /// `consul lock -n SPACES <path without its leading slash> ...`;
    /// implies `--semaphore kv`). Or `kazoo`: the v2 semaphore runs
    /// kazoo's (Python) `Semaphore` on its layout, sharing the lot with
    /// `zk.Semaphore(<path>, max_leases=SPACES)` (`--semaphore v2` only).
    #[arg(long, default_value_t = Layout::Curator)]
    layout: Layout,
    /// Append `in parking-lot` to FILE when a car has parked and
    /// `out parking-lot` before it leaves (O_APPEND writes of one line: the
    /// lines of other processes appending to FILE interleave whole and in
    /// order), so that holders this process cannot count — `consul lock`
    /// children, say — can be checked against the limit with it.
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
    /// Path of the semaphore.
    #[arg(long, default_value = "/parking/lot")]
    path: String,
    /// Path of the in-use counter: a SharedCount (4-byte big-endian int,
    /// Curator's layout) that every car, in any process, updates by
    /// compare-and-set. Created with 0 if absent; never reset.
    #[arg(long, default_value = "/parking/in-use")]
    probe_path: String,
    /// How many times each car parks.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// How long each car stays parked, in milliseconds.
    #[arg(long, default_value_t = 20)]
    hold_ms: u64,
}

impl ParkingLot {
    /// The semaphore's and the in-use counter's paths.
    pub(super) fn paths(&self) -> Vec<&str> {
        vec![&self.path, &self.probe_path]
    }
}

/// Runs the parking lot.
/// Runs the lot; `stop` turning true (Ctrl-C) ends it early, every car
/// that parked counting itself out and leaving first.
pub async fn run(global: &Global, args: ParkingLot, stop: watch::Receiver<bool>) -> Result<()> {
    // Consul's layout exists only for the KvSemaphore; asking for it picks
    // that semaphore, as `dlock semaphore --layout consul` implies --kv.
    if args.layout == Layout::Kazoo && args.semaphore == SemaphoreKind::Kv {
        return Err(crate::exit::Exit::Usage
            .with(
                "--layout kazoo is kazoo's Semaphore, which is no KvSemaphore: use --semaphore v2",
            )
            .into());
    }
    let kind = if args.layout == Layout::Consul {
        SemaphoreKind::Kv
    } else {
        args.semaphore
    };
    let log = match &args.log {
        Some(path) => Some(Arc::new(
            File::options()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("cannot open --log {}", path.display()))?,
        )),
        None => None,
    };
    let mut cars = Vec::with_capacity(args.cars as usize);
    for _ in 0..args.cars {
        let session = global.connect().await?;
        let counter = Probe::open(&session, &args.probe_path).await?;
        let lot = match kind {
            SemaphoreKind::V2 => Lot::V2(Box::new(
                Semaphore::new(&session, &args.path, args.spaces)?.with_layout(args.layout)?,
            )),
            SemaphoreKind::Kv => Lot::Kv(
                KvSemaphore::new(&session, &args.path, args.spaces)?.with_layout(args.layout),
            ),
        };
        cars.push(Car {
            session,
            lot,
            counter,
            log: log.clone(),
        });
    }
    let stats = Arc::new(Stats::default());
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(cars.len());
    for car in &cars {
        let (car, stats, stop) = (car.clone(), stats.clone(), stop.clone());
        let (rounds, spaces, hold) = (
            args.rounds,
            i64::from(args.spaces),
            Duration::from_millis(args.hold_ms),
        );
        tasks.push(tokio::spawn(async move {
            car.drive(rounds, spaces, hold, &stats, stop).await
        }));
    }
    for task in tasks {
        task.await.context("a car panicked")??;
    }
    let seconds = started.elapsed().as_secs_f64();
    for car in &cars {
        car.counter.close().await;
        car.session.close().await;
    }
    println!(
        "parking-lot backend={} semaphore={} layout={} cars={} spaces={} acquisitions={} max_inside={} violations={} seconds={seconds:.3}",
        global.backend_name()?,
        kind.name(),
        args.layout,
        args.cars,
        args.spaces,
        stats.acquisitions.load(Ordering::Relaxed),
        stats.max_inside.load(Ordering::Relaxed),
        stats.violations.load(Ordering::Relaxed),
    );
    Ok(())
}

#[derive(Default)]
struct Stats {
    acquisitions: AtomicU64,
    max_inside: AtomicI64,
    violations: AtomicU64,
}

#[derive(Clone)]
enum Lot {
    V2(Box<Semaphore>),
    Kv(KvSemaphore),
}

enum Space {
    V2(Lease),
    Kv(KvLease),
}

impl Lot {
    async fn enter(&self) -> Result<Space> {
        Ok(match self {
            Lot::V2(s) => Space::V2(s.acquire_one().await?),
            Lot::Kv(s) => Space::Kv(s.acquire().await?),
        })
    }
}

impl Space {
    async fn leave(self) -> Result<()> {
        match self {
            Space::V2(lease) => lease.release().await?,
            Space::Kv(lease) => lease.release().await?,
        }
        Ok(())
    }
}

#[derive(Clone)]
struct Car {
    session: Session,
    lot: Lot,
    counter: Probe,
    log: Option<Arc<File>>,
}

impl Car {
    /// Parks `rounds` times: take a space, count itself in (a car that sees
    /// more cars inside than spaces counts a violation), stay, count itself
    /// out, leave. Once `stop` turns true, it stops waiting for a space
    /// (an acquire dropped is withdrawn) and cuts its stay short.
    async fn drive(
        self,
        rounds: u32,
        spaces: i64,
        hold: Duration,
        stats: &Stats,
        mut stop: watch::Receiver<bool>,
    ) -> Result<()> {
        for _ in 0..rounds {
            let space = tokio::select! {
                biased;
                () = until_stopped(&mut stop) => break,
                space = self.lot.enter() => space?,
            };
            self.record("in")?;
            let inside = i64::from(self.counter.add(1).await?);
            stats.max_inside.fetch_max(inside, Ordering::Relaxed);
            if inside > spaces {
                stats.violations.fetch_add(1, Ordering::Relaxed);
            }
            tokio::select! {
                _ = tokio::time::sleep(hold) => {}
                () = until_stopped(&mut stop) => {}
            }
            self.counter.add(-1).await?;
            // Before the space is given back: the exit line precedes any
            // entry the freed space lets in.
            self.record("out")?;
            space.leave().await?;
            stats.acquisitions.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Appends `<what> parking-lot` to the log, if kept: one write of the
    /// whole line, so that appends from other processes never split it.
    fn record(&self, what: &str) -> Result<()> {
        if let Some(mut log) = self.log.as_deref() {
            log.write_all(format!("{what} parking-lot\n").as_bytes())
                .context("cannot append to --log")?;
        }
        Ok(())
    }
}
