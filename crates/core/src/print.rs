//! The canonical text of a rule: `or(ip:10/s, user:100/5m burst=20)`.
//!
//! Printing then parsing gives back the same rule, so a rule can be stored or logged as text.
//! A top-level `Or` prints as `or(...)` rather than `a; b`, which reads back the same.

use std::fmt;

use crate::rule::{DEFAULT_LEASE, Leaf, LeafOptions, Rule};

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (keyword, children) = match self {
            Rule::Leaf(leaf) => return write!(f, "{leaf}"),
            Rule::Or(children) => ("or", children),
            Rule::And(children) => ("and", children),
        };
        write!(f, "{keyword}(")?;
        for (i, child) in children.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{child}")?;
        }
        f.write_str(")")
    }
}

/// `[selector:]rate[ options]`: `ip+user:10/5m burst=20`; a concurrency leaf as
/// `[selector:]count concurrent[ lease=span]`: `user:3 concurrent lease=30s`.
impl fmt::Display for Leaf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.selector.is_global() {
            write!(f, "{}:", self.selector)?;
        }
        if self.is_concurrency() {
            // `3 concurrent lease=30s`; the options a concurrency leaf cannot take are shown
            // as they are, so a hand-built invalid leaf does not print as a valid one.
            write!(f, "{} concurrent", self.rate.count())?;
            if self.rate.span() != DEFAULT_LEASE {
                write!(f, " lease={}", self.rate.span())?;
            }
            let rest = LeafOptions {
                algorithm: None,
                ..self.options
            };
            if rest != LeafOptions::default() {
                write!(f, " {rest}")?;
            }
            return Ok(());
        }
        write!(f, "{}", self.rate)?;
        if self.options != LeafOptions::default() {
            write!(f, " {}", self.options)?;
        }
        Ok(())
    }
}

/// The options that are set, space-separated, in a fixed order: `burst=20 algorithm=gcra`.
impl fmt::Display for LeafOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut separator = "";
        if let Some(burst) = self.burst {
            write!(f, "{separator}burst={burst}")?;
            separator = " ";
        }
        if let Some(algorithm) = self.algorithm {
            write!(f, "{separator}algorithm={algorithm}")?;
            separator = " ";
        }
        if let Some(windows) = self.windows {
            write!(f, "{separator}windows={windows}")?;
            separator = " ";
        }
        if let Some(block) = self.prefetch {
            write!(f, "{separator}prefetch={block}")?;
        }
        Ok(())
    }
}
