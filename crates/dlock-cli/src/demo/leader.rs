//! `dlock demo leader`: the leader-election scenario of the design documents
//! (选主): candidates elect one leader at a time, with Curator's
//! `LeaderSelector` or `LeaderLatch` layout; a shared counter checks that
//! nobody — in this process or any other — leads at the same time.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use dlock::recipes::leader_latch::{LeaderLatch, Leadership};
use dlock::recipes::leader_selector::LeaderSelector;
use dlock::store::{CreateMode, CreateOptions};
use dlock::{Error, Session};
use tokio::sync::watch;

use crate::Global;

/// Which election recipe the candidates use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Recipe {
    /// LeaderLatch: every candidate stays in the race; the leader leaves
    /// (closes its latch) after its term and joins again at the back.
    Latch,
    /// LeaderSelector: candidates queue on a mutex and lead by turns
    /// (auto-requeue) — shares the election with Curator selectors.
    Selector,
}

impl Recipe {
    fn name(self) -> &'static str {
        match self {
            Recipe::Latch => "latch",
            Recipe::Selector => "selector",
        }
    }
}

/// Arguments of `demo leader`.
#[derive(Debug, Args)]
pub struct Leader {
    /// How many candidates, each with its own session.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    candidates: u32,
    /// How many terms of leadership to run, in all.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    terms: u32,
    /// Which election recipe the candidates use.
    #[arg(long, value_enum, default_value_t = Recipe::Selector)]
    recipe: Recipe,
    /// Path of the election.
    #[arg(long, default_value = "/election")]
    path: String,
    /// Path of the leader counter: a SharedCount (4-byte big-endian int,
    /// Curator's layout) that every leader, in any process, increments on
    /// taking leadership and decrements before giving it up, by
    /// compare-and-set. Above 1 is a violation. Created with 0 if absent;
    /// never reset.
    #[arg(long, default_value = "/election-leaders")]
    probe_path: String,
    /// How long each term lasts, in milliseconds.
    #[arg(long, default_value_t = 50)]
    hold_ms: u64,
}

/// Runs the election.
pub async fn run(global: &Global, args: Leader) -> Result<()> {
    dlock::path::validate(&args.path)?;
    dlock::path::validate(&args.probe_path)?;
    let admin = global.connect().await?;
    create_probe(&admin, &args.probe_path).await?;
    let mut sessions = Vec::with_capacity(args.candidates as usize);
    for _ in 0..args.candidates {
        sessions.push(global.connect().await?);
    }
    let election = Arc::new(Election {
        terms: args.terms,
        hold: Duration::from_millis(args.hold_ms),
        probe: args.probe_path.clone(),
        claimed: AtomicU32::new(0),
        served: AtomicU32::new(0),
        violations: AtomicU32::new(0),
        over: watch::channel(false).0,
        error: StdMutex::new(None),
    });
    let started = Instant::now();
    match args.recipe {
        Recipe::Selector => run_selectors(&sessions, &args.path, &election).await?,
        Recipe::Latch => run_latches(&sessions, &args.path, &election).await?,
    }
    let seconds = started.elapsed().as_secs_f64();
    for s in &sessions {
        s.close().await;
    }
    admin.close().await;
    if let Some(e) = election
        .error
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
    {
        return Err(e);
    }
    println!(
        "leader backend={} recipe={} candidates={} terms={} violations={} seconds={seconds:.3}",
        global.backend_name()?,
        args.recipe.name(),
        args.candidates,
        election.served.load(Ordering::SeqCst),
        election.violations.load(Ordering::SeqCst),
    );
    Ok(())
}

/// What all candidates share.
struct Election {
    terms: u32,
    hold: Duration,
    probe: String,
    /// Terms begun (a leader that finds all of them begun just leaves).
    claimed: AtomicU32,
    /// Terms served to the end.
    served: AtomicU32,
    violations: AtomicU32,
    /// Set once every term was served (or a candidate failed).
    over: watch::Sender<bool>,
    error: StdMutex<Option<anyhow::Error>>,
}

impl Election {
    /// Claims the next term; false once all are claimed.
    fn claim(&self) -> bool {
        self.claimed.fetch_add(1, Ordering::SeqCst) < self.terms
    }

    /// One term: count ourselves in, lead for the hold time (or until the
    /// term is cancelled), count ourselves out.
    async fn serve(&self, session: &Session, term: &Leadership) -> Result<()> {
        if probe_add(session, &self.probe, 1).await? > 1 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        tokio::select! {
            _ = tokio::time::sleep(self.hold) => {}
            _ = term.cancelled() => {}
        }
        probe_add(session, &self.probe, -1).await?;
        if self.served.fetch_add(1, Ordering::SeqCst) + 1 >= self.terms {
            self.over.send_replace(true);
        }
        Ok(())
    }

    fn fail(&self, e: anyhow::Error) {
        self.error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(e);
        self.over.send_replace(true);
    }

    async fn finished(&self) {
        let _ = self.over.subscribe().wait_for(|over| *over).await;
    }
}

/// Candidates as auto-requeueing selectors, until all terms were served.
async fn run_selectors(sessions: &[Session], path: &str, election: &Arc<Election>) -> Result<()> {
    let mut selectors = Vec::with_capacity(sessions.len());
    for (i, session) in sessions.iter().enumerate() {
        let (election, session_for_term) = (election.clone(), session.clone());
        let selector = LeaderSelector::new(session, path, move |term: Leadership| {
            let (election, session) = (election.clone(), session_for_term.clone());
            async move {
                if !election.claim() {
                    return;
                }
                if let Err(e) = election.serve(&session, &term).await {
                    election.fail(e);
                }
            }
        })?
        .with_id(format!("dlock-{i}"))
        .with_auto_requeue()
        // A cancelled term still counts itself out of the probe.
        .with_cancel_grace(Duration::from_secs(10));
        selectors.push(selector);
    }
    for selector in &selectors {
        selector.start()?;
    }
    election.finished().await;
    for selector in &selectors {
        selector.close().await?;
    }
    Ok(())
}

/// Candidates as latches: the leader serves a term, leaves, and joins again
/// with a new latch, until all terms were served.
async fn run_latches(sessions: &[Session], path: &str, election: &Arc<Election>) -> Result<()> {
    let mut tasks = Vec::with_capacity(sessions.len());
    for (i, session) in sessions.iter().enumerate() {
        let (session, path, election) = (session.clone(), path.to_string(), election.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(e) = latch_candidate(&session, &path, i, &election).await {
                election.fail(e);
            }
        }));
    }
    for task in tasks {
        task.await.context("a candidate panicked")?;
    }
    Ok(())
}

async fn latch_candidate(
    session: &Session,
    path: &str,
    i: usize,
    election: &Election,
) -> Result<()> {
    while !*election.over.borrow() {
        let latch = LeaderLatch::new(session, path)?.with_id(format!("dlock-{i}"));
        latch.start()?;
        let term = tokio::select! {
            term = latch.await_leadership() => term?,
            _ = election.finished() => {
                latch.close().await?;
                return Ok(());
            }
        };
        let claimed = election.claim();
        let served = match claimed {
            true => election.serve(session, &term).await,
            false => Ok(()),
        };
        latch.close().await?;
        served?;
        if !claimed {
            return Ok(());
        }
    }
    Ok(())
}

/// Creates the probe with 0, unless it exists (it is never reset).
async fn create_probe(session: &Session, path: &str) -> Result<()> {
    let options = CreateOptions::new(CreateMode::Persistent).with_parents();
    match session.create(path, &0i32.to_be_bytes(), options).await {
        Ok(_) | Err(Error::NodeExists { .. }) => Ok(()),
        Err(e) => bail!(e),
    }
}

/// Adds `delta` to the probe by compare-and-set (get the data and its
/// version, set with that version, again if someone came between); returns
/// the new value.
async fn probe_add(session: &Session, path: &str, delta: i32) -> Result<i32> {
    loop {
        let (data, stat) = match session.get_data(path).await {
            Ok(read) => read,
            Err(Error::NoNode { .. }) => {
                create_probe(session, path).await?;
                continue;
            }
            Err(e) => bail!(e),
        };
        let bytes: [u8; 4] = data
            .as_slice()
            .try_into()
            .map_err(|_| Error::MalformedData {
                path: path.to_string(),
                reason: format!(
                    "the probe is a 4-byte big-endian count, found {} bytes",
                    data.len()
                ),
            })?;
        let value = i32::from_be_bytes(bytes) + delta;
        match session
            .set_data(path, &value.to_be_bytes(), Some(stat.version))
            .await
        {
            Ok(_) => return Ok(value),
            Err(Error::BadVersion { .. }) => continue,
            Err(e) => bail!(e),
        }
    }
}
