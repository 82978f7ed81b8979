//! The config file: TOML, one table per policy. Parsed raw, then converted once into
//! validated policies; every error names the file, the line and the field.
//!
//! ```toml
//! [policies.login]
//! rule = "ip:10/m; ip+user:5/m"
//! count_denied = true
//! penalty = { base = "1s", factor = 2, max = "15m", forget_after = "1h" }
//! failure = "local"   # when the store cannot answer: open, closed or local
//! local_share = 0.5   # with local: the share of each limit this process may grant
//!
//! [audit]             # optional: where denials are written (see `config::audit`)
//! file = "denials.jsonl"
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sluice_core::{Algorithm, Penalty, Rule};
use sluice_limiter::policy::CompiledPolicy;
use sluice_limiter::{FailureMode, Policy, PolicyError};
use toml::Spanned;

pub mod audit;
mod duration;

pub use audit::AuditConfig;
pub use duration::parse_duration;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    policies: BTreeMap<String, Spanned<RawPolicy>>,
    audit: Option<Spanned<audit::RawAudit>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    rule: Spanned<String>,
    key: Option<Spanned<String>>,
    namespace: Option<Spanned<String>>,
    algorithm: Option<Spanned<String>>,
    penalty: Option<Spanned<RawPenalty>>,
    #[serde(default)]
    shadow: bool,
    #[serde(default)]
    count_denied: bool,
    failure: Option<Spanned<String>>,
    local_share: Option<Spanned<f64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPenalty {
    base: Spanned<String>,
    #[serde(default = "default_factor")]
    factor: u32,
    max: Spanned<String>,
    forget_after: Spanned<String>,
}

fn default_factor() -> u32 {
    2
}

/// A config file that cannot be used, with where and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
    /// Dotted path of the field, e.g. `policies.login.rule`.
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: ", self.file.display(), self.line, self.column)?;
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub policies: Vec<Policy>,
    /// Where denials are written, if anywhere (`[audit]`).
    pub audit: Option<AuditConfig>,
}

/// Reads and validates the config at `path`.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: path.to_owned(),
        line: 0,
        column: 0,
        field: String::new(),
        message: format!("cannot read: {e}"),
    })?;
    parse(path, &text)
}

/// Validates config `text` read from `path` (used in messages only).
pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
    let at = |offset: usize, field: String, message: String| {
        let (line, column) = line_column(text, offset);
        ConfigError {
            file: path.to_owned(),
            line,
            column,
            field,
            message,
        }
    };
    let raw: RawConfig = toml::from_str(text).map_err(|e| {
        let offset = e.span().map_or(0, |s| s.start);
        // toml leaves the message empty for some syntax errors (a key with no value at the
        // end of the file): the line and column still need a reason beside them.
        let message = match e.message().trim() {
            "" => "not valid TOML at this point".to_owned(),
            m => m.to_owned(),
        };
        at(offset, String::new(), message)
    })?;

    let mut policies = Vec::new();
    for (name, raw) in &raw.policies {
        let field = |f: &str| format!("policies.{name}.{f}");
        let raw_policy = raw.get_ref();
        let rule_text = raw_policy.rule.get_ref();
        // +1 skips the opening quote, so the column points into the rule itself.
        let rule_start = raw_policy.rule.span().start + 1;
        let rule: Rule = rule_text.parse().map_err(|e: sluice_core::RuleError| {
            let offset = rule_start + char_offset(rule_text, e.column);
            at(
                offset,
                field("rule"),
                format!("expected {}, found {}", e.expected, e.found),
            )
        })?;
        let mut policy = Policy::from_rule(name.clone(), rule);
        policy.shadow = raw_policy.shadow;
        policy.count_denied = raw_policy.count_denied;
        if let Some(key) = &raw_policy.key {
            policy.key = Some(key.get_ref().clone());
        }
        if let Some(namespace) = &raw_policy.namespace {
            policy.namespace = Some(namespace.get_ref().clone());
        }
        if let Some(algorithm) = &raw_policy.algorithm {
            policy.algorithm = algorithm
                .get_ref()
                .parse::<Algorithm>()
                .map_err(|e| at(algorithm.span().start, field("algorithm"), e.to_string()))?;
        }
        let share = raw_policy.local_share.as_ref();
        policy.failure = match raw_policy.failure.as_ref() {
            None if share.is_none() => FailureMode::default(),
            Some(mode) if mode.get_ref() == "open" || mode.get_ref() == "closed" => {
                if let Some(share) = share {
                    let message = "local_share only applies to failure = \"local\"".to_owned();
                    return Err(at(share.span().start, field("local_share"), message));
                }
                if mode.get_ref() == "open" {
                    FailureMode::Open
                } else {
                    FailureMode::Closed
                }
            }
            Some(mode) if mode.get_ref() != "local" => {
                let message = format!(
                    "`{}` is not a failure mode (open, closed, local)",
                    mode.get_ref()
                );
                return Err(at(mode.span().start, field("failure"), message));
            }
            _ => match share {
                None => FailureMode::LocalFull,
                Some(share) => FailureMode::local(*share.get_ref())
                    .map_err(|m| at(share.span().start, field("local_share"), m))?,
            },
        };
        if let Some(penalty) = &raw_policy.penalty {
            let p = penalty.get_ref();
            let duration = |value: &Spanned<String>, name: &str| {
                parse_duration(value.get_ref())
                    .map_err(|m| at(value.span().start, field(&format!("penalty.{name}")), m))
            };
            let base = duration(&p.base, "base")?;
            let max = duration(&p.max, "max")?;
            let forget = duration(&p.forget_after, "forget_after")?;
            policy.penalty = Some(
                Penalty::new(base, p.factor, max, forget)
                    .map_err(|e| at(penalty.span().start, field("penalty"), e.to_string()))?,
            );
        }
        // Compile now so every semantic error is reported here, with its place.
        CompiledPolicy::compile(policy.clone()).map_err(|e| {
            let (offset, f) = match &e {
                PolicyError::BadName(bad)
                    if raw_policy.key.as_ref().is_some_and(|k| k.get_ref() == bad) =>
                {
                    (
                        raw_policy.key.as_ref().map_or(0, |k| k.span().start),
                        field("key"),
                    )
                }
                PolicyError::BadName(bad)
                    if raw_policy
                        .namespace
                        .as_ref()
                        .is_some_and(|k| k.get_ref() == bad) =>
                {
                    let start = raw_policy.namespace.as_ref().map_or(0, |k| k.span().start);
                    (start, field("namespace"))
                }
                PolicyError::BadName(_) => (raw.span().start, format!("policies.{name}")),
                _ => (raw_policy.rule.span().start, field("rule")),
            };
            at(offset, f, e.to_string())
        })?;
        policies.push(policy);
    }
    let audit = match &raw.audit {
        Some(table) => Some(audit::validate(
            table.get_ref(),
            table.span().start,
            path,
            at,
        )?),
        None => None,
    };
    Ok(Config { policies, audit })
}

/// Byte offset of 1-based character `column` in `text`.
fn char_offset(text: &str, column: usize) -> usize {
    text.char_indices()
        .nth(column.saturating_sub(1))
        .map_or(text.len(), |(i, _)| i)
}

/// 1-based line and column of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> ConfigError {
        parse(Path::new("test.toml"), text).unwrap_err()
    }

    /// Found by the `config` fuzz target: toml reports some syntax errors with an empty
    /// message, which left the user with only a line and column.
    #[test]
    fn every_syntax_error_says_what_is_wrong() {
        for text in ["lllllTlle=", "rule = `", "a=\n", "[policies.x]\nrule ="] {
            let e = error(text);
            assert!(!e.message.is_empty(), "{text:?}: {e}");
        }
    }

    #[test]
    fn loads_a_full_policy() {
        let text = r#"
[policies.login]
rule = "ip:10/m; ip+user:5/m"
key = "login-form"
namespace = "shop"
algorithm = "sliding-window"
count_denied = true
shadow = true
failure = "local"
local_share = 0.25
penalty = { base = "1s", factor = 3, max = "15m", forget_after = "1h" }
"#;
        let config = parse(Path::new("x.toml"), text).unwrap();
        let policy = &config.policies[0];
        assert_eq!(policy.name, "login");
        assert_eq!(policy.key.as_deref(), Some("login-form"));
        assert_eq!(policy.algorithm, Algorithm::SlidingWindow);
        assert!(policy.count_denied && policy.shadow);
        assert_eq!(policy.penalty.unwrap().factor(), 3);
        assert_eq!(policy.failure, FailureMode::Local { share: 0.25 });
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let e = error("[policies.api]\nrule = \"10/x\"\n");
        assert_eq!((e.line, e.column), (2, 12), "{e}");
        assert_eq!(e.field, "policies.api.rule");
        assert!(
            e.to_string()
                .starts_with("test.toml:2:12: policies.api.rule: expected a unit"),
            "{e}"
        );

        let e = error("[policies.api]\nrule = \"10/s\"\nalgorithm = \"leaky\"\n");
        assert_eq!((e.line, e.field.as_str()), (3, "policies.api.algorithm"));

        let e = error("[policies.api]\nrule = \"10/s\"\nshdow = true\n");
        assert_eq!(e.line, 3);
        assert!(e.message.contains("shdow"), "{e}");

        let e = error("[policies.api]\nkey = \"x\"\n");
        assert!(e.message.contains("rule"), "{e}");

        let e = error("[policies.api]\nrule = \"10/s burst=5 algorithm=sliding-log\"\n");
        assert!(e.message.contains("burst"), "{e}");

        let e = error("[policies.api]\nrule = \"10/s\"\nkey = \"a:b\"\n");
        assert_eq!((e.line, e.field.as_str()), (3, "policies.api.key"));

        let e = error(
            "[policies.api]\nrule = \"10/s\"\npenalty = { base = \"1s\", max = \"0s\", forget_after = \"1h\" }\n",
        );
        assert_eq!(e.field, "policies.api.penalty", "{e}");

        let e = error(
            "[policies.api]\nrule = \"10/s\"\npenalty = { base = \"1 fortnight\", max = \"1m\", forget_after = \"1h\" }\n",
        );
        assert_eq!(e.field, "policies.api.penalty.base", "{e}");

        let e = error("[policies.api]\nrule = \"10/s\"\nfailure = \"sometimes\"\n");
        assert_eq!((e.line, e.field.as_str()), (3, "policies.api.failure"));
        let e = error("[policies.api]\nrule = \"10/s\"\nfailure = \"local\"\nlocal_share = 1.5\n");
        assert_eq!((e.line, e.field.as_str()), (4, "policies.api.local_share"));
        let e = error("[policies.api]\nrule = \"10/s\"\nfailure = \"open\"\nlocal_share = 0.5\n");
        assert_eq!(e.field, "policies.api.local_share");

        let e = error("[policies.api]\nrule = 10\n");
        assert_eq!(e.line, 2, "{e}");
    }
}
