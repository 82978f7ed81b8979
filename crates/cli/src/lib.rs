//! The pieces of the `sluice` binary, as a library so tests can drive them: the config file,
//! the HTTP/JSON service, the trace simulator and the JSON shape of decisions.
//!
//! ```
//! let config = sluice_cli::config::parse(
//!     std::path::Path::new("inline.toml"),
//!     "[policies.api]\nrule = \"user:100/m\"\n",
//! ).unwrap();
//! assert_eq!(config.policies[0].name, "api");
//! ```

#![forbid(unsafe_code)]

pub mod config;
pub mod duration;
pub mod http;
pub mod output;
pub mod simulate;
pub mod store_url;
