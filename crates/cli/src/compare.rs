//! Several policies replayed on one trace in a single pass: what `sluice simulate` keeps to
//! draw a picture or print one summary per rule.

use std::collections::HashMap;
use std::io::Read;

use serde_json::json;
use sluice_limiter::{Algorithm, Policy};

use crate::simulate::{LeafLeases, Replay, Summary, TraceError, TraceReader, summary_json};

/// What one policy decided for one hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub allowed: bool,
    /// Hits of cost 1 still admissible, as the decision reports it.
    pub remaining: u64,
    /// The deciding leaf's capacity.
    pub limit: u64,
}

/// One policy replayed over the whole trace.
#[derive(Debug, Clone)]
pub struct Run {
    pub policy: Policy,
    pub summary: Summary,
    /// What each concurrency leaf's leases did (empty for a rule without one).
    pub leases: Vec<LeafLeases>,
    /// One per hit, in trace order.
    pub outcomes: Vec<Outcome>,
}

impl Run {
    /// The algorithm the leaves use: the policy's default unless leaves name others
    /// (`fixed-window + gcra` for a rule mixing two).
    pub fn algorithm(&self) -> String {
        let mut names: Vec<&str> = Vec::new();
        for algorithm in self.leaf_algorithms() {
            if !names.contains(&algorithm.name()) {
                names.push(algorithm.name());
            }
        }
        names.join(" + ")
    }

    /// Whether every leaf is a GCRA bucket, so `remaining` is a bucket level.
    pub fn is_gcra(&self) -> bool {
        self.leaf_algorithms().all(|a| a == Algorithm::Gcra)
    }

    /// Whether all the hits of one value of `columns` share the same counters: true when
    /// every selector the rule names is one of `columns` (and for a rule without selectors).
    pub fn counts_within(&self, columns: &[String]) -> bool {
        self.policy
            .rule
            .leaves()
            .iter()
            .all(|l| l.selector.names().iter().all(|n| columns.contains(n)))
    }

    /// Whether the rule keeps one counter for everybody (no leaf names a selector).
    pub fn is_global(&self) -> bool {
        self.counts_within(&[])
    }

    fn leaf_algorithms(&self) -> impl Iterator<Item = Algorithm> + '_ {
        let default = self.policy.algorithm;
        self.policy
            .rule
            .leaves()
            .into_iter()
            .map(move |leaf| leaf.options.algorithm.unwrap_or(default))
    }

    /// The line `sluice simulate` prints for this run when it prints summaries only.
    pub fn summary_json(&self, panel: usize) -> serde_json::Value {
        json!({
            "panel": panel + 1,
            "policy": self.policy.name,
            "rule": self.policy.rule.to_string(),
            "algorithm": self.algorithm(),
            "summary": summary_json(self.summary, &self.leases),
        })
    }
}

/// A trace replayed against several policies.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// Each hit's time, in nanoseconds from the start.
    pub times: Vec<u64>,
    /// Each hit's key: an index into `key_labels`.
    pub keys: Vec<u32>,
    /// The distinct values of the key columns, as shown to a reader.
    pub key_labels: Vec<String>,
    /// The selector columns a key is made of (see [`compare`]).
    pub key_columns: Vec<String>,
    /// One per policy, in the order given.
    pub runs: Vec<Run>,
}

/// Replays `trace` once, deciding every hit under each of `policies` on its own store.
///
/// Hits are told apart by the selector columns `by`; when it is empty, by the first rule's
/// first selector (`ip+user` for `ip+user:5/m`), else by the trace's first selector column.
pub fn compare(
    policies: Vec<Policy>,
    by: &[String],
    trace: impl Read,
) -> Result<Comparison, TraceError> {
    let reader = TraceReader::new(trace)?;
    let header = reader.header().clone();
    let mut replays = policies
        .iter()
        .map(|policy| Replay::new(policy.clone(), &header))
        .collect::<Result<Vec<_>, _>>()?;
    let first_selector = policies
        .iter()
        .flat_map(|p| p.rule.leaves())
        .map(|leaf| leaf.selector.names().to_vec())
        .find(|names| !names.is_empty());
    let key_columns = match (by, first_selector) {
        ([], Some(names)) => names,
        // Rules with one counter for everybody: the first column still says who sent what.
        ([], None) => header.selectors.iter().take(1).cloned().collect(),
        (by, _) => by.to_vec(),
    };
    let key_indices = key_columns
        .iter()
        .map(|name| {
            header
                .selectors
                .iter()
                .position(|s| s == name)
                .ok_or_else(|| {
                    TraceError::Header(format!("no column `{name}` to tell hits apart by"))
                })
        })
        .collect::<Result<Vec<usize>, _>>()?;

    let mut comparison = Comparison {
        times: Vec::new(),
        keys: Vec::new(),
        key_labels: Vec::new(),
        key_columns,
        runs: policies
            .into_iter()
            .map(|policy| Run {
                policy,
                summary: Summary::default(),
                leases: Vec::new(),
                outcomes: Vec::new(),
            })
            .collect(),
    };
    let mut ids: HashMap<String, u32> = HashMap::new();
    for hit in reader {
        let hit = hit?;
        for (replay, run) in replays.iter_mut().zip(&mut comparison.runs) {
            let decision = replay.check(&header, &hit)?.decision;
            run.summary.add(decision.allowed());
            run.outcomes.push(Outcome {
                allowed: decision.allowed(),
                remaining: decision.remaining,
                limit: decision.limit,
            });
        }
        let label = key_label(&comparison.key_columns, &key_indices, &hit.values);
        let next = comparison.key_labels.len() as u32;
        let id = *ids.entry(label).or_insert_with_key(|label| {
            comparison.key_labels.push(label.clone());
            next
        });
        comparison.times.push(hit.t);
        comparison.keys.push(id);
    }
    for (replay, run) in replays.iter_mut().zip(&mut comparison.runs) {
        run.leases = replay.finish()?;
    }
    Ok(comparison)
}

/// `alice` for one key column, `user=alice ip=192.0.2.1` for several, `all hits` for none.
fn key_label(columns: &[String], indices: &[usize], values: &[String]) -> String {
    let value = |i: usize| match values[i].as_str() {
        "" => "(empty)",
        v => v,
    };
    match indices {
        [] => "all hits".to_owned(),
        [i] => value(*i).to_owned(),
        _ => columns
            .iter()
            .zip(indices)
            .map(|(name, &i)| format!("{name}={}", value(i)))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_pass_gives_each_policy_its_own_summary() {
        let trace = "t,user,ip\n0,a,1\n0,a,1\n0,a,2\n0,b,2\n";
        let policies = vec![
            Policy::new("sim", "user:2/s").unwrap(),
            Policy::new("sim", "ip:1/s").unwrap(),
        ];
        let comparison = compare(policies.clone(), &[], trace.as_bytes()).unwrap();
        assert_eq!(comparison.runs[0].summary.allowed, 3);
        assert_eq!(comparison.runs[1].summary.allowed, 2);
        assert_eq!(comparison.key_columns, ["user"]);
        assert_eq!(comparison.key_labels, ["a", "b"]);
        assert_eq!(comparison.keys, [0, 0, 0, 1]);

        let by = ["ip".to_owned(), "user".to_owned()];
        let comparison = compare(policies.clone(), &by, trace.as_bytes()).unwrap();
        assert_eq!(comparison.key_labels[0], "ip=1 user=a");
        assert_eq!(comparison.keys, [0, 0, 1, 2]);
        let unknown = compare(policies, &["host".to_owned()], trace.as_bytes());
        assert!(unknown.unwrap_err().to_string().contains("`host`"));
    }

    #[test]
    fn names_the_algorithms_in_use() {
        let run = |rule: &str| Run {
            policy: Policy::new("sim", rule)
                .unwrap()
                .algorithm(Algorithm::FixedWindow),
            summary: Summary::default(),
            leases: Vec::new(),
            outcomes: Vec::new(),
        };
        assert_eq!(run("10/s").algorithm(), "fixed-window");
        assert_eq!(
            run("10/s; 20/m algorithm=gcra").algorithm(),
            "fixed-window + gcra"
        );
        assert!(run("10/s algorithm=gcra").is_gcra());
        assert!(run("10/s").is_global() && !run("ip:10/s").is_global());
    }
}
