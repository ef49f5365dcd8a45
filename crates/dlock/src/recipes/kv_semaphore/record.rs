//! The `.lock` record of a [`KvSemaphore`](super::KvSemaphore): who holds,
//! and the limit every contender states, as JSON.

use serde_json::Value;

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

/// The record as stored. Private, so that `Record` makes no promise about
/// serde; the derive writes the fields in this order with no spaces.
#[derive(serde::Serialize)]
struct Stored<'a> {
    limit: u32,
    holders: &'a [String],
}

/// Consul's `api.Semaphore` record: holders as a map of session UUIDs.
#[derive(serde::Serialize, serde::Deserialize)]
struct ConsulStored {
    #[serde(rename = "Limit")]
    limit: u32,
    #[serde(rename = "Holders", default)]
    holders: Option<std::collections::BTreeMap<String, bool>>,
}

impl Record {
    /// The record in `layout`'s format.
    pub fn encode(&self, layout: Layout) -> String {
        match layout {
            Layout::Curator | Layout::Kazoo => self.to_json(),
            Layout::Consul => self.to_consul_json(),
        }
    }

    /// Decodes a record in `layout`'s format.
    pub fn decode(layout: Layout, path: &str, data: &[u8]) -> Result<Record> {
        match layout {
            Layout::Curator | Layout::Kazoo => Record::parse(path, data),
            Layout::Consul => Record::parse_consul(path, data),
        }
    }

    /// The record as Consul's `api.Semaphore` writes it.
    ///
    /// ```
    /// use dlock::recipes::kv_semaphore::Record;
    /// let r = Record { limit: 2, holders: vec!["9a2aef2d-ec29-bf90-d2ae-ab04937b1019".into()] };
    /// let json = r.to_consul_json();
    /// assert_eq!(json, r#"{"Limit":2,"Holders":{"9a2aef2d-ec29-bf90-d2ae-ab04937b1019":true}}"#);
    /// assert_eq!(Record::parse_consul("/s/.lock", json.as_bytes()).unwrap(), r);
    /// ```
    pub fn to_consul_json(&self) -> String {
        let stored = ConsulStored {
            limit: self.limit,
            holders: Some(self.holders.iter().map(|h| (h.clone(), true)).collect()),
        };
        serde_json::to_string(&stored).expect("a number and strings always serialize")
    }

    /// Decodes Consul's `api.Semaphore` record, `{"Limit":N,"Holders":{...}}`
    /// (holders mapped to `false` do not hold; `null` holders are none, as
    /// Go writes an empty map). Anything else is [`Error::MalformedData`].
    pub fn parse_consul(path: &str, data: &[u8]) -> Result<Record> {
        let stored: ConsulStored =
            serde_json::from_slice(data).map_err(|e| Error::MalformedData {
                path: path.to_string(),
                reason: format!("not a Consul semaphore record: {e}"),
            })?;
        if stored.limit == 0 {
            return Err(Error::MalformedData {
                path: path.to_string(),
                reason: "the Consul semaphore record has a \"Limit\" of 0".into(),
            });
        }
        let holders = stored.holders.unwrap_or_default().into_iter();
        Ok(Record {
            limit: stored.limit,
            holders: holders.filter(|(_, held)| *held).map(|(h, _)| h).collect(),
        })
    }

    /// The record as JSON.
    pub fn to_json(&self) -> String {
        let stored = Stored {
            limit: self.limit,
            holders: &self.holders,
        };
        serde_json::to_string(&stored).expect("a number and strings always serialize")
    }

    /// Decodes a record stored at `path`: a JSON object with a positive
    /// integer `limit` and an array of strings `holders` (other keys are
    /// ignored but must be valid JSON; duplicate holders count once).
    /// Anything else is [`Error::MalformedData`].
    pub fn parse(path: &str, data: &[u8]) -> Result<Record> {
        let bad = |reason: String| Error::MalformedData {
            path: path.to_string(),
            reason,
        };
        let text = std::str::from_utf8(data).map_err(|_| bad("the record is not UTF-8".into()))?;
        // Into a `Value` rather than a derived struct: each problem then gets
        // its own message, and unknown keys are checked too.
        let value: Value = serde_json::from_str(text).map_err(|e| bad(not_json(&e, text)))?;
        let Value::Object(fields) = value else {
            return Err(bad("the record is not a JSON object".into()));
        };
        let limit = fields
            .get("limit")
            .ok_or_else(|| bad("the record has no \"limit\"".into()))?;
        // Through f64, as before serde: `3.0` is a limit of 3.
        let positive = |f: &f64| f.fract() == 0.0 && (1.0..=f64::from(u32::MAX)).contains(f);
        let Some(whole) = limit.as_f64().filter(positive) else {
            return Err(bad(format!(
                "\"limit\" must be a positive integer, found {limit}"
            )));
        };
        let items = match fields.get("holders") {
            Some(Value::Array(items)) => items,
            Some(other) => return Err(bad(format!("\"holders\" must be an array, found {other}"))),
            None => return Err(bad("the record has no \"holders\"".into())),
        };
        let mut holders: Vec<String> = Vec::with_capacity(items.len());
        for item in items {
            let h = item
                .as_str()
                .ok_or_else(|| bad(format!("\"holders\" must hold strings, found {item}")))?;
            if !holders.iter().any(|known| known == h) {
                holders.push(h.to_owned());
            }
        }
        Ok(Record {
            limit: whole as u32,
            holders,
        })
    }
}

/// Why `text` is not JSON: serde_json's message, in the words of the
/// hand-written parser it replaced where the two differ (callers and tests
/// look for those words).
fn not_json(e: &serde_json::Error, text: &str) -> String {
    let message = e.to_string();
    let what = message.split(" at line ").next().unwrap_or_default();
    // Where serde_json stopped: just after the escape it refused.
    let before = text.split('\n').take(e.line().saturating_sub(1));
    let end = before.map(|l| l.len() + 1).sum::<usize>() + e.column();
    let escape = text.as_bytes().get(..end.saturating_sub(4));
    let unicode = escape.is_some_and(|s| s.ends_with(b"\\u"));
    let ours = match what {
        "recursion limit exceeded" => "nested too deeply",
        "unexpected end of hex escape" | "lone leading surrogate in hex escape" => {
            "unpaired surrogate"
        }
        // Such as 1e999: the old parser read infinity, then refused it as
        // a limit.
        "number out of range" => "number out of range (a \"limit\" must be a positive integer)",
        "invalid escape" if unicode => "invalid \\u escape",
        other => other,
    };
    format!("the record is not JSON: {ours}{}", &message[what.len()..])
}
