//! The rule language: leaves (`user:10/5m burst=20`) joined by `or(...)` and `and(...)`.
//!
//! Grammar (whitespace is allowed between any two tokens):
//!
//! ```text
//! rules     := rule (';' rule)*            -- a top-level list means or(...)
//! rule      := 'or' '(' rule (',' rule)* ')'
//!            | 'and' '(' rule (',' rule)* ')'
//!            | leaf
//! leaf      := [selector ':'] count '/' span option*       -- a rate leaf
//!            | [selector ':'] count 'concurrent' ['lease' '=' span]   -- a concurrency leaf
//! span      := [multiplier] unit           -- s, 5m, 30s: no space inside
//! selector  := name ('+' name)*            -- ip+user: one counter per pair of values
//! option    := name '=' value              -- burst=10, algorithm=sliding-log, windows=6,
//!                                             prefetch=100
//! ```
//!
//! Semantics (DESIGN.md §2): a leaf is *reached* when admitting the hit would exceed it;
//! `or` is reached when any child is, `and` only when every child is.
//!
//! A concurrency leaf (`user:3 concurrent lease=30s`) limits how many leases are held at
//! once rather than how often hits come; a lease whose holder vanished frees its slot after
//! the lease time (default 60 s). It is reached when every slot is held, and combines with
//! rate leaves like any leaf: `user:100/m; user:3 concurrent` admits only when both allow.
//! Such a rule is used through the limiter's `acquire`, which takes a lease; a plain check
//! cannot hold a slot. In a [`Leaf`], it is the algorithm [`Algorithm::Concurrency`] with the
//! count as the rate's count and the lease time as the rate's span (see
//! [`Leaf::concurrent`]).

use std::fmt;

use crate::algorithm::Algorithm;
use crate::rate::{Rate, RateError, Span, Unit};

/// Longest selector name accepted.
pub const MAX_NAME_LEN: usize = 64;
/// Most leaves one rule may hold, and deepest nesting accepted.
pub const MAX_LEAVES: usize = 64;
pub const MAX_DEPTH: usize = 16;
/// Most sub-windows a sliding window counter may use.
pub const MAX_WINDOWS: u32 = 3_600;

/// The attribute names whose values split a leaf's counters. Empty means one global counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Selector {
    names: Vec<String>,
}

impl Selector {
    /// No selector: one counter shared by every request.
    pub fn global() -> Selector {
        Selector { names: Vec::new() }
    }

    /// A selector over one or more names (`["ip", "user"]` for `ip+user`).
    /// Names must be non-empty, at most [`MAX_NAME_LEN`] bytes, start with a letter or `_`,
    /// and hold only ASCII letters, digits, `_`, `-` and `.`; no name may repeat.
    pub fn new<I, S>(names: I) -> Result<Selector, SelectorError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let names: Vec<String> = names.into_iter().map(Into::into).collect();
        for (i, name) in names.iter().enumerate() {
            if !is_valid_name(name) {
                return Err(SelectorError::BadName(name.clone()));
            }
            if names[..i].contains(name) {
                return Err(SelectorError::Repeated(name.clone()));
            }
        }
        Ok(Selector { names })
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn is_global(&self) -> bool {
        self.names.is_empty()
    }
}

/// Whether `name` may name a selector or an option.
pub fn is_valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    name.len() <= MAX_NAME_LEN
        && (first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.names.join("+"))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SelectorError {
    #[error("`{0}` is not a valid selector name (letters, digits, `_`, `-`, `.`; at most 64)")]
    BadName(String),
    #[error("selector `{0}` appears twice")]
    Repeated(String),
}

/// Per-leaf options written after the rate as `name=value`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LeafOptions {
    /// The algorithm; `None` takes the policy's default.
    pub algorithm: Option<Algorithm>,
    /// GCRA capacity: hits admitted at once from a full bucket (1..=MAX_COUNT).
    /// `None` means the rate's count.
    pub burst: Option<u64>,
    /// Sliding window counter: number of sub-windows (1..=MAX_WINDOWS). `None` means the default.
    pub windows: Option<u32>,
    /// Hot identifiers: each server takes blocks of this many admissions from the store in
    /// one call and spends them locally (2..=MAX_COUNT). Not part of the counter's identity:
    /// servers with and without it share the counter. `None`: every hit asks the store.
    pub prefetch: Option<u64>,
}

/// One limit: selector + rate + options.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Leaf {
    pub selector: Selector,
    pub rate: Rate,
    pub options: LeafOptions,
}

impl Leaf {
    /// A global leaf with default options.
    pub fn new(rate: Rate) -> Leaf {
        Leaf {
            selector: Selector::global(),
            rate,
            options: LeafOptions::default(),
        }
    }

    /// A global concurrency leaf: at most `count` leases at once, each lasting `lease`
    /// ([`DEFAULT_LEASE`] when `None`). Stored as the rate `count/lease` with the algorithm
    /// [`Algorithm::Concurrency`].
    pub fn concurrent(count: u64, lease: Option<Span>) -> Result<Leaf, RateError> {
        let rate = Rate::new(count, lease.unwrap_or(DEFAULT_LEASE))?;
        let mut leaf = Leaf::new(rate);
        leaf.options.algorithm = Some(Algorithm::Concurrency);
        Ok(leaf)
    }

    /// Whether this is a concurrency leaf (`3 concurrent`) rather than a rate.
    pub fn is_concurrency(&self) -> bool {
        self.options.algorithm == Some(Algorithm::Concurrency)
    }
}

/// A concurrency leaf's lease time when it names none: one minute.
pub const DEFAULT_LEASE: Span = match Span::new(1, Unit::Minute) {
    Ok(span) => span,
    Err(_) => panic!("one minute is a valid span"),
};

/// A tree of leaves.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Rule {
    Leaf(Leaf),
    /// Reached when any child is reached. A top-level list `a; b` parses as `Or([a, b])`.
    Or(Vec<Rule>),
    /// Reached only when every child is reached.
    And(Vec<Rule>),
}

impl Rule {
    /// The leaves in order of appearance (depth first, left to right).
    pub fn leaves(&self) -> Vec<&Leaf> {
        let mut out = Vec::new();
        self.collect_leaves(&mut out);
        out
    }

    fn collect_leaves<'a>(&'a self, out: &mut Vec<&'a Leaf>) {
        match self {
            Rule::Leaf(leaf) => out.push(leaf),
            Rule::Or(children) | Rule::And(children) => {
                for child in children {
                    child.collect_leaves(out);
                }
            }
        }
    }

    /// The tree's shape with each leaf replaced by its index in [`Rule::leaves`].
    pub fn shape(&self) -> Shape {
        fn walk(rule: &Rule, next: &mut usize) -> Shape {
            match rule {
                Rule::Leaf(_) => {
                    *next += 1;
                    Shape::Leaf(*next - 1)
                }
                Rule::Or(children) => Shape::Or(children.iter().map(|c| walk(c, next)).collect()),
                Rule::And(children) => Shape::And(children.iter().map(|c| walk(c, next)).collect()),
            }
        }
        walk(self, &mut 0)
    }
}

/// A rule tree with leaves replaced by indices into a slice of per-leaf verdicts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Shape {
    Leaf(usize),
    Or(Vec<Shape>),
    And(Vec<Shape>),
}

impl Shape {
    /// A list of leaves joined by `or`, the common case.
    pub fn or_of(leaves: usize) -> Shape {
        if leaves == 1 {
            Shape::Leaf(0)
        } else {
            Shape::Or((0..leaves).map(Shape::Leaf).collect())
        }
    }

    /// Whether an `and` stands anywhere in the tree. Stores that decide a rule in several
    /// steps (slot by slot, leaf by leaf) must keep such a rule's leaves together: an `and`
    /// decided on a stale count of one child may admit more than the rule allows.
    pub fn has_and(&self) -> bool {
        match self {
            Shape::Leaf(_) => false,
            Shape::And(_) => true,
            Shape::Or(children) => children.iter().any(Shape::has_and),
        }
    }
}
