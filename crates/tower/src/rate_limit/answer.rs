//! The layer's own answers: denials (hooks called, fields added) and "could not decide".

use std::time::Duration;

use bytes::Bytes;
use http::Response;
use sluice_core::Decision;

use super::config::{Config, Stats};
use super::flow::{Before, Ctx};
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
    Before::Answer(response)
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
    Before::Answer(response)
}

/// The answer to a denial of this layer's policy, hooks called.
pub(super) fn answer(
    ctx: &Ctx<'_>,
    reason: Reason,
    decision: Option<&Decision>,
    challenge: Option<&Offer>,
    challenge_error: Option<&str>,
) -> Response<Bytes> {
    let denied = Denied {
        policy: &ctx.config.policy,
        reason,
        decision,
        client_ip: ctx.client_ip,
        selectors: ctx.selectors,
        request: ctx.parts,
        shadow: false,
        challenge,
        challenge_error,
    };
    render(ctx.config, &denied, &ctx.config.fields)
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
