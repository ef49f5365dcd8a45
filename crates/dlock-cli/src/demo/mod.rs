//! `dlock demo ...`: the scenarios of the design documents, runnable.

use anyhow::Result;
use clap::Subcommand;

use crate::Global;

mod flash_sale;

/// The demos.
#[derive(Debug, Subcommand)]
pub enum Demo {
    /// The flash sale (秒杀): buyers race for a limited stock; only the lock
    /// keeps the read-modify-write of the stock from overselling.
    ///
    /// Example: dlock demo flash-sale --buyers 200 --stock 50
    FlashSale(flash_sale::FlashSale),
}

/// Runs a demo.
pub async fn run(global: &Global, demo: Demo) -> Result<()> {
    match demo {
        Demo::FlashSale(args) => flash_sale::run(global, args).await,
    }
}
