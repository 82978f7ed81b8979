//! The shared test vectors (DESIGN.md §3): `(states, now, quotas, cost) -> outcome` cases that
//! every translation of the core must reproduce. `vectors.json` is generated here from a
//! fixed seed, with the outcomes the Rust core computes; `crates/redis/tests/vectors.rs` runs
//! the same file through the Lua script.
//!
//! Regenerate (after a deliberate change to the core's semantics) with
//! `SLUICE_REGENERATE_VECTORS=1 cargo test -p sluice-core --test vectors`.
//!
//! Times are microsecond ticks (`Quota::with_tick(1000)`, `Penalty::with_tick(1000)`), the
//! unit the Redis store counts in, near a real epoch value so that stores with double
//! arithmetic meet realistic magnitudes. States are written abstractly:
//! gcra `{"tat"}`, fixed-window `{"window", "count"}`, sliding-window
//! `{"newest", "counts_oldest_first"}` (sub-windows `newest-G+1 ..= newest`), sliding-log
//! `{"hits": [[t, cost], ...]}`, penalty `{"strikes", "until", "last_strike"}`.

use std::collections::BTreeMap;
use std::sync::Once;
use std::time::Duration;

use serde_json::{Value, json};
use sluice_core::algorithm::sliding_log::Log;
use sluice_core::algorithm::sliding_window::Counters;
use sluice_core::{
    Algorithm, Decision, Denial, Evaluation, Leaf, Penalty, PenaltyState, Quota, Rate, Recording,
    Shape, Span, State, Unit, evaluate,
};

const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors.json");
const TICK_NS: u64 = 1_000;
const SEED: u64 = 0x5u64 << 60 | 0x1ce_2025;
const COUNT: usize = 500;
/// 2025-11-13 in microseconds: every `now` lies within 30 days after it.
const EPOCH_US: u64 = 1_763_000_000_000_000;

/// A tiny xorshift64* generator: the vectors must not depend on an RNG crate's versions.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `lo..=hi` (the modulo bias is irrelevant here).
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.range(0, items.len() as u64 - 1) as usize]
    }
}

// The cases -----------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
struct LeafSpec {
    algorithm: Algorithm,
    count: u64,
    span_seconds: u64,
    burst: Option<u64>,
    windows: Option<u32>,
}

impl LeafSpec {
    /// The quota in microsecond ticks.
    fn quota(&self) -> Quota {
        let span = Span::new(self.span_seconds, Unit::Second).unwrap();
        let mut leaf = Leaf::new(Rate::new(self.count, span).unwrap());
        leaf.options.algorithm = Some(self.algorithm);
        leaf.options.burst = self.burst;
        leaf.options.windows = self.windows;
        Quota::from_leaf(&leaf, Algorithm::Gcra)
            .unwrap()
            .with_tick(TICK_NS)
            .unwrap()
    }
}

#[derive(Debug, Clone, Copy)]
struct PenaltySpec {
    base_seconds: u64,
    factor: u32,
    max_seconds: u64,
    forget_seconds: u64,
}

impl PenaltySpec {
    /// The penalty in microsecond ticks.
    fn penalty(&self) -> Penalty {
        Penalty::new(
            Duration::from_secs(self.base_seconds),
            self.factor,
            Duration::from_secs(self.max_seconds),
            Duration::from_secs(self.forget_seconds),
        )
        .unwrap()
        .with_tick(TICK_NS)
    }
}

#[derive(Debug, Clone)]
struct Case {
    shape: Shape,
    leaves: Vec<LeafSpec>,
    states: Vec<State>,
    now: u64,
    cost: u64,
    recording: Recording,
    penalty: Option<PenaltySpec>,
    /// `None`: no record yet (a fresh key).
    penalty_record: Option<PenaltyState>,
}

impl Case {
    fn quotas(&self) -> Vec<Quota> {
        self.leaves.iter().map(LeafSpec::quota).collect()
    }

    /// The core's outcome: the decision, the final states and the final penalty record.
    fn run(&self) -> (Decision, bool, Vec<State>, Option<PenaltyState>) {
        let quotas = self.quotas();
        let penalty = self.penalty.map(|p| p.penalty());
        let mut states = self.states.clone();
        let mut record = self.penalty_record.unwrap_or_default();
        let evaluation = Evaluation {
            shape: &self.shape,
            quotas: &quotas,
            cost: self.cost,
            recording: self.recording,
            penalty: penalty.as_ref(),
        };
        let outcome = evaluate(
            &evaluation,
            &mut states,
            penalty.is_some().then_some(&mut record),
            self.now,
        );
        let record = penalty.is_some().then_some(record);
        (outcome.decision, outcome.changed, states, record)
    }

    fn expected(&self) -> Value {
        let (decision, changed, states, record) = self.run();
        json!({
            "decision": decision_json(&decision),
            "changed": changed,
            "states": states.iter().map(state_json).collect::<Vec<_>>(),
            "penalty_record": record.as_ref().map(penalty_record_json),
        })
    }
}

// JSON, both ways -----------------------------------------------------------------------------

fn shape_json(shape: &Shape) -> Value {
    match shape {
        Shape::Leaf(i) => json!(i),
        Shape::Or(children) => json!({"or": children.iter().map(shape_json).collect::<Vec<_>>()}),
        Shape::And(children) => {
            json!({"and": children.iter().map(shape_json).collect::<Vec<_>>()})
        }
    }
}

fn shape_from(v: &Value) -> Shape {
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

fn leaf_json(leaf: &LeafSpec) -> Value {
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

fn leaf_from(v: &Value) -> LeafSpec {
    LeafSpec {
        algorithm: Algorithm::from_name(v["algorithm"].as_str().unwrap()).unwrap(),
        count: u(&v["count"]),
        span_seconds: u(&v["span_seconds"]),
        burst: v.get("burst").map(u),
        windows: v.get("windows").map(|w| u(w) as u32),
    }
}

fn u(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("expected an unsigned integer, got {v}"))
}

fn state_json(state: &State) -> Value {
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

fn state_from(algorithm: Algorithm, v: &Value) -> State {
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

fn penalty_json(p: &PenaltySpec) -> Value {
    json!({
        "base_seconds": p.base_seconds,
        "factor": p.factor,
        "max_seconds": p.max_seconds,
        "forget_seconds": p.forget_seconds,
    })
}

fn penalty_from(v: &Value) -> PenaltySpec {
    PenaltySpec {
        base_seconds: u(&v["base_seconds"]),
        factor: u(&v["factor"]) as u32,
        max_seconds: u(&v["max_seconds"]),
        forget_seconds: u(&v["forget_seconds"]),
    }
}

fn penalty_record_json(r: &PenaltyState) -> Value {
    json!({"strikes": r.strikes, "until": r.until, "last_strike": r.last_strike})
}

fn penalty_record_from(v: &Value) -> PenaltyState {
    PenaltyState {
        strikes: u(&v["strikes"]) as u32,
        until: u(&v["until"]),
        last_strike: u(&v["last_strike"]),
    }
}

fn recording_name(recording: Recording) -> &'static str {
    match recording {
        Recording::Admitted => "admitted",
        Recording::Always => "always",
        Recording::Never => "never",
    }
}

fn recording_from(name: &str) -> Recording {
    match name {
        "admitted" => Recording::Admitted,
        "always" => Recording::Always,
        "never" => Recording::Never,
        other => panic!("unknown recording {other}"),
    }
}

fn in_ticks(d: Duration) -> u64 {
    let nanos = d.as_nanos();
    assert_eq!(nanos % u128::from(TICK_NS), 0, "{d:?} is not whole ticks");
    (nanos / u128::from(TICK_NS)) as u64
}

fn decision_json(d: &Decision) -> Value {
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

fn case_json(case: &Case) -> Value {
    json!({
        "shape": shape_json(&case.shape),
        "leaves": case.leaves.iter().map(leaf_json).collect::<Vec<_>>(),
        "now": case.now,
        "cost": case.cost,
        "recording": recording_name(case.recording),
        "states": case.states.iter().map(state_json).collect::<Vec<_>>(),
        "penalty": case.penalty.as_ref().map(penalty_json),
        "penalty_record": case.penalty_record.as_ref().map(penalty_record_json),
        "expected": case.expected(),
    })
}

fn case_from(v: &Value) -> Case {
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

// The generator -------------------------------------------------------------------------------

/// A tree over the leaves `first..first + n`, numbered left to right.
fn random_shape(rng: &mut Rng, first: usize, n: usize) -> Shape {
    let group = |rng: &mut Rng, children| {
        if rng.chance(50) {
            Shape::Or(children)
        } else {
            Shape::And(children)
        }
    };
    if n == 1 {
        // Now and then a group of one, which must act as its child.
        return if rng.chance(10) {
            group(rng, vec![Shape::Leaf(first)])
        } else {
            Shape::Leaf(first)
        };
    }
    let parts = rng.range(2, n as u64) as usize;
    // Split n into `parts` non-empty runs.
    let mut sizes = vec![1; parts];
    for _ in parts..n {
        let at = rng.range(0, parts as u64 - 1) as usize;
        sizes[at] += 1;
    }
    let mut next = first;
    let children = sizes
        .into_iter()
        .map(|size| {
            let child = random_shape(rng, next, size);
            next += size;
            child
        })
        .collect();
    group(rng, children)
}

fn random_leaf(rng: &mut Rng) -> LeafSpec {
    let algorithm = rng.pick(&Algorithm::ALL);
    let count = if algorithm == Algorithm::SlidingLog {
        // One sorted-set member per unit in Redis: keep the logs small.
        rng.pick(&[1, 2, 3, 4, 5, 7, 10, 12, 20, 30, 60])
    } else {
        rng.pick(&[1, 2, 3, 4, 5, 7, 10, 12, 20, 30, 60, 100, 250, 1000, 86_400])
    };
    let span_seconds = rng.pick(&[1, 2, 3, 5, 7, 10, 30, 60, 90, 300, 3_600, 86_400]);
    let burst = (algorithm == Algorithm::Gcra && rng.chance(40)).then(|| {
        if rng.chance(50) {
            rng.range(1, count.min(10))
        } else {
            rng.range(1, 2 * count + 1)
        }
    });
    let windows = (algorithm == Algorithm::SlidingWindow && rng.chance(60))
        .then(|| rng.pick(&[1, 2, 3, 4, 5, 6, 7, 10, 12, 30, 60]));
    LeafSpec {
        algorithm,
        count,
        span_seconds,
        burst,
        windows,
    }
}

/// A cost for a leaf of this capacity: mostly small, sometimes filling it, sometimes above it.
fn random_cost(rng: &mut Rng, capacity: u64) -> u64 {
    match rng.range(0, 99) {
        0..=7 => 0,
        8..=44 => 1,
        45..=74 => rng.range(1, capacity),
        75..=89 => rng.range(capacity.div_ceil(2), capacity),
        _ => rng.range(capacity + 1, 2 * capacity + 1),
    }
}

/// How long before `now` a replayed hit happened.
fn random_distance(rng: &mut Rng, window: u64, stale: bool) -> u64 {
    if stale {
        return rng.range(window, 4 * window);
    }
    match rng.range(0, 99) {
        0..=9 => 0,
        10..=14 => window,
        15..=19 => rng.range(window - 1, window + 1),
        20..=29 => rng.range(0, 1_000),
        _ => rng.range(0, window),
    }
}

/// A realistic state: a few earlier hits replayed through the core, some recorded although
/// denied (as a policy that counts denied attempts does).
fn replayed_state(rng: &mut Rng, quota: &Quota, now: u64) -> State {
    let mut state = quota.fresh_state();
    if rng.chance(20) {
        return state;
    }
    let stale = rng.chance(8);
    let window = quota.window_ticks();
    let hits = rng.range(1, 8);
    let mut times: Vec<u64> = (0..hits)
        .map(|_| now - random_distance(rng, window, stale))
        .collect();
    times.sort_unstable();
    for t in times {
        let cost = random_cost(rng, quota.capacity());
        let always = rng.chance(35);
        if always || quota.verdict(&state, t, cost).allowed {
            quota.record(&mut state, t, cost);
        }
    }
    state
}

fn random_penalty(rng: &mut Rng) -> PenaltySpec {
    let base_seconds = rng.range(1, 20);
    let factor = rng.range(1, 4) as u32;
    let max_seconds = base_seconds * rng.pick(&[1, 2, 5, 10, 30]);
    let forget_seconds = rng.pick(&[1, 5, 30, 60, 600, 3_600]);
    PenaltySpec {
        base_seconds,
        factor,
        max_seconds,
        forget_seconds,
    }
}

/// A penalty record at `now`: none, still boxed, served but remembered, or forgotten.
fn random_penalty_record(rng: &mut Rng, spec: &PenaltySpec, now: u64) -> Option<PenaltyState> {
    let penalty = spec.penalty();
    let (base, factor, max, forget) = penalty.ticks();
    let strikes = rng.range(1, 6) as u32;
    let timeout = base
        .saturating_mul(u64::from(factor).saturating_pow(strikes - 1))
        .min(max);
    let since = match rng.range(0, 99) {
        0..=34 => return None,
        // Boxed: struck less than `timeout` ago.
        35..=59 => rng.range(0, timeout - 1),
        // Exactly at the end of the box, or at the edge of forgetting.
        60..=64 => timeout,
        65..=69 => forget,
        // Served; remembered or forgotten depending on `forget`.
        _ => rng.range(timeout, timeout + 2 * forget),
    };
    let last_strike = now - since;
    Some(PenaltyState {
        strikes,
        until: last_strike + timeout,
        last_strike,
    })
}

fn random_case(rng: &mut Rng) -> Case {
    let n = match rng.range(0, 99) {
        0..=34 => 1,
        35..=69 => 2,
        _ => 3,
    };
    let shape = random_shape(rng, 0, n);
    let leaves: Vec<LeafSpec> = (0..n).map(|_| random_leaf(rng)).collect();
    let quotas: Vec<Quota> = leaves.iter().map(LeafSpec::quota).collect();

    let mut now = EPOCH_US + rng.range(0, 30 * 86_400 * 1_000_000);
    if rng.chance(30) {
        // On (or next to) an edge: a window, a sub-window or a GCRA interval.
        let q = quotas[rng.range(0, n as u64 - 1) as usize];
        let unit = match rng.range(0, 2) {
            0 => q.window_ticks(),
            1 => q.sub_window_ticks(),
            _ => q.interval_ticks(),
        };
        now = now - now % unit + rng.pick(&[0, 0, 1, unit - 1]);
    }
    let states: Vec<State> = quotas.iter().map(|q| replayed_state(rng, q, now)).collect();
    let capacity = quotas[rng.range(0, n as u64 - 1) as usize].capacity();
    let cost = random_cost(rng, capacity);
    let recording = match rng.range(0, 99) {
        0..=49 => Recording::Admitted,
        50..=84 => Recording::Always,
        _ => Recording::Never,
    };
    let penalty = rng.chance(35).then(|| random_penalty(rng));
    let penalty_record = penalty
        .as_ref()
        .and_then(|p| random_penalty_record(rng, p, now));
    let mut case = Case {
        shape,
        leaves,
        states,
        now,
        cost,
        recording,
        penalty,
        penalty_record,
    };

    // Sometimes move `now` to an instant where the answer flips: exactly at (or one tick
    // before) the retry time of a denied hit, or when a leaf's state expires.
    let roll = rng.range(0, 99);
    if roll < 15 {
        let mut peek = case.clone();
        peek.recording = Recording::Never;
        peek.penalty = None;
        if let Some(retry) = peek.run().0.retry_after() {
            let retry = in_ticks(retry);
            case.now += retry - u64::from(retry > 0 && rng.chance(30));
        }
    } else if roll < 25 {
        let i = rng.range(0, n as u64 - 1) as usize;
        let expires = quotas[i].expires_at(&case.states[i]);
        if expires > case.now {
            case.now = expires - u64::from(rng.chance(30));
        }
    }
    case
}

fn generate() -> String {
    let mut rng = Rng(SEED);
    let vectors: Vec<String> = (0..COUNT)
        .map(|_| serde_json::to_string(&case_json(&random_case(&mut rng))).unwrap())
        .collect();
    format!(
        "{{\n\"about\": \"sluice shared test vectors: generated by crates/core/tests/vectors.rs \
         (SLUICE_REGENERATE_VECTORS=1), outcomes from the Rust core. Times in microsecond \
         ticks.\",\n\"tick_ns\": {TICK_NS},\n\"vectors\": [\n{}\n]\n}}\n",
        vectors.join(",\n")
    )
}

/// The vectors in the file, written first (once per test run) when
/// `SLUICE_REGENERATE_VECTORS=1`.
fn load() -> Vec<Value> {
    static REGENERATE: Once = Once::new();
    if std::env::var("SLUICE_REGENERATE_VECTORS").as_deref() == Ok("1") {
        REGENERATE.call_once(|| std::fs::write(FILE, generate()).expect("write vectors.json"));
    }
    let text = std::fs::read_to_string(FILE).expect("tests/vectors.json");
    let file: Value = serde_json::from_str(&text).expect("vectors.json is JSON");
    assert_eq!(file["tick_ns"], json!(TICK_NS));
    file["vectors"].as_array().unwrap().clone()
}

// The tests -----------------------------------------------------------------------------------

#[test]
fn core_reproduces_every_vector() {
    let vectors = load();
    let mut failures = Vec::new();
    for (index, vector) in vectors.iter().enumerate() {
        let case = case_from(vector);
        // The inputs must read back exactly as written.
        let mut inputs = case_json(&case);
        inputs["expected"] = vector["expected"].clone();
        assert_eq!(&inputs, vector, "vector {index} does not round-trip");
        let expected = case.expected();
        if expected != vector["expected"] {
            failures.push(format!(
                "vector {index}:\n  file: {}\n  core: {expected}\n  case: {}",
                vector["expected"],
                without_expected(vector),
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "the core disagrees with {} of {} vectors (if the change is deliberate, regenerate \
         with SLUICE_REGENERATE_VECTORS=1):\n{}",
        failures.len(),
        vectors.len(),
        failures.join("\n"),
    );
    let text = std::fs::read_to_string(FILE).unwrap();
    assert!(
        text == generate(),
        "vectors.json is not the generator's output: regenerate with \
         SLUICE_REGENERATE_VECTORS=1"
    );
}

fn without_expected(vector: &Value) -> Value {
    let mut v = vector.clone();
    v.as_object_mut().unwrap().remove("expected");
    v
}

/// The file exercises every path a translation must get right.
#[test]
fn vectors_cover_every_path() {
    let vectors = load();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut note = |what: String| *seen.entry(what).or_default() += 1;
    for vector in &vectors {
        let case = case_from(vector);
        let expected = &vector["expected"];
        for (leaf, state) in case.leaves.iter().zip(&case.states) {
            note(format!("algorithm {}", leaf.algorithm));
            let fresh = *state == leaf.quota().fresh_state();
            note(format!(
                "{} state {}",
                leaf.algorithm,
                if fresh { "fresh" } else { "replayed" }
            ));
        }
        note(format!("leaves {}", case.leaves.len()));
        note(format!("shape {}", shape_kind(&case.shape)));
        note(format!("recording {}", recording_name(case.recording)));
        note(format!("denial {}", expected["decision"]["denial"]));
        note(format!(
            "{} with recording {}",
            if expected["decision"]["allowed"] == json!(true) {
                "allowed"
            } else {
                "denied"
            },
            recording_name(case.recording)
        ));
        if case.cost == 0 {
            note("cost 0".into());
        }
        if case.leaves.iter().any(|l| case.cost > l.quota().capacity()) {
            note("cost above a leaf's capacity".into());
        }
        if let (Some(p), record) = (&case.penalty, &case.penalty_record) {
            let penalty = p.penalty();
            let kind = match record {
                None => "none",
                Some(r) if r.until > case.now => "boxed",
                Some(r) if case.now - r.last_strike < penalty.ticks().3 => "served, remembered",
                Some(_) => "forgotten",
            };
            note(format!("penalty record {kind}"));
            let before = record.unwrap_or_default();
            if penalty_record_from(&expected["penalty_record"]).strikes > before.strikes {
                note("penalty strike".into());
            }
        }
    }
    let summary: Vec<String> = seen.iter().map(|(k, n)| format!("{k}: {n}")).collect();
    println!("{} vectors\n{}", vectors.len(), summary.join("\n"));
    for required in [
        "algorithm gcra",
        "algorithm sliding-window",
        "algorithm sliding-log",
        "algorithm fixed-window",
        "shape leaf",
        "shape or",
        "shape and",
        "shape nested",
        "recording admitted",
        "recording always",
        "recording never",
        "denied with recording always",
        "denial 0",
        "denial 1",
        "denial 2",
        "denial 3",
        "cost 0",
        "cost above a leaf's capacity",
        "penalty record none",
        "penalty record boxed",
        "penalty record served, remembered",
        "penalty record forgotten",
        "penalty strike",
    ] {
        assert!(
            seen.get(required).copied().unwrap_or(0) >= 5,
            "fewer than 5 vectors with {required}"
        );
    }
}

fn shape_kind(shape: &Shape) -> &'static str {
    let nested = |children: &[Shape]| children.iter().any(|c| !matches!(c, Shape::Leaf(_)));
    match shape {
        Shape::Leaf(_) => "leaf",
        Shape::Or(c) | Shape::And(c) if nested(c) => "nested",
        Shape::Or(_) => "or",
        Shape::And(_) => "and",
    }
}
