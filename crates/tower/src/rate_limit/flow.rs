//! One request through the layer: filters, keys, challenge answer, decision, the inner
//! service, then the outcome count and the header fields.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use sluice_core::Decision;
use smallvec::SmallVec;
use tower_service::Service;

use super::answer::answer;
use super::config::{Config, Stats, WhenMissing};
use super::decide::before;
use super::future::ResponseBody;
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
    let client_key = client_ip.map(|ip| config.client_ip.key_inline(ip));
    let inputs = Inputs {
        parts: &parts,
        client_key: client_key.as_deref(),
        fields: fields.as_ref(),
    };
    // Values borrow from the request where they can; on the stack for the usual few keys.
    let mut values: SmallVec<[Cow<'_, str>; 4]> = SmallVec::new();
    let mut skip = false;
    for (name, key) in &config.keys {
        match (key.extract(&inputs), config.when_missing) {
            (Some(value), _) => values.push(value),
            (None, WhenMissing::Skip) => {
                skip = true;
                break;
            }
            (None, WhenMissing::Reject) => {
                let detail = format!("the request lacks a value for selector `{name}`");
                let response = denied::plain_problem(StatusCode::BAD_REQUEST, &detail);
                return Ok(response.map(ResponseBody::full));
            }
            (None, _) => values.push(Cow::Borrowed("")),
        }
    }
    if skip {
        drop(values);
        return pass(inner, parts, body).await;
    }
    let selectors: SmallVec<[(&str, &str); 4]> = config
        .keys
        .iter()
        .zip(&values)
        .map(|((name, _), value)| (name.as_str(), &**value))
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
    // Counting by outcome needs the values after the request has gone to the inner service.
    let kept: Option<Vec<String>> = (config.outcomes.is_some() && !counted)
        .then(|| values.iter().map(|v| v.to_string()).collect());
    drop(selectors);
    drop(values);

    let response = inner.call(Request::from_parts(parts, body)).await?;

    let mut decision = decision;
    if let (Some(outcomes), Some(kept)) = (&config.outcomes, &kept) {
        if outcomes.matches(response.status()) {
            let selectors: Vec<(&str, &str)> = config
                .keys
                .iter()
                .zip(kept)
                .map(|((name, _), value)| (name.as_str(), value.as_str()))
                .collect();
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
