//! Store URLs: `memcached://host:port,host:port,...[?option=value&...]`.
//!
//! A host without a port gets memcached's 11211. Options: `timeout_ms` (each decision),
//! `connect_timeout_ms`, `connections` (per server), `down_ms` (how long a failed server is
//! skipped), `skew_ms` (the clock difference between app servers allowed for). Unknown
//! options are refused, so a typo is not silently ignored.

use std::time::Duration;

use sluice_limiter::store::url::split_query;

use crate::MemcachedError;

/// A URL, read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// `host:port` of each server, in the URL's order (the ring does not depend on it).
    pub servers: Vec<String>,
    pub timeout: Option<Duration>,
    pub connect_timeout: Option<Duration>,
    pub connections: Option<usize>,
    pub down_for: Option<Duration>,
    pub skew: Option<Duration>,
}

/// Reads a store URL.
pub fn parse(url: &str) -> Result<Settings, MemcachedError> {
    let bad = |why: &str| MemcachedError::Url(format!("`{url}`: {why}"));
    let rest = url
        .strip_prefix("memcached://")
        .ok_or_else(|| bad("not a memcached:// URL"))?;
    let (hosts, query) = split_query(rest);
    let mut settings = Settings::default();
    for host in hosts.trim_end_matches('/').split(',').map(str::trim) {
        if host.is_empty() {
            continue;
        }
        if host.contains(['/', '@', ' ']) {
            return Err(bad(&format!("`{host}` is not host:port")));
        }
        let has_port = match host.rsplit_once(':') {
            Some((name, port))
                if !name.is_empty() && (!name.contains(':') || name.ends_with(']')) =>
            {
                port.parse::<u16>()
                    .map_err(|_| bad(&format!("`{host}` has no valid port")))?;
                true
            }
            _ => false,
        };
        let server = if has_port {
            host.to_owned()
        } else {
            format!("{host}:11211")
        };
        if settings.servers.contains(&server) {
            return Err(bad(&format!("`{server}` is listed twice")));
        }
        settings.servers.push(server);
    }
    if settings.servers.is_empty() {
        return Err(bad("no servers"));
    }
    for (name, value) in query {
        let known = [
            "timeout_ms",
            "connect_timeout_ms",
            "down_ms",
            "skew_ms",
            "connections",
        ];
        if !known.contains(&name) {
            return Err(bad(&format!(
                "unknown option `{name}` (known: {})",
                known.join(", ")
            )));
        }
        let positive = value
            .parse::<u64>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| bad(&format!("{name} `{value}` is not a positive number")))?;
        let ms = Duration::from_millis(positive);
        match name {
            "timeout_ms" => settings.timeout = Some(ms),
            "connect_timeout_ms" => settings.connect_timeout = Some(ms),
            "down_ms" => settings.down_for = Some(ms),
            "skew_ms" => settings.skew = Some(ms),
            _ => settings.connections = Some(positive.min(1024) as usize),
        }
    }
    Ok(settings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_urls() {
        let s = parse("memcached://10.0.0.1:11212, cache-b ,[::1]:5/?timeout_ms=50&connections=2")
            .unwrap();
        assert_eq!(s.servers, ["10.0.0.1:11212", "cache-b:11211", "[::1]:5"]);
        assert_eq!(s.timeout, Some(Duration::from_millis(50)));
        assert_eq!(s.connections, Some(2));
        assert_eq!(parse("memcached://a:1").unwrap().timeout, None);
        for bad in [
            "memcached://",
            "memcached://a:1?timeout_ms=0",
            "memcached://a:1?speed=3",
            "memcached://a:x",
            "memcached://a:1,a:1",
            "memcached://u@a:1",
            "redis://a:1",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
