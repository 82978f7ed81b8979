//! Policies: a named rule with its key, namespace, defaults, penalty and flags, compiled once
//! into the quotas and identifier parts every hit needs.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_core::algorithm::QuotaError;
use sluice_core::parse::RuleError;
use sluice_core::{Algorithm, Leaf, Penalty, Quota, Rule, Shape};

use crate::failure::{FailureMode, local_quota};

/// Namespace used when a policy names none.
pub const DEFAULT_NAMESPACE: &str = "sluice";

/// A named rule and how to apply it. Build with [`Policy::new`], adjust with the setters,
/// then hand it to a [`crate::Limiter`], which validates it once.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub name: String,
    pub rule: Rule,
    /// The protected operation; policies with the same key share counters. Default: the name.
    pub key: Option<String>,
    pub namespace: Option<String>,
    /// Algorithm for leaves that name none.
    pub algorithm: Algorithm,
    pub penalty: Option<Penalty>,
    /// Decide and record as usual, but admit every hit (and report what would have happened).
    pub shadow: bool,
    /// Denied attempts count too (login protection).
    pub count_denied: bool,
    /// What to do when the store cannot decide in time.
    pub failure: FailureMode,
}

impl Policy {
    /// A policy named `name` enforcing `rule` (rule-language text).
    pub fn new(name: impl Into<String>, rule: &str) -> Result<Policy, PolicyError> {
        let name = name.into();
        let rule = rule.parse().map_err(|error| PolicyError::Rule {
            policy: name.clone(),
            error,
        })?;
        Ok(Policy::from_rule(name, rule))
    }

    pub fn from_rule(name: impl Into<String>, rule: Rule) -> Policy {
        Policy {
            name: name.into(),
            rule,
            key: None,
            namespace: None,
            algorithm: Algorithm::default(),
            penalty: None,
            shadow: false,
            count_denied: false,
            failure: FailureMode::default(),
        }
    }

    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }
    pub fn penalty(mut self, penalty: Penalty) -> Self {
        self.penalty = Some(penalty);
        self
    }
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }
    pub fn count_denied(mut self, count_denied: bool) -> Self {
        self.count_denied = count_denied;
        self
    }
    pub fn failure(mut self, failure: FailureMode) -> Self {
        self.failure = failure;
        self
    }
}

/// Why a policy cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    #[error("policy `{policy}`: rule: {error}")]
    Rule { policy: String, error: RuleError },
    #[error("policy `{policy}`: leaf `{leaf}`: {error}")]
    Quota {
        policy: String,
        leaf: String,
        error: QuotaError,
    },
    #[error("policy `{policy}`: leaf `{leaf}` appears twice; one counter cannot serve two leaves")]
    DuplicateLeaf { policy: String, leaf: String },
    #[error(
        "`{0}` is not a valid name (1 to 128 characters, no `:`, `{{`, `}}`, whitespace or control characters)"
    )]
    BadName(String),
    #[error("policy `{policy}`: leaf `{leaf}`: `prefetch` {reason}")]
    Prefetch {
        policy: String,
        leaf: String,
        reason: &'static str,
    },
}

/// A leaf ready for hits: its selector names, quota and the identifier's fixed parts.
#[derive(Debug, Clone)]
pub struct CompiledLeaf {
    pub leaf: Leaf,
    pub quota: Quota,
    /// `namespace:key:selector` (then `:` and the selector values, for a leaf with a
    /// selector).
    pub(crate) prefix: String,
    /// `:rate[~options]`, after the values.
    pub(crate) suffix: String,
    pub(crate) group: GroupAt,
    /// This leaf's own number, never given to another (clones share it, and their fixed
    /// parts): a thread's last identifier is known to be this leaf's by it.
    pub(crate) uid: u64,
}

/// The next [`CompiledLeaf::uid`] (0 is no leaf's).
static NEXT_LEAF: AtomicU64 = AtomicU64::new(1);

/// Which part of an identifier is its routing group (see [`crate::Identifier`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupAt {
    /// The value of the selector name at this index: every identifier of a hit that holds
    /// that value shares the group, whatever else it holds.
    Value(usize),
    /// The first bytes of the prefix, `namespace:key`: one group for the whole policy.
    Prefix(usize),
}

/// A validated policy.
#[derive(Debug, Clone)]
pub struct CompiledPolicy {
    pub policy: Policy,
    pub leaves: Vec<CompiledLeaf>,
    pub quotas: Vec<Quota>,
    /// The quotas scaled to the local share, for deciding without the store.
    pub local_quotas: Option<Vec<Quota>>,
    pub shape: Shape,
    /// Selector names of the penalty record: every name the rule uses, sorted.
    pub(crate) penalty_names: Vec<String>,
    /// `namespace:key:names`; the values and `:penalty` follow.
    pub(crate) penalty_prefix: String,
    pub(crate) penalty_group: GroupAt,
    /// Some leaf is a concurrency leaf: hits take a lease ([`crate::Limiter::acquire`]).
    pub(crate) concurrent: bool,
    /// Selector names of the concurrency leaves, sorted, each once: what a lease token
    /// carries (made here once, not on every acquire).
    pub(crate) lease_names: Vec<String>,
    /// `prefetch=N` on the rule's one leaf: the block size and its rate's span.
    pub(crate) prefetch: Option<(u64, std::time::Duration)>,
}

fn check_name(name: &str) -> Result<(), PolicyError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name
            .chars()
            .any(|c| matches!(c, ':' | '{' | '}') || c.is_whitespace() || c.is_control());
    if ok {
        Ok(())
    } else {
        Err(PolicyError::BadName(name.to_owned()))
    }
}

impl CompiledPolicy {
    pub fn compile(policy: Policy) -> Result<CompiledPolicy, PolicyError> {
        check_name(&policy.name)?;
        let key = policy.key.clone().unwrap_or_else(|| policy.name.clone());
        let namespace = policy
            .namespace
            .clone()
            .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());
        check_name(&key)?;
        check_name(&namespace)?;
        let operation = format!("{namespace}:{key}");

        // The first selector every leaf has routes them all, so a store that spreads keys
        // (Redis Cluster) keeps one hit's counters (and its penalty record) together.
        let mut common: Vec<&String> = policy
            .rule
            .leaves()
            .first()
            .map(|l| l.selector.names().iter().collect())
            .unwrap_or_default();
        common.sort();
        let shared = common
            .into_iter()
            .find(|name| {
                policy
                    .rule
                    .leaves()
                    .iter()
                    .all(|l| l.selector.names().contains(name))
            })
            .cloned();
        // A rule with `and` whose leaves share no selector keeps all its counters in one
        // group, the policy's: an `and` decided group by group could admit a hit on a leaf's
        // stale count. An `or` rule is safe across groups and stays spread.
        let whole_policy = shared.is_none() && policy.rule.shape().has_and();
        let group_of = |names: &[String]| -> GroupAt {
            if names.is_empty() || whole_policy {
                return GroupAt::Prefix(operation.len());
            }
            GroupAt::Value(
                shared
                    .as_ref()
                    .and_then(|t| names.iter().position(|n| n == t))
                    .unwrap_or(0),
            )
        };

        let mut leaves: Vec<CompiledLeaf> = Vec::new();
        for leaf in policy.rule.leaves() {
            let quota =
                Quota::from_leaf(leaf, policy.algorithm).map_err(|error| PolicyError::Quota {
                    policy: policy.name.clone(),
                    leaf: leaf.to_string(),
                    error,
                })?;
            let prefix = if leaf.selector.is_global() {
                format!("{operation}:*")
            } else {
                format!("{operation}:{}:", leaf.selector)
            };
            let suffix = leaf_suffix(leaf, &quota);
            if leaves
                .iter()
                .any(|l| l.prefix == prefix && l.suffix == suffix)
            {
                return Err(PolicyError::DuplicateLeaf {
                    policy: policy.name.clone(),
                    leaf: leaf.to_string(),
                });
            }
            leaves.push(CompiledLeaf {
                leaf: leaf.clone(),
                quota,
                prefix,
                suffix,
                group: group_of(leaf.selector.names()),
                uid: NEXT_LEAF.fetch_add(1, Ordering::Relaxed),
            });
        }
        let mut penalty_names: Vec<String> = leaves
            .iter()
            .flat_map(|l| l.leaf.selector.names().iter().cloned())
            .collect();
        penalty_names.sort();
        penalty_names.dedup();
        let penalty_prefix = if penalty_names.is_empty() {
            format!("{operation}:*")
        } else {
            format!("{operation}:{}:", penalty_names.join("+"))
        };
        let local_quotas = policy.failure.share().map(|share| {
            leaves
                .iter()
                .map(|l| local_quota(&l.leaf, &l.quota, share))
                .collect()
        });
        let prefetch = prefetch_of(&policy, &leaves)?;
        let mut lease_names: Vec<String> = leaves
            .iter()
            .filter(|l| l.leaf.is_concurrency())
            .flat_map(|l| l.leaf.selector.names().iter().cloned())
            .collect();
        lease_names.sort();
        lease_names.dedup();
        Ok(CompiledPolicy {
            lease_names,
            prefetch,
            concurrent: leaves.iter().any(|l| l.leaf.is_concurrency()),
            quotas: leaves.iter().map(|l| l.quota).collect(),
            local_quotas,
            shape: policy.rule.shape(),
            penalty_prefix,
            penalty_group: group_of(&penalty_names),
            penalty_names,
            leaves,
            policy,
        })
    }

    pub fn name(&self) -> &str {
        &self.policy.name
    }

    /// Whether the rule holds a concurrency leaf (`user:3 concurrent`): its hits take a
    /// lease with [`crate::Limiter::acquire`], not [`crate::Limiter::check`].
    pub fn has_concurrency(&self) -> bool {
        self.concurrent
    }
}

/// The block size of a `prefetch=N` leaf, checked: blocks are spent in this process, so
/// the leaf must decide alone (a block cannot honour another leaf, a penalty or counted
/// denials), its algorithm must count hits one by one (GCRA or a fixed window), and one
/// block must fit in what the leaf can ever admit.
fn prefetch_of(
    policy: &Policy,
    leaves: &[CompiledLeaf],
) -> Result<Option<(u64, std::time::Duration)>, PolicyError> {
    let Some(leaf) = leaves.iter().find(|l| l.leaf.options.prefetch.is_some()) else {
        return Ok(None);
    };
    let block = leaf.leaf.options.prefetch.unwrap_or(0);
    let refuse = |reason| PolicyError::Prefetch {
        policy: policy.name.clone(),
        leaf: leaf.leaf.to_string(),
        reason,
    };
    if leaves.len() > 1 {
        return Err(refuse("needs the leaf to be the whole rule"));
    }
    if policy.penalty.is_some() {
        return Err(refuse("cannot be combined with a penalty"));
    }
    if policy.count_denied {
        return Err(refuse("cannot be combined with counted denials"));
    }
    if !matches!(
        leaf.quota.algorithm(),
        Algorithm::Gcra | Algorithm::FixedWindow
    ) {
        return Err(refuse("works with gcra and fixed-window only"));
    }
    if block > leaf.quota.capacity() {
        return Err(refuse(
            "is larger than the leaf's capacity (its count or burst)",
        ));
    }
    Ok(Some((block, leaf.leaf.rate.span().duration())))
}

/// `:10/s`, plus `~` options that change the meaning of the state (algorithm, burst, windows).
/// A concurrency leaf's is `:concurrent`, whatever its count and lease time: a reload that
/// changes them keeps the leases held.
fn leaf_suffix(leaf: &Leaf, quota: &Quota) -> String {
    if quota.algorithm() == Algorithm::Concurrency {
        return ":concurrent".to_owned();
    }
    let mut suffix = format!(":{}", leaf.rate);
    if quota.algorithm() != Algorithm::Gcra {
        let _ = write!(suffix, "~{}", quota.algorithm());
    }
    if quota.algorithm() == Algorithm::Gcra && quota.burst() != quota.limit() {
        let _ = write!(suffix, "~b{}", quota.burst());
    }
    if quota.algorithm() == Algorithm::SlidingWindow
        && quota.windows() != sluice_core::algorithm::DEFAULT_WINDOWS
    {
        let _ = write!(suffix, "~w{}", quota.windows());
    }
    suffix
}
