//! The text a user writes: rules and the two config formats.

use std::path::Path;

use sluice_core::parse_rule;
use sluice_limiter::{Limiter, MemoryStore, Policy};

use crate::Target;

/// A rule parses or says why not; one that parses prints as text that parses to the same
/// rule and prints the same again.
pub fn rule(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some(rule) = Target::Rule.hold(data.len(), || parse_rule(text).ok()) else {
        return;
    };
    let printed = rule.to_string();
    let again = parse_rule(&printed)
        .unwrap_or_else(|e| panic!("`{text}` printed as `{printed}`, which does not parse: {e}"));
    assert_eq!(
        again, rule,
        "`{text}` printed as `{printed}`, which reads back different"
    );
    assert_eq!(
        again.to_string(),
        printed,
        "printing is not stable for `{text}`"
    );
}

/// A policies config that validates (what `sluice check` accepts) builds a limiter: serving
/// it cannot fail where checking it passed.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = Target::Config.hold(data.len(), || {
        sluice_server::config::parse(Path::new("fuzz.toml"), text)
    });
    match parsed {
        Ok(config) => builds(config.policies, text),
        Err(e) => assert!(
            !e.message.is_empty(),
            "an error without a message for `{text}`"
        ),
    }
}

/// An envoyproxy/ratelimit config that validates builds a limiter.
pub fn envoy_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = Target::EnvoyConfig.hold(data.len(), || {
        sluice_server::envoy::config::parse([(Path::new("fuzz.yaml"), text)])
    });
    match parsed {
        Ok(config) => builds(config.policies, text),
        Err(e) => assert!(
            !e.message.is_empty(),
            "an error without a message for `{text}`"
        ),
    }
}

fn builds(policies: Vec<Policy>, text: &str) {
    if let Err(e) = Limiter::builder(MemoryStore::new())
        .policies(policies)
        .build()
    {
        panic!("a config that validates does not build a limiter ({e}):\n{text}");
    }
}
