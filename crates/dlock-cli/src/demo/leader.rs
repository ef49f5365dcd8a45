//! `dlock demo leader`: the leader-election scenario of the design documents
//! (选主): candidates elect one leader at a time, with Curator's
//! `LeaderSelector` or `LeaderLatch` layout; a shared counter checks that
//! nobody — in this process or any other — leads at the same time.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use dlock::recipes::leader_latch::{LeaderLatch, Leadership};
use dlock::recipes::leader_selector::LeaderSelector;
use dlock::Session;
use tokio::sync::watch;

use super::probe::Probe;
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

impl Leader {
    /// The election's and the leader counter's paths.
    pub(super) fn paths(&self) -> Vec<&str> {
        vec![&self.path, &self.probe_path]
    }
}

/// One candidate: its own session, and its handle on the leader counter.
struct Candidate {
    session: Session,
    probe: Probe,
}

/// Runs the election.
/// Runs the election; `stop` turning true (Ctrl-C) ends it early, a leader
/// counting itself out first.
pub async fn run(global: &Global, args: Leader, mut stop: watch::Receiver<bool>) -> Result<()> {
    let mut candidates = Vec::with_capacity(args.candidates as usize);
    for _ in 0..args.candidates {
        let session = global.connect().await?;
        let probe = Probe::open(&session, &args.probe_path).await?;
        candidates.push(Candidate { session, probe });
    }
    let election = Arc::new(Election {
        terms: args.terms,
        hold: Duration::from_millis(args.hold_ms),
        claimed: AtomicU32::new(0),
        served: AtomicU32::new(0),
        violations: AtomicU32::new(0),
        over: watch::channel(false).0,
        error: StdMutex::new(None),
    });
    let started = Instant::now();
    let ended = election.clone();
    let stopping = tokio::spawn(async move {
        super::until_stopped(&mut stop).await;
        ended.over.send_replace(true);
    });
    let ran = match args.recipe {
        Recipe::Selector => run_selectors(&candidates, &args.path, &election).await,
        Recipe::Latch => run_latches(&candidates, &args.path, &election).await,
    };
    stopping.abort();
    ran?;
    let seconds = started.elapsed().as_secs_f64();
    for c in &candidates {
        c.probe.close().await;
        c.session.close().await;
    }
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
    async fn serve(&self, probe: &Probe, term: &Leadership) -> Result<()> {
        if probe.add(1).await? > 1 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        tokio::select! {
            _ = tokio::time::sleep(self.hold) => {}
            _ = term.cancelled() => {}
            // Stopped early (Ctrl-C), or the last term is served.
            () = self.finished() => {}
        }
        probe.add(-1).await?;
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
async fn run_selectors(
    candidates: &[Candidate],
    path: &str,
    election: &Arc<Election>,
) -> Result<()> {
    let mut selectors = Vec::with_capacity(candidates.len());
    for (i, candidate) in candidates.iter().enumerate() {
        let (election, probe_for_term) = (election.clone(), candidate.probe.clone());
        let selector = LeaderSelector::new(&candidate.session, path, move |term: Leadership| {
            let (election, probe) = (election.clone(), probe_for_term.clone());
            async move {
                if !election.claim() {
                    return;
                }
                if let Err(e) = election.serve(&probe, &term).await {
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
async fn run_latches(candidates: &[Candidate], path: &str, election: &Arc<Election>) -> Result<()> {
    let mut tasks = Vec::with_capacity(candidates.len());
    for (i, candidate) in candidates.iter().enumerate() {
        let (session, probe) = (candidate.session.clone(), candidate.probe.clone());
        let (path, election) = (path.to_string(), election.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(e) = latch_candidate(&session, &probe, &path, i, &election).await {
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
    probe: &Probe,
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
            true => election.serve(probe, &term).await,
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
