//! KvSemaphore (the Consul design: session entries + a compare-and-set
//! record), on every backend.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use common::tests1::{rivals, Occupancy};
use common::{await_children, persistent, queued, sorted_names, Harness};
use dlock::recipes::kv_semaphore::{holder_id, KvLease, KvSemaphore, Record, RECORD};
use dlock::{Error, RetryPolicy, Session, SessionOptions};
use tokio::task::JoinHandle;

const WITHIN: Duration = Duration::from_secs(20);
const SHORT: Duration = Duration::from_millis(200);

async fn record(session: &Session, path: &str) -> Result<Option<Record>> {
    match session.get_data(&format!("{path}/{RECORD}")).await {
        Ok((data, _)) => Ok(Some(Record::parse(path, &data)?)),
        Err(Error::NoNode { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// `sem`'s acquire, started in the background, once the lot at `path` (as
/// `observer` lists it) has `nodes` nodes: the record and the entries.
async fn queued_for(
    observer: &Session,
    path: &str,
    nodes: usize,
    sem: &KvSemaphore,
) -> Result<JoinHandle<dlock::Result<KvLease>>> {
    let sem = sem.clone();
    queued(
        observer,
        path,
        nodes,
        WITHIN,
        async move { sem.acquire().await },
    )
    .await
}

/// The layout: an ephemeral entry named after the session, and the JSON
/// record; the last release removes the entry and leaves the record
/// without holders.
async fn the_layout_is_the_consul_design(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/lot");
    let lease = KvSemaphore::new(&s, &path, 2)?.acquire().await?;
    let me = holder_id(s.session_id());
    ensure!(lease.holder() == me && lease.node() == format!("{path}/{me}"));
    let (_, entry) = s.get_data(lease.node()).await?;
    ensure!(
        entry.ephemeral_owner == s.session_id(),
        "the entry lives with the session"
    );
    let (data, stat) = s.get_data(&format!("{path}/{RECORD}")).await?;
    ensure!(stat.ephemeral_owner == 0, "the record is persistent");
    ensure!(String::from_utf8(data)? == format!(r#"{{"limit":2,"holders":["{me}"]}}"#));
    ensure!(
        lease.token().0 == stat.mzxid,
        "the token is the admitting write's zxid"
    );
    let second = KvSemaphore::new(&h.session().await, &path, 2)?
        .acquire()
        .await?;
    ensure!(second.token() > lease.token());
    lease.release().await?;
    ensure!(record(&s, &path).await?.context("record")?.holders == [second.holder()]);
    second.release().await?;
    let (data, left) = s.get_data(&format!("{path}/{RECORD}")).await?;
    ensure!(
        String::from_utf8(data)? == r#"{"limit":2,"holders":[]}"# && left.version > stat.version,
        "the last release leaves the record without holders, its version moved on"
    );
    let left: Vec<String> = s
        .children(&path)
        .await?
        .into_iter()
        .map(|c| c.name)
        .collect();
    ensure!(left == [RECORD], "only the record is left: {left:?}");
    Ok(())
}

/// ABA: a compare-and-set on a version read before the last holder left
/// never lands once others joined since — as a contender that read the
/// record, then stalled, would write. (A record deleted by the last holder
/// and made again by the next would be back at that version.)
async fn a_stale_compare_and_set_never_lands_on_a_later_record(h: &Harness) -> Result<()> {
    let path = h.path("/lot");
    let node = format!("{path}/{RECORD}");
    let (b, d) = (h.session().await, h.session().await);
    let first = KvSemaphore::new(&b, &path, 1)?.acquire().await?;
    let (_, read) = b.get_data(&node).await?;
    first.release().await?;
    let next = KvSemaphore::new(&d, &path, 1)?.acquire().await?;
    let stalled = Record {
        limit: 1,
        holders: vec!["00000000deadbeef".into()],
    };
    let stalled = stalled.to_json();
    let written = b
        .set_data(&node, stalled.as_bytes(), Some(read.version))
        .await;
    ensure!(
        matches!(written, Err(Error::BadVersion { .. })),
        "a stale compare-and-set landed: {written:?}"
    );
    ensure!(record(&d, &path).await?.context("record")?.holders == [next.holder()]);
    next.release().await?;
    Ok(())
}

/// Never more holders than the limit, with many contenders competing.
async fn the_limit_holds_under_contention(h: &Harness) -> Result<()> {
    let path = h.path("/lot");
    let (inside, done) = (
        Arc::new(Occupancy::default()),
        Arc::new(AtomicUsize::new(0)),
    );
    let mut cars = Vec::new();
    for _ in 0..8 {
        let sem = KvSemaphore::new(&h.session().await, &path, 3)?;
        let (inside, done) = (inside.clone(), done.clone());
        cars.push(tokio::spawn(async move {
            for _ in 0..3 {
                let lease = sem.acquire_timeout(WITHIN).await?;
                inside.enter();
                let holders = sem.holders().await?;
                ensure!(
                    holders.len() <= 3 && holders.iter().any(|h| h == lease.holder()),
                    "{holders:?}"
                );
                tokio::time::sleep(Duration::from_millis(3)).await; // parked
                inside.leave();
                lease.release().await?;
                done.fetch_add(1, Ordering::SeqCst);
            }
            anyhow::Ok(())
        }));
    }
    for car in cars {
        tokio::time::timeout(WITHIN, car).await???;
    }
    let peak = inside.peak();
    ensure!(peak > 0 && peak <= 3, "peak {peak}");
    ensure!(done.load(Ordering::SeqCst) == 24);
    Ok(())
}

/// A full semaphore: trying fails, waiting times out, and a release admits
/// the waiter (woken by the watch, not by polling).
async fn a_release_admits_a_waiter(h: &Harness) -> Result<()> {
    let path = h.path("/lot");
    let (sa, sb, sc) = (h.session().await, h.session().await, h.session().await);
    let a = KvSemaphore::new(&sa, &path, 2)?.acquire().await?;
    let b = KvSemaphore::new(&sb, &path, 2)?.acquire().await?;
    let c = KvSemaphore::new(&sc, &path, 2)?;
    ensure!(c.try_acquire().await?.is_none());
    ensure!(c.acquire_timeout(SHORT).await.unwrap_err() == Error::Timeout(SHORT));
    ensure!(
        sorted_names(&sa, &path).await?.len() == 3,
        "no entry left by the failed tries"
    );
    // .lock + 3 entries
    let waiter = queued_for(&sa, &path, 4, &c).await?;
    ensure!(!waiter.is_finished());
    a.release().await?;
    let c_lease = tokio::time::timeout(WITHIN, waiter).await???;
    let rec = record(&sa, &path).await?.context("record")?;
    ensure!(
        rec.limit == 2 && rec.holders == [b.holder(), c_lease.holder()],
        "{rec:?}"
    );
    b.release().await?;
    c_lease.release().await?;
    Ok(())
}

/// A holder whose session expires is pruned by the next contender, which
/// takes its slot; the dead holder's late release does not disturb anyone.
async fn an_expired_holder_is_pruned(h: &Harness) -> Result<()> {
    let lot = rivals(h, "/lot", |s, p| KvSemaphore::new(s, p, 1)).await?;
    let (s1, s2, path) = (&lot.first, &lot.second, &lot.path);
    let dead = lot.mine.acquire().await?;
    let waiter = queued_for(s2, path, 3, &lot.theirs).await?;
    s1.faults().context("faults")?.expire().await?;
    let lease = tokio::time::timeout(WITHIN, waiter).await???;
    ensure!(dead.is_lost());
    tokio::time::timeout(WITHIN, dead.lost()).await?;
    let rec = record(s2, path).await?.context("record")?;
    ensure!(
        rec.holders == [lease.holder()],
        "the dead holder was pruned: {rec:?}"
    );
    let err = dead.release().await.unwrap_err();
    ensure!(matches!(err, Error::Lost { .. }), "{err}");
    let rec = record(s2, path).await?.context("record")?;
    ensure!(rec.holders == [lease.holder()], "{rec:?}");
    lease.release().await?;
    Ok(())
}

/// Stale holders in the record (their sessions gone before anyone looked)
/// are pruned when a contender joins.
async fn stale_holders_are_pruned_on_join(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/lot");
    let stale = Record {
        limit: 2,
        holders: vec!["00000000deadbeef".into(), "00000000cafebabe".into()],
    };
    s.create(
        &format!("{path}/{RECORD}"),
        stale.to_json().as_bytes(),
        persistent(),
    )
    .await?;
    let lease = KvSemaphore::new(&s, &path, 2)?
        .try_acquire()
        .await?
        .context("slots of dead holders")?;
    ensure!(record(&s, &path).await?.context("record")?.holders == [lease.holder()]);
    lease.release().await?;
    ensure!(record(&s, &path)
        .await?
        .context("record")?
        .holders
        .is_empty());
    Ok(())
}

/// Contenders that disagree on the limit get a clear error, and leave no
/// entry behind.
async fn a_limit_mismatch_is_an_error(h: &Harness) -> Result<()> {
    let path = h.path("/lot");
    let (s1, s2) = (h.session().await, h.session().await);
    let lease = KvSemaphore::new(&s1, &path, 2)?.acquire().await?;
    let err = KvSemaphore::new(&s2, &path, 3)?
        .acquire()
        .await
        .unwrap_err();
    ensure!(matches!(err, Error::InvalidArgument(_)), "{err}");
    let text = err.to_string();
    ensure!(
        text.contains("limit conflict")
            && text.contains("limit of 2")
            && text.contains("contender 3"),
        "{text}"
    );
    ensure!(sorted_names(&s1, &path).await? == [RECORD.to_string(), lease.holder().to_string()]);
    let err = KvSemaphore::new(&s2, &path, 0).unwrap_err();
    ensure!(matches!(err, Error::InvalidArgument(_)), "{err}");
    lease.release().await?;
    Ok(())
}

/// One session holds one slot of a semaphore; a second acquire on it is a
/// typed error, not a deadlock.
async fn one_slot_per_session(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let sem = KvSemaphore::new(&s, &h.path("/lot"), 3)?;
    let lease = sem.acquire().await?;
    let err = sem.try_acquire().await.unwrap_err();
    ensure!(
        matches!(err, Error::InvalidArgument(_))
            && err.to_string().contains("one lease per session"),
        "{err}"
    );
    ensure!(
        s.exists(lease.node()).await?.is_some(),
        "the holder's entry survives"
    );
    lease.release().await?;
    Ok(())
}

/// A lease dropped (given back in the background) and a slot taken again
/// at once in the same session, as a loop whose body holds a lease does:
/// the new acquire waits for the old entry to go, rather than take it for
/// another handle's lease.
async fn a_dropped_lease_can_be_taken_again_at_once(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/lot");
    for round in 0..20 {
        let _lease = KvSemaphore::new(&s, &path, 1)?
            .acquire_timeout(WITHIN)
            .await
            .with_context(|| format!("round {round}"))?;
    }
    s.background_idle().await;
    let left = record(&s, &path).await?.context("the record")?;
    ensure!(left.holders.is_empty(), "all given back: {left:?}");
    Ok(())
}

/// A cancelled waiter removes its entry; a dropped lease goes back.
async fn cancellation_and_drop_leave_nothing(h: &Harness) -> Result<()> {
    let lot = rivals(h, "/lot", |s, p| KvSemaphore::new(s, p, 1)).await?;
    let (s1, path, sem2) = (&lot.first, &lot.path, &lot.theirs);
    let held: KvLease = lot.mine.acquire().await?;
    let waiter = queued_for(s1, path, 3, sem2).await?;
    waiter.abort();
    let _ = waiter.await;
    await_children(s1, path, 2, WITHIN).await?;
    drop(held);
    // Only the record, without holders.
    await_children(s1, path, 1, WITHIN).await?;
    let left = record(s1, path).await?.context("the record")?;
    ensure!(left.holders.is_empty(), "{left:?}");
    sem2.acquire_timeout(WITHIN).await?.release().await?;
    Ok(())
}

/// Record writes that go unanswered on a live connection are tried again
/// after the retry policy's pause, and not past the deadline: a timed
/// acquire times out, holding nothing. (Before, they were tried again at
/// once and without end: three failed writes, then a lease.)
async fn unanswered_record_writes_are_paced_and_end_at_the_deadline(h: &Harness) -> Result<()> {
    // Pauses of 100 ms exactly (the policy's are random up to a bound).
    let pause = Duration::from_millis(100);
    let retry = RetryPolicy {
        base_sleep: pause,
        max_sleep: pause,
        ..RetryPolicy::default()
    };
    let options = SessionOptions::default()
        .with_session_timeout(h.timeout())
        .with_retry(retry);
    let s = h.session_with(options).await;
    let path = h.path("/unanswered");
    let sem = KvSemaphore::new(&s, &path, 1)?;
    // The record exists: a join is a set.
    sem.acquire().await?.release().await?;
    // Two writes before the 150 ms deadline, one after it, which is not
    // tried again.
    s.faults().context("faults")?.fail_next_sets(3);
    let timed = sem.acquire_timeout(Duration::from_millis(150));
    let timed = tokio::time::timeout(WITHIN, timed)
        .await
        .context("the acquire did not end")?;
    ensure!(matches!(timed, Err(Error::Timeout(_))), "{timed:?}");
    await_children(&s, &path, 1, WITHIN).await?;
    let left = record(&s, &path).await?.context("the record")?;
    ensure!(left.holders.is_empty(), "{left:?}");
    sem.acquire_timeout(WITHIN).await?.release().await?;
    Ok(())
}

/// A record that is not the expected JSON is a typed error, and the
/// contender's entry is removed.
async fn a_malformed_record_is_a_typed_error(h: &Harness) -> Result<()> {
    let s = h.session().await;
    let path = h.path("/lot");
    let record_path = format!("{path}/{RECORD}");
    for bad in [
        &b"not json"[..],
        br#"{"limit":"3","holders":[]}"#,
        br#"{"limit":3}"#,
        br#"[1,2]"#,
    ] {
        s.create(&record_path, bad, persistent()).await?;
        let err = KvSemaphore::new(&s, &path, 3)?
            .try_acquire()
            .await
            .unwrap_err();
        ensure!(matches!(err, Error::MalformedData { .. }), "{err}");
        await_children(&s, &path, 1, WITHIN).await?;
        s.delete(&record_path, None).await?;
    }
    Ok(())
}

// Every case on every backend.
per_backend!(every_backend {
    unanswered_record_writes_are_paced_and_end_at_the_deadline,
    the_layout_is_the_consul_design,
    a_stale_compare_and_set_never_lands_on_a_later_record,
    a_dropped_lease_can_be_taken_again_at_once,
    the_limit_holds_under_contention,
    a_release_admits_a_waiter,
    an_expired_holder_is_pruned,
    stale_holders_are_pruned_on_join,
    a_limit_mismatch_is_an_error,
    one_slot_per_session,
    cancellation_and_drop_leave_nothing,
    a_malformed_record_is_a_typed_error,
});

/// The record's JSON (from the unit test of the hand-written parser that
/// serde_json replaced): spaces, escapes and other keys are read, broken
/// JSON is refused, and holder ids are escaped on the way out.
#[test]
fn the_record_is_strict_json() {
    let text = r#" { "limit" : 3 , "holders" : [ "a\u00e9\"", "b" ], "x": [null, true, -1.5e2] } "#;
    let record = Record::parse("/s/.lock", text.as_bytes()).unwrap();
    assert_eq!(record.limit, 3);
    assert_eq!(record.holders, ["aé\"", "b"]);
    for bad in [
        "",
        "{",
        "{\"a\"}",
        "[1,]",
        "\"abc",
        "01x",
        "{\"a\":1} x",
        "\"\\ud800\"",
        "tru",
    ] {
        let err = Record::parse("/s/.lock", bad.as_bytes()).unwrap_err();
        assert!(matches!(err, Error::MalformedData { .. }), "{bad:?}");
    }
    let odd = Record {
        limit: 1,
        holders: vec!["q\"\\\n\u{1}".into()],
    };
    assert_eq!(odd.to_json(), r#"{"limit":1,"holders":["q\"\\\n\u0001"]}"#);
    assert_eq!(
        Record::parse("/s/.lock", odd.to_json().as_bytes()).unwrap(),
        odd
    );
}
