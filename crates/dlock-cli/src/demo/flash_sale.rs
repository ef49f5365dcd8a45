//! `dlock demo flash-sale`: buyers race for a limited stock (秒杀).

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use dlock::store::{CreateMode, CreateOptions};
use dlock::{Error, Mutex, Session};

use crate::Global;

/// How buyers coordinate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LockKind {
    /// A fair, re-entrant Mutex (Curator InterProcessMutex layout).
    Mutex,
    /// No lock at all: shows the overselling the lock prevents.
    None,
}

impl LockKind {
    fn name(self) -> &'static str {
        match self {
            LockKind::Mutex => "mutex",
            LockKind::None => "none",
        }
    }
}

/// Arguments of `demo flash-sale`.
#[derive(Debug, Args)]
pub struct FlashSale {
    /// How many buyers, each with its own session.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    buyers: u32,
    /// Set the stock to this before the sale. Without it the sale uses the
    /// stock already stored at --stock-path (so several processes can share
    /// one sale), or 20 if none is stored yet.
    #[arg(long)]
    stock: Option<u32>,
    /// How buyers coordinate.
    #[arg(long, value_enum, default_value_t = LockKind::Mutex)]
    lock: LockKind,
    /// Path of the lock.
    #[arg(long, default_value = "/shop/lock")]
    lock_path: String,
    /// Path of the stock counter (its data: the decimal number as text).
    #[arg(long, default_value = "/shop/stock")]
    stock_path: String,
    /// How long each purchase waits between reading and writing the stock.
    #[arg(long, default_value_t = 1)]
    hold_ms: u64,
}

/// Runs the flash sale.
pub async fn run(global: &Global, args: FlashSale) -> Result<()> {
    dlock::path::validate(&args.lock_path)?;
    dlock::path::validate(&args.stock_path)?;
    let admin = global.connect().await?;
    let stock = match args.stock {
        Some(stock) => {
            set_stock(&admin, &args.stock_path, stock).await?;
            stock
        }
        None => match read_stock(&admin, &args.stock_path).await {
            Ok((stock, _)) => stock,
            Err(e) if matches!(e.downcast_ref(), Some(Error::NoNode { .. })) => {
                init_stock(&admin, &args.stock_path, DEFAULT_STOCK).await?
            }
            Err(e) => return Err(e),
        },
    };
    let mut buyers = Vec::with_capacity(args.buyers as usize);
    for _ in 0..args.buyers {
        buyers.push(global.connect().await?);
    }
    let sold = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let progress = std::io::stderr().is_terminal().then(|| {
        let sold = sold.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                eprint!("\rsold {} of {stock}…", sold.load(Ordering::Relaxed));
            }
        })
    });
    let mut tasks = Vec::with_capacity(buyers.len());
    for session in &buyers {
        let buyer = Buyer {
            session: session.clone(),
            lock: match args.lock {
                LockKind::Mutex => Some(Mutex::new(session, &args.lock_path)?),
                LockKind::None => None,
            },
            stock_path: args.stock_path.clone(),
            hold: Duration::from_millis(args.hold_ms),
            sold: sold.clone(),
        };
        tasks.push(tokio::spawn(buyer.run()));
    }
    for task in tasks {
        task.await.context("a buyer panicked")??;
    }
    let seconds = started.elapsed().as_secs_f64();
    if let Some(p) = progress {
        p.abort();
        eprint!("\r\x1b[K");
    }
    let left = read_stock(&admin, &args.stock_path).await?.0;
    for s in &buyers {
        s.close().await;
    }
    admin.close().await;
    let sold = sold.load(Ordering::Relaxed);
    let oversold = sold.saturating_sub(u64::from(stock));
    println!(
        "flash-sale backend={} lock={} buyers={} stock={stock} sold={sold} left={left} oversold={oversold} seconds={seconds:.3}",
        global.backend_name()?,
        args.lock.name(),
        args.buyers,
    );
    Ok(())
}

struct Buyer {
    session: Session,
    lock: Option<Mutex>,
    stock_path: String,
    hold: Duration,
    sold: Arc<AtomicU64>,
}

impl Buyer {
    /// Buys until the stock is gone: read, wait, write stock − 1 — a
    /// non-atomic read-modify-write that only the lock makes safe.
    async fn run(self) -> Result<()> {
        loop {
            let guard = match &self.lock {
                Some(m) => Some(m.acquire().await?),
                None => None,
            };
            let (stock, _) = read_stock(&self.session, &self.stock_path).await?;
            let bought = stock > 0;
            if bought {
                tokio::time::sleep(self.hold).await;
                self.session
                    .set_data(&self.stock_path, (stock - 1).to_string().as_bytes(), None)
                    .await?;
                self.sold.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(g) = guard {
                g.release().await?;
            }
            if !bought {
                return Ok(());
            }
        }
    }
}

async fn read_stock(session: &Session, path: &str) -> Result<(u32, i32)> {
    let (data, stat) = session.get_data(path).await?;
    let text = std::str::from_utf8(&data).map_err(|_| Error::MalformedData {
        path: path.into(),
        reason: "stock is not UTF-8 text".into(),
    })?;
    let stock = text.trim().parse().map_err(|_| Error::MalformedData {
        path: path.into(),
        reason: format!("stock {text:?} is not a non-negative number"),
    })?;
    Ok((stock, stat.version))
}

/// The stock of a sale nobody has set up.
const DEFAULT_STOCK: u32 = 20;

/// Creates the stock node unless another process did first; returns the
/// stock the sale starts with.
async fn init_stock(session: &Session, path: &str, stock: u32) -> Result<u32> {
    let options = CreateOptions::new(CreateMode::Persistent).with_parents();
    match session.create(path, stock.to_string().as_bytes(), options).await {
        Ok(_) => Ok(stock),
        Err(Error::NodeExists { .. }) => Ok(read_stock(session, path).await?.0),
        Err(e) => bail!(e),
    }
}

async fn set_stock(session: &Session, path: &str, stock: u32) -> Result<()> {
    let data = stock.to_string();
    match session
        .create(path, data.as_bytes(), CreateOptions::new(CreateMode::Persistent).with_parents())
        .await
    {
        Ok(_) => Ok(()),
        Err(Error::NodeExists { .. }) => {
            session.set_data(path, data.as_bytes(), None).await?;
            Ok(())
        }
        Err(e) => bail!(e),
    }
}
