//! etcd ⇄ Go, as a tested contract: dlock's recipes and etcd's own Go
//! client recipes (`clientv3/concurrency`: `Mutex`, `Election`, as used by
//! Go services and by `etcdctl lock` / `etcdctl elect`) on one prefix of a
//! real etcd.
//!
//! - a mixed flash sale (Go `peerbench buy` + dlock mutex buyers) sells
//!   exactly the stock;
//! - Go `Election` candidates and dlock `LeaderSelector` / `LeaderLatch`
//!   candidates lead one at a time (a mixed election sale sells exactly the
//!   stock), and each side sees the other's leader;
//! - `etcdctl lock` and a dlock mutex exclude each other, and a dlock
//!   fencing token is the key's create revision as etcd's Go client sees it;
//! - the read-write lock counts a Go mutex holder as a writer.
//!
//! The Go programs are built offline against Debian's etcd 3.4 sources (see
//! `dlock_testkit::etcd_go_peerbench`); `etcdctl` comes with `etcd-client`.
#![cfg(feature = "etcd")]

mod common;

use std::process::Stdio;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use common::tests2::gets_in_after;
use common::{await_children, queued, sold_exactly_the_stock, Harness};
use dlock::recipes::leader_latch::LeaderLatch;
use dlock::recipes::leader_selector::LeaderSelector;
use dlock::store::{CreateMode, CreateOptions};
use dlock::{inspect, Access, FencingToken, Foreign, ReadWriteLock, RecipeKind, Role, Session};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// How long a step that needs no waiting on others may take.
const WITHIN: Duration = Duration::from_secs(20);
/// How long a whole sale may take (the Go build comes first, up to a
/// minute on a loaded machine).
const SALE_WITHIN: Duration = Duration::from_secs(180);

fn etcd_endpoint() -> String {
    dlock_testkit::shared_etcd().endpoint()
}

/// `etcdctl` against the test's etcd.
fn etcdctl() -> Command {
    let mut c = Command::new(std::env::var("DLOCK_ETCDCTL").unwrap_or("etcdctl".into()));
    c.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", etcd_endpoint()))
        .kill_on_drop(true);
    c
}

/// A running `etcdctl lock` / `elect`, and the lines it prints.
struct Etcdctl {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Etcdctl {
    fn spawn(args: &[&str]) -> Result<Etcdctl> {
        let mut child = etcdctl()
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .context("run etcdctl (apt-get install etcd-client)")?;
        let stdout = child.stdout.take().expect("piped");
        Ok(Etcdctl {
            child,
            lines: BufReader::new(stdout).lines(),
        })
    }

    async fn next_line(&mut self) -> Result<String> {
        tokio::time::timeout(WITHIN, self.lines.next_line())
            .await
            .context("etcdctl printed nothing")??
            .context("etcdctl ended")
    }

    /// Whether it has printed a line that was not read yet (it prints only
    /// once it holds or leads).
    async fn has_printed(&mut self) -> bool {
        tokio::time::timeout(Duration::from_millis(1), self.lines.next_line())
            .await
            .is_ok()
    }

    /// SIGINT: etcdctl unlocks (or resigns), and exits.
    async fn interrupt(mut self) -> Result<()> {
        let pid = self.child.id().context("etcdctl's pid")? as libc::pid_t;
        // SAFETY: kill(2) on our own child, not reaped yet.
        unsafe { libc::kill(pid, libc::SIGINT) };
        let status = tokio::time::timeout(WITHIN, self.child.wait()).await??;
        ensure!(status.success(), "etcdctl exited with {status}");
        Ok(())
    }
}

/// The create revision of `key` as etcd's Go client reads it
/// (`etcdctl get -w json`).
async fn create_revision(key: &str) -> Result<i64> {
    let out = etcdctl().args(["get", key, "-w", "json"]).output().await?;
    ensure!(out.status.success(), "etcdctl get {key} failed");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    json["kvs"][0]["create_revision"]
        .as_i64()
        .with_context(|| format!("no key {key}: {json}"))
}

async fn put_stock(s: &Session, path: &str, stock: u64) -> Result<()> {
    let options = CreateOptions::new(CreateMode::Persistent).with_parents();
    s.create(path, stock.to_string().as_bytes(), options)
        .await?;
    Ok(())
}

/// Waits until the stock at `path` is no longer `stock`: the Go side has
/// started selling (so both sides really race).
async fn await_first_sale(s: &Session, path: &str, stock: u64) -> Result<()> {
    tokio::time::timeout(SALE_WITHIN, async {
        loop {
            let (data, _, watch) = s.get_data_watch(path).await?;
            if data != stock.to_string().as_bytes() {
                return anyhow::Ok(());
            }
            watch.changed().await;
        }
    })
    .await
    .context("the Go side never sold")?
}

/// One sale, made while holding whatever excludes the others: reads the
/// stock and writes it back one less. Returns whether there was stock.
async fn sell_one(s: &Session, stock: &str, sold: &AtomicU64) -> Result<bool> {
    let (data, _) = s.get_data(stock).await?;
    let left: u64 = std::str::from_utf8(&data)?.trim().parse()?;
    if left == 0 {
        return Ok(false);
    }
    s.set_data(stock, (left - 1).to_string().as_bytes(), None)
        .await?;
    sold.fetch_add(1, Ordering::SeqCst);
    Ok(true)
}

/// `key=value` fields of the last line a Go program printed.
fn field(stdout: &[u8], name: &str) -> Result<u64> {
    let text = String::from_utf8_lossy(stdout);
    let line = text
        .lines()
        .last()
        .context("the Go program printed nothing")?;
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no {name}= in {line:?}"))
}

/// A mixed sale under way: the Go program selling, and the count of what
/// dlock's sellers sold.
struct Sale {
    go: Child,
    sold: Arc<AtomicU64>,
}

/// Puts `total` in the `stock` node, starts a Go sale there (the Go
/// program `go` with `args`, three clients, on `path`) and waits until it
/// has sold once.
async fn go_sellers(
    go: std::path::PathBuf,
    args: &[&str],
    path: &str,
    stock: &str,
    admin: &Session,
    total: u64,
) -> Result<Sale> {
    put_stock(admin, stock, total).await?;
    let sellers = Command::new(go)
        .args(args)
        .args(["--endpoints", &etcd_endpoint(), "--clients", "3"])
        .args(["--path", path, "--stock-key", stock])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    await_first_sale(admin, stock, total).await?;
    Ok(Sale {
        go: sellers,
        sold: Arc::new(AtomicU64::new(0)),
    })
}

/// Every dlock seller and the Go program (`go`, named `who`) of a sale end
/// well; returns what the Go program printed.
async fn sale_ends(
    sellers: Vec<tokio::task::JoinHandle<Result<()>>>,
    go: Child,
    who: &str,
) -> Result<Vec<u8>> {
    for seller in sellers {
        tokio::time::timeout(SALE_WITHIN, seller).await???;
    }
    let out = tokio::time::timeout(SALE_WITHIN, go.wait_with_output()).await??;
    ensure!(out.status.success(), "{who} failed");
    Ok(out.stdout)
}

/// dlock's sellers (`sold`) and the Go ones (their `sold=` field in
/// `go_said`) sold exactly the stock ([`sold_exactly_the_stock`]).
async fn go_and_dlock_sold_the_stock(
    admin: &Session,
    stock: &str,
    total: u64,
    sold: &AtomicU64,
    go_said: &[u8],
) -> Result<()> {
    let go_sold = field(go_said, "sold")?;
    let dlock_sold = sold.load(Ordering::SeqCst);
    sold_exactly_the_stock(admin, stock, total, dlock_sold, "Go", go_sold).await
}

/// Go `concurrency.Mutex` buyers (`shared/peers/etcd-go` `peerbench buy`)
/// and dlock mutex buyers on one lock prefix and stock key: together they
/// sell exactly the stock.
async fn go_and_dlock_mutex_buyers_sell_exactly_the_stock(h: &Harness) -> Result<()> {
    let total = 200;
    let (lock, stock) = (h.path("/shop/lock"), h.path("/shop/stock"));
    let admin = h.session().await;
    let peerbench = dlock_testkit::etcd_go_peerbench()?;
    let Sale { go, sold } = go_sellers(peerbench, &["buy"], &lock, &stock, &admin, total).await?;
    let mut buyers = Vec::new();
    for _ in 0..3 {
        let s = h.session().await;
        let mutex = dlock::Mutex::new(&s, &lock)?;
        let (stock, sold) = (stock.clone(), sold.clone());
        buyers.push(tokio::spawn(async move {
            loop {
                let guard = mutex.acquire().await?;
                let more = sell_one(&s, &stock, &sold).await?;
                guard.release().await?;
                if !more {
                    return anyhow::Ok(());
                }
            }
        }));
    }
    let go_said = sale_ends(buyers, go, "the Go buyers").await?;
    go_and_dlock_sold_the_stock(&admin, &stock, total, &sold, &go_said).await
}

/// Go `concurrency.Election` candidates (`electsale`: campaign, sell one,
/// resign) and dlock candidates — two `LeaderSelector`s taking turns and two
/// `LeaderLatch`es that close after each term — on one election prefix:
/// leaders sell from one stock with a plain read-then-write, so two leaders
/// at once would sell a unit twice. Together they sell exactly the stock.
async fn go_and_dlock_election_candidates_lead_one_at_a_time(h: &Harness) -> Result<()> {
    let total = 150;
    let (election, stock) = (h.path("/election"), h.path("/stock"));
    let admin = h.session().await;
    let electsale = dlock_testkit::etcd_go_electsale()?;
    let Sale { go, sold } = go_sellers(electsale, &[], &election, &stock, &admin, total).await?;
    // dlock leaders inside a term now, across both kinds of candidate, and
    // how often a term began while another was on.
    let inside = Arc::new(AtomicI32::new(0));
    let overlaps = Arc::new(AtomicU64::new(0));
    let mut candidates = Vec::new();
    for i in 0..2 {
        let s = h.session().await;
        let (stock, sold) = (stock.clone(), sold.clone());
        let (inside, overlaps) = (inside.clone(), overlaps.clone());
        // Some(outcome) once the stock is gone, or a sale failed.
        let (done, mut done_rx) = tokio::sync::watch::channel(None::<Result<(), String>>);
        let term_session = s.clone();
        let selector = LeaderSelector::new(&s, &election, move |_term| {
            let (s, stock, sold) = (term_session.clone(), stock.clone(), sold.clone());
            let (inside, overlaps, done) = (inside.clone(), overlaps.clone(), done.clone());
            async move {
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                let sale = sell_one(&s, &stock, &sold).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                match sale {
                    Ok(true) => {}
                    Ok(false) => {
                        done.send_replace(Some(Ok(())));
                    }
                    Err(e) => {
                        done.send_replace(Some(Err(format!("{e:#}"))));
                    }
                }
            }
        })?
        .with_id(format!("dlock-selector-{i}"))
        .with_auto_requeue();
        candidates.push(tokio::spawn(async move {
            selector.start()?;
            let outcome = done_rx.wait_for(Option::is_some).await?.clone();
            selector.close().await?;
            outcome.expect("waited for it").map_err(anyhow::Error::msg)
        }));
    }
    for i in 0..2 {
        let s = h.session().await;
        let (election, stock, sold) = (election.clone(), stock.clone(), sold.clone());
        let (inside, overlaps) = (inside.clone(), overlaps.clone());
        candidates.push(tokio::spawn(async move {
            loop {
                let latch = LeaderLatch::new(&s, &election)?.with_id(format!("dlock-latch-{i}"));
                latch.start()?;
                latch.await_leadership().await?;
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                let more = sell_one(&s, &stock, &sold).await?;
                inside.fetch_sub(1, Ordering::SeqCst);
                latch.close().await?;
                if !more {
                    return Ok(());
                }
            }
        }));
    }
    let go_said = sale_ends(candidates, go, "the Go candidates").await?;
    ensure!(
        field(&go_said, "violations")? == 0,
        "two Go leaders at once"
    );
    let overlaps = overlaps.load(Ordering::SeqCst);
    ensure!(overlaps == 0, "{overlaps} times two dlock leaders at once");
    go_and_dlock_sold_the_stock(&admin, &stock, total, &sold, &go_said).await
}

/// A dlock leader is the leader Go observes (`etcdctl elect -l`, Go's
/// `Election.Observe`: the key with the lowest create revision, its value
/// the candidate's id); a Go candidate (`etcdctl elect`) waits for it and
/// leads when it closes; a dlock candidate then waits for the Go leader and
/// leads when it resigns. Epochs grow in the order of the terms.
async fn go_and_dlock_see_the_same_leader(h: &Harness) -> Result<()> {
    let election = h.path("/elect");
    let s = h.session().await;
    let first = LeaderLatch::new(&s, &election)?.with_id("dlock-first");
    first.start()?;
    let first_term = first.await_leadership().await?;
    let mut observer = Etcdctl::spawn(&["elect", "-l", &election])?;
    let first_node = first.our_path().context("the leader has a node")?;
    ensure!(observer.next_line().await? == first_node);
    ensure!(observer.next_line().await? == "dlock-first");

    let mut go = Etcdctl::spawn(&["elect", &election, "go-second"])?;
    await_children(&s, &election, 2, WITHIN).await?;
    let seen = inspect(&s, &election).await?;
    ensure!(
        seen.participants.iter().map(|p| p.role).collect::<Vec<_>>()
            == [Role::Holder, Role::Waiter],
        "{seen:?}"
    );
    ensure!(
        seen.participants[1].foreign == Some(Foreign::EtcdGo),
        "{seen:?}"
    );
    ensure!(!go.has_printed().await, "Go leads while dlock leads");

    first.close().await?;
    let go_key = go.next_line().await?;
    ensure!(go.next_line().await? == "go-second");
    ensure!(observer.next_line().await? == go_key);
    ensure!(observer.next_line().await? == "go-second");
    let go_epoch = create_revision(&go_key).await?;
    ensure!(
        go_epoch > first_term.epoch().0,
        "{go_epoch} after {first_term:?}"
    );

    let third = LeaderLatch::new(&s, &election)?.with_id("dlock-third");
    third.start()?;
    await_children(&s, &election, 2, WITHIN).await?;
    let leader = third.leader().await?.context("someone leads")?;
    ensure!(
        leader.id == "go-second" && !third.has_leadership(),
        "{leader:?}"
    );
    go.interrupt().await?;
    let third_term = tokio::time::timeout(WITHIN, third.await_leadership()).await??;
    ensure!(third_term.epoch().0 > go_epoch);
    ensure!(observer.next_line().await? == third.our_path().context("node")?);
    ensure!(observer.next_line().await? == "dlock-third");
    third.close().await?;
    drop(observer);
    Ok(())
}

/// `etcdctl lock` and a dlock mutex on one prefix exclude each other, both
/// ways, and their fencing tokens are one sequence: dlock's token is its
/// key's create revision as etcd's Go client reads it, and Go's
/// `Mutex` orders (and fences, `IsOwner`) by the same number.
async fn etcdctl_lock_and_dlock_mutex_exclude_each_other(h: &Harness) -> Result<()> {
    let lock = h.path("/lock");
    let s = h.session().await;
    let mutex = dlock::Mutex::new(&s, &lock)?;
    let guard = mutex.acquire().await?;
    ensure!(create_revision(guard.node()).await? == guard.token().0);

    // Go waits for dlock.
    let mut go = Etcdctl::spawn(&["lock", &lock])?;
    await_children(&s, &lock, 2, WITHIN).await?;
    let seen = inspect(&s, &lock).await?;
    ensure!(
        seen.participants[1].foreign == Some(Foreign::EtcdGo),
        "{seen:?}"
    );
    ensure!(seen.participants[1].role == Role::Waiter, "{seen:?}");
    ensure!(!go.has_printed().await, "etcdctl locked while dlock held");
    let dlock_token = guard.token();
    guard.release().await?;
    let go_key = go.next_line().await?;
    let go_token = FencingToken(create_revision(&go_key).await?);
    ensure!(go_token > dlock_token, "{go_token:?} after {dlock_token:?}");

    // dlock waits for Go, and sees Go's token as etcd does.
    let waiter = mutex.clone();
    let waiting = queued(&s, &lock, 2, WITHIN, async move { waiter.acquire().await }).await?;
    let seen = inspect(&s, &lock).await?;
    ensure!(seen.participants[0].node == go_key && seen.participants[0].token == go_token);
    ensure!(seen.participants[0].role == Role::Holder, "{seen:?}");
    ensure!(!waiting.is_finished(), "dlock locked while etcdctl held");
    go.interrupt().await?;
    let guard = tokio::time::timeout(WITHIN, waiting).await???;
    ensure!(guard.token() > go_token);
    ensure!(create_revision(guard.node()).await? == guard.token().0);
    guard.release().await?;
    Ok(())
}

/// `etcdctl lock -- CMD` gives CMD the lock's key and a revision
/// (`ETCD_LOCK_KEY`, `ETCD_LOCK_REV`: the revision at which it got the
/// lock); taken right after a dlock hold, both follow dlock's token.
async fn etcdctl_lock_revision_follows_the_dlock_token(h: &Harness) -> Result<()> {
    let lock = h.path("/lock-rev");
    let s = h.session().await;
    let guard = dlock::Mutex::new(&s, &lock)?.acquire().await?;
    let dlock_token = guard.token().0;
    guard.release().await?;
    let out = etcdctl()
        .args(["lock", &lock, "--", "sh", "-c"])
        .arg(r#"echo "$ETCD_LOCK_KEY $ETCD_LOCK_REV""#)
        .output()
        .await?;
    ensure!(out.status.success(), "etcdctl lock failed");
    let text = String::from_utf8(out.stdout)?;
    let (key, rev) = text.trim().split_once(' ').context("two fields")?;
    let rev: i64 = rev.parse()?;
    ensure!(key.starts_with(&format!("{lock}/")), "{key}");
    ensure!(
        rev > dlock_token,
        "Go's revision {rev}, dlock's token {dlock_token}"
    );
    Ok(())
}

/// `dlock inspect` shows a read-write lock at `path` whose queue is `want`
/// in order (the holder, then the waiters): each one's access, and whether
/// it is Go's.
async fn queue_is(s: &Session, path: &str, want: &[(Option<Access>, bool)]) -> Result<()> {
    let seen = inspect(s, path).await?;
    ensure!(seen.recipe == RecipeKind::ReadWriteLock, "{seen:?}");
    let roles = std::iter::once(Role::Holder).chain(std::iter::repeat(Role::Waiter));
    let want: Vec<_> = roles
        .zip(want)
        .map(|(role, &(access, go))| (role, access, go))
        .collect();
    let queue: Vec<_> = seen
        .participants
        .iter()
        .map(|p| (p.role, p.access, p.foreign == Some(Foreign::EtcdGo)))
        .collect();
    ensure!(queue == want, "{seen:?}");
    Ok(())
}

/// A Go mutex holder (`etcdctl lock`) on a read-write lock's path is a
/// writer: a dlock reader waits for it (and `try_read` refuses), a dlock
/// writer queues behind it, and once it unlocks the reader reads first.
async fn a_go_mutex_holder_is_a_writer_to_dlock_readers(h: &Harness) -> Result<()> {
    let path = h.path("/rw");
    let s = h.session().await;
    let mut go = Etcdctl::spawn(&["lock", &path])?;
    let go_key = go.next_line().await?;
    let rw = ReadWriteLock::new(&s, &path)?;
    ensure!(rw.try_read().await?.is_none(), "read while Go holds");
    let reader = rw.clone();
    let reading = queued(&s, &path, 2, WITHIN, async move { reader.read().await }).await?;
    let writer = ReadWriteLock::new(&s, &path)?;
    let writing = queued(&s, &path, 3, WITHIN, async move { writer.write().await }).await?;
    let (r, w) = (Some(Access::Read), Some(Access::Write));
    queue_is(&s, &path, &[(w, true), (r, false), (w, false)]).await?;
    let early = format!("a dlock reader read while Go held {go_key}");
    let read = gets_in_after(reading, go.interrupt(), &early, WITHIN).await?;
    let early = "the writer wrote while a reader read";
    let write = gets_in_after(writing, read.release(), early, WITHIN).await?;
    write.release().await?;
    Ok(())
}

/// dlock readers and writers exclude a Go mutex (`etcdctl lock`): it waits
/// for a reader, and a reader coming after it waits for it (the queue is
/// fair); it waits for a writer.
async fn dlock_readers_and_writers_exclude_a_go_mutex(h: &Harness) -> Result<()> {
    let path = h.path("/rw");
    let s = h.session().await;
    let rw = ReadWriteLock::new(&s, &path)?;
    let first = rw.read().await?;
    let mut go = Etcdctl::spawn(&["lock", &path])?;
    await_children(&s, &path, 2, WITHIN).await?;
    let later = ReadWriteLock::new(&s, &path)?;
    let reading = queued(&s, &path, 3, WITHIN, async move { later.read().await }).await?;
    let (r, w) = (Some(Access::Read), Some(Access::Write));
    queue_is(&s, &path, &[(r, false), (w, true), (r, false)]).await?;
    ensure!(
        !go.has_printed().await,
        "Go locked while a dlock reader read"
    );
    first.release().await?;
    go.next_line().await?;
    let early = "a dlock reader read while Go held";
    let read = gets_in_after(reading, go.interrupt(), early, WITHIN).await?;
    read.release().await?;

    let write = rw.write().await?;
    let mut go = Etcdctl::spawn(&["lock", &path])?;
    await_children(&s, &path, 2, WITHIN).await?;
    ensure!(
        !go.has_printed().await,
        "Go locked while a dlock writer wrote"
    );
    let token = write.token();
    write.release().await?;
    let go_key = go.next_line().await?;
    ensure!(FencingToken(create_revision(&go_key).await?) > token);
    go.interrupt().await?;
    Ok(())
}

per_backend!(etcd => crate::common::etcd(); {
    go_and_dlock_mutex_buyers_sell_exactly_the_stock,
    go_and_dlock_election_candidates_lead_one_at_a_time,
    go_and_dlock_see_the_same_leader,
    etcdctl_lock_and_dlock_mutex_exclude_each_other,
    etcdctl_lock_revision_follows_the_dlock_token,
    a_go_mutex_holder_is_a_writer_to_dlock_readers,
    dlock_readers_and_writers_exclude_a_go_mutex,
});
