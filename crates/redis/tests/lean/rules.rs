//! What the lean rule script's tests share: quotas as the limiter hands them to the store,
//! rules and their lean hits, and what the script answers of a sliding window or log that
//! holds a given state (the spec the script is held to).

use sluice_core::{
    Algorithm, Evaluation, Leaf, Penalty, Quota, Rate, Recording, Shape, Span, State, Unit,
};
use sluice_limiter::{Hit, Identifier};
use sluice_redis::script::LeanRule;

/// A GCRA quota of `count` per `seconds` with a burst of `burst`, as the limiter hands it
/// to the store.
pub fn quota(count: u64, seconds: u64, burst: u64) -> Quota {
    let rate = Rate::new(count, Span::new(seconds, Unit::Second).unwrap()).unwrap();
    let mut leaf = Leaf::new(rate);
    leaf.options.burst = Some(burst);
    Quota::from_leaf(&leaf, Algorithm::Gcra).unwrap()
}

/// A fixed-window quota of `count` per `seconds`.
pub fn fixed(count: u64, seconds: u64) -> Quota {
    let rate = Rate::new(count, Span::new(seconds, Unit::Second).unwrap()).unwrap();
    Quota::from_leaf(&Leaf::new(rate), Algorithm::FixedWindow).unwrap()
}

/// A sliding-window quota of `count` per `seconds` in `windows` sub-windows.
pub fn sliding(count: u64, seconds: u64, windows: u32) -> Quota {
    let rate = Rate::new(count, Span::new(seconds, Unit::Second).unwrap()).unwrap();
    let mut leaf = Leaf::new(rate);
    leaf.options.windows = Some(windows);
    Quota::from_leaf(&leaf, Algorithm::SlidingWindow).unwrap()
}

/// A sliding-log quota of `count` per `seconds`.
pub fn log(count: u64, seconds: u64) -> Quota {
    let rate = Rate::new(count, Span::new(seconds, Unit::Second).unwrap()).unwrap();
    Quota::from_leaf(&Leaf::new(rate), Algorithm::SlidingLog).unwrap()
}

/// The units of a log inside its window at `now`, oldest first: one time per unit.
pub fn units(q: &Quota, state: &State, now: u64) -> Vec<u64> {
    let State::SlidingLog(log) = state else {
        unreachable!("{state:?}")
    };
    log.hits()
        .filter(|(at, _)| at + q.window_ticks() > now)
        .flat_map(|(at, cost)| std::iter::repeat_n(at, cost as usize))
        .collect()
}

/// What the script answers of a sliding log holding `state` for a hit of `cost`: its used
/// units, the newest one's time, the k-th oldest's (k = used + cost - limit, the wait of a
/// denial) and, recording `always`, the (k + cost)-th oldest's (0 for each one not asked or
/// not there).
pub fn log_answer(q: &Quota, state: &State, now: u64, cost: u64, recording: Recording) -> Vec<u64> {
    let units = units(q, state, now);
    let used = units.len() as i64;
    let k = used + cost as i64 - q.limit() as i64;
    let fits = cost <= q.limit();
    let at = |n: i64| {
        if fits && n >= 1 && n <= used {
            units[n as usize - 1]
        } else {
            0
        }
    };
    let next = if recording == Recording::Always {
        at(k + cost as i64)
    } else {
        0
    };
    vec![used as u64, units.last().copied().unwrap_or(0), at(k), next]
}

/// What the script answers of a sliding window holding `state` for a hit of `cost`: the
/// units counted at `now`, the current sub-window's, and as sub-windows back from the
/// current one the newest earlier one holding units, where the k-th oldest unit lies (k =
/// used + cost - limit) and, recording `always`, the k2-th (k2 the same once recorded),
/// each 0 when not asked or in the current one; then how far after now the state's newest
/// sub-window is.
pub fn window_answer(
    q: &Quota,
    state: &State,
    now: u64,
    cost: u64,
    recording: Recording,
) -> Vec<u64> {
    let State::SlidingWindow(c) = state else {
        unreachable!("{state:?}")
    };
    let (g, limit) = (u64::from(q.windows()), q.limit());
    let current = now / q.sub_window_ticks();
    let counted: Vec<(u64, u64)> = ((current + 1).saturating_sub(g)..=current)
        .map(|n| (n, c.count(n)))
        .collect();
    let used: u64 = counted.iter().map(|(_, count)| count).sum();
    let cur = c.count(current);
    let before = used - cur;
    let prev = counted
        .iter()
        .rev()
        .find(|&&(n, count)| n < current && count > 0)
        .map_or(0, |(n, _)| current - n);
    let ahead = c.newest().saturating_sub(current);
    let recorded = if ahead > 0 {
        used
    } else {
        before + (cur + cost).min(2 * limit)
    };
    let at = |k: i64| -> u64 {
        if cost > limit || k < 1 || k > before as i64 {
            return 0;
        }
        let mut sum = 0;
        for &(n, count) in &counted {
            sum += count;
            if sum as i64 >= k {
                return current - n;
            }
        }
        unreachable!("k is within the units before the current sub-window")
    };
    let k = used as i64 + cost as i64 - limit as i64;
    let k2 = recorded as i64 + cost as i64 - limit as i64;
    let second = if recording == Recording::Always {
        at(k2)
    } else {
        0
    };
    vec![used, cur, prev, at(k), second, ahead]
}

/// A rule: its leaves' quotas (joined by `;` when more than one), its penalty.
pub struct Rule {
    pub quotas: Vec<Quota>,
    pub shape: Shape,
    pub penalty: Option<Penalty>,
}

impl Rule {
    pub fn new(quotas: Vec<Quota>, penalty: Option<Penalty>) -> Rule {
        let shape = match quotas.len() {
            1 => Shape::Leaf(0),
            n => Shape::Or((0..n).rev().map(Shape::Leaf).collect()),
        };
        Rule {
            quotas,
            shape,
            penalty,
        }
    }

    /// `or(and(leaf 0, leaf 1), leaf 2)`: leaf 2 always counts, and leaves 0 and 1 only
    /// deny together.
    pub fn or_of_and(quotas: Vec<Quota>) -> Rule {
        let shape = Shape::Or(vec![
            Shape::And(vec![Shape::Leaf(0), Shape::Leaf(1)]),
            Shape::Leaf(2),
        ]);
        Rule {
            quotas,
            shape,
            penalty: None,
        }
    }

    pub fn evaluation(&self, cost: u64, recording: Recording) -> Evaluation<'_> {
        Evaluation {
            shape: &self.shape,
            quotas: &self.quotas,
            cost,
            recording,
            penalty: self.penalty.as_ref(),
        }
    }

    /// The hit as the store sees it: its lean form.
    pub fn lean(&self, cost: u64, recording: Recording) -> LeanRule {
        let ids: Vec<Identifier> = (0..self.quotas.len())
            .map(|i| Identifier::new(format!("k{i}")))
            .collect();
        let penalty_id = Identifier::new("p");
        let hit = Hit {
            identifiers: &ids,
            evaluation: self.evaluation(cost, recording),
            penalty_identifier: self.penalty.is_some().then_some(&penalty_id),
        };
        LeanRule::of(&hit).unwrap().expect("a lean hit")
    }
}
