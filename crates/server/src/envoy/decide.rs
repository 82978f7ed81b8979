//! `ShouldRateLimit` as envoyproxy/ratelimit answers it, independent of the wire format
//! (gRPC and `POST /json` both translate to and from these types).

use std::collections::HashSet;
use std::time::Duration;

use sluice_core::{Leaf, LeafOptions, Rate, Rule, Selector, Span, Unit, whole_seconds};
use sluice_limiter::{Algorithm, Policy};

use super::config::{Limit, Limited, SELECTOR};
use crate::service::{Dynamic, Service};

/// Bounds on one request.
pub const MAX_DESCRIPTORS: usize = 64;
pub const MAX_ENTRIES: usize = 32;
/// Longest key or value of an entry, and longest domain.
pub const MAX_ENTRY_LEN: usize = 1_024;

/// Envoy's `RateLimitResponse.RateLimit.Unit` numbers.
pub mod unit {
    pub const UNKNOWN: i32 = 0;
    pub const SECOND: i32 = 1;
    pub const MINUTE: i32 = 2;
    pub const HOUR: i32 = 3;
    pub const DAY: i32 = 4;
    pub const MONTH: i32 = 5;
    pub const YEAR: i32 = 6;
    pub const WEEK: i32 = 7;
}

#[derive(Debug, Clone, Default)]
pub struct EnvoyRequest {
    pub domain: String,
    pub descriptors: Vec<EnvoyDescriptor>,
    /// 0 (unset on the wire) means 1, as in Envoy.
    pub hits_addend: u32,
}

#[derive(Debug, Clone, Default)]
pub struct EnvoyDescriptor {
    pub entries: Vec<(String, String)>,
    /// `(requests_per_unit, unit)` replacing the configured limit.
    pub limit: Option<(u32, i32)>,
    /// Overrides the request's; `Some(0)` checks without counting.
    pub hits_addend: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Ok,
    OverLimit,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CurrentLimit {
    pub name: String,
    pub requests_per_unit: u32,
    pub unit: i32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DescriptorStatus {
    pub code: Code,
    pub current_limit: Option<CurrentLimit>,
    pub limit_remaining: u32,
    pub duration_until_reset: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct EnvoyResponse {
    pub overall_code: Code,
    pub statuses: Vec<DescriptorStatus>,
    pub headers: Vec<(String, String)>,
}

/// Why a request got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvoyError {
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("could not decide: {0}")]
    Unavailable(String),
}

fn validate(request: &EnvoyRequest) -> Result<(), EnvoyError> {
    let invalid = |m: String| Err(EnvoyError::Invalid(m));
    if request.domain.is_empty() {
        return invalid("`domain` must not be empty".into());
    }
    if request.domain.len() > MAX_ENTRY_LEN {
        return invalid(format!("`domain` is longer than {MAX_ENTRY_LEN} bytes"));
    }
    if request.descriptors.is_empty() {
        return invalid("at least one descriptor is required".into());
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return invalid(format!("at most {MAX_DESCRIPTORS} descriptors per request"));
    }
    for d in &request.descriptors {
        if d.entries.is_empty() || d.entries.len() > MAX_ENTRIES {
            return invalid(format!("a descriptor needs 1 to {MAX_ENTRIES} entries"));
        }
        if d.entries
            .iter()
            .any(|(k, v)| k.len() > MAX_ENTRY_LEN || v.len() > MAX_ENTRY_LEN)
        {
            return invalid(format!(
                "descriptor keys and values are at most {MAX_ENTRY_LEN} bytes"
            ));
        }
    }
    Ok(())
}

/// The counter's selector value: the domain (for overrides) and every entry, escaped so
/// two different descriptors never share it.
fn descriptor_value(prefix: &str, entries: &[(String, String)]) -> String {
    let mut out = String::with_capacity(prefix.len() + entries.len() * 16);
    out.push_str(prefix);
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 || !prefix.is_empty() {
            out.push('|');
        }
        for (j, part) in [k, v].into_iter().enumerate() {
            if j == 1 {
                out.push('=');
            }
            for c in part.chars() {
                if matches!(c, '|' | '=' | '\\') {
                    out.push('\\');
                }
                out.push(c);
            }
        }
    }
    out
}

fn envoy_unit(span: Span) -> i32 {
    match span.unit() {
        Unit::Second => unit::SECOND,
        Unit::Minute => unit::MINUTE,
        Unit::Hour => unit::HOUR,
        Unit::Day if span.multiplier() == 30 => unit::MONTH,
        Unit::Day => unit::DAY,
        Unit::Week => unit::WEEK,
        Unit::Year => unit::YEAR,
        _ => unit::UNKNOWN,
    }
}

fn span_of(unit_number: i32) -> Option<Span> {
    let (n, u) = match unit_number {
        unit::SECOND => (1, Unit::Second),
        unit::MINUTE => (1, Unit::Minute),
        unit::HOUR => (1, Unit::Hour),
        unit::DAY => (1, Unit::Day),
        unit::WEEK => (1, Unit::Week),
        unit::MONTH => (30, Unit::Day),
        unit::YEAR => (1, Unit::Year),
        _ => return None,
    };
    Span::new(n, u).ok()
}

/// Time left at `now` (nanoseconds since the Unix epoch) in the current fixed window of
/// `span`, in whole seconds rounded up.
fn window_left(span: Span, now: u64) -> Duration {
    let now = now / 1_000_000_000;
    let secs = span.duration().as_secs().max(1);
    Duration::from_secs(secs - now % secs)
}

fn current(limited: &Limited) -> CurrentLimit {
    CurrentLimit {
        name: limited.name.clone().unwrap_or_default(),
        requests_per_unit: u32::try_from(limited.requests_per_unit).unwrap_or(u32::MAX),
        unit: envoy_unit(limited.span),
    }
}

/// One descriptor's limit after overrides: the configured one, or one made from the
/// request's override.
enum Resolved {
    None,
    /// The configured limit, and the entries counted as their wildcard pattern.
    Config(Limit, Vec<(usize, String)>),
    Override(std::sync::Arc<Limited>),
}

impl Service {
    /// Decides an Envoy request: every descriptor is checked; OVER_LIMIT when any is over.
    pub async fn should_rate_limit(
        &self,
        request: &EnvoyRequest,
    ) -> Result<EnvoyResponse, EnvoyError> {
        validate(request)?;
        // The limiter's clock: the same time its decisions are made on, and a test's to drive.
        let now = self.limiter().clock().now();
        let config = self.envoy();
        let modes = self.envoy_modes();
        let mut resolved = Vec::with_capacity(request.descriptors.len());
        for d in &request.descriptors {
            // As envoyproxy/ratelimit: an override in a domain with no config is ignored.
            let overridden = d
                .limit
                .filter(|_| config.domains.contains_key(&request.domain));
            if let Some((requests, unit_number)) = overridden {
                let span = span_of(unit_number).ok_or_else(|| {
                    EnvoyError::Invalid(format!("limit override unit {unit_number} is unknown"))
                })?;
                resolved.push(Resolved::Override(std::sync::Arc::new(Limited {
                    // One counter per descriptor and unit, whatever the limit: a new
                    // override value goes on counting where the old one was.
                    policy: format!("envoy.override.{}", span.duration().as_secs()),
                    name: None,
                    replaces: Vec::new(),
                    requests_per_unit: u64::from(requests),
                    span,
                    shadow: false,
                    quota: false,
                    counts_every_hit: true,
                })));
                continue;
            }
            let entries: Vec<(&str, &str)> = d
                .entries
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            resolved.push(match config.find(&request.domain, &entries) {
                Some(found) => Resolved::Config(
                    found.limit.clone(),
                    found
                        .shared
                        .iter()
                        .map(|&(i, p)| (i, p.to_owned()))
                        .collect(),
                ),
                None => Resolved::None,
            });
        }
        // `replaces`: a matched limit named by another matched limit's `replaces` drops out.
        let replaced: HashSet<&str> = resolved
            .iter()
            .filter_map(|r| match r {
                Resolved::Config(Limit::Limited(l) | Limit::Blocked(l), _) => Some(l),
                _ => None,
            })
            .flat_map(|l| l.replaces.iter().map(String::as_str))
            .collect();

        let request_hits = u64::from(request.hits_addend.max(1));
        let mut statuses = Vec::with_capacity(resolved.len());
        let mut quotas = Vec::with_capacity(resolved.len());
        // Over, for descriptors that are not in quota mode; (all, over) for those that are.
        let (mut over, mut quota_all, mut quota_over) = (false, 0usize, 0usize);
        for (d, r) in request.descriptors.iter().zip(&resolved) {
            let cost = d.hits_addend.unwrap_or(request_hits);
            let status = match r {
                Resolved::None => ok_without_limit(0),
                Resolved::Config(Limit::Unlimited, _) => ok_without_limit(u32::MAX),
                Resolved::Config(Limit::Limited(l) | Limit::Blocked(l), _)
                    if l.name.as_deref().is_some_and(|n| replaced.contains(n)) =>
                {
                    ok_without_limit(0)
                }
                Resolved::Config(Limit::Blocked(l), _) => DescriptorStatus {
                    code: if l.shadow || cost == 0 {
                        Code::Ok
                    } else {
                        Code::OverLimit
                    },
                    current_limit: Some(current(l)),
                    limit_remaining: 0,
                    duration_until_reset: Some(window_left(l.span, now)),
                },
                Resolved::Config(Limit::Limited(l), shared) => {
                    let value = if shared.is_empty() {
                        descriptor_value("", &d.entries)
                    } else {
                        // share_threshold: matched values count as their wildcard pattern.
                        let mut entries = d.entries.clone();
                        for (i, pattern) in shared {
                            entries[*i].1.clone_from(pattern);
                        }
                        descriptor_value("", &entries)
                    };
                    let (charge, whole) = charge(l, cost);
                    let checked = self.check(&l.policy, &[(SELECTOR, &value)], charge).await;
                    let status = match checked {
                        // A reload removed this leaf's policy since the tree was read: decide
                        // on the new tree rather than fail the request.
                        Err(sluice_limiter::Error::UnknownPolicy(_)) => {
                            self.recheck(&request.domain, d, &value, cost, now).await?
                        }
                        checked => status_of(l, checked, now)?,
                    };
                    over_whole_limit(l, status, whole)
                }
                Resolved::Override(l) => {
                    let value = descriptor_value(&request.domain, &d.entries);
                    let make = || override_policy(l);
                    let checked = self
                        .check_dynamic(
                            Dynamic::EnvoyOverride,
                            &l.policy,
                            make,
                            &[(SELECTOR, &value)],
                            cost,
                        )
                        .await;
                    override_status(l, checked, now)?
                }
            };
            // As envoyproxy/ratelimit: global quota mode puts every descriptor but the
            // unlimited ones in quota mode, those without a limit too.
            let quota = match r {
                Resolved::Config(Limit::Unlimited, _) => false,
                _ if modes.quota => true,
                Resolved::Config(Limit::Limited(l) | Limit::Blocked(l), _) => {
                    l.quota && !l.name.as_deref().is_some_and(|n| replaced.contains(n))
                }
                _ => false,
            };
            let is_over = status.code == Code::OverLimit;
            quotas.push(quota);
            if quota {
                quota_all += 1;
                quota_over += usize::from(is_over);
            } else {
                over |= is_over;
            }
            statuses.push(status);
        }
        // As envoyproxy/ratelimit: OVER_LIMIT when any descriptor outside quota mode is over,
        // or when every quota descriptor is.
        // Global shadow mode: never OVER_LIMIT overall (the statuses still say who is over).
        let overall_code = if (over || (quota_all > 0 && quota_over == quota_all)) && !modes.shadow
        {
            Code::OverLimit
        } else {
            Code::Ok
        };
        let headers = if modes.headers {
            headers(&statuses, &quotas)
        } else {
            Vec::new()
        };
        Ok(EnvoyResponse {
            overall_code,
            statuses,
            headers,
        })
    }
}

impl Service {
    async fn recheck(
        &self,
        domain: &str,
        d: &EnvoyDescriptor,
        value: &str,
        cost: u64,
        now: u64,
    ) -> Result<DescriptorStatus, EnvoyError> {
        let config = self.envoy();
        let entries: Vec<(&str, &str)> = d
            .entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        match config.limit_for(domain, &entries) {
            Some(Limit::Limited(l)) => {
                let (charge, whole) = charge(l, cost);
                let checked = self.check(&l.policy, &[(SELECTOR, value)], charge).await;
                Ok(over_whole_limit(l, status_of(l, checked, now)?, whole))
            }
            Some(Limit::Unlimited) => Ok(ok_without_limit(u32::MAX)),
            _ => Ok(ok_without_limit(0)),
        }
    }
}

fn ok_without_limit(remaining: u32) -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok,
        current_limit: None,
        limit_remaining: remaining,
        duration_until_reset: None,
    }
}

/// What a hit of `cost` charges: a request asking more than the whole limit can never
/// pass, but where every hit counts (fixed window, as envoyproxy/ratelimit) it still fills
/// the window, so the next hit is over too. Charging the whole limit does that in one
/// recorded step (the counter cannot tell more from enough). `true`: such a request.
fn charge(limited: &Limited, cost: u64) -> (u64, bool) {
    if limited.counts_every_hit && cost > limited.requests_per_unit {
        (limited.requests_per_unit, true)
    } else {
        (cost, false)
    }
}

/// A request over the whole limit is over, whatever charging the limit answered.
fn over_whole_limit(
    limited: &Limited,
    mut status: DescriptorStatus,
    whole: bool,
) -> DescriptorStatus {
    if whole {
        status.code = if limited.shadow {
            Code::Ok
        } else {
            Code::OverLimit
        };
        status.limit_remaining = 0;
    }
    status
}

fn status_of(
    limited: &Limited,
    checked: Result<sluice_limiter::Checked, sluice_limiter::Error>,
    now: u64,
) -> Result<DescriptorStatus, EnvoyError> {
    let checked = checked.map_err(|e| EnvoyError::Unavailable(e.to_string()))?;
    let d = &checked.decision;
    let over = !d.allowed();
    let remaining = if over || checked.shadow_denied {
        0
    } else {
        u32::try_from(d.remaining).unwrap_or(u32::MAX)
    };
    Ok(limited_status(limited, over, remaining, d.reset_after, now))
}

/// A limited descriptor's status; the reset in whole seconds, rounded up, as
/// envoyproxy/ratelimit reports its windows (the window's end when the decision says none).
fn limited_status(
    limited: &Limited,
    over: bool,
    remaining: u32,
    reset_after: Duration,
    now: u64,
) -> DescriptorStatus {
    let reset = Duration::from_secs(whole_seconds(reset_after));
    DescriptorStatus {
        code: if over { Code::OverLimit } else { Code::Ok },
        current_limit: Some(current(limited)),
        limit_remaining: remaining,
        duration_until_reset: Some(if reset.is_zero() {
            window_left(limited.span, now)
        } else {
            reset
        }),
    }
}

/// An override's status from its counter: the policy admits everything (its limit is the
/// largest count), so the decision says how many hits the window holds now, and that is
/// compared with the request's limit, as envoyproxy/ratelimit compares its counter.
fn override_status(
    limited: &Limited,
    checked: Result<sluice_limiter::Checked, sluice_limiter::Error>,
    now: u64,
) -> Result<DescriptorStatus, EnvoyError> {
    let checked = checked.map_err(|e| EnvoyError::Unavailable(e.to_string()))?;
    let d = &checked.decision;
    let counted = d.limit.saturating_sub(d.remaining);
    let over = !d.allowed() || counted > limited.requests_per_unit;
    let remaining = if over {
        0
    } else {
        u32::try_from(limited.requests_per_unit - counted).unwrap_or(u32::MAX)
    };
    Ok(limited_status(limited, over, remaining, d.reset_after, now))
}

/// The counter behind every override of one unit: a fixed window that admits up to the
/// largest `requests_per_unit` the protocol can carry, so it only counts.
fn override_policy(limited: &Limited) -> Policy {
    let rate = Rate::new(u64::from(u32::MAX), limited.span).expect("within bounds");
    let leaf = Leaf {
        selector: Selector::new([SELECTOR]).expect("a valid name"),
        rate,
        options: LeafOptions::default(),
    };
    Policy::from_rule(limited.policy.clone(), Rule::Leaf(leaf))
        .key("envoy.override")
        .algorithm(Algorithm::FixedWindow)
        .count_denied(true)
}

/// The descriptor the headers describe, as envoyproxy/ratelimit picks it: the last one over
/// its limit outside quota mode, else the first with the fewest hits remaining.
fn tightest<'s>(statuses: &'s [DescriptorStatus], quotas: &[bool]) -> Option<&'s DescriptorStatus> {
    let limited = || statuses.iter().filter(|s| s.current_limit.is_some());
    statuses
        .iter()
        .zip(quotas)
        .filter(|(s, quota)| !**quota && s.code == Code::OverLimit && s.current_limit.is_some())
        .map(|(s, _)| s)
        .next_back()
        .or_else(|| limited().min_by_key(|s| s.limit_remaining))
}

/// envoyproxy/ratelimit's `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset`,
/// then the `X-RateLimit-*` trio and the IETF `RateLimit-Policy`/`RateLimit` fields, for
/// the most constrained limited descriptor.
fn headers(statuses: &[DescriptorStatus], quotas: &[bool]) -> Vec<(String, String)> {
    let Some(tightest) = tightest(statuses, quotas) else {
        return Vec::new();
    };
    let limit = tightest.current_limit.as_ref().expect("filtered");
    let window = span_of(limit.unit).map_or(0, |s| s.duration().as_secs());
    let reset = tightest.duration_until_reset.unwrap_or_default().as_secs();
    let remaining = tightest.limit_remaining;
    let n = limit.requests_per_unit;
    vec![
        ("RateLimit-Limit".into(), n.to_string()),
        ("RateLimit-Remaining".into(), remaining.to_string()),
        ("RateLimit-Reset".into(), reset.to_string()),
        ("X-RateLimit-Limit".into(), format!("{n}, {n};w={window}")),
        ("X-RateLimit-Remaining".into(), remaining.to_string()),
        ("X-RateLimit-Reset".into(), reset.to_string()),
        ("RateLimit-Policy".into(), format!("{n};w={window}")),
        (
            "RateLimit".into(),
            format!("limit={n}, remaining={remaining}, reset={reset}"),
        ),
    ]
}
