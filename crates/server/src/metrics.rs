//! Prometheus metrics, written by hand in the text format (a dozen fixed series need no
//! registry crate): decisions by policy and result, shadow-mode would-be denials, decision
//! latency, store errors, near-cache hits, reloads, connections, the audit trail's records
//! written and dropped, concurrency leases and reservations through the service, and what
//! the memory store reports (identifiers held, evictions).
//!
//! Label values are never chosen by clients: a `policy` label is a configured policy's name
//! or the kind of a policy made on the fly (`cl.throttle`, `envoy.override`); checks of a
//! name no policy has are counted in one series without the name. The one exception, the
//! heavy hitters' `sluice_top_refused{selectors}` (see [`crate::top`]), is escaped, cut and
//! at most a few series per policy.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::RwLock;
use sluice_limiter::{Checked, Error, LimiterStats, MemoryStats};

use crate::listener::ConnectionCounts;

mod held;

/// Upper bounds (seconds) of the latency histogram's buckets.
const BUCKETS: [f64; 12] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
];

#[derive(Default)]
struct PolicyCounts {
    allowed: AtomicU64,
    denied: AtomicU64,
    shadow_denied: AtomicU64,
    errors: AtomicU64,
}

/// One policy's decisions so far, as `sluice_decisions_total` shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub allowed: u64,
    pub denied: u64,
    pub shadow_denied: u64,
    pub errors: u64,
}

/// The service's counters. Cheap on the hot path: one read lock and atomic adds.
#[derive(Default)]
pub struct Metrics {
    policies: RwLock<HashMap<String, PolicyCounts>>,
    unknown_policy: AtomicU64,
    buckets: [AtomicU64; BUCKETS.len()],
    latency_count: AtomicU64,
    latency_nanos: AtomicU64,
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
    pub(crate) http: std::sync::Arc<ConnectionCounts>,
    pub(crate) grpc: std::sync::Arc<ConnectionCounts>,
    pub(crate) resp: std::sync::Arc<ConnectionCounts>,
    /// The audit sinks' counters, kept across reloads that replace the sinks.
    pub(crate) audit: crate::audit::AuditCounters,
    /// Leases and reservations taken, given back and settled through this process.
    pub(crate) leases: LeaseCounts,
}

/// What happened to leases and reservations through this process (a lease taken here may be
/// released through another server on the same store: each counts what it saw).
#[derive(Default)]
pub(crate) struct LeaseCounts {
    acquired: AtomicU64,
    denied: AtomicU64,
    released: AtomicU64,
    /// A release or renew that found the lease expired (or gone): its holder kept it past
    /// its lease time, a bug in some client worth seeing.
    expired: AtomicU64,
    not_held: AtomicU64,
    renewed: AtomicU64,
    reserved: AtomicU64,
    reserve_denied: AtomicU64,
    settled: AtomicU64,
    /// The leases granted here and not seen ending: `sluice_leases_held`.
    pub(crate) held: held::HeldLeases,
}

/// One event of [`LeaseCounts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseEvent {
    Acquired,
    Denied,
    Released(sluice_limiter::Released),
    Renewed,
    /// A renew that found no lease left to extend.
    RenewExpired,
    Reserved,
    ReserveDenied,
    Settled,
}

impl LeaseCounts {
    pub(crate) fn count(&self, event: LeaseEvent) {
        use sluice_limiter::Released;
        let counter = match event {
            LeaseEvent::Acquired => &self.acquired,
            LeaseEvent::Denied => &self.denied,
            LeaseEvent::Released(Released::Released) => &self.released,
            LeaseEvent::Released(Released::Expired) | LeaseEvent::RenewExpired => &self.expired,
            LeaseEvent::Released(_) => &self.not_held,
            LeaseEvent::Renewed => &self.renewed,
            LeaseEvent::Reserved => &self.reserved,
            LeaseEvent::ReserveDenied => &self.reserve_denied,
            LeaseEvent::Settled => &self.settled,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, now: u64) {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        out.push_str("# HELP sluice_leases_total Concurrency leases by what happened: acquired, denied, released, expired (released or renewed after its lease time), not_held, renewed.\n# TYPE sluice_leases_total counter\n");
        for (result, counter) in [
            ("acquired", &self.acquired),
            ("denied", &self.denied),
            ("released", &self.released),
            ("expired", &self.expired),
            ("not_held", &self.not_held),
            ("renewed", &self.renewed),
        ] {
            let _ = writeln!(
                out,
                "sluice_leases_total{{result=\"{result}\"}} {}",
                load(counter)
            );
        }
        out.push_str("# HELP sluice_leases_held Leases granted through this process that it has not seen end: released or found expired through it, or past their lease time. A lease released through another server counts here until its lease time passes.\n# TYPE sluice_leases_held gauge\n");
        for (policy, held) in self.held.by_policy(now) {
            let _ = writeln!(
                out,
                "sluice_leases_held{{policy=\"{}\"}} {held}",
                escape(&policy)
            );
        }
        out.push_str("# HELP sluice_reservations_total Reservations by what happened: reserved, denied, settled.\n# TYPE sluice_reservations_total counter\n");
        for (result, counter) in [
            ("reserved", &self.reserved),
            ("denied", &self.reserve_denied),
            ("settled", &self.settled),
        ] {
            let _ = writeln!(
                out,
                "sluice_reservations_total{{result=\"{result}\"}} {}",
                load(counter)
            );
        }
    }
}

impl Metrics {
    /// Keeps series for exactly these policy names (and the on-the-fly kinds): a policy's
    /// counts survive a reload that keeps it; one the reload removed stops being shown.
    pub(crate) fn track(&self, names: Vec<String>) {
        let mut map = self.policies.write();
        let mut next = HashMap::with_capacity(names.len() + 2);
        let kinds = crate::service::Dynamic::ALL.map(|kind| kind.label());
        for name in names.into_iter().chain(kinds.map(str::to_owned)) {
            let counts = map.remove(&name).unwrap_or_default();
            next.insert(name, counts);
        }
        *map = next;
    }

    /// Each tracked policy's decisions so far, by name.
    pub(crate) fn policy_counts(&self) -> HashMap<String, Counts> {
        self.policies
            .read()
            .iter()
            .map(|(name, c)| {
                let counts = Counts {
                    allowed: c.allowed.load(Ordering::Relaxed),
                    denied: c.denied.load(Ordering::Relaxed),
                    shadow_denied: c.shadow_denied.load(Ordering::Relaxed),
                    errors: c.errors.load(Ordering::Relaxed),
                };
                (name.clone(), counts)
            })
            .collect()
    }

    /// Counts a check that named no policy.
    pub(crate) fn unknown_policy(&self) {
        self.unknown_policy.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn reloaded(&self, ok: bool) {
        let counter = if ok {
            &self.reloads_ok
        } else {
            &self.reloads_failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one decision (or failure to decide) of `policy` (a configured policy's name or
    /// an on-the-fly kind) that took `elapsed`.
    pub(crate) fn observe(&self, policy: &str, result: &Result<Checked, Error>, elapsed: Duration) {
        self.observe_outcome(policy, result.as_ref(), elapsed);
    }

    /// [`Metrics::observe`] for a decision held elsewhere (an acquire's or a reserve's).
    pub(crate) fn observe_outcome(
        &self,
        policy: &str,
        result: Result<&Checked, &Error>,
        elapsed: Duration,
    ) {
        let bump = |counts: &PolicyCounts| {
            let counter = match result {
                Ok(c) if c.shadow_denied => &counts.shadow_denied,
                Ok(c) if c.decision.allowed() => &counts.allowed,
                Ok(_) => &counts.denied,
                Err(_) => &counts.errors,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        };
        // A policy a reload removed while this check was deciding has no series any more.
        if let Some(counts) = self.policies.read().get(policy) {
            bump(counts);
        }
        let secs = elapsed.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        self.latency_nanos
            .fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
    }

    /// The text exposition, with the limiters' counts and the memory store's, if that is
    /// the store.
    /// The text of `/metrics`; `now` is the limiter's clock (when leases counted as held
    /// stop being held).
    pub fn render(&self, stats: LimiterStats, memory: Option<MemoryStats>, now: u64) -> String {
        let mut out = String::with_capacity(4096);
        out.push_str("# HELP sluice_decisions_total Decisions by policy and result.\n");
        out.push_str("# TYPE sluice_decisions_total counter\n");
        let map = self.policies.read();
        let mut names: Vec<&String> = map.keys().collect();
        names.sort();
        for name in &names {
            let c = &map[*name];
            let label = escape(name);
            for (result, counter) in [
                ("allowed", &c.allowed),
                ("denied", &c.denied),
                ("shadow_denied", &c.shadow_denied),
                ("error", &c.errors),
            ] {
                let _ = writeln!(
                    out,
                    "sluice_decisions_total{{policy=\"{label}\",result=\"{result}\"}} {}",
                    counter.load(Ordering::Relaxed)
                );
            }
        }
        out.push_str(
            "# HELP sluice_shadow_denied_total Hits a shadow-mode policy would have denied.\n",
        );
        out.push_str("# TYPE sluice_shadow_denied_total counter\n");
        for name in &names {
            let _ = writeln!(
                out,
                "sluice_shadow_denied_total{{policy=\"{}\"}} {}",
                escape(name),
                map[*name].shadow_denied.load(Ordering::Relaxed)
            );
        }
        drop(map);
        out.push_str("# HELP sluice_decision_seconds Time to decide, store round trip included.\n");
        out.push_str("# TYPE sluice_decision_seconds histogram\n");
        let mut cumulative = 0;
        for (bound, bucket) in BUCKETS.iter().zip(&self.buckets) {
            cumulative += bucket.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "sluice_decision_seconds_bucket{{le=\"{bound}\"}} {cumulative}"
            );
        }
        let count = self.latency_count.load(Ordering::Relaxed);
        let _ = writeln!(out, "sluice_decision_seconds_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "sluice_decision_seconds_sum {}",
            self.latency_nanos.load(Ordering::Relaxed) as f64 / 1e9
        );
        let _ = writeln!(out, "sluice_decision_seconds_count {count}");
        for (name, help, value) in [
            (
                "sluice_store_errors_total",
                "Store calls that failed.",
                stats.store_errors,
            ),
            (
                "sluice_near_cache_hits_total",
                "Denials answered by the near cache without the store.",
                stats.near_cache_hits,
            ),
            (
                "sluice_failed_open_total",
                "Hits admitted because the store failed.",
                stats.failed_open,
            ),
            (
                "sluice_failed_closed_total",
                "Hits denied because the store failed.",
                stats.failed_closed,
            ),
            (
                "sluice_failed_local_total",
                "Hits decided in process because the store failed.",
                stats.failed_local,
            ),
            (
                "sluice_prefetch_blocks_total",
                "Blocks of admissions taken from the store for prefetch=N leaves.",
                stats.prefetch_blocks,
            ),
            (
                "sluice_prefetch_spent_total",
                "Decisions spent from a prefetched block, without the store.",
                stats.prefetch_spent,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP sluice_config_reloads_total Config reloads by result.\n# TYPE sluice_config_reloads_total counter\nsluice_config_reloads_total{{result=\"ok\"}} {}\nsluice_config_reloads_total{{result=\"failed\"}} {}",
            self.reloads_ok.load(Ordering::Relaxed),
            self.reloads_failed.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP sluice_unknown_policy_total Checks naming no configured policy.\n# TYPE sluice_unknown_policy_total counter\nsluice_unknown_policy_total {}",
            self.unknown_policy.load(Ordering::Relaxed)
        );
        out.push_str("# HELP sluice_connections Connections open, by listener.\n# TYPE sluice_connections gauge\n");
        let listeners = [
            ("http", &self.http),
            ("grpc", &self.grpc),
            ("resp", &self.resp),
        ];
        for (name, counts) in listeners {
            let _ = writeln!(
                out,
                "sluice_connections{{listener=\"{name}\"}} {}",
                counts.open.load(Ordering::Relaxed)
            );
        }
        out.push_str("# HELP sluice_connections_refused_total Connections closed at once because the listener held its most.\n# TYPE sluice_connections_refused_total counter\n");
        for (name, counts) in listeners {
            let _ = writeln!(
                out,
                "sluice_connections_refused_total{{listener=\"{name}\"}} {}",
                counts.refused.load(Ordering::Relaxed)
            );
        }
        self.audit.render(&mut out);
        self.leases.render(&mut out, now);
        if let Some(memory) = memory {
            let _ = writeln!(
                out,
                "# HELP sluice_identifiers Identifiers held by the memory store.\n# TYPE sluice_identifiers gauge\nsluice_identifiers {}\n# HELP sluice_evictions_total Live states evicted to respect the bound.\n# TYPE sluice_evictions_total counter\nsluice_evictions_total {}",
                memory.identifiers, memory.evictions
            );
        }
        out
    }
}

/// A label value as the text format writes it: `\\`, `"` and newlines escaped.
pub(crate) fn escape(label: &str) -> String {
    label
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
