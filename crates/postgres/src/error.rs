//! Errors of the PostgreSQL store, and which of them a retry may cure.

use sluice_limiter::StoreError;

/// What went wrong talking to PostgreSQL.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PostgresError {
    #[error("bad store URL {0}")]
    Url(String),
    #[error("postgres: {}", describe(.0))]
    Postgres(#[from] tokio_postgres::Error),
    #[error("cannot connect to {url}: {}", describe(.error))]
    Connect {
        /// The URL, its password hidden.
        url: String,
        error: tokio_postgres::Error,
    },
    #[error("postgres connection pool: {0}")]
    Pool(String),
    #[error("postgres did not answer within {0:?}")]
    Timeout(std::time::Duration),
    #[error("unexpected reply from the decision function: {0}")]
    Reply(String),
    #[error("not supported on postgres: {0}")]
    Unsupported(String),
    #[error("cannot create or upgrade the schema `{schema}`: {}", describe(.error))]
    Migration {
        schema: String,
        error: tokio_postgres::Error,
    },
    #[error("TLS setup: {0}")]
    Tls(String),
    /// A call carrying several decisions failed: each of them gets this error.
    #[error("{message}")]
    Batch {
        /// The call's error, as text.
        message: String,
        /// Whether the call may succeed later.
        transient: bool,
    },
}

/// The error with the server's message (tokio-postgres shows only "db error" itself).
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} {}: {}", db.severity(), db.code().code(), db.message()),
        None => match std::error::Error::source(e) {
            Some(source) => format!("{e}: {source}"),
            None => e.to_string(),
        },
    }
}

/// SQLSTATE classes and codes after which the same call may succeed: connection exceptions
/// (08), operator intervention (57: shutdown, starting up), insufficient resources (53),
/// and a transaction rolled back by a deadlock or serialization failure (40).
fn transient_code(code: &str) -> bool {
    ["08", "57", "53", "40"]
        .iter()
        .any(|class| code.starts_with(class))
}

/// Whether `e` is a lost or refused connection, or a transient server condition.
pub(crate) fn is_transient_postgres(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        Some(code) => transient_code(code.code()),
        // No SQLSTATE: a broken, closed or refused connection is transient; a value that
        // does not convert is not.
        None => {
            let io = std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>());
            let text = e.to_string();
            io || e.is_closed()
                || [
                    "error connecting",
                    "error communicating",
                    "timeout",
                    "connection closed",
                ]
                .iter()
                .any(|prefix| text.starts_with(prefix))
        }
    }
}

impl PostgresError {
    /// Whether the same call may succeed later (the server is down, restarting, out of
    /// connections, or rolled the transaction back), as opposed to a mistake that will
    /// repeat.
    pub fn is_transient(&self) -> bool {
        match self {
            PostgresError::Timeout(_) | PostgresError::Pool(_) => true,
            PostgresError::Batch { transient, .. } => *transient,
            PostgresError::Postgres(e) | PostgresError::Connect { error: e, .. } => {
                is_transient_postgres(e)
            }
            _ => false,
        }
    }
}

impl From<PostgresError> for StoreError {
    fn from(error: PostgresError) -> StoreError {
        match error {
            PostgresError::Timeout(after) => StoreError::Timeout(after),
            e if e.is_transient() => StoreError::Unavailable(e.to_string()),
            e => StoreError::Protocol(e.to_string()),
        }
    }
}
