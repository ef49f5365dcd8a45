//! `dlock top [PREFIX]`: a live view of every lock, semaphore and election
//! under a prefix — holders with their fencing token, session and hold
//! time, waiters in queue order, handoffs per second, and holders written
//! by foreign clients (etcd's Go recipes, kazoo, `consul lock`) named as such.
//!
//! Three parts, kept apart so each can be tested on its own:
//! - [`scan`] walks the tree under the prefix (breadth first, bounded by
//!   [`Limits`]), recognises recipe directories with [`dlock::inspect`],
//!   and arms a watch on every directory it looked at;
//! - [`Model`] turns successive scans into [`View`]s (rows), remembering
//!   when each node was first seen holding or waiting, and counting holder
//!   changes for the handoff rate;
//! - [`render`] draws a [`View`] with ratatui.
//!
//! The live loop scans again only when one of the scan's watches fires (a
//! child created or deleted, a record changed, a session state change),
//! and then only the directory that watch was armed for: the store is
//! never polled, and a busy lock costs a rescan of that lock alone. The
//! clock only redraws hold times. Handoffs per second count the new
//! holders seen over the last ten seconds: holders that come and go
//! between two scans of their recipe are not seen.
//!
//! Hold times count from when top first saw a node hold (or wait): the
//! store contract reports no creation time, only the creating
//! transaction, so a node already held when top starts shows the time
//! since top started, marked `≥`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use dlock::store::Watch;
use dlock::{Error, Inspection, RecipeKind, Role, Session};
use futures::StreamExt;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Cell, Paragraph, Row, Table, Widget};

use crate::Global;

/// Arguments of `top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// Show every recipe under this path.
    #[arg(default_value = "/")]
    pub prefix: String,
    /// Print one snapshot and exit instead of the live view.
    #[arg(long)]
    pub once: bool,
    /// With --once: print the snapshot as one JSON document.
    #[arg(long, requires = "once")]
    pub json: bool,
    /// How deep below PREFIX to look for recipes.
    #[arg(long, default_value_t = Limits::default().depth)]
    pub depth: usize,
    /// How many directories to look at, at most, per scan.
    #[arg(long, default_value_t = Limits::default().directories)]
    pub max_dirs: usize,
}

/// How far a scan looks.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Levels below the prefix.
    pub depth: usize,
    /// Directories listed per scan.
    pub directories: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            depth: 8,
            directories: 1000,
        }
    }
}

/// What one scan found: the recipes (by path), whether the limits cut it
/// short, and the watches it armed (empty unless asked for).
pub struct Scan {
    pub recipes: Vec<Inspection>,
    pub truncated: bool,
    pub watches: Vec<Armed>,
}

/// A watch a scan armed, and what to scan again when it fires.
pub struct Armed {
    /// What is watched: a node's children (`path/`) or its data (`path`).
    pub watched: String,
    /// The directory to scan again.
    pub rescan: String,
    /// That directory's depth below the prefix.
    pub depth: usize,
    pub watch: Watch,
}

/// Walks the tree under `prefix` for recipes: [`scan_from`] the prefix.
pub async fn scan(session: &Session, prefix: &str, limits: Limits, watch: bool) -> Result<Scan> {
    scan_from(session, prefix, 0, limits, watch).await
}

/// Walks the tree under `start` (`depth` levels below the prefix) for
/// recipes. A directory [`dlock::inspect`] recognises is a recipe and is
/// not descended into; any other directory with children is. With
/// `watch`, every directory listed gets a children watch, and the parts of
/// a recipe that change without a child of its directory changing (a
/// semaphore's `locks` and `leases`, a KV semaphore's `.lock` record) get
/// theirs: any change under `start` that could change the view fires one
/// of them, and says which directory to scan again. (A directory that is
/// missing needs no watch for its creation: its parent's listing has one —
/// except the prefix, which gets an exists watch.)
pub async fn scan_from(
    session: &Session,
    start: &str,
    depth: usize,
    limits: Limits,
    watch: bool,
) -> Result<Scan> {
    let mut found = Scan {
        recipes: Vec::new(),
        truncated: false,
        watches: Vec::new(),
    };
    let mut queue = VecDeque::from([(start.to_string(), depth)]);
    let mut listed = 0usize;
    while let Some((dir, depth)) = queue.pop_front() {
        if listed == limits.directories {
            found.truncated = true;
            break;
        }
        listed += 1;
        let mut armed = watch.then(Vec::new);
        let children = list(session, &dir, depth == 0, armed.as_mut()).await?;
        if children.is_empty() {
            found.watches.extend(tagged(armed, &dir, depth));
            continue;
        }
        let seen = match dir.as_str() {
            "/" => None,
            // Data no recipe could read (someone else's node named as a
            // recipe's): an ordinary directory, not the end of the view.
            _ => match dlock::inspect(session, &dir).await {
                Err(Error::MalformedData { .. }) => None,
                seen => Some(seen?),
            },
        };
        match seen {
            Some(seen) if seen.recipe != RecipeKind::None => {
                if let Some(armed) = armed.as_mut() {
                    watch_recipe_parts(session, &seen, armed).await?;
                }
                found.recipes.push(seen);
            }
            _ if depth < limits.depth => {
                queue.extend(
                    children
                        .into_iter()
                        .map(|name| (dlock::path::join(&dir, &name), depth + 1)),
                );
            }
            _ => found.truncated = true,
        }
        found.watches.extend(tagged(armed, &dir, depth));
    }
    found.recipes.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}

/// Watches of `dir`'s, to scan it again when they fire.
fn tagged(armed: Option<Vec<(String, Watch)>>, dir: &str, depth: usize) -> Vec<Armed> {
    armed
        .unwrap_or_default()
        .into_iter()
        .map(|(watched, watch)| Armed {
            watched,
            rescan: dir.to_string(),
            depth,
            watch,
        })
        .collect()
}

/// The names of `dir`'s children; with `watches`, a watch for a change
/// among them — or, if `dir` does not exist and `if_missing`, for its
/// creation.
async fn list(
    session: &Session,
    dir: &str,
    if_missing: bool,
    mut watches: Option<&mut Vec<(String, Watch)>>,
) -> Result<Vec<String>> {
    loop {
        let listed = match watches.as_deref_mut() {
            Some(watches) => session.children_watch(dir).await.map(|(children, w)| {
                watches.push((format!("{dir}/"), w));
                children
            }),
            None => session.children(dir).await,
        };
        match listed {
            Ok(children) => return Ok(children.into_iter().map(|c| c.name).collect()),
            Err(Error::NoNode { .. }) if if_missing && watches.is_some() => {
                // Created since the listing? Then its watch would only see
                // its deletion or a data change: list it again instead.
                let (stat, created) = session.exists_watch(dir).await?;
                if stat.is_none() {
                    if let Some(watches) = watches {
                        watches.push((dir.to_string(), created));
                    }
                    return Ok(Vec::new());
                }
            }
            Err(Error::NoNode { .. }) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Watches for the changes of a recipe that its directory's listing does
/// not show. These names are the recipes' documented layouts (Curator's
/// `InterProcessSemaphoreV2`: `locks/` and `leases/`; the KV semaphore's
/// and Consul's `.lock` record). One that is missing is not watched: its
/// creation changes the recipe directory's listing, which is.
async fn watch_recipe_parts(
    session: &Session,
    seen: &Inspection,
    watches: &mut Vec<(String, Watch)>,
) -> Result<()> {
    match seen.recipe {
        RecipeKind::Semaphore if is_kazoo_semaphore(seen) => {
            // A sibling: its creation changes a listing not watched here.
            let dir = kazoo_semaphore_lock(&seen.path);
            list(session, &dir, true, Some(&mut *watches)).await?;
        }
        RecipeKind::Semaphore => {
            for part in ["locks", "leases"] {
                let dir = dlock::path::join(&seen.path, part);
                list(session, &dir, false, Some(&mut *watches)).await?;
            }
        }
        RecipeKind::KvSemaphore => {
            let record = dlock::path::join(&seen.path, ".lock");
            match session.get_data_watch(&record).await {
                Ok((_, _, w)) => watches.push((record, w)),
                Err(Error::NoNode { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        _ => {}
    }
    Ok(())
}

/// Whether `seen` is a kazoo semaphore (every lease and acquirer kazoo's):
/// its acquirers queue at the sibling [`kazoo_semaphore_lock`], not below
/// it.
fn is_kazoo_semaphore(seen: &Inspection) -> bool {
    let all = &seen.participants;
    seen.recipe == RecipeKind::Semaphore
        && !all.is_empty()
        && all.iter().all(|p| p.foreign == Some(dlock::Foreign::Kazoo))
}

/// Where the acquirers of a kazoo semaphore at `path` queue (kazoo's
/// `Semaphore`: `path + "-__lock__"`).
fn kazoo_semaphore_lock(path: &str) -> String {
    format!("{path}-__lock__")
}

/// Whether `path` is `root` or below it.
fn is_under(root: &str, path: &str) -> bool {
    root == "/"
        || path == root
        || path
            .strip_prefix(root)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The directories of `fired` that are not below another of them: scanning
/// those scans the rest too.
fn outermost(mut fired: Vec<(String, usize)>) -> Vec<(String, usize)> {
    fired.sort_by_key(|(dir, _)| dir.len());
    let mut kept: Vec<(String, usize)> = Vec::new();
    for (dir, depth) in fired {
        if !kept.iter().any(|(root, _)| is_under(root, &dir)) {
            kept.push((dir, depth));
        }
    }
    kept
}

/// When a node was first seen in its role.
#[derive(Debug, Clone, Copy)]
struct Since {
    role: Role,
    at: Instant,
    /// Seen at top's first scan: there since before top looked.
    before_top: bool,
}

/// One participant's presence: its node, as made by one creation and held
/// by one session. Consul's `api.Lock` key stays at `.lock` from holder to
/// holder, and etcd names a client's node alike each time, so the node's
/// name alone would take a new holder for the last one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Presence {
    node: String,
    token: dlock::FencingToken,
    session: dlock::store::SessionId,
}

impl Presence {
    fn of(p: &dlock::Contender) -> Self {
        Presence {
            node: p.node.clone(),
            token: p.token,
            session: p.session,
        }
    }
}

/// How long the handoff rate looks back.
const RATE_WINDOW: Duration = Duration::from_secs(10);

/// Successive scans, remembered: when each node was first seen in its
/// role, and the holder changes of each recipe.
#[derive(Debug)]
pub struct Model {
    prefix: String,
    started: Instant,
    scans: u64,
    truncated: bool,
    recipes: Vec<Inspection>,
    /// Each hold or wait → since when it is seen in its role.
    since: HashMap<Presence, Since>,
    /// Recipe path → when each new holder was seen.
    handoffs: HashMap<String, VecDeque<Instant>>,
}

impl Model {
    /// A model of nothing seen yet.
    pub fn new(prefix: &str, now: Instant) -> Self {
        Model {
            prefix: prefix.to_string(),
            started: now,
            scans: 0,
            truncated: false,
            recipes: Vec::new(),
            since: HashMap::new(),
            handoffs: HashMap::new(),
        }
    }

    /// Takes in a scan of the whole prefix made at `now`.
    pub fn update(&mut self, scan: &Scan, now: Instant) {
        let prefix = self.prefix.clone();
        self.update_under(&prefix, scan, now);
    }

    /// Takes in a scan of `root` made at `now`: its recipes replace those
    /// seen under `root` before. A node holding now that was not holding
    /// before is a handoff — unless this is the first scan, which sees
    /// holders that came before top.
    pub fn update_under(&mut self, root: &str, scan: &Scan, now: Instant) {
        let mut recipes: Vec<Inspection> = self
            .recipes
            .iter()
            .filter(|r| !is_under(root, &r.path))
            .cloned()
            .collect();
        recipes.extend(scan.recipes.iter().cloned());
        // A kazoo semaphore's acquirers are its waiters already: their
        // queue is no recipe of its own.
        let queues: HashSet<String> = recipes
            .iter()
            .filter(|r| is_kazoo_semaphore(r))
            .map(|r| kazoo_semaphore_lock(&r.path))
            .collect();
        recipes.retain(|r| !queues.contains(&r.path));
        recipes.sort_by(|a, b| a.path.cmp(&b.path));
        let mut since = HashMap::new();
        for recipe in &recipes {
            for p in &recipe.participants {
                let presence = Presence::of(p);
                let known = self.since.get(&presence).filter(|s| s.role == p.role);
                if known.is_none() && p.role == Role::Holder && self.scans > 0 {
                    self.handoffs
                        .entry(recipe.path.clone())
                        .or_default()
                        .push_back(now);
                }
                let first = Since {
                    role: p.role,
                    at: now,
                    before_top: self.scans == 0,
                };
                since.insert(presence, known.copied().unwrap_or(first));
            }
        }
        let present: HashSet<&str> = recipes.iter().map(|r| r.path.as_str()).collect();
        self.handoffs.retain(|path, times| {
            while times
                .front()
                .is_some_and(|t| now.duration_since(*t) > RATE_WINDOW)
            {
                times.pop_front();
            }
            present.contains(path.as_str()) || !times.is_empty()
        });
        self.since = since;
        self.recipes = recipes;
        self.truncated = if root == self.prefix {
            scan.truncated
        } else {
            self.truncated || scan.truncated
        };
        self.scans += 1;
    }

    /// The rows to show at `now`.
    pub fn view(&self, now: Instant) -> View {
        let window = now
            .duration_since(self.started)
            .clamp(Duration::from_secs(1), RATE_WINDOW);
        let recipes = self
            .recipes
            .iter()
            .map(|r| {
                let recent = self.handoffs.get(&r.path).map_or(0, |times| {
                    times
                        .iter()
                        .filter(|t| now.duration_since(**t) <= RATE_WINDOW)
                        .count()
                });
                let mut waiting = 0;
                RecipeRow {
                    path: r.path.clone(),
                    recipe: r.recipe.as_str(),
                    handoffs_per_second: recent as f64 / window.as_secs_f64(),
                    participants: r
                        .participants
                        .iter()
                        .map(|p| {
                            let position = match p.role {
                                Role::Holder => None,
                                Role::Waiter => {
                                    waiting += 1;
                                    Some(waiting)
                                }
                            };
                            let since = self.since.get(&Presence::of(p));
                            ParticipantRow {
                                role: p.role.as_str(),
                                position,
                                fence: p.token.0,
                                session: format!("{:#x}", p.session),
                                for_time: since
                                    .map_or(Duration::ZERO, |s| now.duration_since(s.at)),
                                before_top: since.is_none_or(|s| s.before_top),
                                data: String::from_utf8_lossy(&p.data).into_owned(),
                                access: p.access.map(dlock::Access::as_str),
                                foreign: p.foreign.map(dlock::Foreign::as_str),
                                node: p.node.clone(),
                            }
                        })
                        .collect(),
                }
            })
            .collect();
        View {
            prefix: self.prefix.clone(),
            truncated: self.truncated,
            recipes,
        }
    }
}

/// What the screen shows: one row group per recipe.
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    pub prefix: String,
    pub truncated: bool,
    pub recipes: Vec<RecipeRow>,
}

/// A recipe, with its participants in the order it serves them.
#[derive(Debug, Clone, PartialEq)]
pub struct RecipeRow {
    pub path: String,
    pub recipe: &'static str,
    pub handoffs_per_second: f64,
    pub participants: Vec<ParticipantRow>,
}

/// A holder or a waiter.
#[derive(Debug, Clone, PartialEq)]
pub struct ParticipantRow {
    pub role: &'static str,
    /// A waiter's place in the queue, from 1.
    pub position: Option<usize>,
    pub fence: i64,
    pub session: String,
    /// How long it has held (or waited), as far as top has seen.
    pub for_time: Duration,
    /// Whether it was there at top's first scan: it has held (or waited)
    /// longer than `for_time`, for how long top cannot tell.
    pub before_top: bool,
    pub data: String,
    pub access: Option<&'static str>,
    pub foreign: Option<&'static str>,
    pub node: String,
}

impl ParticipantRow {
    /// The role as shown: `holder`, `waiter 2`, with the read-write half.
    fn role_label(&self) -> String {
        let mut label = self.role.to_string();
        if let Some(n) = self.position {
            label = format!("{label} {n}");
        }
        if let Some(access) = self.access {
            label = format!("{label} ({access})");
        }
        label
    }

    /// Who it is: the foreign client's name, if any, and the node's data.
    fn who(&self) -> String {
        match self.foreign {
            Some(foreign) => format!("[{foreign}] {}", self.data),
            None => self.data.clone(),
        }
    }
}

impl View {
    /// The snapshot as one JSON document (`dlock top --once --json`).
    pub fn to_json(&self) -> serde_json::Value {
        let recipes: Vec<_> = self
            .recipes
            .iter()
            .map(|r| {
                let participants: Vec<_> = r
                    .participants
                    .iter()
                    .map(|p| {
                        serde_json::json!({
                            "role": p.role,
                            "position": p.position,
                            "fence": p.fence,
                            "session": p.session,
                            "node": p.node,
                            "data": p.data,
                            "access": p.access,
                            "foreign": p.foreign,
                            "seen_for_ms": p.for_time.as_millis() as u64,
                            "seen_at_start": p.before_top,
                        })
                    })
                    .collect();
                serde_json::json!({
                    "path": r.path,
                    "recipe": r.recipe,
                    "handoffs_per_second": r.handoffs_per_second,
                    "participants": participants,
                })
            })
            .collect();
        serde_json::json!({
            "prefix": self.prefix,
            "truncated": self.truncated,
            "recipes": recipes,
        })
    }

    /// How many lines the recipes' table takes (header included).
    fn table_height(&self) -> usize {
        1 + self
            .recipes
            .iter()
            .map(|r| 1 + r.participants.len())
            .sum::<usize>()
    }
}

/// A duration as `1h02m`, `3m07s`, `12s`, `0.4s`.
fn short(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=9 => format!("{:.1}s", d.as_secs_f64()),
        10..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// `path` below `prefix`, as the screen shows it (the title names the
/// prefix); `path` itself if it is the prefix.
fn relative<'a>(prefix: &str, path: &'a str) -> &'a str {
    let below = path
        .strip_prefix(prefix)
        .map(|rest| rest.trim_start_matches('/'));
    match below {
        Some(rest)
            if !rest.is_empty() && (prefix == "/" || path[prefix.len()..].starts_with('/')) =>
        {
            rest
        }
        _ => path,
    }
}

/// The last `n` characters of a node name, where its sequence is
/// (`…-lock-0000000042`).
fn tail(name: &str, n: usize) -> String {
    let count = name.chars().count();
    if count <= n {
        return name.to_string();
    }
    let kept: String = name.chars().skip(count - (n - 1)).collect();
    format!("…{kept}")
}

/// Draws `view` into `area` of `buf`: a title line, then one table of
/// recipes and their participants.
pub fn render(view: &View, status: &str, area: Rect, buf: &mut Buffer) {
    let [title, table] = Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(area);
    let mut heading = format!(
        "dlock top {}: {} recipe(s){} · times since first seen",
        view.prefix,
        view.recipes.len(),
        if view.truncated {
            " (limits reached: not all shown)"
        } else {
            ""
        },
    );
    if !status.is_empty() {
        heading = format!("{heading} · {status}");
    }
    Paragraph::new(Line::from(heading).style(Style::new().add_modifier(Modifier::REVERSED)))
        .render(title, buf);
    let bold = Style::new().add_modifier(Modifier::BOLD);
    let mut rows = Vec::with_capacity(view.table_height());
    for r in &view.recipes {
        rows.push(
            Row::new(vec![
                Cell::from(relative(&view.prefix, &r.path).to_string()),
                Cell::from(r.recipe),
                Cell::from(""),
                Cell::from(""),
                Cell::from(""),
                // The widest column: the rate fits whatever the width.
                Cell::from(format!("{:.1} handoffs/s", r.handoffs_per_second)),
            ])
            .style(bold),
        );
        for p in &r.participants {
            rows.push(Row::new(vec![
                Cell::from(format!("  {}", tail(dlock::path::node_name(&p.node), 20))),
                Cell::from(p.role_label()),
                Cell::from(p.fence.to_string()),
                Cell::from(p.session.clone()),
                Cell::from(format!(
                    "{}{}",
                    if p.before_top { "≥" } else { "" },
                    short(p.for_time)
                )),
                Cell::from(p.who()),
            ]));
        }
    }
    Table::new(
        rows,
        [
            Constraint::Fill(1),
            Constraint::Length(14),
            Constraint::Length(12),
            Constraint::Length(18),
            Constraint::Length(7),
            Constraint::Fill(1),
        ],
    )
    .header(
        Row::new(["RECIPE / NODE", "ROLE", "FENCE", "SESSION", "FOR", "WHO"])
            .style(Style::new().add_modifier(Modifier::UNDERLINED)),
    )
    .render(table, buf);
}

/// A buffer's lines as text, trailing blanks trimmed.
pub fn buffer_lines(buf: &Buffer) -> Vec<String> {
    let width = buf.area.width as usize;
    buf.content()
        .chunks(width.max(1))
        .map(|line| {
            line.iter()
                .map(|c| c.symbol())
                .collect::<String>()
                .trim_end()
                .to_string()
        })
        .collect()
}

/// `dlock top [PREFIX]`.
pub async fn top(global: &Global, args: TopArgs) -> Result<u8> {
    dlock::path::validate(&args.prefix)?;
    let limits = Limits {
        depth: args.depth,
        directories: args.max_dirs.max(1),
    };
    let session = global.connect_remote().await?;
    let result = if args.once {
        once(&session, &args, limits).await
    } else {
        live(&session, &args.prefix, limits).await
    };
    session.close().await;
    result
}

async fn once(session: &Session, args: &TopArgs, limits: Limits) -> Result<u8> {
    let now = Instant::now();
    let mut model = Model::new(&args.prefix, now);
    model.update(&scan(session, &args.prefix, limits, false).await?, now);
    let view = model.view(now);
    if args.json {
        println!("{}", view.to_json());
    } else {
        // A screen buffer has at most u16::MAX lines: the rest are cut,
        // and said to be.
        let rows = view.table_height();
        let shown = rows.min(usize::from(u16::MAX - 1));
        let area = Rect::new(0, 0, 120, 1 + shown as u16);
        let mut buf = Buffer::empty(area);
        render(&view, "", area, &mut buf);
        for line in buffer_lines(&buf) {
            println!("{line}");
        }
        if shown < rows {
            eprintln!("dlock: showed {shown} of {rows} rows; --json lists them all");
        }
    }
    Ok(0)
}

/// The live view, until `q`, Esc or Ctrl-C — or SIGTERM, SIGHUP, SIGQUIT
/// or a SIGINT from `kill`, which would otherwise end dlock with the
/// terminal left raw, on the alternate screen, its cursor hidden.
async fn live(session: &Session, prefix: &str, limits: Limits) -> Result<u8> {
    let signals = crate::run::Signals::new()?;
    let mut terminal = ratatui::try_init()?;
    let result = live_loop(&mut terminal, signals, session, prefix, limits).await;
    ratatui::restore();
    result
}

async fn live_loop(
    terminal: &mut ratatui::DefaultTerminal,
    mut signals: crate::run::Signals,
    session: &Session,
    prefix: &str,
    limits: Limits,
) -> Result<u8> {
    use crossterm::event::{Event, KeyCode, KeyEventKind, KeyModifiers};
    let mut model = Model::new(prefix, Instant::now());
    let mut keys = crossterm::event::EventStream::new();
    let mut clock = tokio::time::interval(Duration::from_secs(1));
    let status = format!("{} · q quits", session.backend());
    // Each armed watch waits in a task of its own, which names the
    // directory to scan again when it fires; a scan of a directory drops
    // the watches it re-arms, and those of what is gone below it.
    let (fired_tx, mut fired) = tokio::sync::mpsc::unbounded_channel();
    let mut armed = Watches::default();
    let mut pending = vec![(prefix.to_string(), 0usize)];
    loop {
        while let Ok(more) = fired.try_recv() {
            pending.push(more);
        }
        for (root, depth) in outermost(std::mem::take(&mut pending)) {
            armed.drop_under(&root);
            let found = scan_from(session, &root, depth, limits, true).await?;
            model.update_under(&root, &found, Instant::now());
            for a in found.watches {
                let tx = fired_tx.clone();
                let (rescan, depth, watch) = (a.rescan.clone(), a.depth, a.watch);
                let task = tokio::spawn(async move {
                    watch.changed().await;
                    let _ = tx.send((rescan, depth));
                });
                armed.insert(a.watched, a.rescan, task);
            }
        }
        loop {
            let view = model.view(Instant::now());
            terminal.draw(|frame| render(&view, &status, frame.area(), frame.buffer_mut()))?;
            tokio::select! {
                rescan = fired.recv() => {
                    pending.extend(rescan);
                    break;
                }
                _ = clock.tick() => {}
                signal = signals.next() => return Ok(128u8.saturating_add(signal as u8)),
                event = keys.next() => match event {
                    Some(Ok(Event::Key(key))) if key.kind == KeyEventKind::Press => {
                        let ctrl_c = key.code == KeyCode::Char('c')
                            && key.modifiers.contains(KeyModifiers::CONTROL);
                        if ctrl_c || matches!(key.code, KeyCode::Char('q') | KeyCode::Esc) {
                            return Ok(0);
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(e.into()),
                    None => return Ok(0),
                },
            }
        }
    }
}

/// The armed watches' tasks, by what they watch and what they rescan (one
/// node can be watched for two: a kazoo semaphore's `-__lock__` sibling,
/// for its semaphore and as a directory of its own); dropping one (or all)
/// drops its watch.
#[derive(Default)]
struct Watches(HashMap<(String, String), tokio::task::JoinHandle<()>>);

impl Watches {
    fn insert(&mut self, watched: String, rescan: String, task: tokio::task::JoinHandle<()>) {
        if let Some(old) = self.0.insert((watched, rescan), task) {
            old.abort();
        }
    }

    /// Drops the watches on `root` and below it.
    fn drop_under(&mut self, root: &str) {
        self.0.retain(|(watched, _), task| {
            let node = match watched.trim_end_matches('/') {
                "" => "/",
                node => node,
            };
            let under = is_under(root, node);
            if under {
                task.abort();
            }
            !under
        });
    }
}

impl Drop for Watches {
    fn drop(&mut self) {
        self.0.values().for_each(|task| task.abort());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    /// Scans `prefix` until `done` holds for what is seen, waiting on the
    /// scan's own watches between scans; bounded by twice the session
    /// timeout.
    async fn scan_until(
        session: &Session,
        prefix: &str,
        model: &mut Model,
        done: impl Fn(&Scan) -> bool,
    ) -> Result<()> {
        let bound = session.session_timeout() * 2;
        tokio::time::timeout(bound, async {
            loop {
                let found = scan(session, prefix, Limits::default(), true).await?;
                model.update(&found, Instant::now());
                if done(&found) {
                    return Ok(());
                }
                let watches: Vec<_> = found
                    .watches
                    .into_iter()
                    .map(|a| Box::pin(a.watch.changed()))
                    .collect();
                futures::future::select_all(watches).await;
            }
        })
        .await
        .map_err(|_| anyhow::anyhow!("{prefix}: not seen within {bound:?}"))?
    }

    fn participants(found: &Scan) -> Vec<(Role, i64)> {
        found
            .recipes
            .iter()
            .flat_map(|r| r.participants.iter().map(|p| (p.role, p.token.0)))
            .collect()
    }

    /// Deletes `path` and everything under it.
    async fn remove_tree(session: &Session, path: &str) -> Result<()> {
        let children = match session.children(path).await {
            Ok(children) => children,
            Err(Error::NoNode { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        for child in children {
            Box::pin(remove_tree(session, &dlock::path::join(path, &child.name))).await?;
        }
        match session.delete(path, None).await {
            Ok(()) | Err(Error::NoNode { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// A holder and a waiter of a real mutex, each in its own session,
    /// rendered: the holder's line shows its token and comes first, the
    /// waiter's line shows `waiter 1` and its token; when the holder
    /// releases, the next scan sees the waiter hold and counts a handoff.
    async fn holder_and_waiter_are_rendered_in_order(
        holder: Session,
        other: Session,
    ) -> Result<()> {
        let root = format!("/top-{}", uuid::Uuid::new_v4().simple());
        let path = format!("{root}/jobs/nightly");
        let guard = dlock::Mutex::new(&holder, &path)?.acquire().await?;
        let queued = dlock::Mutex::new(&other, &path)?;
        let waiter = tokio::spawn(async move { queued.acquire().await });
        let mut model = Model::new(&root, Instant::now());
        scan_until(&holder, &root, &mut model, |s| participants(s).len() == 2).await?;
        let view = model.view(Instant::now());
        let waiter_token = view.recipes[0].participants[1].fence;

        let mut terminal = Terminal::new(TestBackend::new(110, 8))?;
        terminal.draw(|f| render(&view, "test", f.area(), f.buffer_mut()))?;
        let lines = buffer_lines(terminal.backend().buffer());
        // The line with `needle` as a field of its own.
        let find = |needle: &str| {
            lines
                .iter()
                .position(|l| l.split_whitespace().any(|field| field == needle))
                .unwrap_or_else(|| panic!("no line with {needle:?} in {lines:#?}"))
        };
        let holder_line = find(&guard.token().to_string());
        let waiter_line = find(&waiter_token.to_string());
        assert!(lines[holder_line].contains("holder"), "{lines:#?}");
        assert!(
            lines[holder_line].contains(&format!("{:#x}", holder.session_id())),
            "{lines:#?}"
        );
        assert!(lines[waiter_line].contains("waiter 1"), "{lines:#?}");
        assert!(
            lines[waiter_line].contains(&format!("{:#x}", other.session_id())),
            "{lines:#?}"
        );
        assert!(holder_line < waiter_line, "{lines:#?}");
        assert!(lines[find("jobs/nightly")].contains("mutex"), "{lines:#?}");
        assert!(
            lines[0].contains(&format!("dlock top {root}")),
            "{lines:#?}"
        );
        assert!(guard.token().0 < waiter_token);

        guard.release().await?;
        scan_until(&holder, &root, &mut model, |s| {
            participants(s) == [(Role::Holder, waiter_token)]
        })
        .await?;
        assert!(model.view(Instant::now()).recipes[0].handoffs_per_second > 0.0);
        waiter.await??.release().await?;
        remove_tree(&holder, &root).await?;
        assert_eq!(holder.exists(&root).await?, None);
        holder.close().await;
        other.close().await;
        Ok(())
    }

    /// Consul's `api.Lock` key stays `.lock` from one holder to the next: a
    /// new session holding it is a handoff, and its time starts anew.
    #[tokio::test]
    async fn a_new_holder_of_the_same_key_is_a_handoff() -> Result<()> {
        let server = dlock::store::embedded::EmbeddedServer::new();
        let (a, b) = (
            server.connect_default().await?,
            server.connect_default().await?,
        );
        let root = "/top-same-key";
        let prefix = format!("{root}/job");
        let first = dlock::ConsulLock::new(&a, &prefix)?.acquire().await?;
        let start = Instant::now();
        let mut model = Model::new(root, start);
        model.update(&scan(&a, root, Limits::default(), false).await?, start);
        first.release().await?;
        let next = dlock::ConsulLock::new(&b, &prefix)?.acquire().await?;
        let later = start + Duration::from_secs(5);
        model.update(&scan(&a, root, Limits::default(), false).await?, later);
        let view = model.view(later);
        let holder = &view.recipes[0].participants[0];
        assert_eq!(holder.session, format!("{:#x}", b.session_id()), "{view:?}");
        assert!(view.recipes[0].handoffs_per_second > 0.0, "{view:?}");
        assert_eq!(holder.for_time, Duration::ZERO, "{view:?}");
        assert!(!holder.before_top, "{view:?}");
        next.release().await?;
        remove_tree(&a, root).await?;
        Ok(())
    }

    /// A kazoo semaphore's acquirers queue at the sibling `-__lock__`: top
    /// watches it for the semaphore, lists them as its waiters, and shows
    /// no mutex of its own for that queue.
    #[tokio::test]
    async fn a_kazoo_semaphore_s_acquirers_are_its_waiters() -> Result<()> {
        let server = dlock::store::embedded::EmbeddedServer::new();
        let (a, b) = (
            server.connect_default().await?,
            server.connect_default().await?,
        );
        let root = "/top-kazoo-semaphore";
        let path = format!("{root}/api");
        let kazoo = |s: &Session| {
            dlock::Semaphore::new(s, &path, 1).and_then(|s| s.with_layout(dlock::Layout::Kazoo))
        };
        let lease = kazoo(&a)?.acquire_one().await?;
        let now = Instant::now();
        let mut model = Model::new(root, now);
        let found = scan(&a, root, Limits::default(), true).await?;
        model.update(&found, now);
        let queue = format!("{path}-__lock__/");
        let armed = found
            .watches
            .into_iter()
            .find(|w| w.watched == queue && w.rescan == path)
            .expect("the acquirers' queue is watched for the semaphore");
        let waiting = kazoo(&b)?;
        let waiter = tokio::spawn(async move { waiting.acquire_one().await });
        tokio::time::timeout(Duration::from_secs(20), armed.watch.changed()).await?;
        let again = scan_from(&a, &armed.rescan, armed.depth, Limits::default(), false).await?;
        model.update_under(&armed.rescan, &again, Instant::now());
        let roles = |model: &Model| -> Vec<(String, &'static str)> {
            let view = model.view(Instant::now());
            let rows = view
                .recipes
                .iter()
                .flat_map(|r| r.participants.iter().map(|p| (r.path.clone(), p.role)));
            rows.collect()
        };
        let want = [(path.clone(), "holder"), (path.clone(), "waiter")];
        assert_eq!(roles(&model), want);
        // A scan of the whole prefix finds the queue too: one recipe still.
        model.update(
            &scan(&a, root, Limits::default(), false).await?,
            Instant::now(),
        );
        assert_eq!(roles(&model), want);
        lease.release().await?;
        waiter.await??.release().await?;
        remove_tree(&a, root).await?;
        Ok(())
    }

    /// A fired watch of a directory below another fired one is covered by
    /// the other's scan; siblings that share a name's start are not.
    #[test]
    fn only_the_outermost_fired_directories_are_scanned() {
        let fired = vec![
            ("/a/b/c".to_string(), 2),
            ("/a/bc".to_string(), 1),
            ("/a/b".to_string(), 1),
            ("/a/b".to_string(), 1),
        ];
        assert_eq!(
            outermost(fired),
            [("/a/b".to_string(), 1), ("/a/bc".to_string(), 1)]
        );
        assert_eq!(
            outermost(vec![("/x".into(), 1), ("/".into(), 0)]),
            [("/".to_string(), 0)]
        );
    }

    #[test]
    fn recipe_paths_show_below_the_prefix_and_node_names_by_their_tail() {
        assert_eq!(relative("/locks", "/locks/jobs/a"), "jobs/a");
        assert_eq!(relative("/", "/locks/a"), "locks/a");
        assert_eq!(relative("/locks", "/locks"), "/locks");
        assert_eq!(relative("/lo", "/locks/a"), "/locks/a");
        assert_eq!(tail("_c_6f1e-lock-0000000042", 20), "…f1e-lock-0000000042");
        assert_eq!(tail("short", 20), "short");
    }

    #[tokio::test]
    async fn embedded_holder_and_waiter_are_rendered_in_order() -> Result<()> {
        let server = dlock::store::embedded::EmbeddedServer::new();
        let (a, b) = (
            server.connect_default().await?,
            server.connect_default().await?,
        );
        holder_and_waiter_are_rendered_in_order(a, b).await
    }

    #[tokio::test]
    async fn zookeeper_holder_and_waiter_are_rendered_in_order() -> Result<()> {
        let endpoint = format!("zk://{}", dlock_testkit::shared_zk().connect_string());
        let (a, b) = (
            dlock::connect(&endpoint).await?,
            dlock::connect(&endpoint).await?,
        );
        holder_and_waiter_are_rendered_in_order(a, b).await
    }
}
