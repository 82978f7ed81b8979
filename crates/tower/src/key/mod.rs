//! Keys: where the value of each selector of a policy comes from.
//!
//! A policy's rule names selectors (`ip+user:5/m`); the layer is told, for each name, which
//! [`Key`] supplies its value: the client IP, a header, the path or route, the authenticated
//! user from the request's extensions, a form or JSON field, or a combination.

pub mod body;
pub mod client_ip;

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use http::request::Parts;
use http::{Extensions, HeaderName};
use sha2::{Digest, Sha256};

pub use body::BodyFields;
pub use client_ip::{ClientIp, ClientIpResolver, ForwardedHeader, PeerAddr};

type ExtensionFn = dyn Fn(&Extensions) -> Option<String> + Send + Sync;
type RequestFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;
type MapFn = dyn Fn(&str) -> String + Send + Sync;

/// The source of one selector's value.
#[derive(Clone)]
pub struct Key {
    source: Source,
    map: Option<Arc<MapFn>>,
}

#[derive(Clone)]
enum Source {
    ClientIp,
    Header(HeaderName),
    Path,
    Route,
    Extension(Arc<ExtensionFn>),
    Request(Arc<RequestFn>),
    FormField(String),
    JsonField(String),
    Constant(String),
    FirstOf(Vec<Key>),
    Join(Vec<Key>),
}

/// What a key sees of one request.
pub(crate) struct Inputs<'a> {
    pub parts: &'a Parts,
    /// The resolved client address, keyed (grouped) form.
    pub client_key: Option<&'a str>,
    pub fields: Option<&'a BodyFields>,
}

impl Key {
    fn of(source: Source) -> Key {
        Key { source, map: None }
    }

    /// The client address as the layer's [`ClientIpResolver`] resolves and groups it.
    pub fn client_ip() -> Key {
        Key::of(Source::ClientIp)
    }

    /// A request header's value (absent when the header is, or is not text).
    pub fn header(name: HeaderName) -> Key {
        Key::of(Source::Header(name))
    }

    /// The request path, without the query.
    pub fn path() -> Key {
        Key::of(Source::Path)
    }

    /// The matched route (`/users/{id}`) when axum has matched one (use
    /// `Router::route_layer`), else the path.
    pub fn route() -> Key {
        Key::of(Source::Route)
    }

    /// A value from the request's extensions, typically the authenticated user an earlier
    /// layer put there: `Key::extension(|user: &User| user.id.to_string())`.
    pub fn extension<T, F>(f: F) -> Key
    where
        T: Send + Sync + 'static,
        F: Fn(&T) -> String + Send + Sync + 'static,
    {
        Key::of(Source::Extension(Arc::new(move |ext: &Extensions| {
            ext.get::<T>().map(&f)
        })))
    }

    /// Any function of the request's head.
    pub fn from_fn<F>(f: F) -> Key
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        Key::of(Source::Request(Arc::new(f)))
    }

    /// A field of an `application/x-www-form-urlencoded` body. The value is hashed
    /// (SHA-256) before it becomes part of an identifier.
    pub fn form_field(name: impl Into<String>) -> Key {
        Key::of(Source::FormField(name.into()))
    }

    /// A field of a JSON body: a top-level name (`"username"`) or a JSON pointer
    /// (`"/user/name"`). Strings are taken as they are, other values as JSON text. Hashed
    /// like form fields.
    pub fn json_field(name: impl Into<String>) -> Key {
        Key::of(Source::JsonField(name.into()))
    }

    /// The same value for every request.
    pub fn constant(value: impl Into<String>) -> Key {
        Key::of(Source::Constant(value.into()))
    }

    /// The first of `keys` that has a value: `[Key::extension(..user..), Key::client_ip()]`
    /// keys signed-in users by account and everyone else by address.
    pub fn first_of(keys: impl IntoIterator<Item = Key>) -> Key {
        Key::of(Source::FirstOf(keys.into_iter().collect()))
    }

    /// All of `keys` joined by `|`; absent if any is.
    pub fn join(keys: impl IntoIterator<Item = Key>) -> Key {
        Key::of(Source::Join(keys.into_iter().collect()))
    }

    /// Transforms the value before it is used (and before a body field is hashed), e.g.
    /// `Key::form_field("username").map(|v| v.trim().to_lowercase())` so `Alice` and
    /// `alice ` share a counter.
    pub fn map<F>(mut self, f: F) -> Key
    where
        F: Fn(&str) -> String + Send + Sync + 'static,
    {
        self.map = Some(Arc::new(f));
        self
    }

    /// Whether this key reads the request body.
    pub(crate) fn needs_body(&self) -> bool {
        match &self.source {
            Source::FormField(_) | Source::JsonField(_) => true,
            Source::FirstOf(keys) | Source::Join(keys) => keys.iter().any(Key::needs_body),
            _ => false,
        }
    }

    /// Whether this key reads the client address.
    pub(crate) fn needs_client_ip(&self) -> bool {
        match &self.source {
            Source::ClientIp => true,
            Source::FirstOf(keys) | Source::Join(keys) => keys.iter().any(Key::needs_client_ip),
            _ => false,
        }
    }

    /// This key's value for one request, if it has one: borrowed from the request where it
    /// is there as it is (the client key, a header, the path), so the common keys copy nothing.
    /// The client address as it is, not mapped: a value the layer has in hand already.
    pub(crate) fn is_plain_client_ip(&self) -> bool {
        matches!(self.source, Source::ClientIp) && self.map.is_none()
    }

    pub(crate) fn extract<'a>(&self, inputs: &Inputs<'a>) -> Option<Cow<'a, str>> {
        let parts = inputs.parts;
        let (value, hash) = match &self.source {
            Source::ClientIp => (inputs.client_key.map(Cow::Borrowed), false),
            Source::Header(name) => (
                parts
                    .headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(Cow::Borrowed),
                false,
            ),
            Source::Path => (Some(Cow::Borrowed(parts.uri.path())), false),
            Source::Route => (Some(route(parts)), false),
            Source::Extension(f) => (f(&parts.extensions).map(Cow::Owned), false),
            Source::Request(f) => (f(parts).map(Cow::Owned), false),
            Source::FormField(name) => (
                inputs.fields.and_then(|f| f.form(name)).map(Cow::Owned),
                true,
            ),
            Source::JsonField(name) => (
                inputs.fields.and_then(|f| f.json(name)).map(Cow::Owned),
                true,
            ),
            Source::Constant(value) => (Some(Cow::Owned(value.clone())), false),
            Source::FirstOf(keys) => (keys.iter().find_map(|k| k.extract(inputs)), false),
            Source::Join(keys) => {
                let values: Option<Vec<Cow<'_, str>>> =
                    keys.iter().map(|k| k.extract(inputs)).collect();
                (values.map(|v| Cow::Owned(v.join("|"))), false)
            }
        };
        let value = match &self.map {
            Some(map) => Cow::Owned(map(&value?)),
            None => value?,
        };
        Some(if hash {
            Cow::Owned(hashed(&value))
        } else {
            value
        })
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match &self.source {
            Source::ClientIp => "client_ip".to_owned(),
            Source::Header(h) => format!("header({h})"),
            Source::Path => "path".to_owned(),
            Source::Route => "route".to_owned(),
            Source::Extension(_) => "extension".to_owned(),
            Source::Request(_) => "from_fn".to_owned(),
            Source::FormField(n) => format!("form_field({n})"),
            Source::JsonField(n) => format!("json_field({n})"),
            Source::Constant(v) => format!("constant({v})"),
            Source::FirstOf(k) => format!("first_of({k:?})"),
            Source::Join(k) => format!("join({k:?})"),
        };
        f.write_str(&name)
    }
}

fn route(parts: &Parts) -> Cow<'_, str> {
    #[cfg(feature = "axum")]
    if let Some(matched) = parts.extensions.get::<axum::extract::MatchedPath>() {
        return Cow::Borrowed(matched.as_str());
    }
    Cow::Borrowed(parts.uri.path())
}

/// The first 128 bits of SHA-256(`value`), in hex: a stable name that does not reveal a
/// submitted username or e-mail address to whoever reads the store.
pub fn hashed(value: &str) -> String {
    use std::fmt::Write;
    let digest = Sha256::digest(value.as_bytes());
    let mut out = String::with_capacity(32);
    for byte in &digest[..16] {
        let _ = write!(out, "{byte:02x}");
    }
    out
}
