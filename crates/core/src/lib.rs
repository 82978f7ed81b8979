//! Pure decision math for sluice: rates, the rule language, algorithms and decisions.
//! No I/O, no async, no clock: time is an argument (nanoseconds since an epoch you choose).
//!
//! ```
//! use sluice_core::{Algorithm, Rule, State};
//! use sluice_core::algorithm::Quota;
//!
//! let rule: Rule = "user:5/m burst=10".parse().unwrap();
//! let quota = Quota::from_leaf(rule.leaves()[0], Algorithm::Gcra).unwrap();
//! let mut state = quota.fresh_state();
//! let now = 1_000_000_000;
//! for _ in 0..10 {
//!     assert!(quota.verdict(&state, now, 1).allowed);
//!     quota.record(&mut state, now, 1);
//! }
//! let denied = quota.verdict(&state, now, 1);
//! assert!(!denied.allowed); // the burst is spent; one more token comes after 12 s
//! # assert!(matches!(state, State::Gcra { .. }));
//! ```

//!
//! Besides rates, a leaf may limit how many leases are held at once (`user:3 concurrent`,
//! [`algorithm::concurrency`]), and an admitted cost may be settled afterwards at its actual
//! value ([`algorithm::settle`]).

#![forbid(unsafe_code)]

pub mod algorithm;
pub mod decision;
pub mod evaluate;
pub mod parse;
pub mod penalty;
mod print;
pub mod rate;
pub mod rule;

pub use algorithm::{Algorithm, Quota, Retry, State, Verdict};
pub use decision::{Decision, Denial, whole_seconds};
pub use evaluate::{Evaluation, Outcome, Recording, decide_verdicts, evaluate};
pub use parse::{RuleError, parse_rule};
pub use penalty::{Penalty, PenaltyState};
pub use rate::{Rate, RateError, Span, Unit};
pub use rule::{Leaf, LeafOptions, Rule, Selector, Shape};
