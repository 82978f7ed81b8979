//! What a picture shows, before any drawing: hits per bin, admitted and refused, for the
//! busiest values; each rule's limit per bin; a GCRA bucket's lowest level per bin.

use crate::compare::{Comparison, Run};
use crate::simulate::Summary;

use super::axis;

/// Values drawn on their own; the rest are summed as "others".
pub const TOP: usize = 3;
/// Most bins on the time axis.
pub const MAX_BINS: u64 = 75;

/// A coloured series: one busy value, or all the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Series {
    pub label: String,
    /// How many distinct values it sums (more than one only for "others").
    pub values: usize,
}

/// Hits in one bin of one series.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Count {
    pub admitted: u64,
    pub refused: u64,
}

/// A leaf's rate drawn as a reference line.
#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    /// The leaf as written in the rule: `user:100/m`.
    pub leaf: String,
    /// Its count scaled to one bin.
    pub per_bin: f64,
    /// The selector whose every value gets this much (`None` for a global leaf).
    pub per: Option<String>,
}

/// A GCRA bucket's level over time, from the decisions' `remaining`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Level {
    /// The value whose bucket is shown; `None` when the rule keeps one bucket for all.
    pub of: Option<String>,
    /// The bucket's capacity (the right axis's top).
    pub capacity: u64,
    /// The lowest level reported in each bin; `None` for a bin without a hit of `of`.
    pub lowest: Vec<Option<u64>>,
}

/// One rule's panel.
#[derive(Debug, Clone)]
pub struct Panel {
    pub policy: String,
    pub rule: String,
    pub algorithm: String,
    pub summary: Summary,
    /// `counts[bin][series]`.
    pub counts: Vec<Vec<Count>>,
    pub limits: Vec<Limit>,
    pub level: Option<Level>,
}

/// A comparison binned for drawing; every panel shares the bins and the series.
#[derive(Debug, Clone)]
pub struct Timeline {
    /// Bin width in nanoseconds.
    pub bin: u64,
    pub bins: usize,
    pub hits: usize,
    /// The columns the series' values come from.
    pub key_columns: Vec<String>,
    pub series: Vec<Series>,
    pub panels: Vec<Panel>,
}

impl Timeline {
    pub fn new(comparison: &Comparison) -> Timeline {
        let end = comparison.times.last().copied().unwrap_or(0);
        let (bin, bins) = axis::bin_width(end, MAX_BINS);
        let (series, series_of_key) = busiest(comparison);
        let panels = comparison
            .runs
            .iter()
            .map(|run| panel(comparison, run, bin, bins, series.len(), &series_of_key))
            .collect();
        Timeline {
            bin,
            bins,
            hits: comparison.times.len(),
            key_columns: comparison.key_columns.clone(),
            series,
            panels,
        }
    }

    /// The tallest bin, in hits: the same in every panel, since each replays the same hits.
    pub fn tallest_bin(&self) -> u64 {
        self.panels.first().map_or(0, |panel| {
            panel
                .counts
                .iter()
                .map(|bin| bin.iter().map(|c| c.admitted + c.refused).sum())
                .max()
                .unwrap_or(0)
        })
    }
}

/// The `TOP` values with most hits (ties by label), then "others"; and each key's series.
fn busiest(comparison: &Comparison) -> (Vec<Series>, Vec<usize>) {
    let mut hits = vec![0u64; comparison.key_labels.len()];
    for &key in &comparison.keys {
        hits[key as usize] += 1;
    }
    let mut ranked: Vec<usize> = (0..hits.len()).collect();
    ranked.sort_by(|&a, &b| {
        hits[b]
            .cmp(&hits[a])
            .then_with(|| comparison.key_labels[a].cmp(&comparison.key_labels[b]))
    });
    // A fourth colour is clearer than "others (1 value)".
    let shown = if ranked.len() <= TOP + 1 {
        ranked.len()
    } else {
        TOP
    };
    let mut series: Vec<Series> = ranked[..shown]
        .iter()
        .map(|&key| Series {
            label: comparison.key_labels[key].clone(),
            values: 1,
        })
        .collect();
    let mut series_of_key = vec![shown; hits.len()];
    for (i, &key) in ranked[..shown].iter().enumerate() {
        series_of_key[key] = i;
    }
    if ranked.len() > shown {
        series.push(Series {
            label: format!("others ({} values)", ranked.len() - shown),
            values: ranked.len() - shown,
        });
    }
    (series, series_of_key)
}

fn panel(
    comparison: &Comparison,
    run: &Run,
    bin: u64,
    bins: usize,
    series: usize,
    series_of_key: &[usize],
) -> Panel {
    let bin_of = |t: u64| (t / bin) as usize;
    let mut counts = vec![vec![Count::default(); series]; bins];
    for ((&t, &key), outcome) in comparison
        .times
        .iter()
        .zip(&comparison.keys)
        .zip(&run.outcomes)
    {
        let count = &mut counts[bin_of(t)][series_of_key[key as usize]];
        if outcome.allowed {
            count.admitted += 1;
        } else {
            count.refused += 1;
        }
    }

    let mut limits: Vec<Limit> = Vec::new();
    for leaf in run.policy.rule.leaves() {
        let rate = leaf.rate;
        let limit = Limit {
            leaf: format!("{}{rate}", selector_prefix(&leaf.selector.to_string())),
            per_bin: rate.count() as f64 * bin as f64 / rate.span().nanos() as f64,
            per: (!leaf.selector.is_global()).then(|| leaf.selector.to_string()),
        };
        if !limits.contains(&limit) {
            limits.push(limit);
        }
    }

    // One bucket for everybody, or the busiest value's own; none when the hits of one value
    // may fall in several buckets (the rule splits by a column the series do not).
    let drawn = run.is_gcra() && run.counts_within(&comparison.key_columns);
    let level = drawn.then(|| {
        let busiest = series_of_key.iter().position(|&s| s == 0);
        let of = (!run.is_global()).then_some(busiest).flatten();
        let mut lowest: Vec<Option<u64>> = vec![None; bins];
        let mut capacity = 0;
        let hits = comparison
            .times
            .iter()
            .zip(&comparison.keys)
            .zip(&run.outcomes);
        for ((&t, &key), outcome) in hits {
            if of.is_some_and(|of| of != key as usize) {
                continue;
            }
            let slot = &mut lowest[bin_of(t)];
            *slot = Some(slot.map_or(outcome.remaining, |low| low.min(outcome.remaining)));
            capacity = capacity.max(outcome.limit);
        }
        Level {
            of: of.map(|key| comparison.key_labels[key].clone()),
            capacity,
            lowest,
        }
    });

    Panel {
        policy: run.policy.name.clone(),
        rule: run.policy.rule.to_string(),
        algorithm: run.algorithm(),
        summary: run.summary,
        counts,
        limits,
        level,
    }
}

fn selector_prefix(selector: &str) -> String {
    if selector.is_empty() {
        String::new()
    } else {
        format!("{selector}:")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::compare;
    use sluice_limiter::Policy;

    #[test]
    fn bins_sum_to_the_summary_and_others_collect_the_tail() {
        let trace = "t,user\n0,a\n0,a\n0,a\n0,b\n0,b\n1,c\n2,d\n3,e\n4,a\n";
        let policies = vec![Policy::new("sim", "user:2/s").unwrap()];
        let timeline = Timeline::new(&compare(policies, &[], trace.as_bytes()).unwrap());
        let labels: Vec<&str> = timeline.series.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels, ["a", "b", "c", "others (2 values)"]);
        let panel = &timeline.panels[0];
        let total = |f: fn(&Count) -> u64| -> u64 { panel.counts.iter().flatten().map(f).sum() };
        assert_eq!(total(|c| c.admitted), panel.summary.allowed);
        assert_eq!(total(|c| c.refused), panel.summary.denied);
        assert_eq!(timeline.tallest_bin(), 5);
        let level = panel.level.as_ref().unwrap();
        assert_eq!(level.of.as_deref(), Some("a"));
        assert_eq!(level.capacity, 2);
        assert_eq!(level.lowest[0], Some(0));
        assert_eq!(panel.limits[0].leaf, "user:2/s");
    }
}
