//! Rate limit header fields: `Retry-After`, the IETF `RateLimit-Policy` and `RateLimit`
//! fields (draft-ietf-httpapi-ratelimit-headers, structured fields), and the widely used
//! `X-RateLimit-Limit/Remaining/Reset` trio.
//!
//! All times are whole seconds rounded up, so a client that waits what it is told is never
//! early. `t` and `X-RateLimit-Reset` are the seconds until the deciding limit is back to
//! full (`reset_after`); `Retry-After` is the exact wait for this request, on denials only.

use std::collections::BTreeSet;
use std::fmt::Write;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use sluice_core::{Decision, whole_seconds};
use sluice_limiter::CompiledPolicy;

/// Which header fields the layer writes. By default `Retry-After` and the IETF fields; the
/// `X-RateLimit-*` trio repeats what those say, so it is for clients that read only it
/// ([`Headers::ALL`]). Every field costs every response some bytes.
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
            x_ratelimit: false,
        }
    }
}

impl Headers {
    pub const ALL: Headers = Headers {
        retry_after: true,
        ietf: true,
        x_ratelimit: true,
    };
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

/// The fixed part of a policy's fields, computed once when the layer is built.
#[derive(Debug, Clone)]
pub(crate) struct PolicyFields {
    /// `"login";q=5;w=60` (one member per leaf when the rule has several).
    policy: HeaderValue,
    /// The quoted identifier of each leaf, in leaf order.
    ids: Vec<String>,
    /// Each leaf's quota, as `X-RateLimit-Limit` sends it.
    limits: Vec<(u64, HeaderValue)>,
}

impl PolicyFields {
    pub(crate) fn new(policy: &CompiledPolicy) -> PolicyFields {
        let name = policy.name();
        let many = policy.leaves.len() > 1;
        let mut ids = Vec::new();
        let mut members = Vec::new();
        let mut limits = Vec::new();
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
            limits.push((quota, static_value(&quota.to_string())));
            ids.push(id);
        }
        PolicyFields {
            policy: static_value(&members.join(", ")),
            ids,
            limits,
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
        self.apply_with(headers, decision, denied, which, None);
    }

    /// `RateLimit`'s value for `decision`.
    pub(crate) fn ratelimit(&self, decision: &Decision) -> HeaderValue {
        let id = self.ids.get(decision.leaf).unwrap_or(&self.ids[0]);
        ratelimit_value(id, decision.remaining, whole_seconds(decision.reset_after))
    }

    /// [`apply`](Self::apply), with `RateLimit`'s value when the caller has it already
    /// (what [`ratelimit`](Self::ratelimit) gives for `decision`).
    pub(crate) fn apply_with(
        &self,
        headers: &mut HeaderMap,
        decision: &Decision,
        denied: bool,
        which: Headers,
        ratelimit: Option<HeaderValue>,
    ) {
        let reset = whole_seconds(decision.reset_after);
        // One growth of the map instead of several.
        headers.reserve(
            2 * usize::from(which.ietf) + 3 * usize::from(which.x_ratelimit) + usize::from(denied),
        );
        if which.ietf {
            headers.insert(RATELIMIT_POLICY.clone(), self.policy.clone());
            let value = ratelimit.unwrap_or_else(|| self.ratelimit(decision));
            headers.insert(RATELIMIT.clone(), value);
        }
        if which.x_ratelimit {
            let limit = match self.limits.get(decision.leaf) {
                Some((quota, value)) if *quota == decision.limit => value.clone(),
                _ => integer(decision.limit),
            };
            headers.insert(X_RATELIMIT_LIMIT.clone(), limit);
            headers.insert(X_RATELIMIT_REMAINING.clone(), integer(decision.remaining));
            headers.insert(X_RATELIMIT_RESET.clone(), integer(reset));
        }
        if denied && which.retry_after {
            retry_after(headers, decision.retry_after());
        }
    }
}

/// The header fields `which` enables for `decision` under `policy`, as the layer writes them
/// (`Retry-After` only when `denied`): for code that answers requests without the layer,
/// such as the Python bindings' framework integrations.
pub fn fields(
    policy: &CompiledPolicy,
    decision: &Decision,
    denied: bool,
    which: Headers,
) -> HeaderMap {
    let mut headers = HeaderMap::new();
    PolicyFields::new(policy).apply(&mut headers, decision, denied, which);
    headers
}

/// `Retry-After` in whole seconds (rounded up), when a wait is known.
pub(crate) fn retry_after(headers: &mut HeaderMap, wait: Option<Duration>) {
    if let Some(wait) = wait {
        headers.insert(http::header::RETRY_AFTER, integer(whole_seconds(wait)));
    }
}

/// A header value that is cloned on every response, made static: a clone of a shared value
/// bumps a reference count that every core writes, a static one costs nothing. Interned, so
/// building layers again and again keeps one copy of each distinct text.
fn static_value(text: &str) -> HeaderValue {
    static INTERNED: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut interned = INTERNED.lock().unwrap_or_else(|e| e.into_inner());
    let text = match interned.get(text) {
        Some(text) => *text,
        None => {
            let leaked: &'static str = Box::leak(text.to_owned().into_boxed_str());
            interned.insert(leaked);
            leaked
        }
    };
    HeaderValue::from_static(text)
}

/// `RateLimit`'s value, `"name";r=REMAINING;t=RESET`, written by hand (this runs on every
/// response, and `format!` is several times slower for so little text) and cut from the
/// thread's buffer of values.
fn ratelimit_value(id: &str, remaining: u64, reset: u64) -> HeaderValue {
    let (mut r, mut t) = (itoa::Buffer::new(), itoa::Buffer::new());
    let (r, t) = (r.format(remaining).as_bytes(), t.format(reset).as_bytes());
    let bytes = cut([id.as_bytes(), b";r=", r, b";t=", t]);
    HeaderValue::from_maybe_shared(bytes)
        .expect("a structured-field string and digits are visible ASCII")
}

/// Room in each thread's buffer of header values.
const VALUES_BUFFER: usize = 1024;

/// `parts` joined, as bytes cut from this thread's buffer of header values: one allocation
/// for a buffer's worth of values instead of one per value (an allocation and its free were
/// about 150 of the 1,100 instructions a response's fields cost). Once every value cut from
/// it has been dropped (hyper drops a response's header map once it has written it) the
/// buffer is reused in place, so a steady stream of responses allocates nothing. A value kept
/// long keeps its buffer's kilobyte alive with it.
fn cut<const N: usize>(parts: [&[u8]; N]) -> bytes::Bytes {
    use std::cell::RefCell;
    thread_local! {
        static BUFFER: RefCell<bytes::BytesMut> = RefCell::new(bytes::BytesMut::new());
    }
    let len: usize = parts.iter().map(|part| part.len()).sum();
    let cut = BUFFER.try_with(|buffer| {
        let mut buffer = buffer.try_borrow_mut().ok()?;
        if buffer.capacity() - buffer.len() < len {
            buffer.reserve(len.max(VALUES_BUFFER));
        }
        for part in parts {
            buffer.extend_from_slice(part);
        }
        Some(buffer.split().freeze())
    });
    match cut {
        Ok(Some(bytes)) => bytes,
        // During the thread's teardown: a value of its own.
        _ => bytes::Bytes::from(parts.concat()),
    }
}

/// Integers below this come from a table made once.
const SMALL: u64 = 4096;

/// The header value of `n`. Nearly every count and reset is small: those are static values
/// made once, so a response's fields cost no allocation each (the table is one string of
/// about 15 KiB, kept for the life of the process).
fn integer(n: u64) -> HeaderValue {
    static TABLE: OnceLock<Box<[HeaderValue]>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut text = String::new();
        let mut ends = Vec::with_capacity(SMALL as usize);
        for i in 0..SMALL {
            let _ = write!(text, "{i}");
            ends.push(text.len());
        }
        let text: &'static str = Box::leak(text.into_boxed_str());
        let mut start = 0;
        ends.into_iter()
            .map(|end| {
                let value = HeaderValue::from_static(&text[start..end]);
                start = end;
                value
            })
            .collect()
    });
    match table.get(n as usize) {
        Some(value) => value.clone(),
        None => {
            let mut digits = itoa::Buffer::new();
            HeaderValue::from_maybe_shared(cut([digits.format(n).as_bytes()]))
                .expect("digits are visible ASCII")
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_from_the_table_and_beyond_it() {
        let powers = (0..20).flat_map(|e| {
            let p = 10u64.pow(e);
            [p - 1, p, p + 1]
        });
        let samples = [0, 4095, 4096, 123_456_789_012, u64::MAX]
            .into_iter()
            .chain(powers);
        for n in samples.chain(0..20_000) {
            assert_eq!(integer(n), HeaderValue::from(n));
        }
    }

    #[test]
    fn values_cut_from_the_thread_buffer_stay_apart() {
        // Kept values outlive several buffers; dropped ones let a buffer be reused.
        let kept: Vec<_> = (0..3 * VALUES_BUFFER as u64)
            .map(|n| (n, ratelimit_value("\"p\"", n, n % 7)))
            .collect();
        for round in 0..3 * VALUES_BUFFER as u64 {
            let dropped = integer(SMALL + round);
            assert_eq!(dropped, HeaderValue::from(SMALL + round));
        }
        for (n, value) in &kept {
            assert_eq!(value.to_str().unwrap(), format!("\"p\";r={n};t={}", n % 7));
        }
        let long = "x".repeat(3 * VALUES_BUFFER);
        assert_eq!(cut([long.as_bytes(), b"y"]).len(), 3 * VALUES_BUFFER + 1);
        assert_eq!(&cut([b"a", b"", b"bc"])[..], b"abc");
    }

    #[test]
    fn ratelimit_values_short_and_long() {
        let value = ratelimit_value("\"login\"", 4, 60);
        assert_eq!(value, "\"login\";r=4;t=60");
        let value = ratelimit_value("\"bench\"", 999_999_999_999, u64::MAX);
        assert_eq!(value, "\"bench\";r=999999999999;t=18446744073709551615");
        // Beyond the stack buffer.
        let long = format!("\"{}\"", "p".repeat(200));
        let value = ratelimit_value(&long, 0, 1);
        assert_eq!(value.to_str().unwrap(), format!("{long};r=0;t=1"));
    }

    #[test]
    fn structured_field_strings_are_escaped() {
        assert_eq!(sf_string("a\"b\\c é"), "\"a\\\"b\\\\c ?\"");
    }
}
