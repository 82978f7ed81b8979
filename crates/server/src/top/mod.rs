//! Heavy hitters: per policy, the selector values with the most hits (`active`) and the
//! most refusals (`refused`) over the last minutes, and a ring of the last refusals, in
//! memory that does not grow with the traffic.
//!
//! Each policy has two space-saving sketches of K counters per minute, over a ring of
//! [`SLOTS`] minutes (see `sketch.rs` and `window.rs` for the algorithm and its proof): a
//! reported item's true count is within `[count - error, count]`, `error` is at most N / K
//! (N the policy's hits in the window, or its refusals), and every value with more than
//! N / K hits in the window is reported. While a minute sees fewer than K distinct values,
//! its counts are exact.
//!
//! Memory per policy that sees traffic: 2 kinds x [`SLOTS`] minutes x K counters of 48
//! bytes plus a label of at most [`MAX_LABEL`] bytes: with the default K = 64, about 30 KiB
//! plus the labels (`ip=203.0.113.9` is 16 bytes; a few hundred KiB at most if every value
//! is as long as allowed). A policy without traffic costs a few hundred bytes; the refusal
//! ring at most about 40 KiB.
//!
//! A refusal under attack is the common case: the hot path takes one short lock per policy
//! (both kinds behind it), hashes the counted values without allocating, and writes a label
//! only into a counter that a new value takes over (reusing the old value's buffer), or into
//! the refusal ring's reused entries. `cargo bench -p sluice-server --bench top_cost`
//! measures it.
//!
//! A shadow-mode policy's would-be refusals count as refusals here (that is who it would
//! refuse); checks that could not decide (errors) are not counted.

mod label;
mod refusals;
mod sketch;
mod window;

use std::collections::HashMap;
use std::fmt::Write;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use serde::{Serialize, Serializer};
use sluice_limiter::{Checked, Selectors};

pub use label::{MAX_LABEL, MAX_VALUE};
pub use refusals::Refusal;
pub use window::{HeavyHitter, SLOT, SLOTS};

use refusals::Ring;
use window::Windowed;

/// Counters per policy, per kind and per minute, unless the builder says otherwise.
pub const DEFAULT_CAPACITY: usize = 64;
/// Refusals remembered, unless the builder says otherwise.
pub const DEFAULT_REFUSALS: usize = 100;
/// Refused values per policy shown in the metrics (`sluice_top_refused`).
pub const METRICS_TOP: usize = 5;

/// A policy's heavy hitters, as read at one time. As JSON: `{"policy": "login",
/// "window_seconds": 300, "hits": 1200, "refusals": 80, "active": [HeavyHitter...],
/// "refused": [HeavyHitter...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyTop {
    /// The policy's name, or an on-the-fly kind (`cl.throttle`, `envoy.override`).
    pub policy: String,
    /// The span counted: [`SLOTS`] minutes (the current one is still filling).
    #[serde(rename = "window_seconds", serialize_with = "whole_seconds")]
    pub window: Duration,
    /// Hits of the policy counted in the window.
    pub hits: u64,
    /// Refusals counted in the window.
    pub refusals: u64,
    /// The values with the most hits, most first.
    pub active: Vec<HeavyHitter>,
    /// The values with the most refusals, most first.
    pub refused: Vec<HeavyHitter>,
}

struct Streams {
    active: Windowed,
    refused: Windowed,
}

/// Heavy hitters of every tracked policy and the refusal ring. Built by the service (see
/// [`ServiceBuilder::top`](crate::ServiceBuilder::top)); read through
/// [`Service::top`](crate::Service::top) and [`Service::recent_refusals`](crate::Service::recent_refusals).
pub struct Top {
    capacity: usize,
    policies: RwLock<HashMap<String, Mutex<Streams>, foldhash::fast::RandomState>>,
    refusals: Mutex<Ring>,
    /// Seeded per process: a client cannot pick values that collide with another's.
    hasher: foldhash::quality::RandomState,
}

impl Top {
    /// `capacity` counters (K) per policy, kind and minute, 0 to count nothing; the last
    /// `refusals` refusals, 0 to keep none.
    pub fn new(capacity: usize, refusals: usize) -> Top {
        Top {
            capacity,
            policies: RwLock::default(),
            refusals: Mutex::new(Ring::new(refusals)),
            hasher: foldhash::quality::RandomState::default(),
        }
    }

    /// K: counters per policy, kind and minute (0: heavy hitters are off).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// How many refusals are remembered (0: none).
    pub fn refusals_capacity(&self) -> usize {
        self.refusals.lock().capacity()
    }

    /// Keeps sketches for exactly these names: a policy's survive a reload that keeps it;
    /// hits of a name not tracked are not counted.
    pub fn track(&self, names: impl IntoIterator<Item = String>) {
        if self.capacity == 0 {
            return;
        }
        let mut map = self.policies.write();
        let mut next = HashMap::default();
        for name in names {
            let streams = map.remove(&name).unwrap_or_else(|| {
                Mutex::new(Streams {
                    active: Windowed::new(self.capacity),
                    refused: Windowed::new(self.capacity),
                })
            });
            next.insert(name, streams);
        }
        *map = next;
    }

    /// Counts one decision (`checked`, made on `selectors`) of the policy tracked as `name`
    /// (its name, or an on-the-fly kind) at `now` (nanoseconds since the Unix epoch), by the
    /// values of `selectors` that the decision's policy counts by.
    pub fn observe(&self, now: u64, name: &str, selectors: &Selectors<'_>, checked: &Checked) {
        let refused = checked.shadow_denied || !checked.decision.allowed();
        let counted = label::counted(&checked.policy, selectors);
        if self.capacity > 0 {
            let hash = label::hash(&self.hasher, counted.clone());
            if let Some(streams) = self.policies.read().get(name) {
                let mut streams = streams.lock();
                let Streams {
                    active,
                    refused: refusals,
                } = &mut *streams;
                // The label is written once, when the value enters the first sketch, and
                // copied from there.
                let text = active.add(now, hash, |out| label::write(out, counted.clone()));
                if refused {
                    refusals.add(now, hash, |out| out.push_str(text));
                    self.record(now, name, checked, |out| out.push_str(text));
                }
                return;
            }
        }
        if refused {
            self.record(now, name, checked, |out| label::write(out, counted));
        }
    }

    /// Puts a refusal in the ring; `label` writes its selectors.
    fn record(&self, now: u64, name: &str, checked: &Checked, label: impl FnOnce(&mut String)) {
        let denial = checked.decision.denial;
        self.refusals.lock().record(
            now,
            name,
            label,
            denial.map(|d| d.name()),
            denial.and_then(|d| d.retry_after()),
            checked.shadow_denied,
        );
    }

    /// The `n` heaviest values of each kind of the policy tracked as `name`, at `now`;
    /// `None` when no such name is tracked (or heavy hitters are off).
    pub fn policy(&self, now: u64, name: &str, n: usize) -> Option<PolicyTop> {
        let map = self.policies.read();
        let streams = map.get(name)?.lock();
        Some(PolicyTop {
            policy: name.to_owned(),
            window: SLOT * SLOTS as u32,
            hits: streams.active.total(now),
            refusals: streams.refused.total(now),
            active: streams.active.top(now, n),
            refused: streams.refused.top(now, n),
        })
    }

    /// Every tracked policy's [`Top::policy`], by name.
    pub fn all(&self, now: u64, n: usize) -> Vec<PolicyTop> {
        let mut names: Vec<String> = self.policies.read().keys().cloned().collect();
        names.sort();
        names
            .iter()
            .filter_map(|name| self.policy(now, name, n))
            .collect()
    }

    /// The last `n` refusals, newest first.
    pub fn recent_refusals(&self, n: usize) -> Vec<Refusal> {
        self.refusals.lock().recent(n)
    }

    /// Appends the gauge `sluice_top_refused{policy,selectors}` to a Prometheus text
    /// exposition: the [`METRICS_TOP`] most refused values of each policy at `now` and
    /// their counts (upper bounds). A sample that changes over time: a value leaves the
    /// series when it leaves the top. Label values are escaped as the text format says.
    pub fn render_metrics(&self, now: u64, out: &mut String) {
        if self.capacity == 0 {
            return;
        }
        out.push_str(
            "# HELP sluice_top_refused Most refused selector values per policy over the last minutes (a sample of the top few; counts are upper bounds).\n# TYPE sluice_top_refused gauge\n",
        );
        for top in self.all(now, METRICS_TOP) {
            let policy = crate::metrics::escape(&top.policy);
            for hitter in &top.refused {
                let _ = writeln!(
                    out,
                    "sluice_top_refused{{policy=\"{policy}\",selectors=\"{}\"}} {}",
                    crate::metrics::escape(&hitter.selectors),
                    hitter.count
                );
            }
        }
    }
}

fn whole_seconds<S: Serializer>(span: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(span.as_secs())
}

fn nanos_as_seconds<S: Serializer>(nanos: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(*nanos as f64 / 1e9)
}

fn maybe_seconds<S: Serializer>(span: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match span {
        Some(span) => s.serialize_f64(span.as_secs_f64()),
        None => s.serialize_none(),
    }
}

impl std::fmt::Debug for Top {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Top")
            .field("capacity", &self.capacity)
            .field("policies", &self.policies.read().len())
            .field("refusals", &self.refusals_capacity())
            .finish()
    }
}

#[cfg(test)]
mod tests;
