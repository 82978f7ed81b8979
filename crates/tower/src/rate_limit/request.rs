//! What the layer reads of a request before it decides: the method, route and address
//! filters, the client address, each key's value (from the head, or from a form or JSON
//! body) and the selectors the limiter gets.

use std::borrow::Cow;
use std::net::IpAddr;

use bytes::Bytes;
use compact_str::CompactString;
use http::request::Parts;
use http::{Response, StatusCode};
use smallvec::SmallVec;

use super::answer::answer;
use super::config::{Config, Stats, WhenMissing};
use super::flow::{BoxError, Ctx};
use crate::denied::{self, Reason};
use crate::filter::Admission;
use crate::key::body::{self, BodyError, BodyFields};
use crate::key::client_ip::peer_addr;
use crate::key::{ClientIp, Inputs};

/// What the filters and the client address say before any key is read.
pub(super) enum Prefix {
    Pass,
    /// Boxed, as [`Before::Answer`].
    Answer(Box<Response<Bytes>>),
    /// The client address (when a key or a filter needs it) and its key form.
    Keys(Option<IpAddr>, Option<CompactString>),
}

/// The method and route filters, the client address (left in the request for the handlers
/// when asked), and the address filters.
pub(super) fn prefix(config: &Config, parts: &mut Parts) -> Prefix {
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
pub(super) enum Missing {
    Skip,
    /// Boxed: a rare answer should not make every call's result large.
    Answer(Box<Response<Bytes>>),
}

pub(super) type Values<'a> = SmallVec<[Cow<'a, str>; 4]>;

/// The value of every key into `values`, borrowed from the request where it can be; on the
/// stack for the usual few keys.
pub(super) fn fill_values<'a>(
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

pub(super) type Selectors<'a> = SmallVec<[(&'a str, &'a str); 4]>;

/// Each key's selector name with its value, pushed in place (the array is moved no more).
pub(super) fn fill_selectors<'a>(
    config: &'a Config,
    values: &'a Values<'_>,
    selectors: &mut Selectors<'a>,
) {
    for ((name, _), value) in config.keys.iter().zip(values) {
        selectors.push((name.as_str(), &**value));
    }
}

/// Counting by outcome needs the values after the request has gone to the inner service.
pub(super) fn keep(config: &Config, counted: bool, values: &Values<'_>) -> Option<Vec<String>> {
    (config.outcomes.is_some() && !counted).then(|| values.iter().map(|v| v.to_string()).collect())
}

/// Reads and parses the body, and makes a new one of the same type for the inner service.
pub(super) async fn read_fields<B>(
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
