//! Rate limit header fields: `Retry-After`, the IETF `RateLimit-Policy` and `RateLimit`
//! fields (draft-ietf-httpapi-ratelimit-headers, structured fields), and the widely used
//! `X-RateLimit-Limit/Remaining/Reset` trio.
//!
//! All times are whole seconds rounded up, so a client that waits what it is told is never
//! early. `t` and `X-RateLimit-Reset` are the seconds until the deciding limit is back to
//! full (`reset_after`); `Retry-After` is the exact wait for this request, on denials only.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use sluice_core::Decision;
use sluice_limiter::CompiledPolicy;

/// Which header fields the layer writes. All on by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Headers {
    /// `Retry-After` on 429 and 503 answers.
    pub retry_after: bool,
    /// `RateLimit-Policy` and `RateLimit`.
    pub ietf: bool,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
    pub x_ratelimit: bool,
}

impl Default for Headers {
    fn default() -> Self {
        Headers {
            retry_after: true,
            ietf: true,
            x_ratelimit: true,
        }
    }
}

impl Headers {
    pub const NONE: Headers = Headers {
        retry_after: false,
        ietf: false,
        x_ratelimit: false,
    };
}

pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Whole seconds, rounded up.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The fixed part of a policy's fields, computed once when the layer is built.
#[derive(Debug, Clone)]
pub(crate) struct PolicyFields {
    /// `"login";q=5;w=60` (one member per leaf when the rule has several).
    policy: HeaderValue,
    /// The quoted identifier of each leaf, in leaf order.
    ids: Vec<String>,
}

impl PolicyFields {
    pub(crate) fn new(policy: &CompiledPolicy) -> PolicyFields {
        let name = policy.name();
        let many = policy.leaves.len() > 1;
        let mut ids = Vec::new();
        let mut members = Vec::new();
        for (i, leaf) in policy.leaves.iter().enumerate() {
            let id = if many {
                sf_string(&format!("{name}.{i}"))
            } else {
                sf_string(name)
            };
            let rate = leaf.leaf.rate;
            let count = rate.count();
            let span = rate.span().duration().as_secs();
            // The quota is what a full bucket admits at once; its window is how long the
            // bucket takes to refill (the rate's span unless a burst says otherwise).
            let quota = leaf.leaf.options.burst.unwrap_or(count);
            let window = if quota == count {
                span
            } else {
                (u128::from(quota) * u128::from(span)).div_ceil(u128::from(count)) as u64
            };
            members.push(format!("{id};q={quota};w={window}"));
            ids.push(id);
        }
        PolicyFields {
            policy: HeaderValue::from_str(&members.join(", "))
                .expect("structured field text is visible ASCII"),
            ids,
        }
    }

    /// Writes the fields `which` enables for `decision`; `Retry-After` only if `denied`.
    pub(crate) fn apply(
        &self,
        headers: &mut HeaderMap,
        decision: &Decision,
        denied: bool,
        which: Headers,
    ) {
        let reset = ceil_secs(decision.reset_after);
        if which.ietf {
            headers.insert(RATELIMIT_POLICY.clone(), self.policy.clone());
            let id = self.ids.get(decision.leaf).unwrap_or(&self.ids[0]);
            let value = format!("{id};r={};t={reset}", decision.remaining);
            headers.insert(
                RATELIMIT.clone(),
                HeaderValue::from_str(&value).expect("visible ASCII"),
            );
        }
        if which.x_ratelimit {
            headers.insert(X_RATELIMIT_LIMIT.clone(), decision.limit.into());
            headers.insert(X_RATELIMIT_REMAINING.clone(), decision.remaining.into());
            headers.insert(X_RATELIMIT_RESET.clone(), reset.into());
        }
        if denied && which.retry_after {
            retry_after(headers, decision.retry_after);
        }
    }
}

/// `Retry-After` in whole seconds (rounded up), when a wait is known.
pub(crate) fn retry_after(headers: &mut HeaderMap, wait: Option<Duration>) {
    if let Some(wait) = wait {
        headers.insert(http::header::RETRY_AFTER, ceil_secs(wait).into());
    }
}

/// A structured-field string: quoted, `\` and `"` escaped, anything outside visible ASCII
/// replaced (policy names are checked, but not for being ASCII).
fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}
