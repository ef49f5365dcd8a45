//! `dlock demo ...`: the scenarios of the design documents, runnable.

use anyhow::Result;
use clap::Subcommand;
use tokio::sync::watch;

use crate::exit::Exit;
use crate::Global;

mod flash_sale;
mod leader;
mod parking_lot;
mod probe;

/// The demos.
#[derive(Debug, Subcommand)]
pub enum Demo {
    /// The flash sale (秒杀): buyers race for a limited stock; only the lock
    /// keeps the read-modify-write of the stock from overselling.
    ///
    /// Example: dlock demo flash-sale --buyers 200 --stock 50
    FlashSale(flash_sale::FlashSale),
    /// The parking lot (停车场): many cars, few spaces; a distributed
    /// semaphore admits at most `--spaces` cars at once, checked by a shared
    /// in-use counter.
    ///
    /// Example: dlock demo parking-lot --cars 15 --spaces 3 --semaphore kv
    ParkingLot(parking_lot::ParkingLot),
    /// Leader election (选主): candidates lead one at a time, by turns
    /// (LeaderSelector) or by latch (LeaderLatch); a shared counter checks
    /// that nobody, in any process, leads at the same time.
    ///
    /// Example: dlock demo leader --candidates 5 --terms 20 --recipe latch
    Leader(leader::Leader),
}

impl Demo {
    /// Every path the demo's arguments name.
    fn paths(&self) -> Vec<&str> {
        match self {
            Demo::FlashSale(args) => args.paths(),
            Demo::ParkingLot(args) => args.paths(),
            Demo::Leader(args) => args.paths(),
        }
    }
}

/// Runs a demo, once every path it names was found valid.
pub async fn run(global: &Global, demo: Demo) -> Result<()> {
    for path in demo.paths() {
        dlock::path::validate(path)?;
    }
    match demo {
        Demo::FlashSale(args) => flash_sale::run(global, args).await,
        Demo::Leader(args) => {
            let stop = stop_on_ctrl_c()?;
            leader::run(global, args, stop.clone()).await?;
            ended(&stop)
        }
        Demo::ParkingLot(args) => {
            let stop = stop_on_ctrl_c()?;
            parking_lot::run(global, args, stop.clone()).await?;
            ended(&stop)
        }
    }
}

/// How a demo that `stop` may have cut short ended: interrupted, or not.
fn ended(stop: &watch::Receiver<bool>) -> Result<()> {
    let interrupted = *stop.borrow();
    match interrupted {
        true => Err(Exit::Interrupted.with("interrupted by Ctrl-C").into()),
        false => Ok(()),
    }
}

/// Resolves once `stop` is true (never if its sender is gone).
async fn until_stopped(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Turns true at the first Ctrl-C (SIGINT): the demos that count their
/// holders in a shared probe then wind down — each holder counts itself
/// out and lets go — so that a probe left raised does not show up as a
/// violation in the next run on it. A second Ctrl-C ends the process at
/// once.
fn stop_on_ctrl_c() -> Result<watch::Receiver<bool>> {
    use tokio::signal::unix::{signal, SignalKind};
    let (stop, stopped) = watch::channel(false);
    let mut interrupts = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        if interrupts.recv().await.is_some() {
            eprintln!("dlock: stopping: holders count themselves out and let go (Ctrl-C again to quit at once)");
            stop.send_replace(true);
            if interrupts.recv().await.is_some() {
                std::process::exit(Exit::Interrupted as i32);
            }
        }
    });
    Ok(stopped)
}
