//! The loaded descriptor tree and its lookup: which leaf a request's descriptor reaches.

use std::collections::HashMap;
use std::sync::Arc;

use sluice_limiter::Policy;

use sluice_core::Span;

/// What a matched leaf says.
#[derive(Debug, Clone, PartialEq)]
pub enum Limit {
    /// `unlimited: true`: always OK, never counted.
    Unlimited,
    /// `requests_per_unit: 0`: always over limit, never counted.
    Blocked(Arc<Limited>),
    Limited(Arc<Limited>),
}

/// A counted limit and the sluice policy that enforces it.
#[derive(Debug, Clone, PartialEq)]
pub struct Limited {
    /// The policy's name (derived from the domain and the descriptor path).
    pub policy: String,
    /// `rate_limit.name`, for `replaces`.
    pub name: Option<String>,
    pub replaces: Vec<String>,
    pub requests_per_unit: u64,
    pub span: Span,
    pub shadow: bool,
    /// `quota_mode`: over the limit, this descriptor alone does not make the request's
    /// answer OVER_LIMIT; all the request's quota descriptors being over does.
    pub quota: bool,
    /// Fixed window, as envoyproxy/ratelimit counts: every hit counts, even those of a
    /// request over the limit, and even a request asking more than the whole limit.
    pub counts_every_hit: bool,
}

/// One node of a domain's descriptor tree.
#[derive(Debug, Default)]
pub struct Node {
    pub limit: Option<Limit>,
    pub children: Level,
    /// `share_threshold` on a wildcard value: the pattern, counted in place of each value it
    /// matches.
    pub share: Option<String>,
}

/// The children of a node, by how they match an entry.
#[derive(Debug, Default)]
pub struct Level {
    /// key -> value -> node, so lookups borrow the request's strings.
    pub(super) exact: HashMap<String, HashMap<String, Node>>,
    /// `(key, pattern split at each *)` for values with a `*`, in file order.
    pub(super) wildcard: Vec<(String, Vec<String>, Node)>,
    pub(super) any: HashMap<String, Node>,
}

impl Level {
    /// The child matching `key`/`value`: exact value first, then wildcards, then key only
    /// (the order envoyproxy/ratelimit uses).
    pub fn find(&self, key: &str, value: &str) -> Option<&Node> {
        if let Some(node) = self.exact.get(key).and_then(|values| values.get(value)) {
            return Some(node);
        }
        if let Some((_, _, node)) = self
            .wildcard
            .iter()
            .find(|(k, parts, _)| k == key && wildcard_match(parts, value))
        {
            return Some(node);
        }
        self.any.get(key)
    }

    fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcard.is_empty() && self.any.is_empty()
    }
}

/// Whether `value` matches a pattern split at its `*`s: it starts with the first part, ends
/// with the last, and holds the middle ones in order between them, without overlap (each `*`
/// matches any run of characters, none included).
fn wildcard_match(parts: &[String], value: &str) -> bool {
    let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
        return false;
    };
    if parts.len() == 1 {
        return value == first;
    }
    if value.len() < first.len() + last.len()
        || !value.starts_with(first.as_str())
        || !value.ends_with(last.as_str())
    {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part.as_str()) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// Every domain's tree, and the policies its limited leaves need.
#[derive(Debug, Default)]
pub struct EnvoyConfig {
    pub domains: HashMap<String, Level>,
    pub policies: Vec<Policy>,
}

/// The limit a descriptor lands on, and the entries that count as their wildcard pattern
/// (`share_threshold`): `(entry index, pattern)`.
#[derive(Debug)]
pub struct Found<'c> {
    pub limit: &'c Limit,
    pub shared: Vec<(usize, &'c str)>,
}

impl EnvoyConfig {
    /// The limit for one request descriptor: walk the tree entry by entry; the limit counts
    /// only when the last entry lands on a node that has one.
    pub fn limit_for<'a>(&self, domain: &str, entries: &[(&'a str, &'a str)]) -> Option<&Limit> {
        self.find(domain, entries).map(|found| found.limit)
    }

    /// [`limit_for`](Self::limit_for), with the entries whose values share a counter.
    pub fn find<'a>(&self, domain: &str, entries: &[(&'a str, &'a str)]) -> Option<Found<'_>> {
        let mut level = self.domains.get(domain)?;
        let mut shared = Vec::new();
        for (i, (key, value)) in entries.iter().enumerate() {
            let node = level.find(key, value)?;
            if let Some(pattern) = &node.share {
                shared.push((i, pattern.as_str()));
            }
            if i + 1 == entries.len() {
                return node.limit.as_ref().map(|limit| Found { limit, shared });
            }
            if node.children.is_empty() {
                return None;
            }
            level = &node.children;
        }
        None
    }
}
