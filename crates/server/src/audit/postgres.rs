//! The PostgreSQL sink: a task that connects (and reconnects, backing off up to
//! [`MAX_BACKOFF`]), creates `<schema>.audit_denials` when missing, and inserts each batch
//! as one multi-row `INSERT ... SELECT FROM unnest(...)` (one statement, seven array
//! parameters, however many rows).

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use sluice_postgres::ClientUrl;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::Client;

use super::{BATCH, DenialRecord, SinkCounters};
use crate::config::audit::{PostgresSink, redact_url};

/// The longest wait between two connection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// A connection or an insert that takes longer has failed.
const TIMEOUT: Duration = Duration::from_secs(5);
/// The table's name in its schema.
pub const TABLE: &str = "audit_denials";

/// Where and how to connect.
pub(super) struct Target {
    settings: ClientUrl,
    /// The URL without its password, for messages.
    shown: String,
    schema: String,
    server: String,
}

impl Target {
    pub(super) fn new(settings: ClientUrl, sink: &PostgresSink, server: String) -> Target {
        Target {
            settings,
            shown: redact_url(&sink.url),
            schema: sink.schema.clone(),
            server,
        }
    }
}

/// The table's definition, created when missing (under a lock, so two servers starting at
/// once do not both create it).
pub(crate) fn create_sql(schema: &str) -> String {
    format!(
        "BEGIN;
SELECT pg_advisory_xact_lock(hashtext('sluice.audit'));
CREATE SCHEMA IF NOT EXISTS \"{schema}\";
CREATE TABLE IF NOT EXISTS \"{schema}\".{TABLE} (
    at timestamptz NOT NULL,
    server text NOT NULL,
    policy text NOT NULL,
    leaf text NOT NULL,
    selectors jsonb NOT NULL,
    reason text NOT NULL,
    retry_after double precision
);
CREATE INDEX IF NOT EXISTS {TABLE}_at ON \"{schema}\".{TABLE} (at);
COMMIT;"
    )
}

/// Connects to `settings` (TLS as its `sslmode` says), the connection driven by a task of
/// its own.
pub(crate) async fn connect(settings: &ClientUrl) -> Result<Client, String> {
    settings.connect().await.map_err(|e| e.to_string())
}

pub(super) fn spawn(
    runtime: &tokio::runtime::Handle,
    target: Target,
    mut receiver: mpsc::Receiver<Arc<DenialRecord>>,
    counters: Arc<SinkCounters>,
    done: oneshot::Sender<()>,
) {
    runtime.spawn(async move {
        let mut client: Option<Client> = None;
        let mut batch = Vec::with_capacity(BATCH);
        let mut backoff = Duration::from_millis(100);
        let mut failing = false;
        while receiver.recv_many(&mut batch, BATCH).await > 0 {
            let outcome = match client.as_ref().filter(|c| !c.is_closed()) {
                Some(c) => insert(c, &target, &batch).await,
                None => match open(&target).await {
                    Ok(c) => {
                        let outcome = insert(&c, &target, &batch).await;
                        client = Some(c);
                        outcome
                    }
                    Err(e) => Err(e),
                },
            };
            match outcome {
                Ok(()) => {
                    counters.add_written(batch.len());
                    backoff = Duration::from_millis(100);
                    if failing {
                        failing = false;
                        tracing::info!(url = %target.shown, "audit postgres: writing again");
                    }
                }
                Err(error) => {
                    counters.add_failed(batch.len());
                    client = None;
                    if !failing {
                        failing = true;
                        tracing::error!(url = %target.shown, %error, "audit postgres: cannot write; denials are dropped (sluice_audit_dropped_total) until it can");
                    }
                    // Not a test's stand-in for synchronisation: the pause between attempts
                    // on a database that is down, while the queue takes what it can.
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
            batch.clear();
        }
        let _ = done.send(());
    });
}

async fn open(target: &Target) -> Result<Client, String> {
    let client = connect(&target.settings).await?;
    tokio::time::timeout(TIMEOUT, client.batch_execute(&create_sql(&target.schema)))
        .await
        .map_err(|_| format!("creating the table took over {TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    Ok(client)
}

async fn insert(
    client: &Client,
    target: &Target,
    batch: &[Arc<DenialRecord>],
) -> Result<(), String> {
    let mut millis = Vec::with_capacity(batch.len());
    let mut policies = Vec::with_capacity(batch.len());
    let mut leaves = Vec::with_capacity(batch.len());
    let mut selectors = Vec::with_capacity(batch.len());
    let mut reasons = Vec::with_capacity(batch.len());
    let mut retries = Vec::with_capacity(batch.len());
    for record in batch {
        let since = record.at.duration_since(UNIX_EPOCH).unwrap_or_default();
        millis.push(since.as_millis() as i64);
        policies.push(record.policy.as_str());
        leaves.push(record.leaf.as_str());
        selectors.push(record.selectors_json());
        reasons.push(record.reason);
        retries.push(record.retry_after.map(|d| d.as_secs_f64()));
    }
    let sql = format!(
        "INSERT INTO \"{}\".{TABLE} (at, server, policy, leaf, selectors, reason, retry_after)
         SELECT to_timestamp(t / 1000.0), $2, p, l, s::jsonb, r, ra
         FROM unnest($1::int8[], $3::text[], $4::text[], $5::text[], $6::text[], $7::float8[])
              AS u(t, p, l, s, r, ra)",
        target.schema
    );
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] = [
        &millis,
        &target.server,
        &policies,
        &leaves,
        &selectors,
        &reasons,
        &retries,
    ];
    let run = client.execute(&sql, &params);
    tokio::time::timeout(TIMEOUT, run)
        .await
        .map_err(|_| format!("an insert took over {TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    Ok(())
}
