//! One denial as the audit trail keeps it, and its JSON line.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use sluice_limiter::{Checked, CompiledPolicy, Decision, Selectors};

/// One refused hit (or one a shadow-mode policy would have refused), ready for a sink.
///
/// Selector values are written as the policy's identifiers hold them (see
/// [`sluice_limiter::selector_value`]): short plain values as they are, anything long or
/// unusual as `#` and 128 bits of its SHA-256, so a record is small and holds no token.
#[derive(Debug, Clone, PartialEq)]
pub struct DenialRecord {
    pub at: SystemTime,
    /// The policy's name, or the kind of a policy made on the fly (`cl.throttle`,
    /// `envoy.override`), as in the metrics.
    pub policy: String,
    /// The deciding leaf, as rule text (`ip:10/m`).
    pub leaf: String,
    /// The selector names the policy counts by and their values (or hashes), by name.
    pub selectors: Vec<(String, String)>,
    /// Why: `limited`, `penalized`, `cost_exceeds_capacity`, `store_unavailable`, or
    /// `shadow` for a shadow-mode policy's would-be refusal (admitted). The tower layer's
    /// own reasons (`ceiling`, ...) fit too.
    pub reason: &'static str,
    /// When the same hit would pass, where that is known.
    pub retry_after: Option<Duration>,
}

impl DenialRecord {
    /// The record of `decision`, made by `policy` on `selectors` at `at`; `None` when the
    /// hit was admitted and `shadow` (a shadow-mode policy would have refused it) is false.
    /// `name` is what the record calls the policy.
    pub fn new(
        at: SystemTime,
        name: &str,
        policy: &CompiledPolicy,
        selectors: &Selectors<'_>,
        decision: &Decision,
        shadow: bool,
    ) -> Option<DenialRecord> {
        let reason = match decision.denial {
            Some(denial) => denial.name(),
            None if shadow => "shadow",
            None => return None,
        };
        let leaf = policy
            .leaves
            .get(decision.leaf)
            .map(|l| l.leaf.to_string())
            .unwrap_or_default();
        Some(DenialRecord {
            at,
            policy: name.to_owned(),
            leaf,
            selectors: counted(policy, selectors),
            reason,
            retry_after: decision.retry_after(),
        })
    }

    /// The record of a service's answer `checked` on `selectors`, `at` nanoseconds since
    /// the Unix epoch; `None` when it admitted the hit outright.
    pub fn from_checked(
        at: u64,
        name: &str,
        selectors: &Selectors<'_>,
        checked: &Checked,
    ) -> Option<DenialRecord> {
        let at = UNIX_EPOCH + Duration::from_nanos(at);
        let decision = &checked.decision;
        DenialRecord::new(
            at,
            name,
            &checked.policy,
            selectors,
            decision,
            checked.shadow_denied,
        )
    }

    /// The record as one JSON line (with its `\n`), signed by `server`:
    /// `{"time":"2026-11-25T18:30:00.123Z","server":"web-1","policy":"login","leaf":"ip:5/m",
    /// "selectors":{"ip":"203.0.113.9"},"reason":"limited","retry_after":2.5}`.
    pub fn write_json_line(&self, server: &str, out: &mut Vec<u8>) {
        let line = Line {
            time: &humantime::format_rfc3339_millis(self.at).to_string(),
            server,
            policy: &self.policy,
            leaf: &self.leaf,
            selectors: Pairs(&self.selectors),
            reason: self.reason,
            retry_after: self.retry_after.map(|d| d.as_secs_f64()),
        };
        // Writing strings and numbers into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, &line);
        out.push(b'\n');
    }

    /// The selectors as one JSON object's text, for a database column.
    pub(crate) fn selectors_json(&self) -> String {
        serde_json::to_string(&Pairs(&self.selectors)).unwrap_or_else(|_| "{}".to_owned())
    }
}

/// The pairs of `selectors` the policy counts by (the first value of each name, as the
/// limiter reads them), sorted by name, values as identifiers hold them.
fn counted(policy: &CompiledPolicy, selectors: &Selectors<'_>) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for (name, value) in selectors {
        let used = policy
            .leaves
            .iter()
            .any(|l| l.leaf.selector.names().iter().any(|n| n == name));
        if used && !pairs.iter().any(|(n, _)| n == name) {
            pairs.push(((*name).to_owned(), sluice_limiter::selector_value(value)));
        }
    }
    pairs.sort();
    pairs
}

#[derive(Serialize)]
struct Line<'a> {
    time: &'a str,
    server: &'a str,
    policy: &'a str,
    leaf: &'a str,
    selectors: Pairs<'a>,
    reason: &'a str,
    retry_after: Option<f64>,
}

struct Pairs<'a>(&'a [(String, String)]);

impl Serialize for Pairs<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, value) in self.0 {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

/// One record read back from a sink.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AuditEntry {
    #[serde(deserialize_with = "rfc3339")]
    pub time: SystemTime,
    pub server: String,
    pub policy: String,
    pub leaf: String,
    pub selectors: std::collections::BTreeMap<String, String>,
    pub reason: String,
    /// Seconds.
    pub retry_after: Option<f64>,
}

fn rfc3339<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
    let text = String::deserialize(d)?;
    humantime::parse_rfc3339(&text).map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use sluice_limiter::{Denial, Policy};

    use super::*;

    #[test]
    fn a_line_reads_back_as_written() {
        let policy =
            CompiledPolicy::compile(Policy::new("login", "or(ip:5/m, ip+user:3/m)").unwrap())
                .unwrap();
        let token = "x".repeat(100);
        let selectors: &Selectors = &[("user", &token), ("trace", "t1"), ("ip", "10.0.0.1")];
        let decision = Decision {
            denial: Some(Denial::Limited {
                retry_after: Duration::from_millis(2_500),
            }),
            limit: 3,
            remaining: 0,
            reset_after: Duration::from_secs(60),
            leaf: 1,
        };
        let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let record = DenialRecord::new(at, "login", &policy, selectors, &decision, false).unwrap();
        let mut line = Vec::new();
        record.write_json_line("web-1", &mut line);
        let text = String::from_utf8(line).unwrap();
        assert!(
            text.ends_with('\n') && text.matches('\n').count() == 1,
            "{text}"
        );
        assert!(
            text.starts_with(r#"{"time":"2023-11-14T22:13:20.123Z","server":"web-1""#),
            "{text}"
        );
        let entry: AuditEntry = serde_json::from_str(&text).unwrap();
        assert_eq!(entry.time, at);
        assert_eq!(entry.leaf, "ip+user:3/m");
        assert_eq!(entry.reason, "limited");
        assert_eq!(entry.retry_after, Some(2.5));
        // The value the policy ignores is left out; the long one is hashed.
        assert_eq!(entry.selectors.len(), 2, "{text}");
        assert_eq!(entry.selectors["ip"], "10.0.0.1");
        assert!(entry.selectors["user"].starts_with('#'), "{text}");
        assert!(!text.contains(&token));

        let admitted = Decision::admitted(3, 1, Duration::ZERO, 0);
        assert_eq!(
            DenialRecord::new(at, "login", &policy, selectors, &admitted, false),
            None
        );
        let shadow = DenialRecord::new(at, "login", &policy, selectors, &admitted, true);
        assert_eq!(shadow.unwrap().reason, "shadow");
    }
}
