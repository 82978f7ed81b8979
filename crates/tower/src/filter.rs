//! Which requests a layer limits: methods, paths, and exempt and deny lists of networks.

use std::net::IpAddr;

use http::request::Parts;
use http::{Method, Uri};
use ipnet::IpNet;

use crate::key::client_ip::normalize;

/// A path the layer applies to: exact (`/login`) or a prefix (`/api/*` matches `/api/` and
/// everything under it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PathPattern {
    Exact(String),
    Prefix(String),
}

impl PathPattern {
    pub(crate) fn parse(pattern: &str) -> PathPattern {
        match pattern.strip_suffix('*') {
            Some(prefix) => PathPattern::Prefix(prefix.to_owned()),
            None => PathPattern::Exact(pattern.to_owned()),
        }
    }

    fn matches(&self, path: &str) -> bool {
        match self {
            PathPattern::Exact(p) => path == p,
            PathPattern::Prefix(p) => path.starts_with(p.as_str()),
        }
    }
}

/// What the layer does with a request before any key is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Not this layer's business: passed on untouched.
    Pass,
    /// Refused outright (deny list).
    Forbid,
    /// Limited.
    Limit,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Filters {
    /// Empty: every method.
    pub methods: Vec<Method>,
    /// Empty: every path.
    pub paths: Vec<PathPattern>,
    pub exempt: Vec<IpNet>,
    pub deny: Vec<IpNet>,
}

impl Filters {
    /// Whether the request's method and path concern this layer.
    #[inline]
    pub(crate) fn selects(&self, parts: &Parts) -> bool {
        self.selects_head(&parts.method, &parts.uri)
    }

    /// [`Filters::selects`] on a method and a URI.
    #[inline]
    pub(crate) fn selects_head(&self, method: &Method, uri: &Uri) -> bool {
        (self.methods.is_empty() || self.methods.contains(method))
            && (self.paths.is_empty() || self.paths.iter().any(|p| p.matches(uri.path())))
    }

    pub(crate) fn needs_client_ip(&self) -> bool {
        !self.exempt.is_empty() || !self.deny.is_empty()
    }

    /// The lists' verdict on a client address. Deny wins over exempt; a request whose
    /// address is unknown is limited (never exempted by accident).
    #[inline]
    pub(crate) fn admission(&self, client: Option<IpAddr>) -> Admission {
        if self.deny.is_empty() && self.exempt.is_empty() {
            return Admission::Limit;
        }
        let Some(ip) = client.map(normalize) else {
            return Admission::Limit;
        };
        if self.deny.iter().any(|n| n.contains(&ip)) {
            Admission::Forbid
        } else if self.exempt.iter().any(|n| n.contains(&ip)) {
            Admission::Pass
        } else {
            Admission::Limit
        }
    }
}
