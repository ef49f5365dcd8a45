//! The `.lock` record of a [`KvSemaphore`](super::KvSemaphore): who holds,
//! and the limit every contender states, as JSON — one reader and one
//! writer for both layouts, which differ only in their keys' names and in
//! how they list the holders (see the [module docs](super)).

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

impl Record {
    /// The record in `layout`'s format: dlock's
    /// `{"limit":N,"holders":["<id>",...]}`, or Consul's
    /// `{"Limit":N,"Holders":{"<UUID>":true,...}}` with [`Layout::Consul`].
    ///
    /// ```
    /// use dlock::{recipes::kv_semaphore::Record, Layout};
    /// let r = Record { limit: 2, holders: vec!["9a2aef2d-ec29-bf90-d2ae-ab04937b1019".into()] };
    /// let json = r.encode(Layout::Consul);
    /// assert_eq!(json, r#"{"Limit":2,"Holders":{"9a2aef2d-ec29-bf90-d2ae-ab04937b1019":true}}"#);
    /// assert_eq!(Record::decode(Layout::Consul, "/s/.lock", json.as_bytes()).unwrap(), r);
    /// assert_eq!(r.encode(Layout::Curator), r#"{"limit":2,"holders":["9a2aef2d-ec29-bf90-d2ae-ab04937b1019"]}"#);
    /// // Consul's holders are written sorted, as Go writes a map.
    /// let two = Record { limit: 2, holders: vec!["b".into(), "a".into()] };
    /// assert_eq!(two.encode(Layout::Consul), r#"{"Limit":2,"Holders":{"a":true,"b":true}}"#);
    /// ```
    pub fn encode(&self, layout: Layout) -> String {
        let holders = match layout {
            Layout::Curator | Layout::Kazoo => Value::from(self.holders.clone()),
            // Sorted, as Go's encoding/json writes a map (and whatever
            // order serde_json's map keeps in this build).
            Layout::Consul => {
                let held: std::collections::BTreeMap<&str, bool> =
                    self.holders.iter().map(|h| (h.as_str(), true)).collect();
                serde_json::json!(held)
            }
        };
        let (limit_key, holders_key) = keys(layout);
        format!(
            r#"{{"{limit_key}":{},"{holders_key}":{holders}}}"#,
            self.limit
        )
    }

    /// Decodes a record stored at `path` in `layout`'s format: a JSON
    /// object with a positive integer limit and the holders — dlock's an
    /// array of strings (duplicates count once), Consul's a map of session
    /// UUIDs to booleans (those mapped to `false` do not hold; missing or
    /// `null` is none, as Go writes an empty map). Other keys are ignored
    /// but must be valid JSON. Anything else is [`Error::MalformedData`]
    /// naming the problem.
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
            reason,
        };
        let text = std::str::from_utf8(data).map_err(|_| bad("the record is not UTF-8".into()))?;
        // Into a `Value` rather than a derived struct: each problem then gets
        // its own message, and unknown keys are checked too.
        let value: Value = serde_json::from_str(text).map_err(|e| bad(not_json(&e, text)))?;
        let Value::Object(fields) = value else {
            return Err(bad("the record is not a JSON object".into()));
        };
        let (limit_key, holders_key) = keys(layout);
        let no = |key| bad(format!("the record has no \"{key}\""));
        let limit = fields.get(limit_key).ok_or_else(|| no(limit_key))?;
        // Through f64, as before serde: `3.0` is a limit of 3.
        let positive = |f: &f64| f.fract() == 0.0 && (1.0..=f64::from(u32::MAX)).contains(f);
        let Some(whole) = limit.as_f64().filter(positive) else {
            return Err(bad(format!(
                "\"{limit_key}\" must be a positive integer, found {limit}"
            )));
        };
        // dlock lists the holders; Consul maps each to whether it holds.
        let listed: Vec<&str> = match (layout, fields.get(holders_key)) {
            (Layout::Curator | Layout::Kazoo, Some(Value::Array(items))) => {
                let strings = items.iter().map(|item| {
                    let no_string = || bad(format!("\"holders\" must hold strings, found {item}"));
                    item.as_str().ok_or_else(no_string)
                });
                strings.collect::<Result<_>>()?
            }
            // Go decodes the map into `map[string]bool`: anything but a
            // boolean is a corrupt record, not a holder that does not hold.
            (Layout::Consul, Some(Value::Object(map))) => {
                let mut held = Vec::with_capacity(map.len());
                for (holder, holds) in map {
                    match holds {
                        Value::Bool(true) => held.push(holder.as_str()),
                        Value::Bool(false) => {}
                        other => {
                            return Err(bad(format!(
                                "\"Holders\" must map session ids to booleans, found {other} for {holder}"
                            )))
                        }
                    }
                }
                held.sort_unstable();
                held
            }
            (Layout::Consul, None | Some(Value::Null)) => Vec::new(),
            (_, None) => return Err(no(holders_key)),
            (_, Some(other)) => {
                let shape = if layout == Layout::Consul {
                    "an object"
                } else {
                    "an array"
                };
                return Err(bad(format!(
                    "\"{holders_key}\" must be {shape}, found {other}"
                )));
            }
        };
        let mut holders: Vec<String> = Vec::with_capacity(listed.len());
        for h in listed {
            if !holders.iter().any(|known| known == h) {
                holders.push(h.to_owned());
            }
        }
        Ok(Record {
            limit: whole as u32,
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

    /// The record as Consul's `api.Semaphore` writes it:
    /// [`encode`](Self::encode) with [`Layout::Consul`] (see its example).
    pub fn to_consul_json(&self) -> String {
        self.encode(Layout::Consul)
    }

    /// Decodes Consul's `api.Semaphore` record: [`decode`](Self::decode)
    /// with [`Layout::Consul`] (see its example).
    pub fn parse_consul(path: &str, data: &[u8]) -> Result<Record> {
        Record::decode(Layout::Consul, path, data)
    }
}

/// The record's keys for the limit and the holders in `layout`'s format.
fn keys(layout: Layout) -> (&'static str, &'static str) {
    match layout {
        Layout::Curator | Layout::Kazoo => ("limit", "holders"),
        Layout::Consul => ("Limit", "Holders"),
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
