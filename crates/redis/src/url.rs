//! Store URLs: `redis://[user:password@]host:port[/db]`, `rediss://...` (TLS),
//! `redis+cluster://[user:password@]host:port,host:port,...` (`rediss+cluster://` for TLS),
//! and `redis+sentinel://[user:password@]host:port,host:port,.../master-name[/db]`
//! (`rediss+sentinel://` for TLS to the sentinels and the servers alike).

use sluice_limiter::store::url::take_params;

use crate::RedisError;

/// Where the store connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One server: the URL as redis-rs reads it.
    Standalone(String),
    /// Seed nodes of a cluster, each as a `redis://` or `rediss://` URL.
    Cluster(Vec<String>),
    /// Redis Sentinel: whichever server the sentinels name master of `master` now.
    Sentinel(SentinelTarget),
}

/// A `redis+sentinel://` URL, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelTarget {
    /// `(host, port)` of each sentinel.
    pub sentinels: Vec<(String, u16)>,
    /// The name the sentinels monitor the master by.
    pub master: String,
    /// For the master (the sentinels are asked without credentials).
    pub username: Option<String>,
    pub password: Option<String>,
    pub db: i64,
    pub tls: bool,
}

/// A parsed store URL: the target and, for TLS with a private CA, the CA's PEM file
/// (`?tls_ca=/path/ca.pem`; without it the public web roots are trusted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub target: Target,
    pub tls_ca: Option<std::path::PathBuf>,
}

/// Reads a store URL, taking off the parameters that are ours (`tls_ca`).
pub fn parse_url(url: &str) -> Result<Parsed, RedisError> {
    let (url, taken) = take_params(url, &["tls_ca"]);
    let mut tls_ca = None;
    for (_, path) in taken {
        if path.is_empty() {
            return Err(RedisError::Url(format!(
                "`{}`: tls_ca needs a path",
                redact(&url)
            )));
        }
        tls_ca = Some(std::path::PathBuf::from(path));
    }
    if tls_ca.is_some() && !url.starts_with("rediss") {
        return Err(RedisError::Url(format!(
            "`{}`: tls_ca needs rediss://",
            redact(&url)
        )));
    }
    Ok(Parsed {
        target: parse(&url)?,
        tls_ca,
    })
}

/// Reads a store URL.
pub fn parse(url: &str) -> Result<Target, RedisError> {
    let bad = |why: &str| RedisError::Url(format!("`{}`: {why}", redact(url)));
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("not a URL"))?;
    match scheme {
        "redis" | "rediss" => {
            if rest.is_empty() {
                return Err(bad("no host"));
            }
            Ok(Target::Standalone(url.to_owned()))
        }
        "redis+cluster" | "rediss+cluster" => {
            let node_scheme = scheme.trim_end_matches("+cluster");
            let (auth, hosts) = match rest.rsplit_once('@') {
                Some((auth, hosts)) => (format!("{auth}@"), hosts),
                None => (String::new(), rest),
            };
            let hosts = hosts.trim_end_matches('/');
            let nodes: Vec<String> = hosts
                .split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .map(|h| format!("{node_scheme}://{auth}{h}"))
                .collect();
            if nodes.is_empty() {
                return Err(bad("no cluster nodes"));
            }
            if hosts.split(',').any(|h| !h.contains(':')) {
                return Err(bad("every cluster node needs host:port"));
            }
            Ok(Target::Cluster(nodes))
        }
        "redis+sentinel" | "rediss+sentinel" => {
            let (auth, rest) = match rest.rsplit_once('@') {
                Some((auth, rest)) => (Some(auth), rest),
                None => (None, rest),
            };
            let (hosts, path) = rest
                .split_once('/')
                .ok_or_else(|| bad("no master name: add /NAME after the sentinels"))?;
            let (master, db) = match path.split_once('/') {
                Some((master, db)) => (master, db),
                None => (path, ""),
            };
            if master.is_empty() {
                return Err(bad("no master name: add /NAME after the sentinels"));
            }
            let db = match db {
                "" => 0,
                db => db
                    .parse()
                    .map_err(|_| bad(&format!("database `{db}` is not a number")))?,
            };
            let mut sentinels = Vec::new();
            for host in hosts.split(',').map(str::trim).filter(|h| !h.is_empty()) {
                let (name, port) = host
                    .rsplit_once(':')
                    .ok_or_else(|| bad("every sentinel needs host:port"))?;
                let port = port
                    .parse()
                    .map_err(|_| bad(&format!("`{port}` is not a port")))?;
                sentinels.push((name.to_owned(), port));
            }
            if sentinels.is_empty() {
                return Err(bad("no sentinels"));
            }
            let (username, password) = match auth.map(|a| a.split_once(':')) {
                None => (None, None),
                Some(None) => (Some(auth.unwrap_or_default()), None),
                Some(Some((user, password))) => (Some(user), Some(password)),
            };
            let nonempty = |s: Option<&str>| s.filter(|s| !s.is_empty()).map(str::to_owned);
            Ok(Target::Sentinel(SentinelTarget {
                sentinels,
                master: master.to_owned(),
                username: nonempty(username),
                password: nonempty(password),
                db,
                tls: scheme == "rediss+sentinel",
            }))
        }
        other => Err(bad(&format!("unknown scheme `{other}`"))),
    }
}

/// The URL with any password replaced, for messages and logs.
pub fn redact(url: &str) -> String {
    sluice_limiter::store::url::redact_user_info(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the `store_url` fuzz target: an `@` before `://` made this panic, so a typo
    /// in `--store` crashed `sluice serve` instead of saying what was wrong.
    #[test]
    fn redacts_any_text() {
        assert_eq!(redact("r@dis://a:1"), "***@dis://a:1");
        assert_eq!(redact("redis//u:pw@a:1"), "***@a:1");
        assert_eq!(redact("r@dis://u:pw@a:1"), "***@a:1");
        assert_eq!(redact("redis://u:p@ss@a:1"), "redis://u:***@a:1");
        assert_eq!(redact("no scheme@all"), "***@all");
        assert!(parse_url("r@dis://058-1,1-0;8757+1").is_err());
        // Found by the fuzz target too: taking `tls_ca` off took the `://` with it, and the
        // error showed the rest unredacted.
        let error = parse_url("redis+c:1?tls_ca=/:1x://u?x&d:hunter22@a:1,b:2").unwrap_err();
        assert!(!error.to_string().contains("hunter22"), "{error}");
        // And an `@` before a later `://`.
        let url = "redis+c:1?tls_ca=/:1x://u?x&d:hunter22@a:1x://u?t&d:1,b:2";
        let error = parse_url(url).unwrap_err();
        assert!(!error.to_string().contains("hunter22"), "{error}");
        assert_eq!(redact("a:hunter22@b://c@d"), "***@d");
    }

    #[test]
    fn reads_sentinel_urls() {
        let Target::Sentinel(t) =
            parse("redis+sentinel://u:pw@10.0.0.1:26379, 10.0.0.2:26380/mymaster/2").unwrap()
        else {
            panic!("not a sentinel target");
        };
        assert_eq!(
            t.sentinels,
            [("10.0.0.1".into(), 26379), ("10.0.0.2".into(), 26380)]
        );
        assert_eq!(t.master, "mymaster");
        assert_eq!(
            (t.username.as_deref(), t.password.as_deref()),
            (Some("u"), Some("pw"))
        );
        assert_eq!((t.db, t.tls), (2, false));
        let Target::Sentinel(t) = parse("rediss+sentinel://:pw@s:1/m").unwrap() else {
            panic!("not a sentinel target");
        };
        assert_eq!(
            (t.username, t.password.as_deref(), t.db, t.tls),
            (None, Some("pw"), 0, true)
        );
        for bad in [
            "redis+sentinel://s:1",
            "redis+sentinel://s:1/",
            "redis+sentinel:///m",
            "redis+sentinel://s/m",
            "redis+sentinel://s:x/m",
            "redis+sentinel://s:1/m/x",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reads_urls() {
        assert_eq!(
            parse("redis://127.0.0.1:6380/2").unwrap(),
            Target::Standalone("redis://127.0.0.1:6380/2".into())
        );
        assert_eq!(
            parse("redis+cluster://u:p@a:1, b:2").unwrap(),
            Target::Cluster(vec!["redis://u:p@a:1".into(), "redis://u:p@b:2".into()])
        );
        assert_eq!(
            parse("rediss+cluster://a:1").unwrap(),
            Target::Cluster(vec!["rediss://a:1".into()])
        );
        assert!(parse("redis+cluster://").is_err());
        assert!(parse("redis+cluster://a").is_err());
        assert!(parse("http://a:1").is_err());
        assert!(parse("redis://").is_err());
        let parsed = parse_url("rediss://h:1/0?tls_ca=/tmp/ca.pem&protocol=resp3").unwrap();
        assert_eq!(
            parsed.tls_ca.as_deref(),
            Some(std::path::Path::new("/tmp/ca.pem"))
        );
        assert_eq!(
            parsed.target,
            Target::Standalone("rediss://h:1/0?protocol=resp3".into())
        );
        assert!(parse_url("redis://h:1?tls_ca=/x").is_err());
        let error = parse("ftp://user:secret@host").unwrap_err().to_string();
        assert!(!error.contains("secret"), "{error}");
    }
}
