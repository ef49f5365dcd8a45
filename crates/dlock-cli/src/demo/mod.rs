//! `dlock demo ...`: the scenarios of the design documents, runnable.

use anyhow::Result;
use clap::Subcommand;

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
        Demo::Leader(args) => leader::run(global, args).await,
        Demo::ParkingLot(args) => parking_lot::run(global, args).await,
    }
}
