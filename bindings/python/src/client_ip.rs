//! `ClientIp`: the tower layer's client address rules for Python frameworks.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Resolves the client address of a request behind proxies, and the key it is limited
/// under, with the tower layer's own rules: forwarding headers are believed only from
/// `trusted` networks, walked right to left; IPv6 clients are keyed by their /64.
#[pyclass(frozen, module = "sluice", name = "ClientIp")]
pub struct ClientIp {
    resolver: sluice_tower::ClientIpResolver,
}

#[pymethods]
impl ClientIp {
    #[new]
    #[pyo3(signature = (trusted = Vec::new(), *, header = "x-forwarded-for", ipv4_prefix = 32, ipv6_prefix = 64))]
    fn new(
        trusted: Vec<String>,
        header: &str,
        ipv4_prefix: u8,
        ipv6_prefix: u8,
    ) -> PyResult<ClientIp> {
        let networks = trusted
            .iter()
            .map(|net| parse_network(net))
            .collect::<PyResult<Vec<_>>>()?;
        let header = match header.to_ascii_lowercase().as_str() {
            "x-forwarded-for" => sluice_tower::ForwardedHeader::XForwardedFor,
            "forwarded" => sluice_tower::ForwardedHeader::Forwarded,
            other => {
                return Err(PyValueError::new_err(format!(
                    "header `{other}` is not x-forwarded-for or forwarded"
                )));
            }
        };
        if ipv4_prefix > 32 || ipv6_prefix > 128 {
            return Err(PyValueError::new_err(
                "ipv4_prefix is at most 32 and ipv6_prefix at most 128",
            ));
        }
        Ok(ClientIp {
            resolver: sluice_tower::ClientIpResolver::new()
                .trust(networks)
                .header(header)
                .ipv4_prefix(ipv4_prefix)
                .ipv6_prefix(ipv6_prefix),
        })
    }

    /// The client's address: `peer` (the socket's) unless a trusted proxy forwarded it.
    /// `headers` is a list of `(name, value)` pairs; only the forwarding header is read.
    #[pyo3(signature = (peer, headers = Vec::new()))]
    fn resolve(&self, peer: &str, headers: Vec<(String, String)>) -> PyResult<String> {
        let peer = parse_ip(peer)?;
        Ok(self
            .resolver
            .resolve(peer, &header_map(headers))
            .to_string())
    }

    /// The key the client is limited under: its address, or its network for IPv6.
    #[pyo3(signature = (peer, headers = Vec::new()))]
    fn key(&self, peer: &str, headers: Vec<(String, String)>) -> PyResult<String> {
        let peer = parse_ip(peer)?;
        let client = self.resolver.resolve(peer, &header_map(headers));
        Ok(self.resolver.key(client))
    }
}

fn parse_ip(text: &str) -> PyResult<std::net::IpAddr> {
    text.trim()
        .parse()
        .map_err(|_| PyValueError::new_err(format!("`{text}` is not an IP address")))
}

fn parse_network(text: &str) -> PyResult<ipnet::IpNet> {
    let text = text.trim();
    if let Ok(net) = text.parse() {
        return Ok(net);
    }
    parse_ip(text)
        .map(ipnet::IpNet::from)
        .map_err(|_| PyValueError::new_err(format!("`{text}` is not an IP network")))
}

/// Header pairs as a map; a pair whose name or value HTTP would refuse is left out.
fn header_map(headers: Vec<(String, String)>) -> http::HeaderMap {
    let mut map = http::HeaderMap::new();
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            map.append(name, value);
        }
    }
    map
}
