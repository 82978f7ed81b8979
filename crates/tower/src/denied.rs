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
}

impl Reason {
    pub const fn name(self) -> &'static str {
        match self {
            Reason::Limited => "limited",
            Reason::Penalized => "penalized",
            Reason::CostExceedsCapacity => "cost_exceeds_capacity",
            Reason::DenyListed => "deny_listed",
            Reason::Ceiling => "ceiling",
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
    if let Some(offer) = denied.challenge {
        body["challenge"] = Value::Object(offer.fields.clone());
    }
    if let Some(error) = denied.challenge_error {
        body["challenge_error"] = error.into();
    }
    let mut response = Response::new(Bytes::from(body.to_string()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, PROBLEM_JSON);
    response
}

pub(crate) fn status_of(reason: Reason) -> StatusCode {
    match reason {
        Reason::DenyListed => StatusCode::FORBIDDEN,
        _ => StatusCode::TOO_MANY_REQUESTS,
    }
}

/// One sentence for people.
pub(crate) fn detail(denied: &Denied<'_>) -> String {
    let wait = denied
        .decision
        .and_then(|d| d.retry_after())
        .map(|r| format!("; retry after {} s", whole_seconds(r)))
        .unwrap_or_default();
    let policy = denied.policy;
    match denied.reason {
        Reason::Limited => format!("rate limited by policy `{policy}`{wait}"),
        Reason::Penalized => format!("timed out by policy `{policy}` after repeated abuse{wait}"),
        Reason::CostExceedsCapacity => {
            format!("the request costs more than policy `{policy}` can ever admit")
        }
        Reason::DenyListed => "the client address is not allowed".to_owned(),
        Reason::Ceiling => {
            format!("the hard ceiling `{policy}` on solved challenges is reached{wait}")
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
    let denied = Denied {
        policy: policy.name(),
        reason,
        decision: Some(decision),
        client_ip: None,
        selectors: &[],
        request: &parts,
        shadow: false,
        challenge: None,
        challenge_error: None,
    };
    let mut response = problem(&denied);
    let fields = crate::headers::fields(policy, decision, true, which);
    response.headers_mut().extend(fields);
    Some(response)
}
