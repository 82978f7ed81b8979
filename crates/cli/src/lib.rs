//! The commands of the `sluice` binary that are not the service (which is
//! `sluice_server::Server`), as a library so tests can drive them: the trace simulator, its
//! comparisons of several rules, their pictures and example traces.
//!
//! ```
//! use sluice_limiter::Policy;
//!
//! let trace = "t,user\n0,alice\n0,alice\n0,alice\n";
//! let mut out = Vec::new();
//! let policy = Policy::new("sim", "user:2/s").unwrap();
//! let summary = sluice_cli::simulate::simulate(policy, trace.as_bytes(), &mut out).unwrap();
//! assert_eq!((summary.allowed, summary.denied), (2, 1));
//! ```

#![forbid(unsafe_code)]

pub mod compare;
pub mod generate;
pub mod plot;
pub mod replace_file;
pub mod simulate;
