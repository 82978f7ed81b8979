//! `sluice simulate`: replays a CSV trace on a virtual clock. The same trace always gives the
//! same answer.
//!
//! The trace has a header: `t` (seconds from the start, decimal, non-decreasing), one column
//! per selector name, and an optional `cost` column (empty = 1).

use std::io::{Read, Write};

use serde_json::json;
use sluice_limiter::{Checked, Limiter, ManualClock, MemoryStore, Policy, PolicyRef};

use sluice_server::decision_json;

/// Why a trace cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("trace: {0}")]
    Csv(#[from] csv::Error),
    #[error("trace line {line}: {message}")]
    Line { line: u64, message: String },
    #[error("trace: {0}")]
    Header(String),
    #[error("{0}")]
    Policy(#[from] sluice_limiter::PolicyError),
    #[error("writing output: {0}")]
    Io(#[from] std::io::Error),
}

/// Totals of a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Summary {
    pub requests: u64,
    pub allowed: u64,
    pub denied: u64,
}

/// Parses non-negative decimal seconds (`12`, `0.25`, at most 9 decimals) into nanoseconds.
pub fn parse_seconds(text: &str) -> Result<u64, String> {
    let bad = || format!("`{text}` is not a time in seconds (like `0`, `1.5`; at most 9 decimals)");
    let (whole, fraction) = text.trim().split_once('.').unwrap_or((text.trim(), ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() && fraction.is_empty()
        || !digits(whole)
        || !digits(fraction)
        || fraction.len() > 9
    {
        return Err(bad());
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| bad())?
    };
    let mut nanos: u64 = 0;
    for (i, b) in fraction.bytes().enumerate() {
        nanos += u64::from(b - b'0') * 10u64.pow(8 - i as u32);
    }
    whole
        .checked_mul(1_000_000_000)
        .and_then(|n| n.checked_add(nanos))
        .ok_or_else(bad)
}

/// Where the columns of a trace are: `t`, the optional `cost`, and the selector columns (every
/// other one, in header order).
#[derive(Debug, Clone)]
pub struct Header {
    /// The selector columns' names, in header order.
    pub selectors: Vec<String>,
    selector_columns: Vec<usize>,
    t: usize,
    cost: Option<usize>,
}

/// One request of a trace.
#[derive(Debug, Clone)]
pub struct Hit {
    /// The trace line it came from, for messages.
    pub line: u64,
    /// Nanoseconds from the start.
    pub t: u64,
    /// `t` as written, so the JSON output repeats it unchanged.
    t_text: String,
    pub cost: u64,
    /// The selector values, in the order of [`Header::selectors`].
    pub values: Vec<String>,
}

impl Hit {
    /// The hit's selectors as the limiter takes them.
    pub fn selectors<'a>(&'a self, header: &'a Header) -> Vec<(&'a str, &'a str)> {
        header
            .selectors
            .iter()
            .zip(&self.values)
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect()
    }
}

/// Reads a trace one hit at a time, checking that time never goes back.
pub struct TraceReader<R> {
    header: Header,
    records: csv::StringRecordsIntoIter<R>,
    last: u64,
}

impl<R: Read> TraceReader<R> {
    /// Reads the header; hits come from iterating.
    pub fn new(trace: R) -> Result<Self, TraceError> {
        let mut reader = csv::ReaderBuilder::new()
            .trim(csv::Trim::All)
            .from_reader(trace);
        let headers = reader.headers()?.clone();
        let t = headers
            .iter()
            .position(|h| h == "t")
            .ok_or_else(|| TraceError::Header("the header has no `t` column".into()))?;
        let cost = headers.iter().position(|h| h == "cost");
        let (selector_columns, selectors) = headers
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != t && Some(*i) != cost)
            .map(|(i, name)| (i, name.to_owned()))
            .unzip();
        Ok(TraceReader {
            header: Header {
                selectors,
                selector_columns,
                t,
                cost,
            },
            records: reader.into_records(),
            last: 0,
        })
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    fn hit(&mut self, record: &csv::StringRecord) -> Result<Hit, TraceError> {
        let line = record.position().map_or(0, |p| p.line());
        let fail = |message: String| TraceError::Line { line, message };
        let t_text = record.get(self.header.t).unwrap_or("");
        let t = parse_seconds(t_text).map_err(fail)?;
        if t < self.last {
            return Err(fail(format!("t = {t_text} goes back in time")));
        }
        self.last = t;
        let cost = match self
            .header
            .cost
            .and_then(|c| record.get(c))
            .filter(|c| !c.is_empty())
        {
            None => 1,
            Some(c) => c
                .parse::<u64>()
                .map_err(|_| fail(format!("cost `{c}` is not a whole number")))?,
        };
        let values = self
            .header
            .selector_columns
            .iter()
            .map(|&i| record.get(i).unwrap_or("").to_owned())
            .collect();
        Ok(Hit {
            line,
            t,
            t_text: t_text.to_owned(),
            cost,
            values,
        })
    }
}

impl<R: Read> Iterator for TraceReader<R> {
    type Item = Result<Hit, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        let record = match self.records.next()? {
            Ok(record) => record,
            Err(e) => return Some(Err(e.into())),
        };
        Some(self.hit(&record))
    }
}

/// One policy on its own fresh in-memory store and virtual clock.
pub struct Replay {
    clock: ManualClock,
    limiter: Limiter,
    policy: PolicyRef,
    runtime: tokio::runtime::Runtime,
}

impl Replay {
    /// Checks that the trace has a column for every selector the policy names.
    pub fn new(policy: Policy, header: &Header) -> Result<Replay, TraceError> {
        let clock = ManualClock::new(0);
        let store = MemoryStore::builder().clock(clock.clone()).build();
        let limiter = Limiter::builder(store).clock(clock.clone()).build()?;
        let policy = limiter.add_policy(policy)?;
        for leaf in &policy.leaves {
            for name in leaf.leaf.selector.names() {
                if !header.selectors.contains(name) {
                    return Err(TraceError::Header(format!(
                        "no column for selector `{name}`"
                    )));
                }
            }
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .map_err(TraceError::Io)?;
        Ok(Replay {
            clock,
            limiter,
            policy,
            runtime,
        })
    }

    /// Decides `hit` at its time.
    pub fn check(&self, header: &Header, hit: &Hit) -> Result<Checked, TraceError> {
        self.clock.set(hit.t);
        self.runtime
            .block_on(
                self.limiter
                    .check(&self.policy, &hit.selectors(header), hit.cost),
            )
            .map_err(|e| TraceError::Line {
                line: hit.line,
                message: e.to_string(),
            })
    }
}

impl Summary {
    /// Counts one decision.
    pub fn add(&mut self, allowed: bool) {
        self.requests += 1;
        if allowed {
            self.allowed += 1;
        } else {
            self.denied += 1;
        }
    }

    pub fn to_json(self) -> serde_json::Value {
        json!({
            "requests": self.requests,
            "allowed": self.allowed,
            "denied": self.denied,
        })
    }
}

/// Replays `trace` against `policy`, writing one JSON line per request and a summary line.
pub fn simulate(
    policy: Policy,
    trace: impl Read,
    out: &mut impl Write,
) -> Result<Summary, TraceError> {
    let mut reader = TraceReader::new(trace)?;
    let replay = Replay::new(policy, reader.header())?;
    let mut summary = Summary::default();
    while let Some(hit) = reader.next() {
        let hit = hit?;
        let checked = replay.check(reader.header(), &hit)?;
        let t_text = hit.t_text.trim_end_matches('.');
        let mut line_json = json!({ "t": serde_json::from_str::<serde_json::Value>(t_text).unwrap_or(json!(hit.t_text)) });
        if let (Some(obj), serde_json::Value::Object(fields)) =
            (line_json.as_object_mut(), decision_json(&checked))
        {
            obj.extend(fields);
        }
        writeln!(out, "{line_json}")?;
        summary.add(checked.decision.allowed());
    }
    writeln!(out, "{}", json!({ "summary": summary.to_json() }))?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds() {
        assert_eq!(parse_seconds("0"), Ok(0));
        assert_eq!(parse_seconds("1.5"), Ok(1_500_000_000));
        assert_eq!(parse_seconds(".000000001"), Ok(1));
        assert!(parse_seconds("-1").is_err());
        assert!(parse_seconds("1e3").is_err());
        assert!(parse_seconds("1.0000000001").is_err());
        assert!(parse_seconds("").is_err());
        assert!(parse_seconds("99999999999999999999").is_err());
    }

    #[test]
    fn replays_deterministically() {
        // 2/s is one hit per 0.5 s with a burst of 2: the third hit at 0 waits 0.5 s, the one
        // at 0.5 takes that token, and at 1 the next one has refilled; a fourth at 1 is denied.
        let trace = "t,user\n0,a\n0,a\n0,a\n0.5,a\n1,a\n1,a\n1,b\n";
        let policy = Policy::new("sim", "user:2/s").unwrap();
        let mut out = Vec::new();
        let summary = simulate(policy.clone(), trace.as_bytes(), &mut out).unwrap();
        assert_eq!(
            summary,
            Summary {
                requests: 7,
                allowed: 5,
                denied: 2
            }
        );
        let mut again = Vec::new();
        simulate(policy, trace.as_bytes(), &mut again).unwrap();
        assert_eq!(out, again);
        let lines: Vec<serde_json::Value> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[2]["allowed"], false);
        assert_eq!(lines[2]["retry_after"], 0.5);
        assert_eq!(lines[3]["allowed"], true);
        assert_eq!(lines[4]["allowed"], true);
        assert_eq!(lines[5]["allowed"], false);
        assert_eq!(lines[5]["retry_after"], 0.5);
        assert_eq!(
            lines[6]["allowed"], true,
            "another user has its own counter"
        );
        assert_eq!(lines[7]["summary"]["denied"], 2);
    }

    #[test]
    fn rejects_bad_traces() {
        let policy = Policy::new("sim", "user:2/s").unwrap();
        let run = |trace: &str| {
            simulate(policy.clone(), trace.as_bytes(), &mut Vec::new())
                .unwrap_err()
                .to_string()
        };
        assert!(run("time,user\n0,a\n").contains("no `t` column"));
        assert!(run("t,ip\n0,a\n").contains("selector `user`"));
        assert!(run("t,user\n1,a\n0,a\n").contains("line 3"));
        assert!(run("t,user,cost\n0,a,-1\n").contains("cost"));
    }
}
