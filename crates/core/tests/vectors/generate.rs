//! The generator of `vectors.json`: random cases from a fixed seed, each written with the
//! outcome the core computes.

use sluice_core::{Algorithm, PenaltyState, Quota, Recording, Shape, State};
use sluice_testkit::vectors::{Case, LeafSpec, PenaltySpec, TICK_NS, in_ticks};

use super::{run, vector};

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
        if let Some(retry) = run(&peek).0.retry_after() {
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

pub(super) fn generate() -> String {
    let mut rng = Rng(SEED);
    let vectors: Vec<String> = (0..COUNT)
        .map(|_| serde_json::to_string(&vector(&random_case(&mut rng))).unwrap())
        .collect();
    format!(
        "{{\n\"about\": \"sluice shared test vectors: generated by crates/core/tests/vectors.rs \
         (SLUICE_REGENERATE_VECTORS=1), outcomes from the Rust core. Times in microsecond \
         ticks.\",\n\"tick_ns\": {TICK_NS},\n\"vectors\": [\n{}\n]\n}}\n",
        vectors.join(",\n")
    )
}
