//! `sluice simulate`: replays a CSV trace on a virtual clock. The same trace always gives the
//! same answer.
//!
//! The trace has a header: `t` (seconds from the start, decimal, non-decreasing), one column
//! per selector name, an optional `cost` column (empty = 1) and an optional `duration`
//! column: how long each request lasts, in seconds, for rules with a concurrency leaf
//! (`user:3 concurrent`), whose requests take a lease at `t` and release it at
//! `t + duration` (see [`Replay::check`]). A rule without one ignores durations (the command
//! line warns), but every duration given must still be a time.

mod leases;

pub use leases::LeafLeases;

use std::io::{Read, Write};

use serde_json::json;
use sluice_limiter::{Checked, Limiter, ManualClock, MemoryStore, Policy, PolicyRef};

use leases::InFlight;

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

/// Where the columns of a trace are: `t`, the optional `cost` and `duration`, and the
/// selector columns (every other one, in header order).
#[derive(Debug, Clone)]
pub struct Header {
    /// The selector columns' names, in header order.
    pub selectors: Vec<String>,
    selector_columns: Vec<usize>,
    t: usize,
    cost: Option<usize>,
    duration: Option<usize>,
}

impl Header {
    /// Whether the trace has a `duration` column.
    pub fn has_durations(&self) -> bool {
        self.duration.is_some()
    }
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
    /// How long the request lasts, in nanoseconds: `None` when the trace has no `duration`
    /// column or the line leaves it empty.
    pub duration: Option<u64>,
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
        let duration = headers.iter().position(|h| h == "duration");
        let (selector_columns, selectors) = headers
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != t && Some(*i) != cost && Some(*i) != duration)
            .map(|(i, name)| (i, name.to_owned()))
            .unzip();
        Ok(TraceReader {
            header: Header {
                selectors,
                selector_columns,
                t,
                cost,
                duration,
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
        let duration = match self
            .header
            .duration
            .and_then(|d| record.get(d))
            .filter(|d| !d.is_empty())
        {
            None => None,
            Some(d) => Some(parse_seconds(d).map_err(|e| fail(format!("duration {e}")))?),
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
            duration,
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
    /// The leases held, for a rule with a concurrency leaf.
    in_flight: Option<InFlight>,
}

impl Replay {
    /// Checks that the trace has a column for every selector the policy names, and a
    /// `duration` column when the rule has a concurrency leaf.
    pub fn new(policy: Policy, header: &Header) -> Result<Replay, TraceError> {
        let in_flight = InFlight::new(&policy, header);
        if in_flight.is_some() && !header.has_durations() {
            return Err(TraceError::Header(format!(
                "the rule `{}` has a concurrency leaf: the trace needs a `duration` column \
                 (seconds each request holds its slot)",
                policy.rule
            )));
        }
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
            in_flight,
        })
    }

    /// Decides `hit` at its time: after releasing the leases whose requests ended by then,
    /// a lease taken until `hit.t + duration` for a rule with a concurrency leaf, else a
    /// check.
    pub fn check(&mut self, header: &Header, hit: &Hit) -> Result<Checked, TraceError> {
        let at_line = |message: String| TraceError::Line {
            line: hit.line,
            message,
        };
        if self.in_flight.is_none() {
            self.clock.set(hit.t);
            return self
                .runtime
                .block_on(
                    self.limiter
                        .check(&self.policy, &hit.selectors(header), hit.cost),
                )
                .map_err(|e| at_line(e.to_string()));
        }
        let Some(duration) = hit.duration else {
            return Err(at_line(format!(
                "no duration (the rule `{}` has a concurrency leaf: every request needs one)",
                self.policy.policy.rule
            )));
        };
        if hit.cost != 1 {
            return Err(at_line(format!(
                "cost {}: a request takes one lease (leave `cost` empty or 1 for a rule with \
                 a concurrency leaf)",
                hit.cost
            )));
        }
        self.release_until(hit.t)?;
        self.clock.set(hit.t);
        let acquired = self
            .runtime
            .block_on(self.limiter.acquire(&self.policy, &hit.selectors(header)))
            .map_err(|e| at_line(e.to_string()))?;
        if let (Some(lease), Some(in_flight)) = (acquired.lease, self.in_flight.as_mut()) {
            in_flight.hold(hit, duration, lease);
        }
        Ok(acquired.checked)
    }

    /// Releases, in time order, the leases whose requests end no later than `t`.
    fn release_until(&mut self, t: u64) -> Result<(), TraceError> {
        let Some(in_flight) = self.in_flight.as_mut() else {
            return Ok(());
        };
        while let Some((end, lease, line)) = in_flight.next_due(t) {
            self.clock.set(end);
            let answer = self
                .runtime
                .block_on(lease.release())
                .map_err(|e| TraceError::Line {
                    line,
                    message: format!("releasing its lease: {e}"),
                })?;
            in_flight.released(answer);
        }
        Ok(())
    }

    /// Releases every lease still held, at its end, after the trace's last request: then
    /// each concurrency leaf's counts are whole. Empty for a rule without one.
    pub fn finish(&mut self) -> Result<Vec<LeafLeases>, TraceError> {
        self.release_until(u64::MAX)?;
        Ok(self
            .in_flight
            .as_ref()
            .map_or_else(Vec::new, InFlight::counts))
    }

    /// Releases the store answered with `Expired` or `NotHeld` (the lease had expired before
    /// its request ended), all leaves together.
    pub fn expired_releases(&self) -> u64 {
        self.in_flight.as_ref().map_or(0, |f| f.store_expired)
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

/// The summary line's JSON: the totals, and for a rule with concurrency leaves, what each
/// one's leases did (`"leases": [{"leaf": ..., "max_held": ..., "expired": ...}]`).
pub fn summary_json(summary: Summary, leases: &[LeafLeases]) -> serde_json::Value {
    let mut value = summary.to_json();
    if !leases.is_empty()
        && let Some(object) = value.as_object_mut()
    {
        let leases = leases.iter().map(LeafLeases::to_json).collect();
        object.insert("leases".into(), serde_json::Value::Array(leases));
    }
    value
}

/// Replays `trace` against `policy`, writing one JSON line per request and a summary line.
pub fn simulate(
    policy: Policy,
    trace: impl Read,
    out: &mut impl Write,
) -> Result<Summary, TraceError> {
    let mut reader = TraceReader::new(trace)?;
    let mut replay = Replay::new(policy, reader.header())?;
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
    let leases = replay.finish()?;
    writeln!(
        out,
        "{}",
        json!({ "summary": summary_json(summary, &leases) })
    )?;
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
    fn lease_counts_agree_with_the_store() {
        // Durations around the 10 s lease time, exactly it included (a lease expiring at the
        // instant of its release has expired, as the store says).
        let durations = ["1", "10", "9.999999999", "10.000000001", "25", "0", "3.5"];
        let mut trace = String::from("t,user,duration\n");
        for i in 0..300 {
            let user = ["a", "b"][i % 2];
            let duration = durations[i % durations.len()];
            trace.push_str(&format!("{}.{},{user},{duration}\n", i / 4, (i % 4) * 25));
        }
        let policy = Policy::new("sim", "user:3 concurrent lease=10s").unwrap();
        let mut reader = TraceReader::new(trace.as_bytes()).unwrap();
        let mut replay = Replay::new(policy, reader.header()).unwrap();
        let mut long_admitted = 0;
        while let Some(hit) = reader.next() {
            let hit = hit.unwrap();
            if replay
                .check(reader.header(), &hit)
                .unwrap()
                .decision
                .allowed()
                && hit.duration.unwrap() >= 10_000_000_000
            {
                long_admitted += 1;
            }
        }
        let leases = replay.finish().unwrap();
        assert_eq!(leases.len(), 1);
        assert_eq!(leases[0].max_held, 3, "full, never over");
        assert!(long_admitted > 0);
        assert_eq!(leases[0].expired, long_admitted);
        assert_eq!(leases[0].expired, replay.expired_releases());
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
