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
mod tree;

pub use tree::{EnvoyConfig, Found, Level, Limit, Limited, Node};

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
            ..LeafOptions::default()
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
mod tests;
