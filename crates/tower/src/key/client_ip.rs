//! The client's IP address, done right: the socket peer unless it is a trusted proxy, then
//! the forwarding header read from the right, skipping trusted hops.
//!
//! Reading from the right matters: every proxy appends, so only the entries added by proxies
//! we trust are facts; anything to their left may be written by the client. A spoofed header
//! from an untrusted peer is never read at all.

use compact_str::CompactString;
use std::net::{IpAddr, SocketAddr};

use http::{Extensions, HeaderMap, HeaderName};
use ipnet::IpNet;

/// Most forwarding hops examined, from the right. A longer chain of trusted proxies is
/// answered by the last one examined (a stricter key, never a client-chosen one).
const MAX_HOPS: usize = 32;

/// The peer address for servers that do not use axum's `ConnectInfo` (plain hyper, tonic):
/// insert it into the request's extensions before the layer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// The resolved client address. The layer inserts it into the request's extensions when
/// built with `client_ip_extension(true)`, so handlers can log the same address the limit
/// was keyed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientIp(pub IpAddr);

/// Which header the trusted proxies write. Choose the one your proxies set: a header they
/// only pass through is written by the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (nginx, most load balancers).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for="[2001:db8::1]:4711"`.
    Forwarded,
}

/// Resolves and groups client addresses.
#[derive(Debug, Clone)]
pub struct ClientIpResolver {
    trusted: Vec<IpNet>,
    header: ForwardedHeader,
    ipv4_prefix: u8,
    ipv6_prefix: u8,
}

impl Default for ClientIpResolver {
    fn default() -> Self {
        ClientIpResolver::new()
    }
}

impl ClientIpResolver {
    /// No trusted proxies (the socket peer is the client), `X-Forwarded-For`, IPv4 keyed per
    /// address and IPv6 per /64.
    pub fn new() -> ClientIpResolver {
        ClientIpResolver {
            trusted: Vec::new(),
            header: ForwardedHeader::default(),
            ipv4_prefix: 32,
            ipv6_prefix: 64,
        }
    }

    /// Proxies whose forwarding header is believed.
    pub fn trust(mut self, networks: impl IntoIterator<Item = IpNet>) -> Self {
        self.trusted.extend(networks);
        self
    }

    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// IPv6 addresses are keyed by this prefix (default 64: one host usually owns a whole
    /// /64 and could otherwise rotate through it). Values above 128 are rejected when the
    /// layer is built.
    pub fn ipv6_prefix(mut self, prefix: u8) -> Self {
        self.ipv6_prefix = prefix;
        self
    }

    /// IPv4 addresses are keyed by this prefix (default 32, one key per address).
    pub fn ipv4_prefix(mut self, prefix: u8) -> Self {
        self.ipv4_prefix = prefix;
        self
    }

    pub(crate) fn prefixes_valid(&self) -> bool {
        self.ipv4_prefix <= 32 && self.ipv6_prefix <= 128
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client of a request whose socket peer is `peer`.
    #[inline]
    pub fn resolve(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = normalize(peer);
        // No proxy trusted (the default): the peer is the client, whatever the headers say.
        if self.trusted.is_empty() || !self.is_trusted(peer) {
            return peer;
        }
        self.resolve_forwarded(peer, headers)
    }

    /// [`resolve`](Self::resolve) for a trusted peer: the forwarding headers, right to left.
    fn resolve_forwarded(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let hops = match self.header {
            ForwardedHeader::XForwardedFor => {
                hops(headers, &X_FORWARDED_FOR, |v| v.split(',').map(parse_node))
            }
            ForwardedHeader::Forwarded => hops(headers, &http::header::FORWARDED, forwarded_for),
        };
        // Walk right to left; the nearest address we know to be true so far is `client`.
        let mut client = peer;
        for hop in hops.into_iter().rev().take(MAX_HOPS) {
            let Some(ip) = hop else {
                // A trusted proxy wrote something we cannot read ("unknown", an obfuscated
                // node): key on that proxy rather than guess further left.
                return client;
            };
            client = normalize(ip);
            if !self.is_trusted(client) {
                return client;
            }
        }
        client
    }

    /// The network a client address is keyed by: the address itself for IPv4 /32, its /64
    /// (by default) for IPv6. IPv4-mapped IPv6 addresses count as IPv4.
    pub fn group(&self, ip: IpAddr) -> IpNet {
        let ip = normalize(ip);
        let prefix = match ip {
            IpAddr::V4(_) => self.ipv4_prefix.min(32),
            IpAddr::V6(_) => self.ipv6_prefix.min(128),
        };
        IpNet::new(ip, prefix)
            .expect("prefix clamped to the address length")
            .trunc()
    }

    /// The selector value of a client address: `203.0.113.9`, `2001:db8:1:2::/64`.
    pub fn key(&self, ip: IpAddr) -> String {
        self.key_inline(ip).into()
    }

    /// [`ClientIpResolver::key`] held inline (an IPv4 address or a grouped IPv6 prefix fits
    /// in 24 bytes): on every request, so no allocation.
    pub(crate) fn key_inline(&self, ip: IpAddr) -> CompactString {
        // The common case, on every request: an IPv4 address kept whole, formatted by hand
        // (`Display` and the grouping arithmetic are slower).
        if let IpAddr::V4(v4) = normalize(ip)
            && self.ipv4_prefix >= 32
        {
            return ipv4_key(v4);
        }
        let net = self.group(ip);
        match net.addr() {
            IpAddr::V4(v4) if net.prefix_len() == 32 => ipv4_key(v4),
            addr if net.prefix_len() == net.max_prefix_len() => {
                compact_str::format_compact!("{addr}")
            }
            _ => compact_str::format_compact!("{net}"),
        }
    }
}

/// Each octet's decimal digits (up to three) and their count.
const OCTETS: [([u8; 3], u8); 256] = {
    let mut table = [([0u8; 3], 0u8); 256];
    let mut i = 0;
    while i < 256 {
        let n = i as u8;
        table[i] = if n >= 100 {
            ([b'0' + n / 100, b'0' + n / 10 % 10, b'0' + n % 10], 3)
        } else if n >= 10 {
            ([b'0' + n / 10, b'0' + n % 10, 0], 2)
        } else {
            ([b'0' + n, 0, 0], 1)
        };
        i += 1;
    }
    table
};

/// `a.b.c.d`: the key of this thread's last address again when it is the same (a client's
/// requests on one keep-alive connection, a flood from one address), else written anew.
/// Copying the short inline string costs a tenth of writing and checking it.
fn ipv4_key(v4: std::net::Ipv4Addr) -> CompactString {
    thread_local! {
        static LAST: std::cell::RefCell<Option<(std::net::Ipv4Addr, CompactString)>> =
            const { std::cell::RefCell::new(None) };
    }
    let cached = LAST.try_with(|last| {
        let mut last = last.try_borrow_mut().ok()?;
        match &*last {
            Some((ip, key)) if *ip == v4 => Some(key.clone()),
            _ => {
                let key = write_ipv4_key(v4);
                *last = Some((v4, key.clone()));
                Some(key)
            }
        }
    });
    match cached {
        Ok(Some(key)) => key,
        _ => write_ipv4_key(v4),
    }
}

/// `a.b.c.d`, without `Display`'s machinery: each octet's digits from a table.
fn write_ipv4_key(v4: std::net::Ipv4Addr) -> CompactString {
    // Three bytes are copied per octet whatever its length; the next write covers the extra.
    let mut out = [0u8; 18];
    let mut len = 0;
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            out[len] = b'.';
            len += 1;
        }
        let (digits, count) = OCTETS[usize::from(octet)];
        out[len..len + 3].copy_from_slice(&digits);
        len += usize::from(count);
    }
    CompactString::from_utf8(&out[..len]).expect("ASCII digits and dots")
}

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The socket peer: axum's `ConnectInfo<SocketAddr>`, tonic's `TcpConnectInfo` (with the
/// `tonic` feature), else a [`PeerAddr`].
pub fn peer_addr(extensions: &Extensions) -> Option<SocketAddr> {
    #[cfg(feature = "axum")]
    if let Some(info) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0);
    }
    #[cfg(feature = "tonic")]
    if let Some(addr) = extensions
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(|info| info.remote_addr())
    {
        return Some(addr);
    }
    extensions.get::<PeerAddr>().map(|p| p.0)
}

/// `::ffff:192.0.2.1` is `192.0.2.1`: one client, one key, whichever socket family it used.
pub fn normalize(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Every hop of every line of `name`, in order (left to right). `None` marks an entry that
/// is not an address.
fn hops<'h, I>(
    headers: &'h HeaderMap,
    name: &HeaderName,
    split: impl Fn(&'h str) -> I,
) -> Vec<Option<IpAddr>>
where
    I: Iterator<Item = Option<IpAddr>>,
{
    let mut out = Vec::new();
    for value in headers.get_all(name) {
        match value.to_str() {
            Ok(text) => out.extend(split(text)),
            // Not text at all: an unreadable hop, like "unknown".
            Err(_) => out.push(None),
        }
    }
    out
}

/// One node: `192.0.2.1`, `192.0.2.1:8080`, `2001:db8::1`, `[2001:db8::1]:4711`.
fn parse_node(text: &str) -> Option<IpAddr> {
    let text = text.trim();
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    text.strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .and_then(|t| t.parse().ok())
}

/// The `for=` node of each element of a `Forwarded` value (RFC 7239). An element without
/// `for=` is an unreadable hop.
fn forwarded_for(value: &str) -> impl Iterator<Item = Option<IpAddr>> + '_ {
    split_outside_quotes(value, ',').map(|element| {
        split_outside_quotes(element, ';').find_map(|pair| {
            let (name, value) = pair.split_once('=')?;
            if !name.trim().eq_ignore_ascii_case("for") {
                return None;
            }
            let value = value.trim();
            let value = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(value);
            Some(parse_node(value))
        })?
    })
}

/// Splits on `sep`, except inside double quotes (a quoted IPv6 node holds no `,` or `;`,
/// but a hostile header might).
fn split_outside_quotes(text: &str, sep: char) -> impl Iterator<Item = &str> {
    let mut start = 0;
    let mut quoted = false;
    let mut parts = Vec::new();
    for (i, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            c if c == sep && !quoted => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts.into_iter()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_formatted_ipv4_keys_match_display() {
        let resolver = ClientIpResolver::new();
        let mut before = std::net::Ipv4Addr::new(10, 0, 0, 1);
        for a in 0..=255u8 {
            for b in [0u8, 7, 42, 250] {
                let ip = std::net::Ipv4Addr::new(a, b, 255 - b, a ^ b);
                // Written, then the thread's last key, then after another address.
                for ip in [ip, ip, before, ip] {
                    assert_eq!(resolver.key(IpAddr::V4(ip)), ip.to_string());
                }
                before = ip;
            }
        }
    }
}
