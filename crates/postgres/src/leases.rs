//! Concurrency leases and reservations on PostgreSQL: each step is one call of a function in
//! `sql/leases.sql` (`acquire`, `release`, `renew`, `reserve`, `settle`), under the rows'
//! locks taken in identifier order, with the database's clock read once they are held.
//!
//! A concurrency leaf's leases live in its row of the counters table, as
//! `{id, expires_at, ...}` pairs, with the latest expiry as the row's `expires_at`: the cleaner
//! deletes a row once every lease in it has expired, as it deletes expired counters.

use std::time::Duration;

use sluice_core::algorithm::concurrency::Released;
use sluice_core::{Algorithm, Decision};
use sluice_limiter::{Hit, Identifier, LeaseKeys, Settlement};

use crate::batch::rolled_back;
use crate::call::{TICK_NS, algorithm_code, arguments, arguments_coded, cost, decision, micro};
use crate::{PostgresError, PostgresStore};

/// A lease id as the functions keep it: the u64's bits in a bigint.
fn lease_bits(lease: u64) -> i64 {
    lease as i64
}

/// `params` and `shape` of `acquire`: those of `decide`, concurrency leaves numbered 5.
pub fn acquire_arguments(hit: &Hit<'_>) -> Result<(Vec<i64>, String), PostgresError> {
    arguments_coded(hit, |algorithm| match algorithm {
        Algorithm::Concurrency => Ok(5),
        other => algorithm_code(other),
    })
}

/// Each leaf's lease time in microseconds, as `renew` takes them.
pub fn lease_times(leases: &LeaseKeys<'_>) -> Result<Vec<i64>, PostgresError> {
    leases
        .quotas
        .iter()
        .map(|quota| Ok(cost(micro(quota)?.window_ticks())))
        .collect()
}

/// `params`, `taken_at`, `reserved` and `actual` of `settle`: the leaf count and six numbers
/// per leaf as `decide` takes them; times in microseconds.
pub fn settle_arguments(
    settlement: &Settlement<'_>,
) -> Result<(Vec<i64>, i64, i64, i64), PostgresError> {
    let mut params = Vec::with_capacity(1 + settlement.quotas.len() * 6);
    params.push(settlement.quotas.len() as i64);
    for quota in settlement.quotas {
        let q = micro(quota)?;
        let code = match q.algorithm() {
            Algorithm::Concurrency => 5,
            other => algorithm_code(other)?,
        };
        params.extend([
            code,
            crate::call::number(q.limit(), "limit")?,
            crate::call::number(q.window_ticks(), "window")?,
            crate::call::number(q.interval_ticks(), "interval")?,
            crate::call::number(q.burst(), "burst")?,
            i64::from(q.windows()),
        ]);
    }
    let taken_at = cost(settlement.taken_at / TICK_NS);
    Ok((
        params,
        taken_at,
        cost(settlement.reserved),
        cost(settlement.actual),
    ))
}

/// `release`'s answer.
pub fn released(code: i32) -> Result<Released, PostgresError> {
    match code {
        0 => Ok(Released::NotHeld),
        1 => Ok(Released::Released),
        2 => Ok(Released::Expired),
        other => Err(PostgresError::Reply(format!(
            "release answered {other}, expected 0, 1 or 2"
        ))),
    }
}

/// A reply of `decide` or `acquire` as the decision of `hit`: a denial by a concurrency
/// leaf is [`Denial::Occupied`](sluice_core::Denial::Occupied), as in the memory store.
pub fn acquired(hit: &Hit<'_>, reply: &[i64]) -> Result<Decision, PostgresError> {
    let decision = decision(reply)?;
    let quota = hit.evaluation.quotas.get(decision.leaf).ok_or_else(|| {
        PostgresError::Reply(format!("leaf {} is not in the rule", decision.leaf))
    })?;
    Ok(if quota.algorithm() == Algorithm::Concurrency {
        decision.occupied()
    } else {
        decision
    })
}

fn ids(identifiers: &[Identifier]) -> Vec<&str> {
    identifiers.iter().map(Identifier::as_str).collect()
}

impl PostgresStore {
    /// Runs `sql` with `params` once on a pooled connection (again when PostgreSQL rolled
    /// the transaction back: it counted nothing), and hands its row to `read`.
    async fn call_once<T>(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        read: impl Fn(&tokio_postgres::Row) -> Result<T, PostgresError>,
    ) -> Result<T, PostgresError> {
        loop {
            let client = self.pool().get().await?;
            let statement = client.prepare_cached(sql).await?;
            match client.query_one(&statement, params).await {
                Ok(row) => return read(&row),
                Err(e) if rolled_back(&e) => {
                    tracing::debug!(error = %e, "postgres rolled the step back; trying again");
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub(crate) async fn acquire_once(
        &self,
        hit: &Hit<'_>,
        lease: u64,
    ) -> Result<Decision, PostgresError> {
        let (params, shape) = acquire_arguments(hit)?;
        let ids = ids(hit.identifiers);
        let penalty = hit.penalty_identifier.map(Identifier::as_str);
        let sql = format!(
            "SELECT {}.acquire($1::text[], $2::text, $3::bigint[], $4::text, $5::bigint)",
            self.schema()
        );
        let lease = lease_bits(lease);
        self.call_once(&sql, &[&ids, &penalty, &params, &shape, &lease], |row| {
            let reply: Vec<i64> = row
                .try_get(0)
                .map_err(|e| PostgresError::Reply(e.to_string()))?;
            acquired(hit, &reply)
        })
        .await
    }

    pub(crate) async fn release_once(
        &self,
        leases: &LeaseKeys<'_>,
        lease: u64,
    ) -> Result<Released, PostgresError> {
        let ids = ids(leases.identifiers);
        let sql = format!("SELECT {}.release($1::text[], $2::bigint)", self.schema());
        let lease = lease_bits(lease);
        self.call_once(&sql, &[&ids, &lease], |row| {
            released(
                row.try_get(0)
                    .map_err(|e| PostgresError::Reply(e.to_string()))?,
            )
        })
        .await
    }

    pub(crate) async fn renew_once(
        &self,
        leases: &LeaseKeys<'_>,
        lease: u64,
    ) -> Result<Option<Duration>, PostgresError> {
        let ids = ids(leases.identifiers);
        let times = lease_times(leases)?;
        let sql = format!(
            "SELECT {}.renew($1::text[], $2::bigint[], $3::bigint)",
            self.schema()
        );
        let lease = lease_bits(lease);
        self.call_once(&sql, &[&ids, &times, &lease], |row| {
            let left: Option<i64> = row
                .try_get(0)
                .map_err(|e| PostgresError::Reply(e.to_string()))?;
            left.map(|us| {
                u64::try_from(us)
                    .map(Duration::from_micros)
                    .map_err(|_| PostgresError::Reply(format!("renew answered {us} µs left")))
            })
            .transpose()
        })
        .await
    }

    /// The decision and the database's time of the step, in nanoseconds since the Unix
    /// epoch (as the memory store's clock counts), which `settle` takes back.
    pub(crate) async fn reserve_once(
        &self,
        hit: &Hit<'_>,
    ) -> Result<(Decision, u64), PostgresError> {
        let (params, shape) = arguments(hit)?;
        let ids = ids(hit.identifiers);
        let penalty = hit.penalty_identifier.map(Identifier::as_str);
        let sql = format!(
            "SELECT {}.reserve($1::text[], $2::text, $3::bigint[], $4::text)",
            self.schema()
        );
        self.call_once(&sql, &[&ids, &penalty, &params, &shape], |row| {
            let reply: Vec<i64> = row
                .try_get(0)
                .map_err(|e| PostgresError::Reply(e.to_string()))?;
            let [decided @ .., now] = &reply[..] else {
                return Err(PostgresError::Reply("reserve answered nothing".into()));
            };
            let now = u64::try_from(*now)
                .map_err(|_| PostgresError::Reply(format!("reserve answered time {now}")))?;
            Ok((decision(decided)?, now.saturating_mul(TICK_NS)))
        })
        .await
    }

    pub(crate) async fn settle_once(
        &self,
        settlement: &Settlement<'_>,
    ) -> Result<(), PostgresError> {
        let (params, taken_at, reserved, actual) = settle_arguments(settlement)?;
        if settlement.identifiers.len() != settlement.quotas.len() {
            return Err(PostgresError::Unsupported(format!(
                "a settlement of {} identifiers and {} quotas",
                settlement.identifiers.len(),
                settlement.quotas.len()
            )));
        }
        let ids = ids(settlement.identifiers);
        let sql = format!(
            "SELECT {}.settle($1::text[], $2::bigint[], $3::bigint, $4::bigint, $5::bigint)",
            self.schema()
        );
        self.call_once(
            &sql,
            &[&ids, &params, &taken_at, &reserved, &actual],
            |_| Ok(()),
        )
        .await
    }
}
