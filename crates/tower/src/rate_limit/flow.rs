//! One request through the layer: filters, keys, challenge answer, decision, the inner
//! service, then the outcome count and the header fields.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use compact_str::CompactString;
use http::request::Parts;
use http::{HeaderMap, Request, Response, StatusCode};
use sluice_core::Decision;
use smallvec::SmallVec;
use tower_service::Service;

use super::answer::answer;
use super::config::{Config, Stats, WhenMissing};
use super::decide::before_now;
use super::hold::{self, before_holding};
use super::mode::LayerBody;
use super::refusal::Refused;
use crate::denied::{self, Reason};
use crate::filter::Admission;
use crate::key::body::{self, BodyError, BodyFields};
use crate::key::client_ip::peer_addr;
use crate::key::{ClientIp, Inputs};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the layer knows about a request once its keys are read.
pub(super) struct Ctx<'a> {
    pub config: &'a Config,
    pub parts: &'a Parts,
    pub client_ip: Option<IpAddr>,
    pub selectors: &'a [(&'a str, &'a str)],
}

/// The verdict before the inner service runs.
pub(super) enum Before {
    /// Call the inner service. `decision` feeds the header fields; `counted` says the hit
    /// is recorded already (so a matching outcome is not counted twice).
    Admit {
        decision: Option<Decision>,
        counted: bool,
    },
    /// Boxed: the usual verdicts are small, and moved several times.
    Answer(Box<Response<Bytes>>),
    /// A refusal the layer renders once the request's header map is free for its answer.
    Refuse(Refused),
}

/// What [`prepare`] found. The request stays where it is: the caller passes it on, or not.
pub(super) enum Step {
    Pass,
    Answer(Response<Bytes>),
    /// Needs the async path; nothing is recorded yet.
    Slow,
    Admit {
        decision: Option<Decision>,
        /// The key values, for counting the outcome once the response is known.
        kept: Option<Vec<String>>,
    },
}

/// Filters, keys and the decision, when none of them has to wait, on the request's head in
/// place (moving a request costs a copy of a few hundred bytes). A refusal takes the head's
/// header map for its answer; the request is not passed on then.
pub(super) fn prepare(config: &Config, parts: &mut Parts) -> Step {
    if config.always_slow {
        return Step::Slow;
    }
    let (client_ip, client_key) = match prefix(config, parts) {
        Prefix::Pass => return Step::Pass,
        Prefix::Answer(response) => return Step::Answer(*response),
        Prefix::Keys(ip, key) => (ip, key),
    };
    if config.client_ip_only
        && let Some(key) = client_key.as_deref()
    {
        let ctx = Ctx {
            config,
            parts,
            client_ip,
            selectors: &[(config.keys[0].0.as_str(), key)],
        };
        return decided(config, parts, before_now(&ctx), None);
    }
    let inputs = Inputs {
        parts,
        client_key: client_key.as_deref(),
        fields: None,
    };
    let mut values = Values::new();
    if let Err(missing) = fill_values(config, &inputs, &mut values) {
        drop(values);
        return match missing {
            Missing::Skip => Step::Pass,
            Missing::Answer(response) => Step::Answer(*response),
        };
    }
    let mut selectors = Selectors::new();
    fill_selectors(config, &values, &mut selectors);
    let ctx = Ctx {
        config,
        parts,
        client_ip,
        selectors: &selectors,
    };
    let decision = before_now(&ctx);
    let kept = match &decision {
        Some(Before::Admit { counted, .. }) => keep(config, *counted, &values),
        _ => None,
    };
    drop(selectors);
    drop(values);
    decided(config, parts, decision, kept)
}

/// The step a synchronous decision makes (`None`: there was none to make without waiting).
fn decided(
    config: &Config,
    parts: &mut Parts,
    decided: Option<Before>,
    kept: Option<Vec<String>>,
) -> Step {
    match decided {
        None => Step::Slow,
        Some(Before::Answer(response)) => Step::Answer(*response),
        Some(Before::Refuse(refused)) => Step::Answer(refused_answer(
            config,
            &refused,
            std::mem::take(&mut parts.headers),
        )),
        Some(Before::Admit { decision, .. }) => Step::Admit { decision, kept },
    }
}

/// The whole flow, any part of which may wait.
pub(super) async fn slow<S, ReqBody, ResBody, O>(
    config: Arc<Config>,
    mut inner: S,
    request: Request<ReqBody>,
) -> Result<Response<O>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    O: LayerBody<ResBody>,
    ReqBody: http_body::Body + 'static,
    ReqBody::Error: Into<BoxError>,
{
    let (mut parts, body) = request.into_parts();
    let (client_ip, client_key) = match prefix(&config, &mut parts) {
        Prefix::Pass => return pass(inner, Request::from_parts(parts, body)).await,
        Prefix::Answer(response) => return Ok(response.map(O::full)),
        Prefix::Keys(ip, key) => (ip, key),
    };
    let (body, fields) = if config.needs_body {
        match read_fields(&config, &parts, body).await {
            Ok((body, fields)) => (body, Some(fields)),
            Err(response) => return Ok(response.map(O::full)),
        }
    } else {
        (body, None)
    };
    let inputs = Inputs {
        parts: &parts,
        client_key: client_key.as_deref(),
        fields: fields.as_ref(),
    };
    let mut values = Values::new();
    if let Err(missing) = fill_values(&config, &inputs, &mut values) {
        drop(values);
        return match missing {
            Missing::Skip => pass(inner, Request::from_parts(parts, body)).await,
            Missing::Answer(response) => Ok(response.map(O::full)),
        };
    }
    let mut selectors = Selectors::new();
    fill_selectors(&config, &values, &mut selectors);
    let ctx = Ctx {
        config: &config,
        parts: &parts,
        client_ip,
        selectors: &selectors,
    };
    // `before` takes the synchronous path itself where the store allows it; leases and
    // reservations take theirs.
    let (decided, held) = before_holding(&ctx).await;
    let (decision, counted) = match decided {
        Before::Admit { decision, counted } => (decision, counted),
        Before::Answer(response) => return Ok(response.map(O::full)),
        Before::Refuse(refused) => {
            drop(selectors);
            drop(values);
            let response = refused_answer(&config, &refused, parts.headers);
            return Ok(response.map(O::full));
        }
    };
    let kept = keep(&config, counted, &values);
    drop(selectors);
    drop(values);
    let response = match inner.call(Request::from_parts(parts, body)).await {
        Ok(response) => response,
        Err(error) => {
            if let Some(held) = held {
                hold::abandon(&config, held);
            }
            return Err(error);
        }
    };
    let response = match finish_now(&config, decision, kept, response) {
        Ok(response) => response,
        Err(unfinished) => finish_later(config.clone(), unfinished).await,
    };
    Ok(match held {
        Some(held) => hold::after(&config, held, response),
        None => response,
    })
}

/// The answer to a refusal the layer renders, in the refused request's own header map
/// (the request is done with).
fn refused_answer(config: &Config, refused: &Refused, headers: HeaderMap) -> Response<Bytes> {
    config
        .refusal
        .response(refused, &config.fields, config.headers, headers)
}

/// What the filters and the client address say before any key is read.
enum Prefix {
    Pass,
    /// Boxed, as [`Before::Answer`].
    Answer(Box<Response<Bytes>>),
    /// The client address (when a key or a filter needs it) and its key form.
    Keys(Option<IpAddr>, Option<CompactString>),
}

/// The method and route filters, the client address (left in the request for the handlers
/// when asked), and the address filters.
fn prefix(config: &Config, parts: &mut Parts) -> Prefix {
    if !config.filters.selects(parts) {
        return Prefix::Pass;
    }
    let client_ip = if config.needs_client_ip {
        peer_addr(&parts.extensions).map(|peer| config.client_ip.resolve(peer.ip(), &parts.headers))
    } else {
        None
    };
    if let Some(ip) = client_ip
        && config.client_ip_extension
    {
        parts.extensions.insert(ClientIp(ip));
    }
    match config.filters.admission(client_ip) {
        Admission::Pass => Prefix::Pass,
        Admission::Forbid => {
            let ctx = Ctx {
                config,
                parts,
                client_ip,
                selectors: &[],
            };
            Stats::bump(&config.stats.deny_listed);
            Prefix::Answer(Box::new(answer(&ctx, Reason::DenyListed, None, None, None)))
        }
        Admission::Limit => Prefix::Keys(
            client_ip,
            client_ip.map(|ip| config.client_ip.key_inline(ip)),
        ),
    }
}

/// A request without a value for some key, when the layer does not limit it as empty.
enum Missing {
    Skip,
    /// Boxed: a rare answer should not make every call's result large.
    Answer(Box<Response<Bytes>>),
}

type Values<'a> = SmallVec<[Cow<'a, str>; 4]>;

/// The value of every key into `values`, borrowed from the request where it can be; on the
/// stack for the usual few keys.
fn fill_values<'a>(
    config: &Config,
    inputs: &Inputs<'a>,
    values: &mut Values<'a>,
) -> Result<(), Missing> {
    for (name, key) in &config.keys {
        match (key.extract(inputs), config.when_missing) {
            (Some(value), _) => values.push(value),
            (None, WhenMissing::Skip) => return Err(Missing::Skip),
            (None, WhenMissing::Reject) => {
                let detail = format!("the request lacks a value for selector `{name}`");
                return Err(Missing::Answer(Box::new(denied::plain_problem(
                    StatusCode::BAD_REQUEST,
                    &detail,
                ))));
            }
            (None, _) => values.push(Cow::Borrowed("")),
        }
    }
    Ok(())
}

type Selectors<'a> = SmallVec<[(&'a str, &'a str); 4]>;

/// Each key's selector name with its value, pushed in place (the array is moved no more).
fn fill_selectors<'a>(config: &'a Config, values: &'a Values<'_>, selectors: &mut Selectors<'a>) {
    for ((name, _), value) in config.keys.iter().zip(values) {
        selectors.push((name.as_str(), &**value));
    }
}

/// Counting by outcome needs the values after the request has gone to the inner service.
fn keep(config: &Config, counted: bool, values: &Values<'_>) -> Option<Vec<String>> {
    (config.outcomes.is_some() && !counted).then(|| values.iter().map(|v| v.to_string()).collect())
}

/// A response waiting for its outcome to be counted by a store that must be awaited.
pub(super) struct Unfinished<B> {
    decision: Option<Decision>,
    kept: Vec<String>,
    response: Response<B>,
}

/// The outcome count (when counting by outcome) and the header fields, when the count
/// needs no waiting; otherwise hands back what [`finish_later`] needs.
pub(super) fn finish_now<B, O: LayerBody<B>>(
    config: &Config,
    mut decision: Option<Decision>,
    kept: Option<Vec<String>>,
    response: Response<B>,
) -> Result<Response<O>, Box<Unfinished<B>>> {
    if let (Some(outcomes), Some(kept)) = (&config.outcomes, kept) {
        if outcomes.matches(response.status()) {
            let result =
                config
                    .limiter
                    .try_check_now(&config.policy, &outcome_selectors(config, &kept), 1);
            match result {
                Some(result) => counted_outcome(config, &mut decision, result),
                None => {
                    return Err(Box::new(Unfinished {
                        decision,
                        kept,
                        response,
                    }));
                }
            }
        } else if let Some(d) = &mut decision {
            // The peek reported what would remain after this hit; it was not counted.
            d.remaining = (d.remaining + 1).min(d.limit);
        }
    }
    Ok(decorate(config, decision.as_ref(), response))
}

/// [`finish_now`] for a store that must be awaited.
pub(super) async fn finish_later<B, O: LayerBody<B>>(
    config: Arc<Config>,
    unfinished: Box<Unfinished<B>>,
) -> Response<O> {
    let config = &*config;
    let Unfinished {
        mut decision,
        kept,
        response,
    } = *unfinished;
    let selectors = outcome_selectors(config, &kept);
    let result = config.limiter.check(&config.policy, &selectors, 1).await;
    counted_outcome(config, &mut decision, result);
    decorate(config, decision.as_ref(), response)
}

fn outcome_selectors<'a>(config: &'a Config, kept: &'a [String]) -> Vec<(&'a str, &'a str)> {
    config
        .keys
        .iter()
        .zip(kept)
        .map(|((name, _), value)| (name.as_str(), value.as_str()))
        .collect()
}

fn counted_outcome(
    config: &Config,
    decision: &mut Option<Decision>,
    result: Result<sluice_limiter::Checked, sluice_limiter::Error>,
) {
    match result {
        Ok(checked) => *decision = Some(checked.decision),
        Err(error) => {
            tracing::warn!(policy = %config.policy, %error, "could not count an outcome");
            Stats::bump(&config.stats.outcome_unrecorded);
        }
    }
}

/// The header fields, unless the layer is in shadow mode.
fn decorate<B, O: LayerBody<B>>(
    config: &Config,
    decision: Option<&Decision>,
    mut response: Response<B>,
) -> Response<O> {
    // Admitted answers carry the policy's fields only (`Retry-After` is for refusals).
    if let Some(decision) = decision
        && !config.shadow
        && (config.headers.ietf || config.headers.x_ratelimit)
    {
        config
            .fields
            .apply(response.headers_mut(), decision, false, config.headers);
    }
    response.map(O::inner)
}

async fn pass<S, ReqBody, ResBody, O>(
    mut inner: S,
    request: Request<ReqBody>,
) -> Result<Response<O>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    O: LayerBody<ResBody>,
{
    let response = inner.call(request).await?;
    Ok(response.map(O::inner))
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
