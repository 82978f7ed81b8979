//! envoyproxy/ratelimit's YAML configuration, loaded unchanged: one file per domain, nested
//! `descriptors` (key, optional value, wildcards: each `*` in a value matches any run of
//! characters, `foo*`, `bar*b`, `foo*bar*baz`; `share_threshold` makes every value a
//! wildcard matches count on one counter), `rate_limit` (`unit`,
//! `requests_per_unit`, `unlimited`, `name`, `replaces`), `shadow_mode`, `quota_mode` (a quota
//! descriptor over its limit makes the answer OVER_LIMIT only when every quota descriptor of
//! the request is over), `detailed_metric`; `metadata` is loaded and not used.
//!
//! Extensions: `unit` takes a multiplier (`5 minutes`), and `rate_limit` may name a sluice
//! `algorithm` (default `fixed-window`, as envoyproxy/ratelimit counts) and a `burst`.
//! Each limited leaf becomes one sluice [`Policy`], counting per distinct descriptor.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use sluice_core::{Algorithm, Leaf, LeafOptions, Rate, Rule, Selector, Span, Unit};
use sluice_limiter::Policy;

/// The selector every envoy policy counts by: the request's descriptor entries.
pub const SELECTOR: &str = "descriptor";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    domain: String,
    #[serde(default)]
    descriptors: Vec<RawDescriptor>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDescriptor {
    key: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    rate_limit: Option<RawRateLimit>,
    #[serde(default)]
    descriptors: Vec<RawDescriptor>,
    #[serde(default)]
    shadow_mode: bool,
    /// Over the limit alone does not make the answer OVER_LIMIT: only all quota descriptors
    /// of a request being over does.
    #[serde(default)]
    quota_mode: bool,
    /// On a wildcard value: every value it matches counts on one shared counter.
    #[serde(default)]
    share_threshold: bool,
    /// Loaded and not used: envoyproxy/ratelimit returns it only in dynamic metadata, which
    /// sluice does not send.
    #[serde(default, rename = "metadata")]
    _metadata: Option<serde_norway::Value>,
    /// Accepted for compatibility: sluice's metrics are per policy (per leaf) already.
    #[serde(default, rename = "detailed_metric")]
    _detailed_metric: bool,
    #[serde(default, rename = "value_to_metric")]
    _value_to_metric: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<RawReplace>,
    #[serde(default)]
    unit: Option<String>,
    #[serde(default)]
    requests_per_unit: Option<u64>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    algorithm: Option<String>,
    #[serde(default)]
    burst: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplace {
    /// `- name:` with nothing after it reads as no name, refused with a clear message.
    #[serde(default)]
    name: Option<String>,
}

/// A configuration that cannot be used: the file, and a message naming the descriptor path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyConfigError {
    pub file: PathBuf,
    pub message: String,
}

impl fmt::Display for EnvoyConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file.display(), self.message)
    }
}

impl std::error::Error for EnvoyConfigError {}

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
    exact: HashMap<String, HashMap<String, Node>>,
    /// `(key, pattern split at each *)` for values with a `*`, in file order.
    wildcard: Vec<(String, Vec<String>, Node)>,
    any: HashMap<String, Node>,
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

/// Loads every `*.yaml` / `*.yml` file of `dir` (sorted by name; one domain per file).
pub fn load_dir(dir: &Path) -> Result<EnvoyConfig, EnvoyConfigError> {
    let entries = std::fs::read_dir(dir).map_err(|e| EnvoyConfigError {
        file: dir.to_owned(),
        message: format!("cannot read directory: {e}"),
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file() && matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
        })
        .collect();
    files.sort();
    let mut texts = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|e| EnvoyConfigError {
            file: file.clone(),
            message: format!("cannot read: {e}"),
        })?;
        texts.push((file, text));
    }
    parse(texts.iter().map(|(f, t)| (f.as_path(), t.as_str())))
}

/// Validates config files given as `(path, text)`; the path is used in messages only.
pub fn parse<'a>(
    files: impl IntoIterator<Item = (&'a Path, &'a str)>,
) -> Result<EnvoyConfig, EnvoyConfigError> {
    let mut config = EnvoyConfig::default();
    for (path, text) in files {
        let error = |message: String| EnvoyConfigError {
            file: path.to_owned(),
            message,
        };
        let raw: RawFile = serde_norway::from_str(text).map_err(|e| error(e.to_string()))?;
        if raw.domain.is_empty() {
            return Err(error("`domain` must not be empty".into()));
        }
        if config.domains.contains_key(&raw.domain) {
            return Err(error(format!("domain `{}` is defined twice", raw.domain)));
        }
        let mut level = Level::default();
        let mut path_names = Vec::new();
        build_level(
            &raw.domain,
            &raw.descriptors,
            &mut path_names,
            &mut level,
            &mut config.policies,
        )
        .map_err(error)?;
        config.domains.insert(raw.domain, level);
    }
    Ok(config)
}

fn build_level(
    domain: &str,
    raw: &[RawDescriptor],
    path: &mut Vec<String>,
    level: &mut Level,
    policies: &mut Vec<Policy>,
) -> Result<(), String> {
    for descriptor in raw {
        if descriptor.key.is_empty() {
            return Err(format!(
                "descriptors.{}: `key` must not be empty",
                path.join(".")
            ));
        }
        let segment = match &descriptor.value {
            Some(v) => format!("{}={}", descriptor.key, v),
            None => descriptor.key.clone(),
        };
        path.push(segment);
        let here = path.join(".");
        let mut node = Node::default();
        if descriptor.share_threshold {
            match &descriptor.value {
                Some(v) if v.contains('*') => node.share = Some(v.clone()),
                _ => {
                    return Err(format!(
                        "descriptor `{here}`: share_threshold needs a wildcard value (with `*`)"
                    ));
                }
            }
        }
        if let Some(rate) = &descriptor.rate_limit {
            let modes = Modes {
                shadow: descriptor.shadow_mode,
                quota: descriptor.quota_mode,
            };
            let (limit, policy) = build_limit(domain, &here, rate, modes)
                .map_err(|m| format!("descriptor `{here}`: {m}"))?;
            node.limit = Some(limit);
            policies.extend(policy);
        }
        build_level(
            domain,
            &descriptor.descriptors,
            path,
            &mut node.children,
            policies,
        )?;
        path.pop();
        let key = descriptor.key.clone();
        let duplicate = match &descriptor.value {
            Some(v) if v.contains('*') => {
                let parts: Vec<String> = v.split('*').map(str::to_owned).collect();
                let dup = level
                    .wildcard
                    .iter()
                    .any(|(k, p, _)| *k == key && *p == parts);
                level.wildcard.push((key, parts, node));
                dup
            }
            Some(v) => level
                .exact
                .entry(key)
                .or_default()
                .insert(v.clone(), node)
                .is_some(),
            None => level.any.insert(key, node).is_some(),
        };
        if duplicate {
            return Err(format!("descriptor `{here}` is defined twice"));
        }
    }
    Ok(())
}

/// A descriptor's `shadow_mode` and `quota_mode`.
#[derive(Debug, Clone, Copy)]
struct Modes {
    shadow: bool,
    quota: bool,
}

fn build_limit(
    domain: &str,
    path: &str,
    raw: &RawRateLimit,
    modes: Modes,
) -> Result<(Limit, Option<Policy>), String> {
    let Modes { shadow, quota } = modes;
    let mut replaces = Vec::with_capacity(raw.replaces.len());
    for replace in &raw.replaces {
        match replace.name.as_deref() {
            None | Some("") => return Err("a `replaces` entry has an empty `name`".into()),
            Some(name) if raw.name.as_deref() == Some(name) => {
                return Err(format!("`replaces` names this limit itself (`{name}`)"));
            }
            Some(name) => replaces.push(name.to_owned()),
        }
    }
    if raw.unlimited {
        // As envoyproxy/ratelimit: a unit contradicts `unlimited`; a count alone is ignored.
        if raw.unit.is_some() {
            return Err("`unlimited` takes no `unit`".into());
        }
        return Ok((Limit::Unlimited, None));
    }
    let unit = raw.unit.as_deref().ok_or("`rate_limit` needs `unit`")?;
    let span = parse_unit(unit)?;
    let requests = raw
        .requests_per_unit
        .ok_or("`rate_limit` needs `requests_per_unit`")?;
    let algorithm = match &raw.algorithm {
        Some(name) => name.parse::<Algorithm>().map_err(|e| e.to_string())?,
        None => Algorithm::FixedWindow,
    };
    let policy = policy_name(domain, path);
    let limited = Arc::new(Limited {
        policy: policy.clone(),
        name: raw.name.clone(),
        replaces,
        requests_per_unit: requests,
        span,
        shadow,
        quota,
        counts_every_hit: algorithm == Algorithm::FixedWindow,
    });
    if requests == 0 {
        return Ok((Limit::Blocked(limited), None));
    }
    let rate = Rate::new(requests, span).map_err(|e| e.to_string())?;
    let leaf = Leaf {
        selector: Selector::new([SELECTOR]).expect("a valid name"),
        rate,
        options: LeafOptions {
            algorithm: None,
            burst: raw.burst,
            windows: None,
        },
    };
    let policy = Policy::from_rule(policy, Rule::Leaf(leaf))
        .algorithm(algorithm)
        .shadow(shadow)
        // envoyproxy/ratelimit counts every hit, over the limit or not.
        .count_denied(algorithm == Algorithm::FixedWindow);
    sluice_limiter::CompiledPolicy::compile(policy.clone()).map_err(|e| e.to_string())?;
    Ok((Limit::Limited(limited), Some(policy)))
}

/// `second`, `MINUTE`, `5 minutes`, `month` (30 days).
pub fn parse_unit(text: &str) -> Result<Span, String> {
    let text = text.trim();
    let (multiplier, name) = match text.split_once(char::is_whitespace) {
        Some((n, rest)) => (
            n.parse::<u64>()
                .map_err(|_| format!("`{text}` is not a unit"))?,
            rest.trim(),
        ),
        None => (1, text),
    };
    let (multiplier, unit) = match name.to_ascii_lowercase().as_str() {
        "month" | "months" => (multiplier.saturating_mul(30), Unit::Day),
        other => (
            multiplier,
            Unit::from_name(other).ok_or_else(|| format!("`{text}` is not a unit"))?,
        ),
    };
    Span::new(multiplier, unit).map_err(|e| e.to_string())
}

/// `envoy.DOMAIN.key=value.key`, or a hash of it when that is not a valid policy name.
fn policy_name(domain: &str, path: &str) -> String {
    let readable = format!("envoy.{domain}.{path}");
    let valid = readable.len() <= 128
        && !readable
            .chars()
            .any(|c| matches!(c, ':' | '{' | '}') || c.is_whitespace() || c.is_control());
    if valid {
        readable
    } else {
        format!("envoy.{:016x}", fnv1a(readable.as_bytes()))
    }
}

/// FNV-1a, 64 bits: stable across builds, so counters survive restarts and reloads.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: remote_address
    rate_limit:
      unit: 5 minutes
      requests_per_unit: 10
      algorithm: gcra
      burst: 20
  - key: path
    value: "/foo*"
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: { unlimited: true }
"#;

    fn config() -> EnvoyConfig {
        parse([(Path::new("a.yaml"), EXAMPLE)]).unwrap()
    }

    #[test]
    fn matches_like_envoyproxy_ratelimit() {
        let c = config();
        let limit = |entries: &[(&str, &str)]| match c.limit_for("mongo_cps", entries) {
            Some(Limit::Limited(l)) => Some(l.policy.clone()),
            Some(Limit::Unlimited) => Some("unlimited".into()),
            _ => None,
        };
        assert_eq!(
            limit(&[("database", "users")]).as_deref(),
            Some("envoy.mongo_cps.database=users")
        );
        assert_eq!(limit(&[("database", "other")]), None);
        assert_eq!(
            limit(&[("remote_address", "10.0.0.1")]).as_deref(),
            Some("envoy.mongo_cps.remote_address")
        );
        assert!(limit(&[("path", "/foo/bar")]).is_some());
        assert_eq!(limit(&[("path", "/bar")]), None);
        assert_eq!(limit(&[("key1", "value1")]), None);
        assert_eq!(
            limit(&[("key1", "value1"), ("subkey1", "x")]).as_deref(),
            Some("unlimited")
        );
        assert_eq!(c.policies.len(), 4);
    }

    #[test]
    fn units_take_multipliers() {
        assert_eq!(parse_unit("5 minutes").unwrap().duration().as_secs(), 300);
        assert_eq!(parse_unit("HOUR").unwrap().duration().as_secs(), 3600);
        assert!(parse_unit("fortnight").is_err());
    }

    #[test]
    fn rejects_bad_files_naming_the_descriptor() {
        let bad = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: parsec, requests_per_unit: 1 }\n";
        let e = parse([(Path::new("bad.yaml"), bad)]).unwrap_err();
        assert!(e.to_string().contains("bad.yaml: descriptor `k`"), "{e}");
        let unknown = "domain: d\ndescriptors:\n  - key: k\n    rate_limt: {}\n";
        assert!(parse([(Path::new("u.yaml"), unknown)]).is_err());
    }

    /// Written from envoyproxy/ratelimit's wildcard tests: a `*` anywhere in a value matches
    /// any run of characters; an exact value is tried first; no `*`, no wildcard.
    #[test]
    fn stars_match_anywhere_in_a_value() {
        let yaml = r#"
domain: d
descriptors:
  - key: wild
    value: foo*
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: noWild
    value: foo
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: midWild
    value: bar*b
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: multiWild
    value: foo*bar*baz
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit: { unit: minute, requests_per_unit: 20 }
"#;
        let c = parse([(Path::new("w.yaml"), yaml)]).unwrap();
        let matched = |entries: &[(&str, &str)]| c.limit_for("d", entries).is_some();
        assert!(matched(&[("wild", "foo1")]));
        assert!(matched(&[("wild", "foo")]));
        assert!(!matched(&[("wild", "bar")]));
        assert!(!matched(&[("noWild", "foo1")]), "no star, no prefix match");
        assert!(matched(&[("midWild", "barab")]));
        assert!(matched(&[("midWild", "bar123b")]));
        assert!(matched(&[("midWild", "barb")]));
        assert!(
            !matched(&[("midWild", "bab")]),
            "prefix and suffix may not overlap"
        );
        assert!(!matched(&[("midWild", "bara")]));
        assert!(matched(&[("multiWild", "foobarbaz")]));
        assert!(matched(&[("multiWild", "foo-1-bar-2-baz")]));
        assert!(!matched(&[("multiWild", "foobaz")]));
        assert!(!matched(&[("multiWild", "foobazbar")]), "parts in order");
        assert!(matched(&[("nestedWild", "val1"), ("wild", "goo2")]));
        assert!(!matched(&[("nestedWild", "val1"), ("wild", "foo2")]));
    }

    /// As envoyproxy/ratelimit: `replaces` may not be empty nor name its own limit, and
    /// `unlimited` refuses a `unit` but ignores a lone `requests_per_unit`.
    #[test]
    fn replaces_and_unlimited_are_checked_as_envoyproxy_ratelimit_does() {
        let with = |rate_limit: &str| {
            let yaml =
                format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n{rate_limit}");
            parse([(Path::new("r.yaml"), yaml.as_str())]).map(|c| c.policies.len())
        };
        let error = |rate_limit: &str| with(rate_limit).unwrap_err().to_string();
        let unit = "      unit: second\n      requests_per_unit: 5\n";
        assert!(
            error(&format!(
                "      name: self\n      replaces:\n        - name: self\n{unit}"
            ))
            .contains("`replaces` names this limit itself (`self`)")
        );
        assert!(
            error(&format!(
                "      name: self\n      replaces:\n        - name:\n{unit}"
            ))
            .contains("a `replaces` entry has an empty `name`")
        );
        assert_eq!(
            with(&format!(
                "      name: a\n      replaces:\n        - name: b\n{unit}"
            )),
            Ok(1)
        );
        assert!(
            error("      unlimited: true\n      unit: day\n      requests_per_unit: 25\n")
                .contains("`unlimited` takes no `unit`")
        );
        assert_eq!(
            with("      unlimited: true\n      requests_per_unit: 25\n"),
            Ok(0)
        );
    }

    #[test]
    fn share_threshold_needs_a_wildcard() {
        let yaml = "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n";
        let e = parse([(Path::new("s.yaml"), yaml)]).unwrap_err();
        assert!(
            e.to_string()
                .contains("share_threshold needs a wildcard value"),
            "{e}"
        );
        let ok = yaml.replace("value: v", "value: v*");
        assert!(parse([(Path::new("s.yaml"), ok.as_str())]).is_ok());
    }

    /// The configs envoyproxy/ratelimit's own config tests refuse are refused here too
    /// (duplicate domain, duplicate key, empty domain, empty key, a bad unit, an unknown
    /// key), and its units mean what they mean there.
    #[test]
    fn refuses_what_envoyproxy_ratelimit_refuses() {
        let one = |text: &str| parse([(Path::new("c.yaml"), text)]);
        let two = |a: &str, b: &str| parse([(Path::new("a.yaml"), a), (Path::new("b.yaml"), b)]);
        let limited = "  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n";
        let file = format!("domain: d\ndescriptors:\n{limited}");
        assert!(one(&file).is_ok());
        assert!(
            two(&file, &file)
                .unwrap_err()
                .message
                .contains("defined twice")
        );
        assert!(one(&format!("domain: d\ndescriptors:\n{limited}{limited}")).is_err());
        assert!(one(&format!("domain: \"\"\ndescriptors:\n{limited}")).is_err());
        assert!(one(&file.replace("key: k", "key: \"\"")).is_err());
        assert!(one(&file.replace("unit: hour", "unit: fortnight")).is_err());
        assert!(one(&file.replace("rate_limit:", "ratelimit:")).is_err());
        for (unit, seconds) in [
            ("second", 1),
            ("minute", 60),
            ("hour", 3_600),
            ("day", 86_400),
            ("week", 7 * 86_400),
            ("month", 30 * 86_400),
            ("year", 365 * 86_400),
        ] {
            assert_eq!(
                parse_unit(unit).unwrap().duration().as_secs(),
                seconds,
                "{unit}"
            );
            assert_eq!(
                parse_unit(&unit.to_uppercase())
                    .unwrap()
                    .duration()
                    .as_secs(),
                seconds
            );
        }
    }
}
