//! Histories of what clients did, and checkers for them (after Jepsen):
//! a fenced mutex, a semaphore, leader election. A failing check returns the
//! history around the violation, printed readably.

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What a client did or saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Started an operation (e.g. "acquire").
    Invoke(&'static str),
    /// The operation succeeded, with the fencing token or epoch it got.
    Ok(&'static str, i64),
    /// The operation failed.
    Fail(&'static str, String),
    /// Entered the protected section with this token.
    Enter(i64),
    /// Left the protected section.
    Exit(i64),
}

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Since the history started.
    pub at: Duration,
    /// Which client.
    pub client: usize,
    /// What happened.
    pub event: Event,
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:>9.3}s  client {:<3} {:?}",
            self.at.as_secs_f64(),
            self.client,
            self.event
        )
    }
}

/// A log that many tasks append to, in real-time order.
pub struct History {
    start: Instant,
    entries: Mutex<Vec<Entry>>,
}

impl Default for History {
    fn default() -> Self {
        History {
            start: Instant::now(),
            entries: Mutex::new(Vec::new()),
        }
    }
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `event` by `client` now.
    pub fn record(&self, client: usize, event: Event) {
        let mut entries = self.entries.lock().unwrap();
        entries.push(Entry {
            at: self.start.elapsed(),
            client,
            event,
        });
    }

    /// Everything recorded so far.
    pub fn entries(&self) -> Vec<Entry> {
        self.entries.lock().unwrap().clone()
    }

    /// Checks a semaphore: never more than `limit` clients inside at once,
    /// and no client leaves more often than it entered (an unmatched exit
    /// would hide an entry too many).
    pub fn check_at_most(&self, limit: usize) -> Result<usize, String> {
        let entries = self.entries();
        let mut inside = 0usize;
        let mut max = 0usize;
        let mut held_by: std::collections::HashMap<usize, usize> = Default::default();
        for (i, e) in entries.iter().enumerate() {
            match e.event {
                Event::Enter(_) => {
                    *held_by.entry(e.client).or_default() += 1;
                    inside += 1;
                    max = max.max(inside);
                    if inside > limit {
                        return Err(violation(
                            &entries,
                            i,
                            &format!("{inside} holders inside, limit {limit}"),
                        ));
                    }
                }
                Event::Exit(_) => {
                    let held = held_by.entry(e.client).or_default();
                    if *held == 0 {
                        return Err(violation(
                            &entries,
                            i,
                            &format!("client {} leaves without having entered", e.client),
                        ));
                    }
                    *held -= 1;
                    inside -= 1;
                }
                _ => {}
            }
        }
        Ok(max)
    }

    /// Checks leader election: at most one leader per epoch at any time,
    /// and each new leadership term has a larger epoch than every earlier one.
    pub fn check_leaders(&self) -> Result<usize, String> {
        let entries = self.entries();
        let mut leader: Option<(usize, i64)> = None;
        let mut highest = i64::MIN;
        let mut terms = 0;
        for (i, e) in entries.iter().enumerate() {
            match e.event {
                Event::Enter(epoch) => {
                    if let Some((other, their)) = leader {
                        return Err(violation(&entries, i, &format!("client {} leads (epoch {epoch}) while client {other} leads (epoch {their})", e.client)));
                    }
                    if epoch <= highest {
                        return Err(violation(
                            &entries,
                            i,
                            &format!("epoch {epoch} after epoch {highest}: epochs must grow"),
                        ));
                    }
                    highest = epoch;
                    leader = Some((e.client, epoch));
                    terms += 1;
                }
                Event::Exit(_) if leader.is_some_and(|(c, _)| c == e.client) => leader = None,
                _ => {}
            }
        }
        Ok(terms)
    }
}

/// Checks what a fenced resource accepted, in the order it accepted it:
/// `(token, begin)` marks, `begin = true` for the first write of a holder's
/// critical section. The fencing property: every section starts with a token
/// larger than any accepted before, and once a larger token was accepted no
/// write with a smaller one is (a holder whose lock was lost mid-section is
/// cut off, never interleaved). Returns the number of sections.
pub fn check_fenced_log(log: &[(i64, bool)]) -> Result<usize, String> {
    let mut current: Option<i64> = None;
    let mut sections = 0;
    for (i, &(token, begin)) in log.iter().enumerate() {
        let fail = |why: String| {
            let from = i.saturating_sub(6);
            let lines: Vec<String> = log[from..(i + 3).min(log.len())]
                .iter()
                .enumerate()
                .map(|(j, (t, b))| {
                    format!(
                        "{}{:>5}: token {t} {}",
                        if from + j == i { "=> " } else { "   " },
                        from + j,
                        if *b { "begin" } else { "write" }
                    )
                })
                .collect();
            Err(format!(
                "fenced log violated at write {i}: {why}\n{}",
                lines.join("\n")
            ))
        };
        match (begin, current) {
            (true, Some(last)) if token <= last => {
                return fail(format!(
                    "token {token} began after token {last} was accepted"
                ))
            }
            (true, _) => {
                sections += 1;
                current = Some(token);
            }
            (false, Some(last)) if token == last => {}
            (false, last) => {
                return fail(format!(
                    "a write of token {token} accepted while the current token is {last:?}"
                ))
            }
        }
    }
    Ok(sections)
}

fn violation(entries: &[Entry], at: usize, why: &str) -> String {
    let from = at.saturating_sub(10);
    let lines: Vec<String> = entries[from..(at + 3).min(entries.len())]
        .iter()
        .enumerate()
        .map(|(j, e)| format!("{}{e}", if from + j == at { "=> " } else { "   " }))
        .collect();
    format!(
        "history violated at entry {at}: {why}\n{}",
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenced_logs() {
        assert_eq!(
            check_fenced_log(&[(3, true), (3, false), (5, true), (5, false)]),
            Ok(2)
        );
        // A section cut short by a lost lock is fine; its late write is not.
        assert_eq!(check_fenced_log(&[(3, true), (5, true), (5, false)]), Ok(2));
        let err = check_fenced_log(&[(3, true), (5, true), (3, false)]).unwrap_err();
        assert!(
            err.contains("a write of token 3 accepted while the current token is Some(5)"),
            "{err}"
        );
        let err = check_fenced_log(&[(5, true), (5, false), (3, true), (3, false)]).unwrap_err();
        assert!(
            err.contains("token 3 began after token 5") && err.contains("=> "),
            "{err}"
        );
    }

    #[test]
    fn semaphores_and_leaders() {
        let h = History::new();
        h.record(0, Event::Enter(1));
        h.record(1, Event::Enter(2));
        h.record(0, Event::Exit(1));
        assert_eq!(h.check_at_most(2), Ok(2));
        assert!(h.check_at_most(1).unwrap_err().contains("2 holders inside"));
        assert!(h.check_leaders().unwrap_err().contains("client 1 leads"));
        let l = History::new();
        l.record(0, Event::Enter(4));
        l.record(0, Event::Exit(4));
        l.record(1, Event::Enter(3));
        assert!(l.check_leaders().unwrap_err().contains("epochs must grow"));
        // A stray exit (client 2 never entered) hides no third holder.
        let s = History::new();
        s.record(0, Event::Enter(1));
        s.record(2, Event::Exit(0));
        s.record(1, Event::Enter(2));
        assert!(s.check_at_most(1).unwrap_err().contains("client 2 leaves"));
    }
}
