//! `dlock members join|list|watch` (a GroupMember, Curator's layout) and
//! `dlock observe` (an election's leader, without taking part): printers of
//! the library's `GroupMember`, children cache and leader observer.

use std::time::Duration;

use anyhow::Result;
use clap::{Args, Subcommand};
use dlock::recipes::group_member::{member_events, members_of, watch_group};
use dlock::{GroupMember, LeaderParticipant, MemberEvent, Session};
use futures::StreamExt;

use crate::commands::printable;
use crate::run::{self, pass_on, Signals};
use crate::Global;

/// `dlock members ...`: a group's membership (Curator's GroupMember).
#[derive(Debug, Subcommand)]
pub enum MembersCommand {
    /// Join the group at PATH as ID (an ephemeral node PATH/ID holding
    /// PAYLOAD) until dlock is stopped (SIGINT, SIGTERM, SIGHUP, SIGQUIT:
    /// it leaves and exits 0) — or, with `-- CMD`, while CMD runs (then dlock exits with
    /// CMD's code). A node that vanishes is created again.
    ///
    /// Example: dlock members join /groups/workers host-a --payload 10.0.0.5:8080 -- ./serve.sh
    Join(JoinArgs),
    /// Print the group's members, one `ID PAYLOAD` line each (or one JSON
    /// object, id → payload).
    ///
    /// Example: dlock members list /groups/workers --json
    List {
        /// The group's membership path.
        path: String,
        /// Print JSON for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Print the members, then every join, payload update and departure as
    /// it happens (`joined ID PAYLOAD`, `updated ID PAYLOAD`, `left ID`, or
    /// one JSON line each), until stopped.
    ///
    /// Example: dlock members watch /groups/workers --json
    Watch {
        /// The group's membership path.
        path: String,
        /// Print one JSON object per line.
        #[arg(long)]
        json: bool,
    },
}

/// Arguments of `members join`.
#[derive(Debug, Args)]
pub struct JoinArgs {
    /// The group's membership path.
    pub path: String,
    /// This member's id: one path segment, unique in the group.
    pub id: String,
    /// The member's payload (default: this host's address, as Curator).
    #[arg(long)]
    pub payload: Option<String>,
    /// A command to run while a member, after `--`; it gets DLOCK_MEMBER
    /// (the member's node) and DLOCK_ENDPOINT.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Arguments of `observe`.
#[derive(Debug, Args)]
pub struct ObserveArgs {
    /// The election's path (a LeaderLatch's or a LeaderSelector's, as
    /// Curator or dlock writes it).
    pub path: String,
    /// Print one JSON object per line.
    #[arg(long)]
    pub json: bool,
}

/// Runs a `members` command.
pub async fn members(global: &Global, command: MembersCommand) -> Result<u8> {
    let path = match &command {
        MembersCommand::Join(args) => &args.path,
        MembersCommand::List { path, .. } | MembersCommand::Watch { path, .. } => path,
    };
    crate::commands::refuse_bad_paths("a group", [path.as_str()])?;
    let session = global.connect_remote().await?;
    let result = match command {
        MembersCommand::Join(args) => join(global, &session, args).await,
        MembersCommand::List { path, json } => list(&session, &path, json).await,
        MembersCommand::Watch { path, json } => watch(&session, &path, json).await,
    };
    session.close().await;
    result
}

fn text(payload: &[u8]) -> String {
    String::from_utf8_lossy(payload).into_owned()
}

async fn join(global: &Global, session: &Session, args: JoinArgs) -> Result<u8> {
    let mut stop = Signals::new()?;
    let mut member = GroupMember::new(session, &args.path, &args.id)?;
    if let Some(payload) = args.payload {
        member = member.with_payload(payload.into_bytes());
    }
    member.start().await?;
    eprintln!("dlock: joined {} as {}", args.path, member.node());
    let code = match args.command.split_first() {
        None => {
            stop.next().await;
            0
        }
        Some((program, rest)) => {
            let endpoint = global.endpoint()?.without_credentials().to_string();
            // As `dlock lock` runs its CMD (a member that is gone must not
            // go on serving).
            let env = [
                ("DLOCK_MEMBER", member.node()),
                ("DLOCK_ENDPOINT", &endpoint),
            ];
            let (mut child, cmd) = match run::spawn_cmd(program, rest, &env) {
                Ok(spawned) => spawned,
                Err(e) => {
                    member.close().await?;
                    return Err(e);
                }
            };
            tokio::select! {
                status = child.wait() => run::exit_code(status?),
                signal = stop.next() => {
                    // Pass it on, and leave once the command is done; a
                    // second signal stops it at once (128 + that signal,
                    // as `lock` ends).
                    pass_on(signal, cmd.group, |signal| cmd.signal(signal));
                    tokio::select! {
                        status = child.wait() => run::exit_code(status?),
                        second = stop.next() => {
                            eprintln!("dlock: a second signal — stopping the command now");
                            run::stop(&mut child, cmd, Duration::ZERO).await;
                            128u8.saturating_add(second as u8)
                        }
                    }
                }
            }
        }
    };
    member.close().await?;
    Ok(code)
}

async fn list(session: &Session, path: &str, json: bool) -> Result<u8> {
    let group = watch_group(session, path).await?;
    let members = members_of(&group);
    group.close().await;
    if json {
        let object: serde_json::Map<String, serde_json::Value> = members
            .iter()
            .map(|(id, payload)| (id.clone(), text(payload).into()))
            .collect();
        println!("{}", serde_json::Value::Object(object));
    } else {
        for (id, payload) in &members {
            println!("{} {}", printable(id.as_bytes()), printable(payload));
        }
    }
    Ok(0)
}

fn print_event(event: &MemberEvent, json: bool) {
    let (kind, id, payload) = match event {
        MemberEvent::Joined { id, payload } => ("joined", id, Some(payload)),
        MemberEvent::Updated { id, payload } => ("updated", id, Some(payload)),
        MemberEvent::Left { id } => ("left", id, None),
    };
    if json {
        println!(
            "{}",
            serde_json::json!({ "event": kind, "id": id, "payload": payload.map(|p| text(p)) })
        );
    } else {
        match payload {
            Some(p) => println!("{kind} {} {}", printable(id.as_bytes()), printable(p)),
            None => println!("{kind} {}", printable(id.as_bytes())),
        }
    }
}

async fn watch(session: &Session, path: &str, json: bool) -> Result<u8> {
    let mut stop = Signals::new()?;
    let group = watch_group(session, path).await?;
    let (now, events) = group.snapshot_and_events();
    for (id, child) in now {
        print_event(
            &MemberEvent::Joined {
                id,
                payload: child.data,
            },
            json,
        );
    }
    let mut events = member_events(events);
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(event) => print_event(&event, json),
                None => break,
            },
            _ = stop.next() => break,
        }
    }
    group.close().await;
    Ok(0)
}

fn print_leader(leader: &Option<LeaderParticipant>, json: bool) {
    match (leader, json) {
        (Some(l), true) => println!(
            "{}",
            serde_json::json!({ "leader": l.id, "node": l.node, "epoch": l.epoch.0 })
        ),
        (None, true) => println!("{}", serde_json::json!({ "leader": null })),
        // The id is any client's data: a newline in it must not make a line.
        (Some(l), false) => {
            let id = crate::commands::printable(l.id.as_bytes());
            println!("leader {id} {} {}", l.node, l.epoch)
        }
        (None, false) => println!("no leader"),
    }
}

/// `dlock observe PATH`: the leader now, then every new leader, until
/// stopped.
pub async fn observe(global: &Global, args: ObserveArgs) -> Result<u8> {
    crate::commands::refuse_bad_paths("an election", [args.path.as_str()])?;
    let session = global.connect_remote().await?;
    let result = async {
        let mut stop = Signals::new()?;
        let observer = dlock::observe(&session, &args.path).await?;
        let mut leaders = observer.leader_changes();
        loop {
            tokio::select! {
                leader = leaders.next() => match leader {
                    Some(leader) => print_leader(&leader, args.json),
                    None => break,
                },
                _ = stop.next() => break,
            }
        }
        observer.close().await;
        anyhow::Ok(0)
    }
    .await;
    session.close().await;
    result
}
