//! One request through the layer: what it reads of the request (`request.rs`), the
//! challenge answer and the decision, the inner service, then the outcome count and the
//! header fields (`finish.rs`).

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Request, Response};
use sluice_core::Decision;
use tower_service::Service;

use super::config::Config;
use super::decide::before_now;
use super::finish::{finish_later, finish_now};
use super::hold::{self, before_holding};
use super::mode::LayerBody;
use super::refusal::Refused;
use super::request::{
    Missing, Prefix, Selectors, Values, fill_selectors, fill_values, keep, prefix, read_fields,
};
use crate::key::Inputs;

pub(super) type BoxError = Box<dyn std::error::Error + Send + Sync>;

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
pub(super) fn decided(
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
