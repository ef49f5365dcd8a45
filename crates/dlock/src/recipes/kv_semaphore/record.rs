//! The `.lock` record of a [`KvSemaphore`](super::KvSemaphore): who holds,
//! and the limit every contender states, as JSON. The two layouts differ
//! only in their keys' names and in how they list the holders, so each is
//! one serde shape. Also how a write of it that lost a race goes again
//! ([`raced`], [`Unanswered`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::recipes::layout::Layout;

/// The decoded `.lock` record.
///
/// ```
/// use dlock::recipes::kv_semaphore::Record;
/// let r = Record { limit: 3, holders: vec!["00000000000000a1".into()] };
/// let json = r.to_json();
/// assert_eq!(json, r#"{"limit":3,"holders":["00000000000000a1"]}"#);
/// assert_eq!(Record::parse("/s/.lock", json.as_bytes()).unwrap(), r);
/// assert!(Record::parse("/s/.lock", b"{\"limit\":0,\"holders\":[]}").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// How many holders at most.
    pub limit: u32,
    /// The holders' ids.
    pub holders: Vec<String>,
}

/// dlock's record: the holders listed in the order they joined.
#[derive(Serialize, Deserialize)]
struct Listed {
    limit: Limit,
    holders: Vec<String>,
}

/// Consul's `api.Semaphore` record: each holder's session UUID mapped to
/// whether it holds (Go's `map[string]bool`, written sorted; `null` or
/// missing when empty).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Mapped {
    limit: Limit,
    #[serde(default)]
    holders: Option<BTreeMap<String, bool>>,
}

/// A limit of at least 1, read through a JSON number so that `3.0` is 3.
#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(try_from = "serde_json::Number")]
struct Limit(u32);

impl TryFrom<serde_json::Number> for Limit {
    type Error = String;

    fn try_from(n: serde_json::Number) -> std::result::Result<Self, String> {
        let f = n.as_f64().unwrap_or(f64::NAN);
        match f.fract() == 0.0 && (1.0..=f64::from(u32::MAX)).contains(&f) {
            true => Ok(Limit(f as u32)),
            false => Err(format!("the limit must be a positive integer, found {n}")),
        }
    }
}

impl Record {
    /// The record in `layout`'s format: dlock's
    /// `{"limit":N,"holders":["<id>",...]}`, or Consul's
    /// `{"Limit":N,"Holders":{"<UUID>":true,...}}` with [`Layout::Consul`].
    ///
    /// ```
    /// use dlock::{recipes::kv_semaphore::Record, Layout};
    /// let r = Record { limit: 2, holders: vec!["b".into(), "a".into()] };
    /// let json = r.encode(Layout::Consul);
    /// // Sorted, as Go writes a map.
    /// assert_eq!(json, r#"{"Limit":2,"Holders":{"a":true,"b":true}}"#);
    /// let back = Record::decode(Layout::Consul, "/s/.lock", json.as_bytes()).unwrap();
    /// assert_eq!(back.holders, ["a", "b"]);
    /// assert_eq!(r.encode(Layout::Curator), r#"{"limit":2,"holders":["b","a"]}"#);
    /// ```
    pub fn encode(&self, layout: Layout) -> String {
        let (limit, holders) = (Limit(self.limit), self.holders.clone());
        match layout {
            Layout::Curator | Layout::Kazoo => serde_json::to_string(&Listed { limit, holders }),
            Layout::Consul => serde_json::to_string(&Mapped {
                limit,
                holders: Some(holders.into_iter().map(|h| (h, true)).collect()),
            }),
        }
        .expect("a record always serializes")
    }

    /// Decodes a record stored at `path` in `layout`'s format: a JSON
    /// object with a positive integer limit and the holders (duplicates
    /// count once; in Consul's, those mapped to `false` do not hold). Other
    /// keys are ignored but must be valid JSON. Anything else is
    /// [`Error::MalformedData`] naming the problem.
    ///
    /// ```
    /// use dlock::{recipes::kv_semaphore::Record, Layout};
    /// let r = Record::decode(Layout::Consul, "/s/.lock", br#"{"Limit":2,"Holders":{"a":true,"b":false}}"#).unwrap();
    /// assert_eq!((r.limit, r.holders), (2, vec!["a".to_string()]));
    /// assert!(Record::decode(Layout::Consul, "/s/.lock", br#"{"limit":2,"holders":[]}"#).is_err());
    /// assert!(Record::decode(Layout::Consul, "/s/.lock", br#"{"Limit":2,"Holders":{"a":1}}"#).is_err());
    /// ```
    pub fn decode(layout: Layout, path: &str, data: &[u8]) -> Result<Record> {
        let bad = |reason: String| Error::MalformedData {
            path: path.to_string(),
            reason: format!("not a semaphore record: {reason}"),
        };
        let text = std::str::from_utf8(data).map_err(|_| bad("it is not UTF-8".into()))?;
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        // Checked first: serde would also read a struct from an array.
        if !value.is_object() {
            return Err(bad("it is not a JSON object".into()));
        }
        let invalid = |e: serde_json::Error| bad(e.to_string());
        let (limit, listed) = match layout {
            Layout::Curator | Layout::Kazoo => {
                let r: Listed = serde_json::from_value(value).map_err(invalid)?;
                (r.limit, r.holders)
            }
            Layout::Consul => {
                let r: Mapped = serde_json::from_value(value).map_err(invalid)?;
                let held = r.holders.unwrap_or_default().into_iter();
                (
                    r.limit,
                    held.filter_map(|(h, holds)| holds.then_some(h)).collect(),
                )
            }
        };
        let mut holders: Vec<String> = Vec::with_capacity(listed.len());
        for h in listed {
            if !holders.contains(&h) {
                holders.push(h);
            }
        }
        Ok(Record {
            limit: limit.0,
            holders,
        })
    }

    /// The record in dlock's format: [`encode`](Self::encode) with
    /// [`Layout::Curator`] (see [`Record`]'s example).
    pub fn to_json(&self) -> String {
        self.encode(Layout::Curator)
    }

    /// Decodes a record in dlock's format: [`decode`](Self::decode) with
    /// [`Layout::Curator`] (see [`Record`]'s example).
    pub fn parse(path: &str, data: &[u8]) -> Result<Record> {
        Record::decode(Layout::Curator, path, data)
    }
}

/// Counts a contender's record writes that went unanswered.
#[derive(Default)]
pub(super) struct Unanswered(u32);

impl Unanswered {
    /// Whether a write of ours went unanswered: then the record may list
    /// us by it.
    pub(super) fn any(&self) -> bool {
        self.0 > 0
    }

    /// Before looking again after a write that lost a race: no pause if
    /// someone wrote first; the retry policy's pause if the write went
    /// unanswered (it may land yet — the next look tells), so that a server
    /// that times writes out is not written to in a tight loop. `false`
    /// once the policy's retries are spent.
    pub(super) async fn pause(&mut self, session: &crate::Session, e: &Error) -> bool {
        if !matches!(e, Error::ConnectionLoss) {
            return true;
        }
        // Counted before the pause, which a deadline may cut short.
        self.0 += 1;
        session.retry_pause(self.0 - 1).await
    }
}

/// Whether a write lost a race (someone wrote first, or our reply was lost):
/// then look again.
pub(super) fn raced(e: &Error) -> bool {
    use Error::{BadVersion, ConnectionLoss, NoNode, NodeExists};
    matches!(
        e,
        BadVersion { .. } | NodeExists { .. } | NoNode { .. } | ConnectionLoss
    )
}
