//! Denials: what the hooks see, and the answer a denied client gets (429 problem+json by
//! default, 403 for a deny-listed address, a gRPC status for gRPC requests).

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Response, StatusCode};
use serde_json::{Value, json};
use sluice_core::{Decision, Denial};

use crate::challenge::Offer;
use sluice_core::whole_seconds;

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// The policy's rule is reached.
    Limited,
    /// The key is serving a penalty timeout.
    Penalized,
    /// The request costs more than the limit can ever admit.
    CostExceedsCapacity,
    /// The client address is on the deny list.
    DenyListed,
    /// A solved challenge, but the hard ceiling on solved requests is reached.
    Ceiling,
    /// Every slot of a concurrency leaf is held (`user:3 concurrent`). The `Retry-After`
    /// sent with it is a bound: the time until the earliest held lease expires; a holder
    /// that finishes frees its slot sooner.
    Occupied,
}

impl Reason {
    pub const fn name(self) -> &'static str {
        match self {
            Reason::Limited => "limited",
            Reason::Penalized => "penalized",
            Reason::CostExceedsCapacity => "cost_exceeds_capacity",
            Reason::DenyListed => "deny_listed",
            Reason::Ceiling => "ceiling",
            Reason::Occupied => "occupied",
        }
    }

    /// The reason of a policy's denial; `None` when the denial says the limiter could not
    /// decide (a policy whose store failed and that fails closed), which is no client's
    /// fault and gets 503, not 429.
    pub(crate) fn of(decision: &Decision) -> Option<Reason> {
        match decision.denial {
            Some(Denial::Limited { .. }) => Some(Reason::Limited),
            Some(Denial::Penalized { .. }) => Some(Reason::Penalized),
            Some(Denial::CostExceedsCapacity) => Some(Reason::CostExceedsCapacity),
            Some(Denial::Occupied { .. }) => Some(Reason::Occupied),
            _ => None,
        }
    }
}

/// One refused request, as the hooks see it.
#[derive(Debug, Clone, Copy)]
pub struct Denied<'a> {
    /// The policy that refused (the ceiling policy for [`Reason::Ceiling`]).
    pub policy: &'a str,
    pub reason: Reason,
    /// The limiter's decision; `None` for a deny-listed address.
    pub decision: Option<&'a Decision>,
    pub client_ip: Option<IpAddr>,
    /// Selector names and values as they were sent to the limiter (body fields hashed).
    pub selectors: &'a [(&'a str, &'a str)],
    pub request: &'a Parts,
    /// The layer or the policy is in shadow mode: the request goes through regardless.
    pub shadow: bool,
    /// The challenge offered with the answer, if any.
    pub challenge: Option<&'a Offer>,
    /// Why the challenge answer the request carried was refused, if it carried one.
    pub challenge_error: Option<&'a str>,
}

impl<'a> Denied<'a> {
    /// A refusal known only by its policy, reason and decision: no client, selectors,
    /// shadow or challenge (what the default body is made of).
    pub(crate) fn bare(
        policy: &'a str,
        reason: Reason,
        decision: &'a Decision,
        request: &'a Parts,
    ) -> Denied<'a> {
        Denied {
            policy,
            reason,
            decision: Some(decision),
            client_ip: None,
            selectors: &[],
            request,
            shadow: false,
            challenge: None,
            challenge_error: None,
        }
    }
}

pub(crate) type AuditHook = Arc<dyn Fn(&Denied<'_>) + Send + Sync>;
pub(crate) type RenderHook = Arc<dyn Fn(&Denied<'_>) -> Option<Response<Bytes>> + Send + Sync>;

/// Hooks, shown in `Debug` output by presence only.
#[derive(Clone, Default)]
pub(crate) struct Hooks {
    pub audit: Option<AuditHook>,
    pub render: Option<RenderHook>,
}

impl fmt::Debug for Hooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hooks")
            .field("audit", &self.audit.is_some())
            .field("render", &self.render.is_some())
            .finish()
    }
}

pub(crate) const PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

/// The answer for a denial: the custom page if the render hook gives one, else a gRPC
/// status for gRPC requests, else problem+json.
pub(crate) fn answer(denied: &Denied<'_>, hooks: &Hooks) -> Response<Bytes> {
    if crate::grpc::is_grpc(denied.request) {
        return crate::grpc::denied(denied);
    }
    if let Some(render) = &hooks.render
        && let Some(response) = render(denied)
    {
        return response;
    }
    problem(denied)
}

/// The default body: RFC 9457 problem details plus the numbers a client needs.
pub fn problem(denied: &Denied<'_>) -> Response<Bytes> {
    let status = status_of(denied.reason);
    let mut response = Response::new(Bytes::from(problem_body(denied, status)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, PROBLEM_JSON);
    response
}

/// The problem+json text, written field by field. Under a flood most requests are refused,
/// so this is the path a flood takes: building a `serde_json::Value` and printing it cost
/// about 22,000 instructions a refusal (callgrind, `benches/instructions.sh`), more than a
/// whole admitted request; writing the few fields straight into one buffer costs a tenth.
/// The keys and their order are those of `serde_json`'s output of the same object (a test
/// compares the two).
fn problem_body(denied: &Denied<'_>, status: StatusCode) -> String {
    let mut out = String::with_capacity(320);
    out.push_str(r#"{"type":"about:blank","title":"#);
    json_str(&mut out, status.canonical_reason().unwrap_or("Refused"));
    out.push_str(r#","status":"#);
    out.push_str(itoa::Buffer::new().format(status.as_u16()));
    out.push_str(r#","detail":""#);
    write_detail(&mut out, denied, json_escaped);
    out.push('"');
    out.push_str(r#","policy":"#);
    json_str(&mut out, denied.policy);
    out.push_str(r#","reason":""#);
    out.push_str(denied.reason.name());
    out.push('"');
    if let Some(d) = denied.decision {
        let mut number = itoa::Buffer::new();
        for (key, value) in [
            (r#","limit":"#, d.limit),
            (r#","remaining":"#, d.remaining),
            (r#","reset_after":"#, whole_seconds(d.reset_after)),
        ] {
            out.push_str(key);
            out.push_str(number.format(value));
        }
        out.push_str(r#","retry_after":"#);
        match d.retry_after() {
            Some(wait) => out.push_str(number.format(whole_seconds(wait))),
            None => out.push_str("null"),
        }
    }
    if let Some(offer) = denied.challenge {
        out.push_str(r#","challenge":"#);
        out.push_str(&Value::Object(offer.fields.clone()).to_string());
    }
    if let Some(error) = denied.challenge_error {
        out.push_str(r#","challenge_error":"#);
        json_str(&mut out, error);
    }
    out.push('}');
    out
}

/// The default body of a refusal by `policy` for `reason` with `decision`, as [`problem`]
/// writes it (the pre-rendered refusal of a layer is cut from it).
pub(crate) fn problem_text(policy: &str, reason: Reason, decision: &Decision) -> String {
    let parts = http::Request::new(()).into_parts().0;
    let denied = Denied::bare(policy, reason, decision, &parts);
    problem_body(&denied, status_of(reason))
}

/// `text` as a JSON string: quoted, with `"`, `\\` and control characters escaped. Text
/// with nothing to escape (nearly always) is copied whole.
fn json_str(out: &mut String, text: &str) {
    out.push('"');
    json_escaped(out, text);
    out.push('"');
}

/// `text` escaped for the inside of a JSON string.
fn json_escaped(out: &mut String, text: &str) {
    use std::fmt::Write;
    if !text.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        out.push_str(text);
        return;
    }
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
}

pub(crate) fn status_of(reason: Reason) -> StatusCode {
    match reason {
        Reason::DenyListed => StatusCode::FORBIDDEN,
        _ => StatusCode::TOO_MANY_REQUESTS,
    }
}

/// One sentence for people.
pub(crate) fn detail(denied: &Denied<'_>) -> String {
    let mut out = String::with_capacity(96);
    write_detail(&mut out, denied, |out, text| out.push_str(text));
    out
}

/// Writes [`detail`]'s sentence into `out`, the policy's name through `name` (which escapes
/// it for JSON in a problem body), without a `format!` and its allocation per refusal.
fn write_detail(out: &mut String, denied: &Denied<'_>, name: fn(&mut String, &str)) {
    let policy = denied.policy;
    let wait = denied.decision.and_then(|d| d.retry_after());
    let tail = |out: &mut String| {
        if let Some(wait) = wait {
            out.push_str("; retry after ");
            out.push_str(itoa::Buffer::new().format(whole_seconds(wait)));
            out.push_str(" s");
        }
    };
    match denied.reason {
        Reason::Limited => {
            out.push_str("rate limited by policy `");
            name(out, policy);
            out.push('`');
            tail(out);
        }
        Reason::Penalized => {
            out.push_str("timed out by policy `");
            name(out, policy);
            out.push_str("` after repeated abuse");
            tail(out);
        }
        Reason::CostExceedsCapacity => {
            out.push_str("the request costs more than policy `");
            name(out, policy);
            out.push_str("` can ever admit");
        }
        Reason::DenyListed => out.push_str("the client address is not allowed"),
        Reason::Ceiling => {
            out.push_str("the hard ceiling `");
            name(out, policy);
            out.push_str("` on solved challenges is reached");
            tail(out);
        }
        Reason::Occupied => {
            out.push_str("every slot of policy `");
            name(out, policy);
            out.push_str("` is in use");
            if let Some(wait) = wait {
                out.push_str("; one frees within ");
                out.push_str(itoa::Buffer::new().format(whole_seconds(wait)));
                out.push_str(" s");
            }
        }
    }
}

/// 503 for "could not decide" (the store failed and the layer fails closed).
pub(crate) fn unavailable(request: &Parts) -> Response<Bytes> {
    if crate::grpc::is_grpc(request) {
        return crate::grpc::unavailable();
    }
    plain_problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "the rate limiter could not decide; try again shortly",
    )
}

/// A problem+json answer with only a status and a detail.
pub(crate) fn plain_problem(status: StatusCode, detail: &str) -> Response<Bytes> {
    let body = json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = Response::new(Bytes::from(body.to_string()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, PROBLEM_JSON);
    response
}

/// The layer's default answer to a denied `decision` of `policy`, for code that decides
/// without the layer (the Python bindings' framework integrations): 429 with problem+json
/// and the header fields `which` enables, or 503 when the store could not decide and the
/// policy fails closed. `None` when the decision admits.
pub fn refusal(
    policy: &sluice_limiter::CompiledPolicy,
    decision: &Decision,
    which: crate::Headers,
) -> Option<Response<Bytes>> {
    if decision.allowed() {
        return None;
    }
    let parts = http::Request::new(()).into_parts().0;
    let Some(reason) = Reason::of(decision) else {
        let mut response = unavailable(&parts);
        let wait = decision
            .retry_after()
            .unwrap_or(std::time::Duration::from_secs(1));
        crate::headers::retry_after(response.headers_mut(), Some(wait));
        return Some(response);
    };
    let denied = Denied::bare(policy.name(), reason, decision, &parts);
    let mut response = problem(&denied);
    let fields = crate::headers::fields(policy, decision, true, which);
    response.headers_mut().extend(fields);
    Some(response)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The object the body used to be built as, with `serde_json`.
    fn as_value(denied: &Denied<'_>, status: StatusCode) -> Value {
        let mut body = json!({
            "type": "about:blank",
            "title": status.canonical_reason().unwrap_or("Refused"),
            "status": status.as_u16(),
            "detail": detail(denied),
            "policy": denied.policy,
            "reason": denied.reason.name(),
        });
        if let Some(d) = denied.decision {
            body["limit"] = d.limit.into();
            body["remaining"] = d.remaining.into();
            body["reset_after"] = whole_seconds(d.reset_after).into();
            body["retry_after"] = d.retry_after().map(whole_seconds).into();
        }
        if let Some(error) = denied.challenge_error {
            body["challenge_error"] = error.into();
        }
        body
    }

    #[test]
    fn the_hand_written_body_is_the_same_json() {
        let parts = http::Request::new(()).into_parts().0;
        let limited = Decision {
            denial: Some(Denial::Limited {
                retry_after: Duration::from_millis(1500),
            }),
            limit: 5,
            remaining: 0,
            reset_after: Duration::from_secs(60),
            leaf: 0,
        };
        let occupied = Decision {
            denial: Some(Denial::Occupied {
                retry_after: Duration::from_millis(29_001),
            }),
            ..limited.clone()
        };
        let unknown_wait = Decision {
            denial: Some(Denial::CostExceedsCapacity),
            ..limited.clone()
        };
        let cases = [
            ("login", Reason::Limited, Some(&limited), None),
            ("a\"b\\c\u{1}é", Reason::Penalized, Some(&limited), None),
            (
                "api",
                Reason::CostExceedsCapacity,
                Some(&unknown_wait),
                None,
            ),
            ("api", Reason::DenyListed, None, Some("bad \"answer\"\n")),
            ("exports", Reason::Occupied, Some(&occupied), None),
        ];
        for (policy, reason, decision, challenge_error) in cases {
            let denied = Denied {
                policy,
                reason,
                decision,
                client_ip: None,
                selectors: &[],
                request: &parts,
                shadow: false,
                challenge: None,
                challenge_error,
            };
            let status = status_of(reason);
            let text = problem_body(&denied, status);
            let expected = as_value(&denied, status);
            let parsed: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(parsed, expected, "{text}");
            if policy.is_ascii() && policy.chars().all(|c| c.is_alphanumeric()) {
                assert_eq!(text, expected.to_string(), "byte for byte");
            }
            if reason == Reason::Occupied {
                assert_eq!(
                    parsed["detail"],
                    "every slot of policy `exports` is in use; one frees within 30 s"
                );
                assert_eq!(parsed["reason"], "occupied");
                assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
            }
        }
    }
}
