//! Reading the trail back: who was refused most over a recent span, from the files (the
//! current one and every rotated one) or the table. `sluice audit` prints these.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::AuditEntry;
use super::postgres::{TABLE, connect};
use crate::config::audit::{check_postgres_url, check_schema, redact_url};

/// What to count.
#[derive(Debug, Clone)]
pub struct Query {
    /// Denials at or after this time.
    pub since: SystemTime,
    /// Only this policy's, if given.
    pub policy: Option<String>,
    /// How many offenders to report, most first.
    pub top: usize,
}

/// One client (a policy's selector values) and how often it was refused. As JSON:
/// `{"policy": "login", "selectors": {"ip": "203.0.113.9"}, "count": 42, "last":
/// "2026-11-25T18:30:00.123Z"}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Offender {
    pub policy: String,
    pub selectors: BTreeMap<String, String>,
    pub count: u64,
    #[serde(serialize_with = "rfc3339")]
    pub last: SystemTime,
}

fn rfc3339<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_rfc3339_millis(*t))
}

/// The offenders and what was read to find them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub offenders: Vec<Offender>,
    /// Denials counted (every offender's, not only the top's).
    pub denials: u64,
    /// Lines that were not records (a line cut by a crash, say), skipped.
    pub skipped: u64,
}

/// Why the trail could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    #[error("no audit file at {0} (nor rotated ones beside it)")]
    NoFile(PathBuf),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Postgres(String),
}

/// `path` and its rotated files (`path.1`, `path.2`, ...) that exist, newest first.
pub fn files(path: &Path) -> Result<Vec<PathBuf>, ReadError> {
    let io = |source| ReadError::Io {
        path: path.to_owned(),
        source,
    };
    if path.is_dir() {
        return Err(io(std::io::Error::other(
            "is a directory, not an audit file",
        )));
    }
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| ReadError::NoFile(path.to_owned()))?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut rotated: Vec<(u32, PathBuf)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let file = entry.file_name();
            let n = file
                .to_str()
                .and_then(|f| f.strip_prefix(name)?.strip_prefix('.')?.parse::<u32>().ok());
            if let Some(n) = n {
                rotated.push((n, entry.path()));
            }
        }
    }
    rotated.sort();
    let mut all: Vec<PathBuf> = path.exists().then(|| path.to_owned()).into_iter().collect();
    all.extend(rotated.into_iter().map(|(_, p)| p));
    if all.is_empty() {
        return Err(ReadError::NoFile(path.to_owned()));
    }
    Ok(all)
}

/// Counts the denials in the file at `path` and its rotated files.
pub fn from_files(path: &Path, query: &Query) -> Result<Report, ReadError> {
    let mut counts: HashMap<(String, BTreeMap<String, String>), (u64, SystemTime)> = HashMap::new();
    let (mut denials, mut skipped) = (0, 0);
    for file in files(path)? {
        let io = |source| ReadError::Io {
            path: file.clone(),
            source,
        };
        let reader = match std::fs::File::open(&file) {
            Ok(opened) => BufReader::new(opened),
            // Rotated away between the listing and now: its lines are in the next file.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(e)),
        };
        for line in reader.split(b'\n') {
            let line = line.map_err(io)?;
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let Ok(entry) = serde_json::from_slice::<AuditEntry>(&line) else {
                skipped += 1;
                continue;
            };
            if entry.time < query.since || query.policy.as_ref().is_some_and(|p| *p != entry.policy)
            {
                continue;
            }
            denials += 1;
            let slot = counts
                .entry((entry.policy, entry.selectors))
                .or_insert((0, entry.time));
            slot.0 += 1;
            slot.1 = slot.1.max(entry.time);
        }
    }
    let mut offenders: Vec<Offender> = counts
        .into_iter()
        .map(|((policy, selectors), (count, last))| Offender {
            policy,
            selectors,
            count,
            last,
        })
        .collect();
    offenders.sort_by(|a, b| {
        (b.count, b.last, &a.policy, &a.selectors).cmp(&(a.count, a.last, &b.policy, &b.selectors))
    });
    offenders.truncate(query.top);
    Ok(Report {
        offenders,
        denials,
        skipped,
    })
}

/// Counts the denials in `<schema>.audit_denials` at `url` (grouped in the database).
pub async fn from_postgres(url: &str, schema: &str, query: &Query) -> Result<Report, ReadError> {
    let settings = check_postgres_url(url).map_err(ReadError::Postgres)?;
    check_schema(schema).map_err(ReadError::Postgres)?;
    let client = connect(&settings).await.map_err(ReadError::Postgres)?;
    let shown = redact_url(url);
    let failed = |e: String| ReadError::Postgres(format!("{shown}: {e}"));
    let since = query
        .since
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let sql = format!(
        "WITH d AS (
             SELECT policy, selectors, at FROM \"{schema}\".{TABLE}
             WHERE at >= to_timestamp($1) AND ($2::text IS NULL OR policy = $2)
         )
         SELECT policy, selectors::text, count(*), extract(epoch FROM max(at))::float8,
                (SELECT count(*) FROM d)
         FROM d GROUP BY policy, selectors ORDER BY 3 DESC, 4 DESC, 1 LIMIT $3"
    );
    let top = i64::try_from(query.top).unwrap_or(i64::MAX);
    let rows = client
        .query(&sql, &[&since, &query.policy, &top])
        .await
        .map_err(|e| match e.as_db_error() {
            Some(db) if db.code() == &tokio_postgres::error::SqlState::UNDEFINED_TABLE => failed(
                format!("no table {schema}.{TABLE}: no audit has been written there"),
            ),
            _ => failed(e.to_string()),
        })?;
    let mut denials = 0;
    let mut offenders = Vec::with_capacity(rows.len());
    for row in rows {
        let selectors: String = row.get(1);
        let count: i64 = row.get(2);
        let last: f64 = row.get(3);
        denials = row.get::<_, i64>(4) as u64;
        offenders.push(Offender {
            policy: row.get(0),
            selectors: serde_json::from_str(&selectors).unwrap_or_default(),
            count: count as u64,
            last: SystemTime::UNIX_EPOCH + Duration::from_secs_f64(last.max(0.0)),
        });
    }
    Ok(Report {
        offenders,
        denials,
        skipped: 0,
    })
}

/// The report as a table for people: count, policy, selectors, last refusal.
pub fn render_table(report: &Report) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let label = |o: &Offender| {
        o.selectors
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let policy_width = report
        .offenders
        .iter()
        .map(|o| o.policy.len())
        .chain([6])
        .max()
        .unwrap_or(6);
    let selectors_width = report
        .offenders
        .iter()
        .map(|o| label(o).len())
        .chain([9])
        .max()
        .unwrap_or(9);
    let _ = writeln!(
        out,
        "{:>8}  {:<policy_width$}  {:<selectors_width$}  LAST",
        "COUNT", "POLICY", "SELECTORS"
    );
    for o in &report.offenders {
        let _ = writeln!(
            out,
            "{:>8}  {:<policy_width$}  {:<selectors_width$}  {}",
            o.count,
            o.policy,
            label(o),
            humantime::format_rfc3339_millis(o.last)
        );
    }
    let _ = writeln!(
        out,
        "{} denials, {} shown{}",
        report.denials,
        report.offenders.len(),
        if report.skipped > 0 {
            format!(", {} lines skipped (not records)", report.skipped)
        } else {
            String::new()
        }
    );
    out
}
