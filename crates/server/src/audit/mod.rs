//! The audit trail of denials: every refusal (and every would-be refusal of a shadow-mode
//! policy) written as one record to a JSON-lines file rotated by size, a PostgreSQL table,
//! or both, as the config's `[audit]` table says (see [`crate::config::audit`]).
//!
//! Writing never holds up a decision: [`AuditSink::record`] only offers the record to a
//! bounded queue per sink (`try_send`); a writer per sink (a thread for the file, a task for
//! PostgreSQL) takes records in batches (one write, or one multi-row `INSERT`, per batch).
//! A record that finds its queue full is dropped, and so is a batch the sink refuses (a full
//! disk, a database that is down); both are counted in `sluice_audit_dropped_total{sink,
//! reason="queue_full"|"write_failed"}`, beside `sluice_audit_written_total{sink}`. A
//! PostgreSQL sink reconnects by itself, backing off up to 5 s.
//!
//! The service audits each decision of `/v1/check`, Envoy's gRPC and `/json`, and the
//! Redis protocol once, where they all decide ([`Service::check_policy`](crate::Service)).
//! A reload that changes `[audit]` starts the new sinks, then lets the old ones finish
//! what they hold.
//!
//! The same sink serves a program that limits in process, as the tower layer's `on_denied`
//! hook does:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::SystemTime;
//! use sluice_limiter::{Limiter, MemoryStore, Policy};
//! use sluice_server::audit::{AuditSink, DenialRecord};
//! use sluice_server::config::AuditConfig;
//!
//! let path = std::env::temp_dir().join(format!("sluice-audit-doc-{}.jsonl", std::process::id()));
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let sink = AuditSink::start(&AuditConfig::file(&path)).unwrap();
//! let limiter = Arc::new(
//!     Limiter::builder(MemoryStore::new())
//!         .policy(Policy::new("api", "ip:1/m").unwrap())
//!         .build()
//!         .unwrap(),
//! );
//! let hook_sink = sink.clone();
//! let hook_limiter = limiter.clone();
//! let layer = sluice_tower::RateLimitLayer::builder(limiter.clone(), "api")
//!     .selector("ip", sluice_tower::Key::client_ip())
//!     .on_denied(move |denied| {
//!         let (Some(decision), Some(policy)) = (denied.decision, hook_limiter.policy(denied.policy)) else {
//!             return;
//!         };
//!         let record = DenialRecord::new(
//!             SystemTime::now(), denied.policy, &policy, denied.selectors, decision, denied.shadow,
//!         );
//!         if let Some(record) = record {
//!             hook_sink.record(&record); // never waits
//!         }
//!     })
//!     .build()
//!     .unwrap();
//! # let _ = layer;
//! // The same call, made by hand:
//! let policy = limiter.policy("api").unwrap();
//! let selectors = [("ip", "203.0.113.9")];
//! limiter.check(&policy, &selectors, 1).await.unwrap();
//! let checked = limiter.check(&policy, &selectors, 1).await.unwrap();
//! let record = DenialRecord::new(SystemTime::now(), "api", &policy, &selectors, &checked.decision, false);
//! sink.record(&record.unwrap());
//! sink.close(std::time::Duration::from_secs(5)).await; // writes what it holds
//! let text = std::fs::read_to_string(&path).unwrap();
//! assert!(text.contains(r#""selectors":{"ip":"203.0.113.9"},"reason":"limited""#), "{text}");
//! # });
//! # std::fs::remove_file(&path).unwrap();
//! ```

mod file;
mod postgres;
pub mod read;
mod record;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

pub use crate::config::audit::{AuditConfig, FileSink, PostgresSink, redact_url};
pub use record::{AuditEntry, DenialRecord};

/// Most records a writer takes in one batch.
pub(crate) const BATCH: usize = 512;

/// What a sink has done so far.
#[derive(Debug, Default)]
pub struct SinkCounters {
    written: AtomicU64,
    queue_full: AtomicU64,
    write_failed: AtomicU64,
}

impl SinkCounters {
    /// Records written.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Records dropped because the queue was full (the sink could not keep up).
    pub fn queue_full(&self) -> u64 {
        self.queue_full.load(Ordering::Relaxed)
    }

    /// Records dropped because the sink refused them (a full disk, a database down).
    pub fn write_failed(&self) -> u64 {
        self.write_failed.load(Ordering::Relaxed)
    }

    pub(crate) fn add_written(&self, n: usize) {
        self.written.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_failed(&self, n: usize) {
        self.write_failed.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// The counters of both kinds of sink, kept by the service across reloads.
#[derive(Debug, Default, Clone)]
pub struct AuditCounters {
    pub file: Arc<SinkCounters>,
    pub postgres: Arc<SinkCounters>,
}

impl AuditCounters {
    /// Appends the `sluice_audit_*` series to a Prometheus text exposition.
    pub(crate) fn render(&self, out: &mut String) {
        use std::fmt::Write;
        let sinks = [("file", &self.file), ("postgres", &self.postgres)];
        out.push_str("# HELP sluice_audit_written_total Denials written to the audit trail.\n# TYPE sluice_audit_written_total counter\n");
        for (sink, c) in sinks {
            let _ = writeln!(
                out,
                "sluice_audit_written_total{{sink=\"{sink}\"}} {}",
                c.written()
            );
        }
        out.push_str("# HELP sluice_audit_dropped_total Denials the audit trail dropped: its queue was full, or the sink refused them.\n# TYPE sluice_audit_dropped_total counter\n");
        for (sink, c) in sinks {
            for (reason, n) in [
                ("queue_full", c.queue_full()),
                ("write_failed", c.write_failed()),
            ] {
                let _ = writeln!(
                    out,
                    "sluice_audit_dropped_total{{sink=\"{sink}\",reason=\"{reason}\"}} {n}"
                );
            }
        }
    }
}

/// A sink could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuditError {
    #[error("audit file {path}: {source}")]
    File {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("audit postgres: {0}")]
    Postgres(String),
}

struct Queue {
    sender: mpsc::Sender<Arc<DenialRecord>>,
    counters: Arc<SinkCounters>,
    /// Completes when the writer has finished (its sender is dropped then).
    finished: parking_lot::Mutex<Option<oneshot::Receiver<()>>>,
}

/// Where denials go: one queue and writer per sink. Cheap to clone (clones share the
/// queues); the writers finish once every clone is dropped, or at [`AuditSink::close`].
#[derive(Clone)]
pub struct AuditSink {
    config: Arc<AuditConfig>,
    queues: Arc<Vec<Queue>>,
}

impl std::fmt::Debug for AuditSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditSink")
            .field("config", &self.config)
            .finish()
    }
}

impl AuditSink {
    /// Opens the file (if any) and starts the writers, with counters of their own. Outside a
    /// Tokio runtime a config naming PostgreSQL is an error ([`AuditError::Postgres`]).
    pub fn start(config: &AuditConfig) -> Result<AuditSink, AuditError> {
        AuditSink::start_counted(config, &AuditCounters::default())
    }

    /// As [`AuditSink::start`], counting into `counters`.
    pub fn start_counted(
        config: &AuditConfig,
        counters: &AuditCounters,
    ) -> Result<AuditSink, AuditError> {
        let mut queues = Vec::new();
        if let Some(file) = &config.file {
            let (sender, receiver) = mpsc::channel(config.queue);
            let (done, finished) = oneshot::channel();
            file::spawn(
                file,
                config.server.clone(),
                receiver,
                counters.file.clone(),
                done,
            )
            .map_err(|source| AuditError::File {
                path: file.path.clone(),
                source,
            })?;
            queues.push(Queue {
                sender,
                counters: counters.file.clone(),
                finished: parking_lot::Mutex::new(Some(finished)),
            });
        }
        if let Some(pg) = &config.postgres {
            let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
                AuditError::Postgres("the sink's writer needs a Tokio runtime to run on".into())
            })?;
            let settings =
                crate::config::audit::check_postgres_url(&pg.url).map_err(AuditError::Postgres)?;
            let (sender, receiver) = mpsc::channel(config.queue);
            let (done, finished) = oneshot::channel();
            postgres::spawn(
                &runtime,
                postgres::Target::new(settings, pg, config.server.clone()),
                receiver,
                counters.postgres.clone(),
                done,
            );
            queues.push(Queue {
                sender,
                counters: counters.postgres.clone(),
                finished: parking_lot::Mutex::new(Some(finished)),
            });
        }
        Ok(AuditSink {
            config: Arc::new(config.clone()),
            queues: Arc::new(queues),
        })
    }

    /// The config the sink was started with.
    pub fn config(&self) -> &AuditConfig {
        &self.config
    }

    /// Offers `record` to every sink's queue without waiting; where a queue is full, the
    /// record is dropped there and counted.
    pub fn record(&self, record: &DenialRecord) {
        if self.has_room() {
            self.record_owned(record.clone());
        } else {
            self.count_full();
        }
    }

    /// Whether some queue has room: when none has, the caller need not build a record.
    pub(crate) fn has_room(&self) -> bool {
        self.queues.iter().any(|q| q.sender.capacity() > 0)
    }

    pub(crate) fn count_full(&self) {
        for queue in self.queues.iter() {
            queue.counters.queue_full.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn record_owned(&self, record: DenialRecord) {
        let record = Arc::new(record);
        for queue in self.queues.iter() {
            if queue.sender.try_send(record.clone()).is_err() {
                queue.counters.queue_full.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Drops this handle and waits up to `within` for the writers to write what their
    /// queues hold and finish (a writer stuck on its sink is left behind). Writers finish
    /// once every clone of the sink is dropped.
    pub async fn close(self, within: Duration) {
        let waits: Vec<_> = self
            .queues
            .iter()
            .filter_map(|q| q.finished.lock().take())
            .collect();
        drop(self);
        let all = async {
            for wait in waits {
                let _ = wait.await;
            }
        };
        let _ = tokio::time::timeout(within, all).await;
    }
}
