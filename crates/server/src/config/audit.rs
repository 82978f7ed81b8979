//! The `[audit]` table: where denials are written (see [`crate::audit`]).
//!
//! ```toml
//! [audit]
//! file = "/var/log/sluice/denials.jsonl"   # JSON lines; relative to the config file
//! max_bytes = 104857600                    # rotate past this size (100 MiB by default)
//! keep = 5                                 # rotated files kept: denials.jsonl.1 ... .5
//! postgres = "postgres://sluice:secret@db:5432/app"   # and/or a table in PostgreSQL
//! schema = "sluice"                        # the table is <schema>.audit_denials
//! server = "web-1"                         # names this server in records (the hostname)
//! queue = 10000                            # records waiting per sink; more are dropped
//! ```

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

/// Rotate the file past 100 MiB unless told otherwise.
pub const DEFAULT_MAX_BYTES: u64 = 100 * 1024 * 1024;
/// Rotated files kept unless told otherwise.
pub const DEFAULT_KEEP: u32 = 5;
/// Records waiting per sink unless told otherwise.
pub const DEFAULT_QUEUE: usize = 10_000;
/// The schema of the table unless told otherwise.
pub const DEFAULT_SCHEMA: &str = "sluice";
const MAX_KEEP: u32 = 1_000;
const MAX_QUEUE: usize = 1_000_000;
const MIN_MAX_BYTES: u64 = 4_096;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAudit {
    file: Option<Spanned<String>>,
    max_bytes: Option<Spanned<i64>>,
    keep: Option<Spanned<i64>>,
    postgres: Option<Spanned<String>>,
    schema: Option<Spanned<String>>,
    server: Option<Spanned<String>>,
    queue: Option<Spanned<i64>>,
}

/// Where and how denials are written: a file, a PostgreSQL table, or both.
#[derive(Clone, PartialEq, Eq)]
pub struct AuditConfig {
    pub file: Option<FileSink>,
    pub postgres: Option<PostgresSink>,
    /// Names this server in every record (the hostname by default).
    pub server: String,
    /// Records waiting per sink; a denial that finds its sink's queue full is dropped and
    /// counted (`sluice_audit_dropped_total`).
    pub queue: usize,
}

/// A JSON-lines file, rotated by size: `path` becomes `path.1`, `path.1` becomes
/// `path.2`, ... up to `path.<keep>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSink {
    pub path: PathBuf,
    pub max_bytes: u64,
    pub keep: u32,
}

/// A table `<schema>.audit_denials` in PostgreSQL, created when missing.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresSink {
    /// `postgres://` or `postgresql://` URL; it may hold a password, so it is shown
    /// redacted (see [`redact_url`]).
    pub url: String,
    pub schema: String,
}

impl fmt::Debug for PostgresSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresSink")
            .field("url", &redact_url(&self.url))
            .field("schema", &self.schema)
            .finish()
    }
}

impl fmt::Debug for AuditConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuditConfig")
            .field("file", &self.file)
            .field("postgres", &self.postgres)
            .field("server", &self.server)
            .field("queue", &self.queue)
            .finish()
    }
}

impl AuditConfig {
    /// A config writing to `file` only, with the defaults.
    pub fn file(path: impl Into<PathBuf>) -> AuditConfig {
        AuditConfig {
            file: Some(FileSink {
                path: path.into(),
                max_bytes: DEFAULT_MAX_BYTES,
                keep: DEFAULT_KEEP,
            }),
            postgres: None,
            server: default_server(),
            queue: DEFAULT_QUEUE,
        }
    }
}

/// This machine's hostname, or `sluice` when it has none that is text.
pub fn default_server() -> String {
    let name = gethostname::gethostname();
    match name.to_str() {
        Some(name) if !name.is_empty() => name.to_owned(),
        _ => "sluice".to_owned(),
    }
}

/// `url` with any password (in the user part or a `password=` option) hidden, fit for
/// messages and logs: the PostgreSQL store's rule, one home for both.
pub use sluice_postgres::redact_url;

/// Checks a PostgreSQL URL as the sink will use it (the PostgreSQL store's URL rules: TLS by
/// `sslmode` and `sslrootcert`, timeouts); the message never shows the password.
pub fn check_postgres_url(url: &str) -> Result<sluice_postgres::ClientUrl, String> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(format!(
            "`{}` is not a postgres:// or postgresql:// URL",
            redact_url(url)
        ));
    }
    sluice_postgres::ClientUrl::parse(url).map_err(|e| e.to_string())
}

/// Checks a schema name: a plain SQL identifier (letters, digits, `_`; at most 63 bytes).
pub fn check_schema(schema: &str) -> Result<(), String> {
    let ok = !schema.is_empty()
        && schema.len() <= 63
        && schema.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && schema
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{schema}` is not a schema name (letters, digits and `_`, not starting with a digit, at most 63)"
        ))
    }
}

/// Validates the raw table; `at(offset, field, message)` makes the error; `config` is the
/// config file's path (a relative `file` is relative to its directory); `table` is where
/// `[audit]` starts.
pub(super) fn validate<E>(
    raw: &RawAudit,
    table: usize,
    config: &Path,
    at: impl Fn(usize, String, String) -> E,
) -> Result<AuditConfig, E> {
    let field = |f: &str| format!("audit.{f}");
    let number = |value: &Spanned<i64>, name: &str, min: i64, max: i64| {
        let v = *value.get_ref();
        if (min..=max).contains(&v) {
            Ok(v)
        } else {
            Err(at(
                value.span().start,
                field(name),
                format!("{v} is out of range ({min} to {max})"),
            ))
        }
    };
    let text = |value: &Option<Spanned<String>>| {
        value
            .as_ref()
            .filter(|v| !v.get_ref().trim().is_empty())
            .map(|v| (v.span().start, v.get_ref().clone()))
    };
    let file_text = text(&raw.file);
    let postgres_text = text(&raw.postgres);
    if file_text.is_none() && postgres_text.is_none() {
        let offset = raw
            .file
            .as_ref()
            .or(raw.postgres.as_ref())
            .map_or(table, |v| v.span().start);
        return Err(at(
            offset,
            "audit".to_owned(),
            "give `file = \"PATH\"`, `postgres = \"URL\"` or both: where should denials go?"
                .to_owned(),
        ));
    }
    let file = match file_text {
        None => {
            for (value, name) in [(&raw.max_bytes, "max_bytes"), (&raw.keep, "keep")] {
                if let Some(value) = value {
                    let message = format!("{name} only applies with `file`");
                    return Err(at(value.span().start, field(name), message));
                }
            }
            None
        }
        Some((offset, path)) => {
            let path = config
                .parent()
                .unwrap_or(Path::new(""))
                .join(Path::new(&path));
            check_file(&path).map_err(|m| at(offset, field("file"), m))?;
            let max_bytes = match &raw.max_bytes {
                Some(v) => number(v, "max_bytes", MIN_MAX_BYTES as i64, i64::MAX)? as u64,
                None => DEFAULT_MAX_BYTES,
            };
            let keep = match &raw.keep {
                Some(v) => number(v, "keep", 0, MAX_KEEP.into())? as u32,
                None => DEFAULT_KEEP,
            };
            Some(FileSink {
                path,
                max_bytes,
                keep,
            })
        }
    };
    let postgres = match postgres_text {
        None => {
            if let Some(schema) = &raw.schema {
                let message = "schema only applies with `postgres`".to_owned();
                return Err(at(schema.span().start, field("schema"), message));
            }
            None
        }
        Some((offset, url)) => {
            check_postgres_url(&url).map_err(|m| at(offset, field("postgres"), m))?;
            let schema = match &raw.schema {
                Some(s) => {
                    check_schema(s.get_ref())
                        .map_err(|m| at(s.span().start, field("schema"), m))?;
                    s.get_ref().clone()
                }
                None => DEFAULT_SCHEMA.to_owned(),
            };
            Some(PostgresSink { url, schema })
        }
    };
    let server = match &raw.server {
        Some(s) => {
            let name = s.get_ref();
            if name.is_empty() || name.len() > 255 || name.chars().any(char::is_control) {
                let message = "the server name must be 1 to 255 characters, no control characters";
                return Err(at(s.span().start, field("server"), message.to_owned()));
            }
            name.clone()
        }
        None => default_server(),
    };
    let queue = match &raw.queue {
        Some(v) => number(v, "queue", 1, MAX_QUEUE as i64)? as usize,
        None => DEFAULT_QUEUE,
    };
    Ok(AuditConfig {
        file,
        postgres,
        server,
        queue,
    })
}

/// A file the sink can open: not a directory, in a directory that exists.
fn check_file(path: &Path) -> Result<(), String> {
    if path.is_dir() {
        return Err(format!("{} is a directory, not a file", path.display()));
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        return Err(format!(
            "{} cannot be created: directory {} does not exist",
            path.display(),
            parent.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigError, parse};

    const POLICY: &str = "[policies.api]\nrule = \"ip:5/m\"\n";

    fn audit(table: &str) -> Result<Option<AuditConfig>, ConfigError> {
        let dir = std::env::temp_dir();
        parse(
            &dir.join("sluice.toml"),
            &format!("{POLICY}[audit]\n{table}"),
        )
        .map(|c| c.audit)
    }

    #[test]
    fn reads_every_field_with_defaults() {
        let dir = std::env::temp_dir();
        let a = audit("file = \"denials.jsonl\"\n").unwrap().unwrap();
        let file = a.file.unwrap();
        assert_eq!(
            file.path,
            dir.join("denials.jsonl"),
            "relative to the config"
        );
        assert_eq!(
            (file.max_bytes, file.keep),
            (DEFAULT_MAX_BYTES, DEFAULT_KEEP)
        );
        assert_eq!((a.queue, a.server.is_empty()), (DEFAULT_QUEUE, false));
        assert!(a.postgres.is_none());

        let a = audit(
            "file = \"/tmp/a.jsonl\"\nmax_bytes = 10000\nkeep = 0\npostgres = \"postgres://u:pw@h:5/d\"\nschema = \"audit_1\"\nserver = \"web-1\"\nqueue = 50\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!(a.file.as_ref().unwrap().path, Path::new("/tmp/a.jsonl"));
        assert_eq!(a.file.as_ref().unwrap().keep, 0);
        assert_eq!(a.postgres.as_ref().unwrap().schema, "audit_1");
        assert_eq!((a.server.as_str(), a.queue), ("web-1", 50));
        assert!(!format!("{a:?}").contains("pw"), "{a:?}");
        assert_eq!(parse(&dir.join("x.toml"), POLICY).unwrap().audit, None);
    }

    #[test]
    fn errors_name_the_line_and_field() {
        let at = |table: &str, line: usize, field: &str, says: &str| {
            let e = audit(table).unwrap_err();
            assert_eq!((e.line, e.field.as_str()), (line, field), "{table}: {e}");
            assert!(e.to_string().contains(says), "{table}: {e}");
        };
        // Lines 1 and 2 are the policy, 3 is `[audit]`.
        at("fil = \"a\"\n", 4, "", "unknown field `fil`");
        at("", 3, "audit", "give `file = ");
        at(
            "file = \"\"\npostgres = \" \"\n",
            4,
            "audit",
            "where should denials go",
        );
        at(
            "file = \"/no/such/dir/a.jsonl\"\n",
            4,
            "audit.file",
            "does not exist",
        );
        at("file = \"/tmp\"\n", 4, "audit.file", "is a directory");
        at(
            "file = \"a\"\nmax_bytes = 10\n",
            5,
            "audit.max_bytes",
            "out of range",
        );
        at("file = \"a\"\nkeep = -1\n", 5, "audit.keep", "out of range");
        at(
            "postgres = \"postgres://h/d\"\nkeep = 2\n",
            5,
            "audit.keep",
            "only applies with `file`",
        );
        at(
            "file = \"a\"\nschema = \"s\"\n",
            5,
            "audit.schema",
            "only applies with `postgres`",
        );
        at(
            "postgres = \"postgres://h/d\"\nschema = \"a;b\"\n",
            5,
            "audit.schema",
            "not a schema name",
        );
        at(
            "postgres = \"redis://:pw@h\"\n",
            4,
            "audit.postgres",
            "not a postgres://",
        );
        at(
            "file = \"a\"\nqueue = 0\n",
            5,
            "audit.queue",
            "out of range",
        );
        at(
            "file = \"a\"\nserver = \"\"\n",
            5,
            "audit.server",
            "1 to 255",
        );
        let e = audit("postgres = \"postgres://u:hunter2@h:x/d\"\n").unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }

    #[test]
    fn passwords_never_show() {
        let url = "postgres://app:s3cr%40t@db:5432/x?sslmode=disable&password=two";
        let shown = redact_url(url);
        assert_eq!(
            shown,
            "postgres://app:***@db:5432/x?sslmode=disable&password=***"
        );
        check_postgres_url("postgres://app:hunter2@db/x?sslmode=require").expect("TLS");
        let e = check_postgres_url("postgres://app:hunter2@db/x?sslrootcert=/no/such/ca.pem")
            .unwrap_err();
        assert!(
            e.contains("/no/such/ca.pem") && !e.contains("hunter2"),
            "{e}"
        );
        let e = check_postgres_url("postgres://app:hunter2@db:notaport/x").unwrap_err();
        assert!(!e.contains("hunter2") && e.contains("***"), "{e}");
        let e = check_postgres_url("mysql://app:hunter2@db/x").unwrap_err();
        assert!(!e.contains("hunter2"), "{e}");
    }
}
