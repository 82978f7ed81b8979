//! The layer's own answers: denials (hooks called, fields added) and "could not decide".

use std::time::Duration;

use bytes::Bytes;
use http::Response;
use sluice_core::Decision;

use super::config::{Config, Stats};
use super::flow::{Before, Ctx};
use super::refusal::Refused;
use crate::challenge::Offer;
use crate::denied::{self, Denied, Reason};
use crate::headers::PolicyFields;

/// The limiter could not decide: 503, or admit when the layer fails open.
pub(super) fn failed(ctx: &Ctx<'_>, error: &sluice_limiter::Error) -> Before {
    let config = ctx.config;
    if config.fail_open {
        tracing::warn!(policy = %config.policy, %error, "rate limiter failed; admitting (fail open)");
        Stats::bump(&config.stats.failed_open);
        return Before::Admit {
            decision: None,
            counted: true,
        };
    }
    tracing::error!(policy = %config.policy, %error, "rate limiter failed; answering 503");
    Stats::bump(&config.stats.failed_closed);
    let mut response = denied::unavailable(ctx.parts);
    if error.is_transient() {
        crate::headers::retry_after(response.headers_mut(), Some(Duration::from_secs(1)));
    }
    Before::Answer(Box::new(response))
}

/// The policy's own failure mode refused because its store could not decide.
pub(super) fn unavailable(ctx: &Ctx<'_>, decision: &Decision) -> Before {
    let config = ctx.config;
    let denial = decision.denial.map_or("none", |d| d.name());
    tracing::error!(policy = %config.policy, denial, "the policy could not decide; answering 503");
    Stats::bump(&config.stats.failed_closed);
    let mut response = denied::unavailable(ctx.parts);
    let wait = decision.retry_after().unwrap_or(Duration::from_secs(1));
    crate::headers::retry_after(response.headers_mut(), Some(wait));
    Before::Answer(Box::new(response))
}

/// The answer to a denial of this layer's policy, hooks called.
pub(super) fn answer(
    ctx: &Ctx<'_>,
    reason: Reason,
    decision: Option<&Decision>,
    challenge: Option<&Offer>,
    challenge_error: Option<&str>,
) -> Response<Bytes> {
    render(
        ctx.config,
        &denied(ctx, reason, decision, challenge, challenge_error),
        &ctx.config.fields,
    )
}

/// A denial of this layer's policy: pre-rendered unless a render hook, a gRPC client or a
/// challenge asks for the general path (see [`super::refusal`]). Hooks called.
pub(super) fn refusal(
    ctx: &Ctx<'_>,
    reason: Reason,
    decision: Decision,
    challenge: Option<&Offer>,
    challenge_error: Option<&str>,
) -> Before {
    let config = ctx.config;
    if challenge.is_none()
        && challenge_error.is_none()
        && config.hooks.render.is_none()
        && config.refusal.renders(reason)
        && !crate::grpc::is_grpc(ctx.parts)
    {
        if let Some(audit) = &config.hooks.audit {
            audit(&denied(ctx, reason, Some(&decision), None, None));
        }
        return Before::Refuse(Refused { reason, decision });
    }
    Before::Answer(Box::new(answer(
        ctx,
        reason,
        Some(&decision),
        challenge,
        challenge_error,
    )))
}

fn denied<'a>(
    ctx: &'a Ctx<'_>,
    reason: Reason,
    decision: Option<&'a Decision>,
    challenge: Option<&'a Offer>,
    challenge_error: Option<&'a str>,
) -> Denied<'a> {
    Denied {
        policy: ctx.config.policy.name(),
        reason,
        decision,
        client_ip: ctx.client_ip,
        selectors: ctx.selectors,
        request: ctx.parts,
        shadow: false,
        challenge,
        challenge_error,
    }
}

pub(super) fn render(
    config: &Config,
    denied: &Denied<'_>,
    fields: &PolicyFields,
) -> Response<Bytes> {
    if let Some(audit) = &config.hooks.audit {
        audit(denied);
    }
    let mut response = denied::answer(denied, &config.hooks);
    let headers = response.headers_mut();
    if let Some(decision) = denied.decision {
        fields.apply(headers, decision, true, config.headers);
    }
    if let Some(offer) = denied.challenge {
        for (name, value) in &offer.headers {
            headers.insert(name.clone(), value.clone());
        }
    }
    response
}
