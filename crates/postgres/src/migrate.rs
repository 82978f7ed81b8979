//! The schema, created or upgraded by sluice at start: versioned migrations and the
//! functions, in one transaction under an advisory lock, so servers starting at once take
//! turns and the second finds the work done.

use sha2::{Digest, Sha256};
use tokio_postgres::Client;

use crate::PostgresError;

/// The algorithms and the decision functions, with `__S__` standing for the schema.
const FUNCTIONS: &str = concat!(
    include_str!("sql/algorithms.sql"),
    include_str!("sql/decide.sql"),
    include_str!("sql/leases.sql")
);

/// Table migrations in order; version N is `MIGRATIONS[N - 1]`. Never edit one that has
/// shipped: add the next. `__S__` is the schema, `__UNLOGGED__` empty or `UNLOGGED`.
const MIGRATIONS: &[&str] = &[
    // 1: one row per identifier. fillfactor leaves room on each page so the update of a
    // decision stays a heap-only (HOT) update; no index but the key, for the same reason
    // (the cleaner sweeps pages instead of reading an index of expiries).
    "CREATE __UNLOGGED__ TABLE __S__.counters (
        id text PRIMARY KEY,
        v bigint[] NOT NULL,
        expires_at bigint NOT NULL
    ) WITH (fillfactor = 70)",
    // 2: concurrency leases (sql/leases.sql). A concurrency leaf's row holds its lease set
    // in `v` and its latest expiry in `expires_at`, so the cleaner needs nothing new; the
    // version marks that rows may hold lease sets, which a sluice older than this one does
    // not know (it refuses the schema rather than run beside this one's functions).
    "COMMENT ON TABLE __S__.counters IS
        'sluice: one row per identifier: a rate state, a penalty record, or a lease set \
         {id, expires_at, ...} (see the functions'' comments)'",
];

/// The SQL text of the functions for `schema`.
pub fn functions_sql(schema: &str) -> String {
    FUNCTIONS.replace("__S__", schema)
}

/// Creates or upgrades `schema` (a plain identifier, checked by the URL reader): missing
/// migrations, the functions when their text changed, and the table's persistence
/// (`unlogged`). Everything in one transaction, after `pg_advisory_xact_lock` on the schema's
/// name.
pub async fn migrate(
    client: &mut Client,
    schema: &str,
    unlogged: bool,
) -> Result<(), PostgresError> {
    let failed = |error| PostgresError::Migration {
        schema: schema.to_owned(),
        error,
    };
    let tx = client.transaction().await.map_err(failed)?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('sluice schema ' || $1, 0))",
        &[&schema],
    )
    .await
    .map_err(failed)?;
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {schema};
         CREATE TABLE IF NOT EXISTS {schema}.meta (name text PRIMARY KEY, value text NOT NULL);"
    ))
    .await
    .map_err(failed)?;
    let meta = |name: &'static str| {
        let sql = format!("SELECT value FROM {schema}.meta WHERE name = '{name}'");
        let tx = &tx;
        async move {
            let row = tx.query_opt(&sql, &[]).await?;
            Ok::<_, tokio_postgres::Error>(row.map(|r| r.get::<_, String>(0)))
        }
    };
    let version: usize = meta("schema_version")
        .await
        .map_err(failed)?
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if version > MIGRATIONS.len() {
        return Err(PostgresError::Unsupported(format!(
            "schema `{schema}` is at version {version}, newer than this sluice knows ({}); \
             upgrade sluice or use another schema",
            MIGRATIONS.len()
        )));
    }
    let persistence = if unlogged { "UNLOGGED" } else { "" };
    for (n, migration) in MIGRATIONS.iter().enumerate().skip(version) {
        tracing::info!(schema, version = n + 1, "migrating the postgres schema");
        let sql = migration
            .replace("__S__", schema)
            .replace("__UNLOGGED__", persistence);
        tx.batch_execute(&sql).await.map_err(failed)?;
    }
    let set = format!(
        "INSERT INTO {schema}.meta (name, value) VALUES ($1, $2)
         ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value"
    );
    tx.execute(&set, &[&"schema_version", &MIGRATIONS.len().to_string()])
        .await
        .map_err(failed)?;

    let functions = functions_sql(schema);
    let digest = format!("{:x}", Sha256::digest(functions.as_bytes()));
    if meta("functions_sha256").await.map_err(failed)?.as_deref() != Some(digest.as_str()) {
        tx.batch_execute(&functions).await.map_err(failed)?;
        tx.execute(&set, &[&"functions_sha256", &digest])
            .await
            .map_err(failed)?;
    }

    // The last server to start decides whether counters survive a crash.
    let row = tx
        .query_one(
            "SELECT c.relpersistence = 'u' FROM pg_class c JOIN pg_namespace n
             ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = 'counters'",
            &[&schema],
        )
        .await
        .map_err(failed)?;
    if row.get::<_, bool>(0) != unlogged {
        let to = if unlogged { "UNLOGGED" } else { "LOGGED" };
        tracing::info!(schema, to, "changing the counters table's persistence");
        tx.batch_execute(&format!("ALTER TABLE {schema}.counters SET {to}"))
            .await
            .map_err(failed)?;
    }
    tx.commit().await.map_err(failed)
}
