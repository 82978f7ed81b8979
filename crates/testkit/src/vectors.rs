//! The shared test vectors (`crates/core/tests/vectors.json`, DESIGN.md §3): one case's
//! inputs and outcome, and their JSON form, read and written the same way by every test that
//! runs them (the core's, which generates the file, and each store's translation).
//!
//! Times are microsecond ticks ([`TICK_NS`]). States are written abstractly: gcra `{"tat"}`,
//! fixed-window `{"window", "count"}`, sliding-window `{"newest", "counts_oldest_first"}`
//! (sub-windows `newest-G+1 ..= newest`), sliding-log `{"hits": [[t, cost], ...]}`, penalty
//! `{"strikes", "until", "last_strike"}`.

use std::time::Duration;

use serde_json::{Value, json};
use sluice_core::algorithm::sliding_log::Log;
use sluice_core::algorithm::sliding_window::Counters;
use sluice_core::{
    Algorithm, Decision, Denial, Leaf, Penalty, PenaltyState, Quota, Rate, Recording, Shape, Span,
    State, Unit,
};

/// Nanoseconds per tick of the vectors' times: a microsecond, the Redis store's unit.
pub const TICK_NS: u64 = 1_000;

/// The file, as text.
pub const FILE_TEXT: &str = include_str!("../../core/tests/vectors.json");

/// The vectors of `text` (a vectors file), checking its tick.
pub fn parse(text: &str) -> Vec<Value> {
    let file: Value = serde_json::from_str(text).expect("vectors.json is JSON");
    assert_eq!(
        file["tick_ns"],
        json!(TICK_NS),
        "vectors count in microseconds"
    );
    file["vectors"].as_array().unwrap().clone()
}

/// A vector without its outcome, for messages.
pub fn without_expected(vector: &Value) -> Value {
    let mut v = vector.clone();
    v.as_object_mut().unwrap().remove("expected");
    v
}

#[derive(Debug, Clone, Copy)]
pub struct LeafSpec {
    pub algorithm: Algorithm,
    pub count: u64,
    pub span_seconds: u64,
    pub burst: Option<u64>,
    pub windows: Option<u32>,
}

impl LeafSpec {
    /// The quota in microsecond ticks.
    pub fn quota(&self) -> Quota {
        self.quota_ns().with_tick(TICK_NS).unwrap()
    }

    /// The quota in nanoseconds, as the limiter hands it to a store.
    pub fn quota_ns(&self) -> Quota {
        let span = Span::new(self.span_seconds, Unit::Second).unwrap();
        let mut leaf = Leaf::new(Rate::new(self.count, span).unwrap());
        leaf.options.algorithm = Some(self.algorithm);
        leaf.options.burst = self.burst;
        leaf.options.windows = self.windows;
        Quota::from_leaf(&leaf, Algorithm::Gcra).unwrap()
    }
}

#[derive(Debug, Clone, Copy)]
pub struct PenaltySpec {
    pub base_seconds: u64,
    pub factor: u32,
    pub max_seconds: u64,
    pub forget_seconds: u64,
}

impl PenaltySpec {
    /// The penalty in microsecond ticks.
    pub fn penalty(&self) -> Penalty {
        self.penalty_ns().with_tick(TICK_NS)
    }

    /// The penalty in nanoseconds, as the limiter hands it to a store.
    pub fn penalty_ns(&self) -> Penalty {
        Penalty::new(
            Duration::from_secs(self.base_seconds),
            self.factor,
            Duration::from_secs(self.max_seconds),
            Duration::from_secs(self.forget_seconds),
        )
        .unwrap()
    }
}

#[derive(Debug, Clone)]
pub struct Case {
    pub shape: Shape,
    pub leaves: Vec<LeafSpec>,
    pub states: Vec<State>,
    pub now: u64,
    pub cost: u64,
    pub recording: Recording,
    pub penalty: Option<PenaltySpec>,
    /// `None`: no record yet (a fresh key).
    pub penalty_record: Option<PenaltyState>,
}

impl Case {
    /// The quotas of the leaves, in microsecond ticks.
    pub fn quotas(&self) -> Vec<Quota> {
        self.leaves.iter().map(LeafSpec::quota).collect()
    }
}

pub fn shape_json(shape: &Shape) -> Value {
    match shape {
        Shape::Leaf(i) => json!(i),
        Shape::Or(children) => json!({"or": children.iter().map(shape_json).collect::<Vec<_>>()}),
        Shape::And(children) => {
            json!({"and": children.iter().map(shape_json).collect::<Vec<_>>()})
        }
    }
}

pub fn shape_from(v: &Value) -> Shape {
    if let Some(i) = v.as_u64() {
        return Shape::Leaf(i as usize);
    }
    let children = |c: &Value| c.as_array().unwrap().iter().map(shape_from).collect();
    match (v.get("or"), v.get("and")) {
        (Some(c), None) => Shape::Or(children(c)),
        (None, Some(c)) => Shape::And(children(c)),
        _ => panic!("bad shape {v}"),
    }
}

pub fn leaf_json(leaf: &LeafSpec) -> Value {
    let mut v = json!({
        "algorithm": leaf.algorithm.name(),
        "count": leaf.count,
        "span_seconds": leaf.span_seconds,
    });
    if let Some(burst) = leaf.burst {
        v["burst"] = json!(burst);
    }
    if let Some(windows) = leaf.windows {
        v["windows"] = json!(windows);
    }
    v
}

pub fn leaf_from(v: &Value) -> LeafSpec {
    LeafSpec {
        algorithm: Algorithm::from_name(v["algorithm"].as_str().unwrap()).unwrap(),
        count: u(&v["count"]),
        span_seconds: u(&v["span_seconds"]),
        burst: v.get("burst").map(u),
        windows: v.get("windows").map(|w| u(w) as u32),
    }
}

pub fn u(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("expected an unsigned integer, got {v}"))
}

pub fn state_json(state: &State) -> Value {
    match state {
        State::Gcra { tat } => json!({"tat": tat}),
        State::FixedWindow { window, count } => json!({"window": window, "count": count}),
        State::SlidingWindow(counters) => {
            let g = u64::from(counters.len());
            let newest = counters.newest();
            // Sub-windows before number 0 do not exist; their slots are never written.
            let counts: Vec<u64> = (0..g)
                .map(|offset| {
                    (newest + 1 + offset)
                        .checked_sub(g)
                        .map_or(0, |n| counters.count(n))
                })
                .collect();
            json!({"newest": newest, "counts_oldest_first": counts})
        }
        State::SlidingLog(log) => {
            json!({"hits": log.hits().map(|(t, c)| json!([t, c])).collect::<Vec<_>>()})
        }
        other => panic!("no vector form for {other:?}"),
    }
}

pub fn state_from(algorithm: Algorithm, v: &Value) -> State {
    match algorithm {
        Algorithm::Gcra => State::Gcra { tat: u(&v["tat"]) },
        Algorithm::FixedWindow => State::FixedWindow {
            window: u(&v["window"]),
            count: u(&v["count"]),
        },
        Algorithm::SlidingWindow => {
            let counts: Vec<u64> = v["counts_oldest_first"]
                .as_array()
                .unwrap()
                .iter()
                .map(u)
                .collect();
            State::SlidingWindow(Counters::from_parts(u(&v["newest"]), &counts))
        }
        Algorithm::SlidingLog => State::SlidingLog(Log::from_hits(
            v["hits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|hit| (u(&hit[0]), u(&hit[1]))),
        )),
        other => panic!("no vector form for {other}"),
    }
}

pub fn penalty_json(p: &PenaltySpec) -> Value {
    json!({
        "base_seconds": p.base_seconds,
        "factor": p.factor,
        "max_seconds": p.max_seconds,
        "forget_seconds": p.forget_seconds,
    })
}

pub fn penalty_from(v: &Value) -> PenaltySpec {
    PenaltySpec {
        base_seconds: u(&v["base_seconds"]),
        factor: u(&v["factor"]) as u32,
        max_seconds: u(&v["max_seconds"]),
        forget_seconds: u(&v["forget_seconds"]),
    }
}

pub fn penalty_record_json(r: &PenaltyState) -> Value {
    json!({"strikes": r.strikes, "until": r.until, "last_strike": r.last_strike})
}

pub fn penalty_record_from(v: &Value) -> PenaltyState {
    PenaltyState {
        strikes: u(&v["strikes"]) as u32,
        until: u(&v["until"]),
        last_strike: u(&v["last_strike"]),
    }
}

pub fn recording_name(recording: Recording) -> &'static str {
    match recording {
        Recording::Admitted => "admitted",
        Recording::Always => "always",
        Recording::Never => "never",
    }
}

pub fn recording_from(name: &str) -> Recording {
    match name {
        "admitted" => Recording::Admitted,
        "always" => Recording::Always,
        "never" => Recording::Never,
        other => panic!("unknown recording {other}"),
    }
}

pub fn in_ticks(d: Duration) -> u64 {
    let nanos = d.as_nanos();
    assert_eq!(nanos % u128::from(TICK_NS), 0, "{d:?} is not whole ticks");
    (nanos / u128::from(TICK_NS)) as u64
}

pub fn decision_json(d: &Decision) -> Value {
    let denial = match d.denial {
        None => 0,
        Some(Denial::Limited { .. }) => 1,
        Some(Denial::CostExceedsCapacity) => 2,
        Some(Denial::Penalized { .. }) => 3,
        Some(other) => panic!("the core never decides {other:?}"),
    };
    json!({
        "allowed": d.allowed(),
        "limit": d.limit,
        "remaining": d.remaining,
        "reset_after_ticks": in_ticks(d.reset_after),
        "retry_after_ticks": d.retry_after().map_or(-1, |r| in_ticks(r) as i64),
        "denial": denial,
        "leaf": d.leaf,
    })
}

/// The case's inputs; the file adds the outcome under `"expected"`.
pub fn case_json(case: &Case) -> Value {
    json!({
        "shape": shape_json(&case.shape),
        "leaves": case.leaves.iter().map(leaf_json).collect::<Vec<_>>(),
        "now": case.now,
        "cost": case.cost,
        "recording": recording_name(case.recording),
        "states": case.states.iter().map(state_json).collect::<Vec<_>>(),
        "penalty": case.penalty.as_ref().map(penalty_json),
        "penalty_record": case.penalty_record.as_ref().map(penalty_record_json),
    })
}

pub fn case_from(v: &Value) -> Case {
    let leaves: Vec<LeafSpec> = v["leaves"]
        .as_array()
        .unwrap()
        .iter()
        .map(leaf_from)
        .collect();
    let states = v["states"]
        .as_array()
        .unwrap()
        .iter()
        .zip(&leaves)
        .map(|(s, leaf)| state_from(leaf.algorithm, s))
        .collect();
    Case {
        shape: shape_from(&v["shape"]),
        leaves,
        states,
        now: u(&v["now"]),
        cost: u(&v["cost"]),
        recording: recording_from(v["recording"].as_str().unwrap()),
        penalty: (!v["penalty"].is_null()).then(|| penalty_from(&v["penalty"])),
        penalty_record: (!v["penalty_record"].is_null())
            .then(|| penalty_record_from(&v["penalty_record"])),
    }
}

/// xorshift64*, the generator the vectors' generators and the step-by-step comparisons use:
/// tests must not depend on an RNG crate, and a seed replays a run.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number from `lo` to `hi`, both included.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}
