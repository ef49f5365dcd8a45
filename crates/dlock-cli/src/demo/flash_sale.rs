//! `dlock demo flash-sale`: buyers race for a limited stock (秒杀).

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use dlock::store::{CreateMode, CreateOptions, Op};
use dlock::{Error, Hold, Layout, Lockable, Mutex, ReadWriteLock, SemaphoreMutex, Session};

use crate::exit::Exit;
use crate::Global;

/// How buyers coordinate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LockKind {
    /// A fair, re-entrant Mutex (Curator InterProcessMutex layout).
    Mutex,
    /// The write half of a ReadWriteLock (Curator InterProcessReadWriteLock).
    Write,
    /// A SemaphoreMutex (Curator InterProcessSemaphoreMutex: the semaphore
    /// layout with one lease).
    SemaphoreMutex,
    /// No lock at all: shows the overselling the lock prevents.
    None,
}

impl LockKind {
    fn name(self) -> &'static str {
        match self {
            LockKind::Mutex => "mutex",
            LockKind::Write => "write",
            LockKind::SemaphoreMutex => "semaphore-mutex",
            LockKind::None => "none",
        }
    }

    /// The lock for one buyer; its nodes carry `label` (as `dlock inspect`
    /// shows), so that anyone can tell which process and buyer holds.
    fn make(
        self,
        session: &Session,
        path: &str,
        label: &str,
        layout: Layout,
    ) -> Result<Option<Box<dyn Lockable>>> {
        Ok(match self {
            LockKind::Mutex => Some(Box::new(
                Mutex::new(session, path)?
                    .with_layout(layout)?
                    .with_data(label),
            )),
            LockKind::Write => Some(Box::new(
                ReadWriteLock::new(session, path)?
                    .with_data(label)
                    .write_half(),
            )),
            LockKind::SemaphoreMutex => Some(Box::new(
                SemaphoreMutex::new(session, path)?.with_data(label),
            )),
            LockKind::None => None,
        })
    }
}

/// How the stock write is protected against a holder that lost its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GuardKind {
    /// A plain write: a holder that stalled past its session still writes.
    None,
    /// A guarded write that lands only while the buyer's lock node exists;
    /// a buyer whose lock was lost abandons that purchase and goes on.
    Fence,
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
    /// Whose node layout the mutex writes: `curator` (Curator's
    /// InterProcessMutex) or `kazoo` (kazoo's `Lock`: Python buyers with a
    /// plain `Lock` on --lock-path share the sale). `--lock mutex` only.
    #[arg(long, default_value_t = Layout::Curator)]
    layout: Layout,
    /// Path of the stock counter (its data: the decimal number as text).
    #[arg(long, default_value = "/shop/stock")]
    stock_path: String,
    /// How long each purchase waits between reading and writing the stock.
    #[arg(long, default_value_t = 1)]
    hold_ms: u64,
    /// How the stock write is protected.
    #[arg(long, value_enum, default_value_t = GuardKind::None)]
    guard: GuardKind,
    /// Make every Nth purchase stall between its read and its write for
    /// twice the session timeout, as a long GC pause would (0 = never). The
    /// stalled buyer's session is lost meanwhile and another buyer takes
    /// over: the Kleppmann scenario. Needs a backend with fault injection.
    #[arg(long, default_value_t = 0)]
    stall_every: u64,
    /// Record every sale in the store, in the same atomic (and, with
    /// `--guard fence`, guarded) write as the stock: a persistent
    /// sequential node PATH/sale-NNNNNNNNNN whose data is
    /// `unit=<stock it sold> fence=<token> pid=<process>`. The sales can
    /// then be counted from the store even if a process dies mid-sale.
    /// PATH is created if missing; the entries stay until removed.
    #[arg(long, value_name = "PATH")]
    ledger: Option<String>,
}

impl FlashSale {
    /// The lock's, the stock's and the ledger's paths.
    pub(super) fn paths(&self) -> Vec<&str> {
        let mut paths = vec![self.lock_path.as_str(), &self.stock_path];
        paths.extend(self.ledger.as_deref());
        paths
    }
}

/// Runs the flash sale.
pub async fn run(global: &Global, args: FlashSale) -> Result<()> {
    if args.layout != Layout::Curator && args.lock != LockKind::Mutex {
        return Err(crate::exit::Exit::Usage
            .with(format!("--layout {} is for --lock mutex only", args.layout))
            .into());
    }
    if args.layout == Layout::Consul {
        return Err(crate::exit::Exit::Usage
            .with("the flash sale's mutex has the curator and kazoo layouts, not consul")
            .into());
    }
    let admin = global.connect().await?;
    if let Some(ledger) = &args.ledger {
        let options = CreateOptions::new(CreateMode::Persistent).with_parents();
        match admin.create(ledger, b"", options).await {
            Ok(_) | Err(Error::NodeExists { .. }) => {}
            Err(e) => bail!(e),
        }
    }
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
    let counters = Arc::new(Counters::default());
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
    for (i, session) in buyers.iter().enumerate() {
        if args.stall_every > 0 && session.faults().is_none() {
            let why = format!(
                "--stall-every needs fault injection, which the {} backend lacks",
                global.backend_name()?
            );
            return Err(Exit::Usage.with(why).into());
        }
        let buyer = Buyer {
            session: session.clone(),
            lock: args.lock.make(
                session,
                &args.lock_path,
                &format!("flash-sale pid={} buyer={i}", std::process::id()),
                args.layout,
            )?,
            guard: args.guard,
            stock_path: args.stock_path.clone(),
            ledger: args.ledger.as_ref().map(|l| format!("{l}/sale-")),
            hold: Duration::from_millis(args.hold_ms),
            stall_every: args.stall_every,
            stall: session.session_timeout() * 2,
            sold: sold.clone(),
            counters: counters.clone(),
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
    if args.guard == GuardKind::Fence || args.stall_every > 0 {
        eprintln!(
            "stalls={} abandoned={} unconfirmed={} (abandoned: purchases whose lock was lost \
             before their write; unconfirmed: writes whose outcome a lost connection hid)",
            counters.stalls.load(Ordering::Relaxed),
            counters.abandoned.load(Ordering::Relaxed),
            counters.unconfirmed.load(Ordering::Relaxed)
        );
    }
    println!(
        "flash-sale backend={} lock={} buyers={} stock={stock} sold={sold} left={left} oversold={oversold} seconds={seconds:.3}",
        global.backend_name()?,
        args.lock.name(),
        args.buyers,
    );
    Ok(())
}

#[derive(Default)]
struct Counters {
    purchases: AtomicU64,
    stalls: AtomicU64,
    abandoned: AtomicU64,
    unconfirmed: AtomicU64,
}

/// What became of one purchase's write.
enum Written {
    /// The stock (and the ledger entry) landed.
    Sold,
    /// Nothing landed: the lock was lost first.
    Abandoned,
    /// The connection dropped with the write in flight, and whether it
    /// landed could not be found out (the lock was lost meanwhile). The
    /// store — the stock and the ledger — knows; this process does not.
    Unconfirmed,
}

/// Errors after which a buyer gives up the purchase at hand and starts
/// over: its lock (or the session holding it) is gone, or the connection
/// dropped; the session renews itself on the next operation.
fn lost_purchase(e: &Error) -> bool {
    matches!(
        e,
        Error::Lost { .. } | Error::SessionExpired | Error::ConnectionLoss
    )
}

struct Buyer {
    session: Session,
    lock: Option<Box<dyn Lockable>>,
    guard: GuardKind,
    stock_path: String,
    /// Prefix of the ledger entries (`<ledger>/sale-`), if kept.
    ledger: Option<String>,
    hold: Duration,
    stall_every: u64,
    stall: Duration,
    sold: Arc<AtomicU64>,
    counters: Arc<Counters>,
}

impl Buyer {
    /// Buys until the stock is gone: read, wait, write stock − 1 — a
    /// non-atomic read-modify-write that only the lock makes safe.
    async fn run(self) -> Result<()> {
        loop {
            let hold = match &self.lock {
                Some(lock) => match lock.lock_for(None).await {
                    Ok(hold) => hold,
                    // Our session died while we waited (the process was
                    // frozen past its timeout, say): queue up again.
                    Err(e) if lost_purchase(&e) => continue,
                    Err(e) => return Err(e.into()),
                },
                None => None,
            };
            let (stock, version) = match read_stock(&self.session, &self.stock_path).await {
                Ok(read) => read,
                Err(e) if e.downcast_ref().is_some_and(lost_purchase) => {
                    self.release(hold).await?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if stock == 0 {
                if let Some(h) = hold {
                    let _ = h.release().await;
                }
                return Ok(());
            }
            tokio::time::sleep(self.hold).await;
            let n = self.counters.purchases.fetch_add(1, Ordering::Relaxed) + 1;
            if self.stall_every > 0 && n % self.stall_every == 0 {
                // The process freezes (a long GC pause): its connection goes
                // silent, the session times out meanwhile, and the buyer
                // itself does nothing until the pause is over.
                self.counters.stalls.fetch_add(1, Ordering::Relaxed);
                if let Some(faults) = self.session.faults() {
                    faults.suspend(self.stall);
                }
                tokio::time::sleep(self.stall).await;
            }
            match self.write(hold.as_deref(), stock, version).await? {
                Written::Sold => {
                    self.sold.fetch_add(1, Ordering::Relaxed);
                }
                Written::Abandoned => {
                    self.counters.abandoned.fetch_add(1, Ordering::Relaxed);
                }
                Written::Unconfirmed => {
                    self.counters.unconfirmed.fetch_add(1, Ordering::Relaxed);
                }
            }
            // A lost lock reports itself here; the purchase was already
            // accounted for above.
            self.release(hold).await?;
        }
    }

    /// Writes stock − 1 (and the ledger entry) for a purchase that read
    /// `stock` at data version `version`.
    async fn write(&self, hold: Option<&dyn Hold>, stock: u32, version: i32) -> Result<Written> {
        let data = (stock - 1).to_string().into_bytes();
        let fenced = hold.filter(|_| self.guard == GuardKind::Fence);
        let result = match (&self.ledger, fenced) {
            (None, None) => self
                .session
                .set_data(&self.stock_path, &data, None)
                .await
                .map(drop),
            (ledger, fenced) => {
                let mut ops = vec![Op::SetData {
                    path: self.stock_path.clone(),
                    data,
                    version: None,
                }];
                if let Some(prefix) = ledger {
                    let fence = hold.map_or("none".to_string(), |h| h.token().to_string());
                    let entry = format!("unit={stock} fence={fence} pid={}", std::process::id());
                    ops.push(Op::Create {
                        path: prefix.clone(),
                        data: entry.into_bytes(),
                        mode: CreateMode::PersistentSequential,
                    });
                }
                match fenced {
                    Some(h) => h.guarded(&ops).await.map(drop),
                    None => self.session.multi(&ops).await.map(drop),
                }
            }
        };
        match (result, fenced) {
            (Ok(()), _) => Ok(Written::Sold),
            // The lock (with its session) was gone when the write came:
            // the guard refused it.
            (Err(Error::Lost { .. } | Error::SessionExpired), Some(_)) => Ok(Written::Abandoned),
            (Err(Error::ConnectionLoss), Some(h)) => Ok(self.after_lost_reply(h, version).await),
            (Err(e), _) => Err(e.into()),
        }
    }

    /// The connection dropped with our guarded write in flight. While we
    /// still hold the lock nobody else writes the stock, so its version
    /// tells: one past the version we read means our write landed.
    async fn after_lost_reply(&self, hold: &dyn Hold, version: i32) -> Written {
        let landed = Op::Check {
            path: self.stock_path.clone(),
            version: Some(version + 1),
        };
        // The check only reads, so it can be repeated — with the session's
        // pauses, not in a tight loop while the connection is down.
        let retry = &self.session.options().retry;
        for attempt in 0.. {
            match hold.guarded(std::slice::from_ref(&landed)).await {
                Ok(_) => return Written::Sold,
                // The lock check passed, the version check did not.
                Err(Error::MultiFailed { .. }) => return Written::Abandoned,
                Err(Error::ConnectionLoss) if attempt < retry.max_retries => {
                    tokio::time::sleep(retry.sleep_for(attempt)).await;
                }
                Err(_) => return Written::Unconfirmed,
            }
        }
        Written::Unconfirmed
    }

    /// Gives the lock back; a lock or session lost meanwhile is no error.
    async fn release(&self, hold: Option<Box<dyn Hold>>) -> Result<()> {
        match hold {
            Some(h) => match h.release().await {
                Ok(()) => Ok(()),
                Err(e) if lost_purchase(&e) => Ok(()),
                Err(e) => Err(e.into()),
            },
            None => Ok(()),
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
    match session
        .create(path, stock.to_string().as_bytes(), options)
        .await
    {
        Ok(_) => Ok(stock),
        Err(Error::NodeExists { .. }) => Ok(read_stock(session, path).await?.0),
        Err(e) => bail!(e),
    }
}

async fn set_stock(session: &Session, path: &str, stock: u32) -> Result<()> {
    let data = stock.to_string();
    match session
        .create(
            path,
            data.as_bytes(),
            CreateOptions::new(CreateMode::Persistent).with_parents(),
        )
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
