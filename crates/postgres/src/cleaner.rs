//! The cleaner: PostgreSQL has no expiry, so a background task deletes rows whose state has
//! expired. It sweeps the table's pages in order (a TID range scan, no index of expiries to
//! maintain on every decision), a bounded number of pages per run and a few per statement,
//! each statement its own short transaction that skips rows a decision holds, so it never
//! waits on (or blocks) a decision. Every store runs one; several servers sweeping one table
//! only share the work.

use std::sync::{Arc, Weak};
use std::time::Duration;

use deadpool_postgres::Pool;

/// Pages per DELETE statement: a short transaction.
const PAGES_PER_STATEMENT: u32 = 128;

/// What the cleaner runs, every `interval`, on `pages` pages.
pub(crate) struct Cleaner {
    pub pool: Weak<Pool>,
    pub schema: String,
    pub interval: Duration,
    pub pages: u32,
}

impl Cleaner {
    /// Runs until the store is dropped.
    pub(crate) fn spawn(self) {
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(self.interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // Start at a page of our own: several servers then sweep different parts.
            let mut cursor = u64::from(std::process::id()) * 7919;
            loop {
                ticks.tick().await;
                let Some(pool) = self.pool.upgrade() else {
                    return;
                };
                match sweep(&pool, &self.schema, &mut cursor, self.pages).await {
                    Ok(deleted) if deleted > 0 => {
                        tracing::debug!(deleted, "deleted expired postgres rows");
                    }
                    Ok(_) => {}
                    // The decisions report outages; the cleaner tries again next time.
                    Err(e) => tracing::debug!(error = %e, "postgres cleaner run failed"),
                }
            }
        });
    }
}

/// Sweeps `pages` pages from `cursor` (wrapping at the table's end); returns the rows
/// deleted.
pub(crate) async fn sweep(
    pool: &Arc<Pool>,
    schema: &str,
    cursor: &mut u64,
    pages: u32,
) -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
    let client = pool.get().await?;
    let size = client
        .query_one(
            &format!(
                "SELECT pg_relation_size('{schema}.counters') \
                 / current_setting('block_size')::bigint"
            ),
            &[],
        )
        .await?;
    let table_pages: i64 = size.get(0);
    if table_pages <= 0 {
        return Ok(0);
    }
    let table_pages = table_pages as u64;
    let delete = client
        .prepare_cached(&format!(
            "DELETE FROM {schema}.counters WHERE ctid = ANY(ARRAY(
                SELECT ctid FROM {schema}.counters
                WHERE ctid >= ('(' || $1::bigint || ',0)')::tid
                  AND ctid < ('(' || $2::bigint || ',0)')::tid
                  AND expires_at <= (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
                FOR UPDATE SKIP LOCKED))"
        ))
        .await?;
    let mut deleted = 0;
    let mut left = u64::from(pages).min(table_pages);
    while left > 0 {
        *cursor %= table_pages;
        let step = left
            .min(u64::from(PAGES_PER_STATEMENT))
            .min(table_pages - *cursor);
        let (from, to) = (*cursor as i64, (*cursor + step) as i64);
        deleted += client.execute(&delete, &[&from, &to]).await?;
        *cursor += step;
        left -= step;
    }
    Ok(deleted)
}
