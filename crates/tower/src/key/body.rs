//! Reading a request body for form and JSON field keys, then putting it back.
//!
//! The body is read up to a bound, parsed once, and handed on to the inner service as a new
//! body of the same type. Only body types that can be rebuilt from bytes qualify
//! (`axum::body::Body`, `http_body_util::Full<Bytes>`, `String`, `Bytes`); a layer that
//! needs fields over another body type answers 500 and logs why.

use std::any::Any;

use bytes::Bytes;
use http::HeaderMap;
use http_body::Body;
use http_body_util::{BodyExt, Full, Limited};
use serde_json::Value;

/// Largest body read for field keys unless the layer says otherwise.
pub const DEFAULT_MAX_BODY: usize = 64 * 1024;

/// The fields of a form or JSON body.
#[derive(Debug, Clone, PartialEq)]
pub enum BodyFields {
    Form(Vec<(String, String)>),
    Json(Value),
    /// Neither a form nor JSON (or not parseable as what it claims to be).
    Other,
}

impl BodyFields {
    /// Parses `body` according to the request's `Content-Type`.
    pub fn parse(headers: &HeaderMap, body: &[u8]) -> BodyFields {
        let content_type = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let mime = content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if mime == "application/x-www-form-urlencoded" {
            BodyFields::Form(form_urlencoded::parse(body).into_owned().collect())
        } else if mime == "application/json" || mime.ends_with("+json") {
            serde_json::from_slice(body).map_or(BodyFields::Other, BodyFields::Json)
        } else {
            BodyFields::Other
        }
    }

    /// The first value of form field `name`.
    pub fn form(&self, name: &str) -> Option<String> {
        match self {
            BodyFields::Form(pairs) => pairs
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone()),
            _ => None,
        }
    }

    /// JSON field `name` (top level) or pointer (`/a/b`); strings as they are, other
    /// values (numbers, objects) as JSON text, `null` as absent.
    pub fn json(&self, name: &str) -> Option<String> {
        let BodyFields::Json(value) = self else {
            return None;
        };
        let found = if name.starts_with('/') {
            value.pointer(name)
        } else {
            value.get(name)
        }?;
        match found {
            Value::Null => None,
            Value::String(s) => Some(s.clone()),
            other => Some(other.to_string()),
        }
    }
}

/// Why a body could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyError {
    TooLarge,
    Unreadable,
}

/// Reads at most `max` bytes of `body`.
pub(crate) async fn read<B>(body: B, max: usize) -> Result<Bytes, BodyError>
where
    B: Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    match Limited::new(body, max).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(BodyError::TooLarge),
        Err(_) => Err(BodyError::Unreadable),
    }
}

/// A body of type `B` holding `bytes`, when `B` is a type that can hold plain bytes.
pub(crate) fn rebuild<B: 'static>(bytes: Bytes) -> Option<B> {
    fn offer<B: 'static, T: 'static>(value: T) -> Option<B> {
        let mut slot = Some(value);
        (&mut slot as &mut dyn Any)
            .downcast_mut::<Option<B>>()
            .and_then(Option::take)
    }
    #[cfg(feature = "axum")]
    if let Some(body) = offer::<B, _>(axum::body::Body::from(bytes.clone())) {
        return Some(body);
    }
    offer::<B, _>(Full::new(bytes.clone()))
        .or_else(|| offer::<B, _>(bytes.clone()))
        .or_else(|| offer::<B, _>(String::from_utf8(bytes.to_vec()).ok()?))
}

/// Whether [`rebuild`] knows how to make a `B`.
pub(crate) fn can_rebuild<B: 'static>() -> bool {
    rebuild::<B>(Bytes::new()).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_that_can_be_rebuilt() {
        // axum's body only with the `axum` feature (a dev-dependency makes the type exist).
        assert_eq!(can_rebuild::<axum::body::Body>(), cfg!(feature = "axum"));
        assert!(can_rebuild::<Full<Bytes>>());
        assert!(can_rebuild::<Bytes>());
        assert!(can_rebuild::<String>());
        assert!(!can_rebuild::<hyper::body::Incoming>());
        let body: Full<Bytes> = rebuild(Bytes::from_static(b"a=1")).unwrap();
        assert_eq!(body.size_hint().exact(), Some(3));
    }

    #[test]
    fn fields_follow_the_content_type() {
        let mut headers = HeaderMap::new();
        let form = BodyFields::parse(&headers, b"username=alice");
        assert_eq!(form, BodyFields::Other, "no content type, no fields");
        headers.insert(
            http::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded; charset=utf-8"
                .parse()
                .unwrap(),
        );
        let form = BodyFields::parse(&headers, b"username=al%20ice&username=bob");
        assert_eq!(form.form("username").as_deref(), Some("al ice"));
        headers.insert(
            http::header::CONTENT_TYPE,
            "application/vnd.api+json".parse().unwrap(),
        );
        let json = BodyFields::parse(&headers, br#"{"id": 7, "user": {"name": "x"}, "n": null}"#);
        assert_eq!(json.json("id").as_deref(), Some("7"));
        assert_eq!(json.json("/user/name").as_deref(), Some("x"));
        assert_eq!(json.json("n"), None);
        assert_eq!(BodyFields::parse(&headers, b"{not json"), BodyFields::Other);
    }
}
