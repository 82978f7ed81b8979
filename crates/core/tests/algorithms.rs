//! Properties of the four algorithms, driven by a manual clock (`now` in nanoseconds): each
//! algorithm's documented bound, agreement with a naive reference model, exact retry times,
//! overflow safety, bounded recording of denied hits, and mismatched states.

use std::collections::HashMap;

use proptest::prelude::*;
use proptest::sample::select;
use sluice_core::algorithm::Quota;
use sluice_core::{Algorithm, Leaf, Rate, Retry, Span, State, Unit};

const SEC: u64 = 1_000_000_000;

/// One hit of a trace: time since the previous hit, cost, and whether a denial is recorded
/// anyway (policies that count denied attempts).
type Hit = (u64, u64, bool);

fn quota(alg: Algorithm, count: u64, span: Span, burst: u64, windows: u32) -> Option<Quota> {
    let mut leaf = Leaf::new(Rate::new(count, span).ok()?);
    leaf.options.algorithm = Some(alg);
    match alg {
        Algorithm::Gcra => leaf.options.burst = Some(burst),
        Algorithm::SlidingWindow => leaf.options.windows = Some(windows),
        _ => {}
    }
    Quota::from_leaf(&leaf, Algorithm::Gcra).ok()
}

/// Small counts and spans, so that traces of a few hundred hits cross many windows.
fn small_quota(alg: Algorithm) -> impl Strategy<Value = Quota> {
    (1..=20u64, 1..=10u64, 1..=20u64, 1..=10u32).prop_map(move |(count, secs, burst, windows)| {
        let span = Span::new(secs, Unit::Second).unwrap();
        quota(alg, count, span, burst, windows).unwrap()
    })
}

fn any_small_quota() -> impl Strategy<Value = Quota> {
    select(Algorithm::ALL.to_vec()).prop_flat_map(small_quota)
}

/// From 1 per 10 years to 10^9 per second, with the largest bursts and sub-window counts.
fn wide_quota() -> impl Strategy<Value = Quota> {
    let span = select(vec![
        (1, Unit::Second),
        (7, Unit::Minute),
        (1, Unit::Day),
        (3_650, Unit::Day),
        (10, Unit::Year),
    ]);
    let count = prop_oneof![Just(1u64), 1..=1_000_000_000u64, Just(1_000_000_000)];
    let windows = prop_oneof![1..=10u32, Just(3_600)];
    let alg = select(Algorithm::ALL.to_vec());
    (alg, count, span, 1..=9u64, windows).prop_filter_map(
        "a valid quota",
        |(alg, count, (mult, unit), burst_factor, windows)| {
            let span = Span::new(mult, unit).ok()?;
            quota(alg, count, span, count * burst_factor, windows)
        },
    )
}

fn start() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), 0..1_000 * SEC]
}

fn hits(max: usize) -> impl Strategy<Value = Vec<Hit>> {
    let gap = prop_oneof![
        Just(0u64),
        1..SEC / 10,
        (0..40u64).prop_map(|k| k * SEC / 4),
        0..3 * SEC,
    ];
    prop::collection::vec((gap, 0..=3u64, prop::bool::weighted(0.2)), 0..=max)
}

/// Runs a trace, calling `each(state, now, cost)` before every hit. Returns the admitted hits
/// and the time of the last hit.
fn run(
    q: &Quota,
    state: &mut State,
    start: u64,
    trace: &[Hit],
    mut each: impl FnMut(&State, u64, u64),
) -> (Vec<(u64, u64)>, u64) {
    let (mut now, mut admitted) = (start, Vec::new());
    for &(gap, cost, count_denied) in trace {
        now += gap;
        each(state, now, cost);
        let v = q.verdict(state, now, cost);
        if v.allowed {
            admitted.push((now, cost));
        }
        if v.allowed || count_denied {
            q.record(state, now, cost);
        }
    }
    (admitted, now)
}

/// The largest admitted cost within any interval `[a, a + len)`.
fn most_in_any(admitted: &[(u64, u64)], len: u64) -> u64 {
    (0..admitted.len())
        .map(|i| {
            let end = admitted[i].0 + len;
            admitted[i..]
                .iter()
                .take_while(|(t, _)| *t < end)
                .map(|(_, c)| c)
                .sum()
        })
        .max()
        .unwrap_or(0)
}

/// The retry contract of one verdict: `After(d)` means denied until exactly `now + d`.
fn assert_retry_exact(q: &Quota, state: &State, now: u64, cost: u64) {
    let v = q.verdict(state, now, cost);
    assert_eq!(
        v.retry == Retry::Never,
        cost > q.capacity(),
        "{q:?} cost {cost}: {v:?}"
    );
    match v.retry {
        Retry::Now => assert!(v.allowed, "{v:?}"),
        Retry::Never => assert!(!v.allowed, "{v:?}"),
        Retry::After(d) => {
            assert!(!v.allowed && d > 0, "{v:?}");
            for early in [now + d / 2, now + d - 1] {
                let w = q.verdict(state, early, cost);
                assert!(
                    !w.allowed,
                    "{q:?} {state:?} cost {cost}: {v:?} at {now}, yet {w:?}"
                );
            }
            let w = q.verdict(state, now + d, cost);
            assert!(
                w.allowed,
                "{q:?} {state:?} cost {cost}: {v:?} at {now}, yet {w:?}"
            );
        }
    }
}

fn no_check(_: &State, _: u64, _: u64) {}

/// A naive model of each algorithm's contract, kept as plainly as possible.
enum Model {
    /// GCRA seen as a bucket of time: `level` nanoseconds of credit, full at `burst * interval`.
    Bucket { level: u128, at: u64 },
    /// Sliding log: every admitted hit.
    Log(Vec<(u64, u64)>),
    /// Fixed window (1 slot of length W) or sliding window (the last G slots of one
    /// sub-window each): (slot length, slots counted, admitted cost per slot number).
    Slots(u64, u64, HashMap<u64, u64>),
}

impl Model {
    fn new(q: &Quota) -> Model {
        let slots = |len, counted| Model::Slots(len, counted, HashMap::new());
        match q.algorithm() {
            Algorithm::Gcra => Model::Bucket {
                level: tau(q) as u128,
                at: 0,
            },
            Algorithm::SlidingLog => Model::Log(Vec::new()),
            Algorithm::FixedWindow => slots(q.window_ticks(), 1),
            _ => slots(q.sub_window_ticks(), u64::from(q.windows())),
        }
    }

    /// (allowed, remaining) for a hit of `cost` at `now`.
    fn check(&self, q: &Quota, now: u64, cost: u64) -> (bool, u64) {
        let used: u64 = match self {
            Model::Bucket { level, at } => {
                let t = u128::from(q.interval_ticks());
                let level = (level + u128::from(now - at)).min(u128::from(tau(q)));
                let need = u128::from(cost) * t;
                let left = if need <= level { level - need } else { level };
                return (need <= level, (left / t) as u64);
            }
            Model::Log(hits) => hits
                .iter()
                .filter(|(t, _)| t + q.window_ticks() > now)
                .map(|(_, c)| c)
                .sum(),
            Model::Slots(len, counted, used) => {
                let current = now / len;
                used.iter()
                    .filter(|(n, _)| *n + counted > current)
                    .map(|(_, c)| c)
                    .sum()
            }
        };
        let limit = q.limit();
        match used + cost <= limit {
            true => (true, limit - used - cost),
            false => (false, limit.saturating_sub(used)),
        }
    }

    fn record(&mut self, q: &Quota, now: u64, cost: u64) {
        match self {
            Model::Bucket { level, at } => {
                let full = u128::from(tau(q));
                *level = (*level + u128::from(now - *at)).min(full)
                    - u128::from(cost * q.interval_ticks());
                *at = now;
            }
            Model::Log(hits) => hits.push((now, cost)),
            Model::Slots(len, _, used) => *used.entry(now / *len).or_default() += cost,
        }
    }
}

fn tau(q: &Quota) -> u64 {
    q.burst() * q.interval_ticks()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn gcra_admits_at_most_burst_plus_elapsed_intervals(
        q in small_quota(Algorithm::Gcra), start in start(), trace in hits(200),
    ) {
        let (admitted, _) = run(&q, &mut q.fresh_state(), start, &trace, no_check);
        let (t, w) = (q.interval_ticks(), q.window_ticks());
        for len in [1, t / 2, t, t + 1, w, tau(&q), 3 * w + 7] {
            let most = most_in_any(&admitted, len);
            prop_assert!(most <= q.burst() + len / t, "{most} in {len} ns: {admitted:?}");
        }
    }

    #[test]
    fn gcra_admits_agrees_with_the_verdict(
        q in small_quota(Algorithm::Gcra), now in start(), ahead in 0..100 * SEC,
        behind in 0..100 * SEC, cost in 0..30u64,
    ) {
        // TATs ahead of, behind and at `now`, costs within and beyond capacity.
        for tat in [now.saturating_add(ahead), now.saturating_sub(behind), now, 0] {
            let verdict = q.gcra_verdict(tat, now, cost);
            let (allowed, possible) = q.gcra_admits(tat, now, cost);
            prop_assert_eq!(allowed, verdict.allowed, "tat {} now {} cost {}", tat, now, cost);
            prop_assert_eq!(possible, verdict.retry != sluice_core::Retry::Never);
        }
    }

    /// The verdict on counts as a store reads them (oldest first, ending at sub-window
    /// `newest`) is the verdict on the counters built from them, for `now` in, after and
    /// before that sub-window, and counts up to past the limit.
    #[test]
    fn sliding_window_verdict_on_parts_agrees_with_the_verdict(
        q in small_quota(Algorithm::SlidingWindow), now in start(), cost in 0..30u64,
        counts in proptest::collection::vec(0..25u64, 10), back in 0..12u64, ahead in 0..3u64,
    ) {
        let g = q.windows() as usize;
        let counts = &counts[..g];
        let current = now / q.sub_window_ticks();
        for newest in [current.saturating_sub(back), current + ahead] {
            let state = State::SlidingWindow(
                sluice_core::algorithm::sliding_window::Counters::from_parts(newest, counts),
            );
            prop_assert_eq!(
                q.sliding_window_verdict(newest, counts, now, cost),
                q.verdict(&state, now, cost),
                "newest {} counts {:?}", newest, counts
            );
        }
    }

    #[test]
    fn sliding_log_admits_at_most_limit_per_window(
        q in small_quota(Algorithm::SlidingLog), start in start(), trace in hits(200),
    ) {
        let (admitted, _) = run(&q, &mut q.fresh_state(), start, &trace, no_check);
        prop_assert!(most_in_any(&admitted, q.window_ticks()) <= q.limit(), "{admitted:?}");
    }

    #[test]
    fn fixed_window_admits_at_most_limit_per_aligned_window(
        q in small_quota(Algorithm::FixedWindow), start in start(), trace in hits(200),
    ) {
        let (admitted, _) = run(&q, &mut q.fresh_state(), start, &trace, no_check);
        let mut per_window = HashMap::<u64, u64>::new();
        for (t, c) in admitted {
            *per_window.entry(t / q.window_ticks()).or_default() += c;
        }
        prop_assert!(per_window.values().all(|&n| n <= q.limit()), "{per_window:?}");
    }

    #[test]
    fn sliding_window_keeps_its_documented_bound(
        q in small_quota(Algorithm::SlidingWindow), start in start(), trace in hits(200),
    ) {
        let (admitted, _) = run(&q, &mut q.fresh_state(), start, &trace, no_check);
        let covered = u64::from(q.windows() - 1) * q.sub_window_ticks();
        prop_assert!(most_in_any(&admitted, covered) <= q.limit(), "{admitted:?}");
        prop_assert!(most_in_any(&admitted, q.window_ticks()) <= 2 * q.limit(), "{admitted:?}");
    }

    /// Every verdict agrees with the naive model; once `expires_at` passes, the state acts fresh.
    #[test]
    fn algorithms_agree_with_reference_models(
        q in any_small_quota(), start in start(), trace in hits(200),
    ) {
        let (mut state, mut model, mut now) = (q.fresh_state(), Model::new(&q), start);
        for (gap, cost, _) in trace {
            now += gap;
            let v = q.verdict(&state, now, cost);
            prop_assert_eq!((v.allowed, v.remaining), model.check(&q, now, cost), "at {}", now);
            prop_assert_eq!(v.limit, q.capacity());
            if v.allowed {
                q.record(&mut state, now, cost);
                model.record(&q, now, cost);
            }
        }
        let fresh_at = q.expires_at(&state).max(now);
        for cost in 0..=5 {
            let fresh = q.verdict(&q.fresh_state(), fresh_at, cost);
            prop_assert_eq!(q.verdict(&state, fresh_at, cost), fresh);
        }
    }

    #[test]
    fn retry_after_is_exact(
        q in any_small_quota(), start in start(), trace in hits(200),
        probes in prop::collection::vec((0..2 * SEC, 0..=25u64), 1..10),
    ) {
        let mut state = q.fresh_state();
        let (_, end) = run(&q, &mut state, start, &trace, |s, now, cost| {
            assert_retry_exact(&q, s, now, cost)
        });
        for (gap, cost) in probes {
            assert_retry_exact(&q, &state, end + gap, cost);
        }
    }

    /// Debug builds check arithmetic overflow, so a panic-free run is the property.
    #[test]
    fn extreme_rates_costs_and_times_never_panic(
        q in wide_quota(),
        start in 0..=1u64 << 62,
        trace in prop::collection::vec((
            prop_oneof![Just(0u64), 0..SEC, 0..1u64 << 58],
            prop_oneof![0..=3u64, any::<u64>(), Just(u64::MAX)],
            any::<bool>(),
        ), 0..40),
    ) {
        let mut state = q.fresh_state();
        let mut now = start;
        for (gap, cost, count_denied) in trace {
            now = now.saturating_add(gap).min(1 << 62);
            assert_retry_exact(&q, &state, now, cost);
            let v = q.verdict(&state, now, cost);
            if v.allowed || count_denied {
                q.record(&mut state, now, cost);
            }
            q.expires_at(&state);
        }
    }

    #[test]
    fn counting_denied_hits_never_locks_out(
        q in prop_oneof![any_small_quota(), wide_quota()],
        start in start(),
        trace in hits(100),
        abuse in prop::collection::vec(prop_oneof![1..=3u64, any::<u64>()], 1..50),
    ) {
        let mut state = q.fresh_state();
        let (_, t) = run(&q, &mut state, start, &trace, no_check);
        for cost in abuse {
            q.record(&mut state, t, cost);
        }
        let w = q.window_ticks();
        let healed = t + if q.algorithm() == Algorithm::Gcra { tau(&q) + w } else { 2 * w };
        prop_assert!(q.verdict(&state, healed, 1).allowed, "{:?}", state);
    }

    #[test]
    fn mismatched_state_is_treated_as_fresh(
        (made_by, q) in (0..4usize, 1..4usize).prop_flat_map(|(a, shift)| (
            small_quota(Algorithm::ALL[a]),
            small_quota(Algorithm::ALL[(a + shift) % 4]),
        )),
        start in start(),
        trace in hits(50),
        (gap, cost) in (0..3 * SEC, 0..=5u64),
    ) {
        let mut state = made_by.fresh_state();
        let (_, end) = run(&made_by, &mut state, start, &trace, no_check);
        let now = end + gap;
        let mut fresh = q.fresh_state();
        prop_assert_eq!(q.verdict(&state, now, cost), q.verdict(&fresh, now, cost));
        q.record(&mut state, now, cost);
        q.record(&mut fresh, now, cost);
        prop_assert_eq!(state, fresh);
    }
}

#[test]
fn gcra_burst_then_one_per_interval() {
    // 5/m burst 10: ten at once, then one every 12 s, not a nanosecond earlier.
    let q = Quota::gcra(
        Rate::new(5, Span::new(1, Unit::Minute).unwrap()).unwrap(),
        Some(10),
    )
    .unwrap();
    let (mut state, now) = (q.fresh_state(), 1_000 * SEC);
    for left in (0..10).rev() {
        let v = q.verdict(&state, now, 1);
        assert!(v.allowed && v.remaining == left, "{v:?}");
        q.record(&mut state, now, 1);
    }
    let v = q.verdict(&state, now, 1);
    assert_eq!(
        (v.allowed, v.retry, v.remaining),
        (false, Retry::After(12 * SEC), 0)
    );
    assert!(!q.verdict(&state, now + 12 * SEC - 1, 1).allowed);
    assert!(q.verdict(&state, now + 12 * SEC, 1).allowed);
    assert_eq!(q.verdict(&state, now, 11).retry, Retry::Never);
}

#[test]
fn sliding_window_with_other_sub_windows_starts_fresh() {
    let rate = Rate::new(3, Span::new(1, Unit::Minute).unwrap()).unwrap();
    let with = |windows| quota(Algorithm::SlidingWindow, 3, rate.span(), 0, windows).unwrap();
    let (six, four) = (with(6), with(4));
    let mut state = six.fresh_state();
    for _ in 0..3 {
        six.record(&mut state, 5 * SEC, 1);
    }
    assert!(!six.verdict(&state, 5 * SEC, 1).allowed);
    let v = four.verdict(&state, 5 * SEC, 3);
    assert!(v.allowed && v.remaining == 0, "{v:?}");
    four.record(&mut state, 5 * SEC, 1);
    assert!(four.fits(&state) && !six.fits(&state));
}
