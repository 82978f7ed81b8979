//! The store URL: `postgres://user:pass@host:port/db?options` (or `postgresql://`), read once
//! into validated settings. sluice's own options are taken off the query string; the rest
//! (`application_name`, `target_session_attrs`, ...) go to the PostgreSQL client as they are.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use sluice_limiter::store::url::take_params;

use crate::PostgresError;

/// Time allowed for one decision when the URL sets none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);
/// Time allowed to open one connection when the URL sets none.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections in the pool when the URL sets none.
pub const DEFAULT_POOL_SIZE: usize = 16;

/// Batch senders when the URL names none. Each keeps one backend busy with whole batches;
/// fewer make larger batches, which cost the database less per decision (on a 2-core
/// machine, 2 senders took a third of the server CPU per decision that 16 did), while more
/// let a database with many cores decide batches in parallel.
pub const DEFAULT_BATCH_SENDERS: usize = 4;
/// The schema sluice's tables and functions live in when the URL names none.
pub const DEFAULT_SCHEMA: &str = "sluice";
/// How often the cleaner runs when the URL sets none.
pub const DEFAULT_CLEANUP_INTERVAL: Duration = Duration::from_secs(1);
/// Heap pages the cleaner examines per run when the URL sets none (8 KiB each).
pub const DEFAULT_CLEANUP_PAGES: u32 = 1024;

/// Whether and how to use TLS (`sslmode`). The server's certificate is always verified
/// (against the Mozilla roots, plus `sslrootcert`) when TLS is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
}

/// Everything a store URL says.
#[derive(Debug, Clone)]
pub struct Settings {
    pub(crate) client: tokio_postgres::Config,
    pub(crate) ssl_mode: SslMode,
    pub(crate) root_cert: Option<PathBuf>,
    pub(crate) pool_size: usize,
    /// Tasks sending batched lean decisions, each on a connection of its own (at most
    /// `pool_size`): fewer senders make larger batches.
    pub(crate) batch_senders: usize,
    pub(crate) timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) schema: String,
    pub(crate) unlogged: bool,
    pub(crate) cleanup_interval: Duration,
    pub(crate) cleanup_pages: u32,
}

/// The options sluice reads itself.
const OURS: &[&str] = &[
    "pool_size",
    "batch_senders",
    "timeout_ms",
    "connect_timeout_ms",
    "schema",
    "unlogged",
    "cleanup_interval_ms",
    "cleanup_pages",
    "sslmode",
    "sslrootcert",
];

impl Settings {
    /// Reads a store URL. A URL that cannot be used is an error saying why (with any
    /// password hidden).
    pub fn parse(url: &str) -> Result<Settings, PostgresError> {
        let bad = |why: String| PostgresError::Url(format!("`{}`: {why}", redact(url)));
        let Some((scheme, _)) = url.split_once("://") else {
            return Err(bad(
                "not a URL (expected postgres://user:pass@host:port/db)".into(),
            ));
        };
        if scheme != "postgres" && scheme != "postgresql" {
            return Err(bad(format!(
                "scheme `{scheme}` is not postgres:// or postgresql://"
            )));
        }
        let (base, params) = take_params(url, OURS);
        let mut settings = Settings {
            client: tokio_postgres::Config::new(),
            ssl_mode: SslMode::Prefer,
            root_cert: None,
            pool_size: DEFAULT_POOL_SIZE,
            batch_senders: DEFAULT_BATCH_SENDERS,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            schema: DEFAULT_SCHEMA.to_owned(),
            unlogged: false,
            cleanup_interval: DEFAULT_CLEANUP_INTERVAL,
            cleanup_pages: DEFAULT_CLEANUP_PAGES,
        };
        let positive = |name: &str, value: &str| {
            value
                .parse::<u64>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| bad(format!("{name} `{value}` is not a positive number")))
        };
        let millis = |name: &str, value: &str| positive(name, value).map(Duration::from_millis);
        for (name, value) in params {
            match name {
                "pool_size" => {
                    let n = positive(name, value)?;
                    if n > 10_000 {
                        return Err(bad(format!("pool_size `{value}` is above 10000")));
                    }
                    settings.pool_size = n as usize;
                }
                "batch_senders" => {
                    let n = positive(name, value)?;
                    if n > 10_000 {
                        return Err(bad(format!("batch_senders `{value}` is above 10000")));
                    }
                    settings.batch_senders = n as usize;
                }
                "timeout_ms" => settings.timeout = millis(name, value)?,
                "connect_timeout_ms" => settings.connect_timeout = millis(name, value)?,
                "cleanup_interval_ms" => settings.cleanup_interval = millis(name, value)?,
                "cleanup_pages" => {
                    settings.cleanup_pages = u32::try_from(positive(name, value)?)
                        .map_err(|_| bad(format!("cleanup_pages `{value}` is too large")))?;
                }
                "schema" => settings.schema = schema_name(value).map_err(bad)?,
                "unlogged" => {
                    settings.unlogged = match value {
                        "true" | "1" | "yes" | "" => true,
                        "false" | "0" | "no" => false,
                        other => {
                            return Err(bad(format!("unlogged `{other}` is not true or false")));
                        }
                    }
                }
                "sslmode" => {
                    settings.ssl_mode = match value {
                        "disable" => SslMode::Disable,
                        "prefer" | "allow" => SslMode::Prefer,
                        "require" | "verify-ca" | "verify-full" => SslMode::Require,
                        other => {
                            return Err(bad(format!(
                                "sslmode `{other}` (expected disable, prefer, require, verify-ca or verify-full)"
                            )));
                        }
                    }
                }
                _ => settings.root_cert = Some(PathBuf::from(value)),
            }
        }
        if settings.root_cert.is_some() && settings.ssl_mode == SslMode::Disable {
            return Err(bad("sslrootcert with sslmode=disable".into()));
        }
        let mut client =
            tokio_postgres::Config::from_str(&base).map_err(|e| bad(format!("{e}")))?;
        if client.get_hosts().is_empty() {
            return Err(bad("no host".into()));
        }
        client.connect_timeout(settings.connect_timeout);
        if client.get_application_name().is_none() {
            client.application_name("sluice");
        }
        settings.client = client;
        Ok(settings)
    }
}

/// A schema name: a plain identifier, lower case (so it needs no quoting anywhere).
fn schema_name(value: &str) -> Result<String, String> {
    let ok = !value.is_empty()
        && value.len() <= 63
        && value.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "schema `{value}` is not a plain lower-case identifier (a-z, 0-9, _; at most 63)"
        ))
    }
}

/// The URL with any password hidden (in the user info and in a `password=` option), for
/// messages and logs.
pub fn redact(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let base = sluice_limiter::store::url::redact_user_info(base);
    match query {
        None => base,
        Some(query) => {
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, _)) if name.eq_ignore_ascii_case("password") => {
                        format!("{name}=***")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{base}?{}", pairs.join("&"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(url: &str) -> String {
        Settings::parse(url).unwrap_err().to_string()
    }

    #[test]
    fn reads_options() {
        let s = Settings::parse(
            "postgresql://u:pw@db:5433/app?pool_size=4&timeout_ms=100&connect_timeout_ms=900\
             &schema=rl&unlogged=true&sslmode=require&application_name=x&cleanup_interval_ms=50\
             &batch_senders=2",
        )
        .unwrap();
        assert_eq!(s.pool_size, 4);
        assert_eq!(s.batch_senders, 2);
        assert_eq!(s.timeout, Duration::from_millis(100));
        assert_eq!(s.connect_timeout, Duration::from_millis(900));
        assert_eq!(s.cleanup_interval, Duration::from_millis(50));
        assert_eq!(s.schema, "rl");
        assert!(s.unlogged);
        assert_eq!(s.ssl_mode, SslMode::Require);
        assert_eq!(s.client.get_dbname(), Some("app"));
        assert_eq!(s.client.get_application_name(), Some("x"));
        let d = Settings::parse("postgres://db/app").unwrap();
        assert_eq!(
            (d.pool_size, d.batch_senders, d.schema.as_str(), d.unlogged),
            (16, 4, "sluice", false)
        );
    }

    #[test]
    fn refuses_bad_urls_clearly_and_hides_passwords() {
        for (url, says) in [
            ("postgres//u:hunter22@db/app", "not a URL"),
            ("mysql://u:hunter22@db/app", "scheme `mysql`"),
            ("postgres://u:hunter22@db/app?pool_size=0", "pool_size `0`"),
            (
                "postgres://u:hunter22@db/app?batch_senders=-1",
                "batch_senders `-1`",
            ),
            (
                "postgres://u:hunter22@db/app?timeout_ms=soon",
                "timeout_ms `soon`",
            ),
            (
                "postgres://u:hunter22@db/app?schema=Drop;Table",
                "schema `Drop;Table`",
            ),
            (
                "postgres://u:hunter22@db/app?unlogged=maybe",
                "unlogged `maybe`",
            ),
            (
                "postgres://u:hunter22@db/app?sslmode=sometimes",
                "sslmode `sometimes`",
            ),
            (
                "postgres://u:hunter22@db:notaport/app",
                "postgres://u:***@db:notaport/app",
            ),
            ("postgres://", "no host"),
            (
                "postgres://db/app?password=hunter22&sslmode=x",
                "password=***",
            ),
        ] {
            let message = error(url);
            assert!(message.contains(says), "{url}: {message}");
            assert!(!message.contains("hunter22"), "{url}: {message}");
        }
    }

    #[test]
    fn redacts_any_text() {
        assert_eq!(redact("postgres://u:pw@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("p@g://u:pw@h"), "***@h");
        assert_eq!(
            redact("postgres://h/db?password=pw&x=1"),
            "postgres://h/db?password=***&x=1"
        );
        assert_eq!(redact("postgres://h/db"), "postgres://h/db");
    }
}
