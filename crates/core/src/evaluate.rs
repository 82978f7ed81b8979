//! Evaluating a rule tree over its leaves' states in one step.
//!
//! Each leaf judges the hit on its own; the tree combines the judgements (`or` is reached when
//! any child is, `and` only when every child is). An admitted hit is recorded in every leaf;
//! a denied one in none, unless the policy counts denied attempts. Stores call this with the
//! states locked (or inside one script), so check and record are one atomic step.

use crate::algorithm::{Quota, Retry, State, Verdict};
use crate::decision::{Decision, Denial, denial_of, ticks};
use crate::penalty::{Penalty, PenaltyState};
use crate::rule::Shape;

/// Which hits change the states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Recording {
    /// Record admitted hits: an ordinary check. (With either recording mode, a hit the rule
    /// limits also strikes the policy's penalty; a peek never does.)
    Admitted,
    /// Record every hit, denied ones too (login protection).
    Always,
    /// Record nothing: a peek.
    Never,
}

impl Recording {
    /// Whether a hit is recorded, from whether the rule `allowed` it and whether it was
    /// `possible` at all (its cost within what the rule can ever admit: a hit that can never
    /// pass is a caller's mistake, not an attempt worth counting).
    #[inline]
    pub const fn records(self, allowed: bool, possible: bool) -> bool {
        match self {
            Recording::Admitted => allowed,
            Recording::Always => possible,
            Recording::Never => false,
        }
    }

    /// [`Recording::records`] for a decision already made.
    pub fn records_decision(self, decision: &Decision) -> bool {
        self.records(
            decision.allowed(),
            decision.denial != Some(Denial::CostExceedsCapacity),
        )
    }
}

/// Everything about one hit except the states and the time.
#[derive(Debug, Clone, Copy)]
pub struct Evaluation<'a> {
    pub shape: &'a Shape,
    pub quotas: &'a [Quota],
    pub cost: u64,
    pub recording: Recording,
    pub penalty: Option<&'a Penalty>,
}

/// A decision and whether any state changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub decision: Decision,
    pub changed: bool,
}

/// Decides one hit at `now` and updates `states` (one per quota, same order) and the
/// penalty record as the decision requires.
pub fn evaluate(
    evaluation: &Evaluation<'_>,
    states: &mut [State],
    penalty: Option<&mut PenaltyState>,
    now: u64,
) -> Outcome {
    let Evaluation {
        shape,
        quotas,
        cost,
        recording,
        ..
    } = *evaluation;
    assert_eq!(quotas.len(), states.len(), "one state per quota");
    // All quotas of one evaluation count in the same tick (one store, one clock).
    let tick = quotas[0].tick();

    if let (Some(config), Some(record)) = (evaluation.penalty, penalty.as_deref())
        && let Some(wait) = config.remaining(record, now)
    {
        let verdict = quotas[0].verdict(&states[0], now, 0);
        let decision = Decision {
            denial: Some(Denial::Penalized {
                retry_after: ticks(wait, tick),
            }),
            limit: verdict.limit,
            remaining: 0,
            reset_after: ticks(verdict.reset_after.max(wait), tick),
            leaf: 0,
        };
        return Outcome {
            decision,
            changed: false,
        };
    }

    let mut decision = decide(shape, quotas, states, now, cost);

    let record = recording.records_decision(&decision);
    if record {
        for (quota, state) in quotas.iter().zip(states.iter_mut()) {
            quota.record(state, now, cost);
        }
        if !decision.allowed() {
            // A denied hit that counts makes the wait longer: report the wait of the recorded
            // states, or a client retrying exactly at `retry_after` would be denied forever.
            let recorded = decide(shape, quotas, states, now, cost);
            if !recorded.allowed() {
                decision = recorded;
            }
        }
    }
    let mut changed = record;
    if let (Some(config), Some(record), Some(Denial::Limited { retry_after })) =
        (evaluation.penalty, penalty, decision.denial)
        && recording != Recording::Never
    {
        let wait = ticks(config.strike(record, now), tick);
        changed = true;
        if retry_after < wait {
            decision.denial = Some(Denial::Penalized { retry_after: wait });
            decision.reset_after = decision.reset_after.max(wait);
        }
    }
    Outcome { decision, changed }
}

/// The decision the tree makes on a hit of `cost` at `now`, from the leaves' states.
fn decide(shape: &Shape, quotas: &[Quota], states: &[State], now: u64, cost: u64) -> Decision {
    // Nearly every rule has a few leaves: their verdicts stay on the stack (a heap list per
    // decision was a fifth of a one-leaf fixed-window decision in the memory store).
    const ON_STACK: usize = 8;
    if quotas.len() <= ON_STACK {
        let mut verdicts = [Verdict {
            allowed: true,
            limit: 0,
            remaining: 0,
            reset_after: 0,
            retry: Retry::Never,
        }; ON_STACK];
        for ((slot, quota), state) in verdicts.iter_mut().zip(quotas).zip(states) {
            *slot = quota.verdict(state, now, cost);
        }
        return decide_verdicts(shape, &verdicts[..quotas.len()], quotas[0].tick());
    }
    let verdicts: Vec<Verdict> = quotas
        .iter()
        .zip(states.iter())
        .map(|(quota, state)| quota.verdict(state, now, cost))
        .collect();
    decide_verdicts(shape, &verdicts, quotas[0].tick())
}

/// The decision a tree makes from its leaves' verdicts (one per leaf, in leaf order), with
/// times in ticks of `tick` nanoseconds. Stores that cannot judge every leaf in one step (a
/// rule spread over several Redis Cluster slots) fold their verdicts with this.
pub fn decide_verdicts(shape: &Shape, verdicts: &[Verdict], tick: u64) -> Decision {
    let root = fold(shape, verdicts);
    if root.reached {
        let mut d = Decision::from_verdict(&verdicts[root.retry_leaf], root.retry_leaf, tick);
        // A reached node always has a retry time; were it `Now`, the hit is still denied.
        d.denial = Some(denial_of(root.retry, tick).unwrap_or(Denial::Limited {
            retry_after: std::time::Duration::ZERO,
        }));
        d.remaining = root.remaining;
        d
    } else {
        let mut d =
            Decision::from_verdict(&verdicts[root.remaining_leaf], root.remaining_leaf, tick);
        // The reporting leaf may itself be reached (inside an `and`); the tree is not.
        d.denial = None;
        d.remaining = root.remaining;
        d
    }
}

/// A subtree's combined judgement.
struct Node {
    reached: bool,
    /// When the subtree stops being reached (meaningful only if reached).
    retry: Retry,
    retry_leaf: usize,
    /// Cost-1 hits left before the subtree is reached.
    remaining: u64,
    remaining_leaf: usize,
}

fn later(a: Retry, b: Retry) -> bool {
    match (a, b) {
        (Retry::Never, _) => false,
        (_, Retry::Never) => true,
        (Retry::After(x), Retry::After(y)) => y > x,
        (Retry::Now, _) => true,
        (_, Retry::Now) => false,
    }
}

fn fold(shape: &Shape, verdicts: &[Verdict]) -> Node {
    match shape {
        Shape::Leaf(i) => Node {
            reached: !verdicts[*i].allowed,
            retry: verdicts[*i].retry,
            retry_leaf: *i,
            remaining: verdicts[*i].remaining,
            remaining_leaf: *i,
        },
        Shape::Or(children) => {
            // Reached when any child is; clears when the last reached child clears; its
            // headroom is the smallest child's.
            let (mut out, nodes) = first_node(children, verdicts);
            for n in nodes {
                out.reached |= n.reached;
                if n.reached && (!out_reached_set(&out) || later(out.retry, n.retry)) {
                    (out.retry, out.retry_leaf) = (n.retry, n.retry_leaf);
                }
                if n.remaining < out.remaining {
                    (out.remaining, out.remaining_leaf) = (n.remaining, n.remaining_leaf);
                }
            }
            out
        }
        Shape::And(children) => {
            // Reached only when every child is; clears when the first child clears; its
            // headroom is the largest child's.
            let (mut out, nodes) = first_node(children, verdicts);
            out.reached = true;
            for n in nodes {
                out.reached &= n.reached;
                if later(n.retry, out.retry) {
                    (out.retry, out.retry_leaf) = (n.retry, n.retry_leaf);
                }
                if n.remaining > out.remaining {
                    (out.remaining, out.remaining_leaf) = (n.remaining, n.remaining_leaf);
                }
            }
            out
        }
    }
}

/// The starting point of a fold: the first child's numbers with `retry` unset (`Now`) and
/// `reached` false, and every child's node in order (the first included), folded as they
/// are walked: a group's nodes are never collected (a list per group per decision was
/// most of a compound rule's allocations).
fn first_node<'a>(
    children: &'a [Shape],
    verdicts: &'a [Verdict],
) -> (Node, impl Iterator<Item = Node> + 'a) {
    let first = fold(children.first().expect("groups are never empty"), verdicts);
    let out = Node {
        reached: false,
        retry: if first.reached {
            first.retry
        } else {
            Retry::Now
        },
        retry_leaf: first.retry_leaf,
        remaining: first.remaining,
        remaining_leaf: first.remaining_leaf,
    };
    let rest = children[1..].iter().map(move |c| fold(c, verdicts));
    (out, std::iter::once(first).chain(rest))
}

fn out_reached_set(node: &Node) -> bool {
    node.retry != Retry::Now
}
