//! One request through the layer: filters, keys, challenge answer, decision, the inner
//! service, then the outcome count and the header fields.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use sha2::{Digest, Sha256};
use sluice_core::{Decision, Denial};
use tower_service::Service;

use super::config::{ChallengeConfig, Config, Stats, WhenMissing};
use super::future::ResponseBody;
use crate::challenge::{Offer, Subject, Verification};
use crate::denied::{self, Denied, Reason};
use crate::filter::Admission;
use crate::headers::PolicyFields;
use crate::key::body::{self, BodyError, BodyFields};
use crate::key::client_ip::peer_addr;
use crate::key::{ClientIp, Inputs};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the layer knows about a request once its keys are read.
struct Ctx<'a> {
    config: &'a Config,
    parts: &'a Parts,
    client_ip: Option<IpAddr>,
    selectors: &'a [(&'a str, &'a str)],
}

/// The verdict before the inner service runs.
enum Before {
    /// Call the inner service. `decision` feeds the header fields; `counted` says the hit
    /// is recorded already (so a matching outcome is not counted twice).
    Admit {
        decision: Option<Decision>,
        counted: bool,
    },
    Answer(Response<Bytes>),
}

pub(crate) async fn handle<S, ReqBody, ResBody>(
    config: Arc<Config>,
    mut inner: S,
    request: Request<ReqBody>,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ReqBody: http_body::Body + 'static,
    ReqBody::Error: Into<BoxError>,
{
    let (mut parts, body) = request.into_parts();
    if !config.filters.selects(&parts) {
        return pass(inner, parts, body).await;
    }
    let client_ip = if config.needs_client_ip {
        peer_addr(&parts.extensions).map(|peer| config.client_ip.resolve(peer.ip(), &parts.headers))
    } else {
        None
    };
    if let Some(ip) = client_ip {
        parts.extensions.insert(ClientIp(ip));
    }
    match config.filters.admission(client_ip) {
        Admission::Pass => return pass(inner, parts, body).await,
        Admission::Forbid => {
            let ctx = Ctx {
                config: &config,
                parts: &parts,
                client_ip,
                selectors: &[],
            };
            Stats::bump(&config.stats.deny_listed);
            let response = answer(&ctx, Reason::DenyListed, None, None, None);
            return Ok(response.map(ResponseBody::full));
        }
        Admission::Limit => {}
    }
    let (body, fields) = if config.needs_body {
        match read_fields(&config, &parts, body).await {
            Ok((body, fields)) => (body, Some(fields)),
            Err(response) => return Ok(response.map(ResponseBody::full)),
        }
    } else {
        (body, None)
    };
    let client_key = client_ip.map(|ip| config.client_ip.key(ip));
    let inputs = Inputs {
        parts: &parts,
        client_key: client_key.as_deref(),
        fields: fields.as_ref(),
    };
    let mut values = Vec::with_capacity(config.keys.len());
    for (name, key) in &config.keys {
        match (key.extract(&inputs), config.when_missing) {
            (Some(value), _) => values.push(value),
            (None, WhenMissing::Skip) => return pass(inner, parts, body).await,
            (None, WhenMissing::Reject) => {
                let detail = format!("the request lacks a value for selector `{name}`");
                let response = denied::plain_problem(StatusCode::BAD_REQUEST, &detail);
                return Ok(response.map(ResponseBody::full));
            }
            (None, _) => values.push(String::new()),
        }
    }
    let selectors: Vec<(&str, &str)> = config
        .keys
        .iter()
        .zip(&values)
        .map(|((name, _), value)| (name.as_str(), value.as_str()))
        .collect();
    let ctx = Ctx {
        config: &config,
        parts: &parts,
        client_ip,
        selectors: &selectors,
    };
    let (decision, counted) = match before(&ctx).await {
        Before::Admit { decision, counted } => (decision, counted),
        Before::Answer(response) => return Ok(response.map(ResponseBody::full)),
    };

    let response = inner.call(Request::from_parts(parts, body)).await?;

    let mut decision = decision;
    if let Some(outcomes) = &config.outcomes
        && !counted
    {
        if outcomes.matches(response.status()) {
            match config.limiter.check(&config.policy, &selectors, 1).await {
                Ok(checked) => decision = Some(checked.decision),
                Err(error) => {
                    tracing::warn!(policy = %config.policy, %error, "could not count an outcome");
                    Stats::bump(&config.stats.outcome_unrecorded);
                }
            }
        } else if let Some(d) = &mut decision {
            // The peek reported what would remain after this hit; it was not counted.
            d.remaining = (d.remaining + 1).min(d.limit);
        }
    }
    let (mut head, body) = response.into_parts();
    if let Some(decision) = &decision
        && !config.shadow
    {
        config
            .fields
            .apply(&mut head.headers, decision, false, config.headers);
    }
    Ok(Response::from_parts(head, ResponseBody::inner(body)))
}

async fn pass<S, ReqBody, ResBody>(
    mut inner: S,
    parts: Parts,
    body: ReqBody,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    let response = inner.call(Request::from_parts(parts, body)).await?;
    Ok(response.map(ResponseBody::inner))
}

/// Reads and parses the body, and makes a new one of the same type for the inner service.
async fn read_fields<B>(
    config: &Config,
    parts: &Parts,
    body: B,
) -> Result<(B, BodyFields), Response<Bytes>>
where
    B: http_body::Body + 'static,
    B::Error: Into<BoxError>,
{
    if !body::can_rebuild::<B>() {
        tracing::error!(
            policy = %config.policy,
            body = std::any::type_name::<B>(),
            "form and JSON keys need a body type that can be rebuilt from bytes"
        );
        return Err(denied::plain_problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the rate limiter cannot read this request's body",
        ));
    }
    match body::read(body, config.max_body).await {
        Ok(bytes) => {
            let fields = BodyFields::parse(&parts.headers, &bytes);
            let body = body::rebuild(bytes).expect("checked by can_rebuild");
            Ok((body, fields))
        }
        Err(BodyError::TooLarge) => Err(denied::plain_problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            "the request body is too large",
        )),
        Err(BodyError::Unreadable) => Err(denied::plain_problem(
            StatusCode::BAD_REQUEST,
            "the request body could not be read",
        )),
    }
}

async fn before(ctx: &Ctx<'_>) -> Before {
    let config = ctx.config;
    let limiter = &config.limiter;
    let mut challenge_error = None;
    if let Some(challenge) = &config.challenge
        && let Some(answer) = challenge.challenge.answer(ctx.parts)
    {
        let digest = subject_digest(&config.policy, ctx.selectors);
        let subject = Subject {
            policy: &config.policy,
            digest: &digest,
            level: 0,
        };
        match challenge.challenge.verify(answer, subject).await {
            Verification::Solved => return solved(ctx, challenge).await,
            Verification::Refused(why) => {
                Stats::bump(&config.stats.challenges_refused);
                challenge_error = Some(why);
            }
        }
    }
    // Counting by outcome only peeks first; the hit is recorded once the outcome is known.
    let peek = config.outcomes.is_some();
    let mut waited = Duration::ZERO;
    loop {
        let result = if peek {
            limiter.peek(&config.policy, ctx.selectors, 1).await
        } else {
            limiter.check(&config.policy, ctx.selectors, 1).await
        };
        let checked = match result {
            Ok(checked) => checked,
            Err(error) => return failed(ctx, &error),
        };
        if checked.decision.allowed {
            if checked.shadow_denied {
                shadow_denied(ctx, &checked.decision);
            }
            return Before::Admit {
                decision: Some(checked.decision),
                counted: !peek,
            };
        }
        if let (Some(max), Some(wait)) = (config.wait_up_to, checked.decision.retry_after)
            && waited + wait <= max
        {
            tokio::time::sleep(wait).await;
            waited += wait;
            continue;
        }
        if Reason::of(&checked.decision).is_none() {
            return unavailable(ctx, &checked.decision);
        }
        let mut decision = checked.decision;
        let mut counted = !peek;
        if peek && decision.denial == Some(Denial::Limited) {
            // A peek never strikes the penalty box: count the refused attempt, so repeated
            // abuse meets timeouts that double.
            match limiter.check(&config.policy, ctx.selectors, 1).await {
                Ok(checked) if checked.decision.allowed => {
                    return Before::Admit {
                        decision: Some(checked.decision),
                        counted: true,
                    };
                }
                Ok(checked) => decision = checked.decision,
                Err(error) => {
                    tracing::warn!(policy = %config.policy, %error, "could not count a refused attempt")
                }
            }
            counted = true;
        }
        return refuse(ctx, decision, counted, challenge_error).await;
    }
}

/// A policy denial: the answer, unless the layer is in shadow mode.
async fn refuse(
    ctx: &Ctx<'_>,
    decision: Decision,
    counted: bool,
    challenge_error: Option<String>,
) -> Before {
    let config = ctx.config;
    if config.shadow {
        shadow_denied(ctx, &decision);
        return Before::Admit {
            decision: None,
            counted,
        };
    }
    let reason = Reason::of(&decision).unwrap_or(Reason::Limited);
    let offer = match &config.challenge {
        Some(challenge) if reason != Reason::CostExceedsCapacity => offer(ctx, challenge).await,
        _ => None,
    };
    Stats::bump(&config.stats.denied);
    Before::Answer(answer(
        ctx,
        reason,
        Some(&decision),
        offer.as_ref(),
        challenge_error.as_deref(),
    ))
}

fn shadow_denied(ctx: &Ctx<'_>, decision: &Decision) {
    Stats::bump(&ctx.config.stats.shadow_denied);
    if let Some(audit) = &ctx.config.hooks.audit {
        audit(&Denied {
            policy: &ctx.config.policy,
            reason: Reason::of(decision).unwrap_or(Reason::Limited),
            decision: Some(decision),
            client_ip: ctx.client_ip,
            selectors: ctx.selectors,
            request: ctx.parts,
            shadow: true,
            challenge: None,
            challenge_error: None,
        });
    }
}

/// The challenge for a refused client, unless it has reached the ceiling already (then
/// solving could not help it).
async fn offer(ctx: &Ctx<'_>, challenge: &ChallengeConfig) -> Option<Offer> {
    let limiter = &ctx.config.limiter;
    let level = match limiter.peek(&challenge.ceiling, ctx.selectors, 1).await {
        // A peek reports what would remain after one more: the solved requests so far are
        // the rest.
        Ok(c) if c.decision.allowed => c
            .decision
            .limit
            .saturating_sub(c.decision.remaining)
            .saturating_sub(1),
        Ok(_) => return None,
        Err(error) => {
            tracing::warn!(ceiling = %challenge.ceiling, %error, "no challenge offered");
            return None;
        }
    };
    let digest = subject_digest(&ctx.config.policy, ctx.selectors);
    Stats::bump(&ctx.config.stats.challenges_offered);
    Some(challenge.challenge.offer(Subject {
        policy: &ctx.config.policy,
        digest: &digest,
        level,
    }))
}

/// A correct answer: admitted if the ceiling admits it.
async fn solved(ctx: &Ctx<'_>, challenge: &ChallengeConfig) -> Before {
    let config = ctx.config;
    let limiter = &config.limiter;
    Stats::bump(&config.stats.challenges_solved);
    match limiter.check(&challenge.ceiling, ctx.selectors, 1).await {
        Ok(checked) if checked.decision.allowed => {
            if challenge.pardon
                && let Err(error) = limiter.reset(&config.policy, ctx.selectors).await
            {
                tracing::warn!(policy = %config.policy, %error, "could not pardon a solved challenge");
            }
            Before::Admit {
                decision: None,
                counted: false,
            }
        }
        Ok(checked) => {
            Stats::bump(&config.stats.denied);
            let denied = Denied {
                policy: &challenge.ceiling,
                reason: Reason::Ceiling,
                decision: Some(&checked.decision),
                client_ip: ctx.client_ip,
                selectors: ctx.selectors,
                request: ctx.parts,
                shadow: false,
                challenge: None,
                challenge_error: None,
            };
            Before::Answer(render(config, &denied, &challenge.ceiling_fields))
        }
        Err(error) => failed(ctx, &error),
    }
}

/// The limiter could not decide: 503, or admit when the layer fails open.
fn failed(ctx: &Ctx<'_>, error: &sluice_limiter::Error) -> Before {
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
fn unavailable(ctx: &Ctx<'_>, decision: &Decision) -> Before {
    let config = ctx.config;
    let denial = decision.denial.map_or("none", |d| d.name());
    tracing::error!(policy = %config.policy, denial, "the policy could not decide; answering 503");
    Stats::bump(&config.stats.failed_closed);
    let mut response = denied::unavailable(ctx.parts);
    let wait = decision.retry_after.unwrap_or(Duration::from_secs(1));
    crate::headers::retry_after(response.headers_mut(), Some(wait));
    Before::Answer(response)
}

/// The answer to a denial of this layer's policy, hooks called.
fn answer(
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

fn render(config: &Config, denied: &Denied<'_>, fields: &PolicyFields) -> Response<Bytes> {
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

/// Binds a challenge to the policy and the client's selector values.
fn subject_digest(policy: &str, selectors: &[(&str, &str)]) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(policy.as_bytes());
    for (name, value) in selectors {
        // Lengths first, so no two different lists hash alike.
        hash.update((name.len() as u64).to_be_bytes());
        hash.update(name.as_bytes());
        hash.update((value.len() as u64).to_be_bytes());
        hash.update(value.as_bytes());
    }
    hash.finalize().into()
}
