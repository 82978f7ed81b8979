//! One leaf of a rule, judged (and recorded, if asked) on memcached.
//!
//! **Sliding window counter**, the native algorithm: one counter per sub-window under
//! `<base>|w<n>`, expiring one sub-window after the window has slid past it. A hit reads the
//! window's counters with one `get` (older sub-windows no longer change), and if it fits,
//! adds its cost to the current one with `incr` (`add` creates the counter). `incr` is atomic
//! and returns the new total, so the hits that reach a counter are in one order, each knowing
//! the exact total before it: a hit is admitted when the older sub-windows plus that total
//! stay within the limit, otherwise it gives its cost back (`decr`) and is denied. A counter
//! thus always holds the hits it admitted plus the denied ones in flight: no interleaving
//! admits more than the limit, and a hit can only be denied wrongly while another's cost
//! is in flight (under-admission, bounded by the cost of the hits in flight). App servers
//! whose clocks differ count into neighbouring sub-windows around each boundary; the read
//! takes the next sub-window too once a clock running ahead by the skew could reach it
//! within the call's deadline, and a hit near a boundary reads its neighbours again after
//! counting (see [`MemcachedStoreBuilder::skew`](crate::MemcachedStoreBuilder::skew)).
//! Two hits racing across a boundary may each see the other and both step back; such a
//! refusal says retry now (see `racing`), so it is never remembered as a lasting one.
//! Hits that take a counter away from a boundary are combined with the other hits on it in
//! this process (see [`crate::combine`]): one read and one `incr` per batch, sent in one
//! round trip when the counter is new.
//!
//! **GCRA, fixed window, sliding log**: the state under `<base>|s`, updated by
//! compare-and-swap (see [`crate::cas`]). The core's functions judge and record, so the
//! numbers are those of every other store.
//!
//! **Concurrency**: the lease set under `<base>|s`, by compare-and-swap too (see
//! [`crate::concurrency`]).

use std::collections::HashMap;
use std::sync::Arc;

use sluice_core::algorithm::sliding_window::Counters;
use sluice_core::{Algorithm, Quota, Retry, State, Verdict};

use crate::MemcachedError;
use crate::cas::{Answer, Plan, update};
use crate::commands::StoreReply;
use crate::expiry::exptime;
use crate::key::{Keys, Record};
use crate::pool::Deadline;
use crate::stats::Counters as Stats;
use crate::store::Inner;
use crate::value::{MAX_LEASES, MAX_LOG_LIMIT, Stored, count, decode, encode_state};

/// Times a counter may vanish between our `add` and `incr` before the call gives up.
const VANISH_TRIES: u32 = 3;

/// How a hit treats one leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Read only.
    Peek,
    /// Record the hit only if this leaf admits it.
    Take,
    /// Record the hit whatever this leaf says (the rule admitted it, or denials count).
    Force,
    /// Record it unless the cost is above the leaf's capacity (one-leaf rules that count
    /// denied attempts).
    TakeOrCount,
}

impl Mode {
    fn records(self, verdict: &Verdict) -> bool {
        match self {
            Mode::Peek => false,
            Mode::Take => verdict.allowed,
            Mode::Force => true,
            Mode::TakeOrCount => verdict.retry != Retry::Never,
        }
    }
}

/// Where a hit was recorded, to give it back.
#[derive(Debug, Clone)]
pub enum Recorded {
    /// Added to the counter of sub-window `number`.
    Counter {
        number: u64,
        cost: u64,
    },
    State {
        at: u64,
        cost: u64,
    },
    /// A concurrency lease taken.
    Lease {
        id: u64,
    },
}

/// One leaf's answer to one hit.
#[derive(Debug, Clone)]
pub struct Judged {
    /// As the hit found the leaf (for a recorded hit: at the moment it was recorded).
    pub verdict: Verdict,
    pub recorded: Option<Recorded>,
    /// The state with the hit recorded, when it was.
    pub after: Option<State>,
}

/// What a sliding-window counter of sub-window `number` is created with at `now`: its
/// expiry, and the identifier's `|m` record (`<sub-window ns> <sub-windows>`, how a reset
/// finds the counters), written beside it.
pub(crate) fn counter_record(quota: &Quota, number: u64, now: u64) -> (u32, Record) {
    let sub = quota.sub_window_ticks();
    let g = u64::from(quota.windows());
    // Counted until sub-window `number + g` starts; one more for callers whose clocks lag.
    let expiry = exptime((number + g + 1).saturating_mul(sub), now);
    (expiry, Record::new(sub, g))
}

/// Whether memcached can hold this quota's state.
pub fn supported(quota: &Quota) -> Result<(), MemcachedError> {
    match quota.algorithm() {
        Algorithm::SlidingLog if quota.limit() > MAX_LOG_LIMIT => {
            Err(MemcachedError::Unsupported(format!(
                "a sliding log of limit {} does not fit one memcached item (at most {MAX_LOG_LIMIT}; \
                 use sliding-window or gcra)",
                quota.limit()
            )))
        }
        Algorithm::Concurrency if quota.limit() > MAX_LEASES => {
            Err(MemcachedError::Unsupported(format!(
                "a concurrency leaf of {} slots does not fit one memcached item (at most \
                 {MAX_LEASES})",
                quota.limit()
            )))
        }
        _ => Ok(()),
    }
}

/// The leaf state a `|s` value holds; a fresh one when absent or written by another
/// algorithm (the same identifier reused with another algorithm).
pub(crate) fn leaf_state(
    quota: &Quota,
    key: &Keys,
    value: Option<&[u8]>,
) -> Result<State, MemcachedError> {
    let Some(value) = value else {
        return Ok(quota.fresh_state());
    };
    match decode(value) {
        Ok(Stored::Leaf(state)) if quota.fits(&state) => Ok(state),
        Ok(_) => Ok(quota.fresh_state()),
        Err(why) => Err(MemcachedError::Corrupt {
            key: key.state(),
            why,
        }),
    }
}

/// The time to judge `state` at: `now`, or the state's own latest time if that is later.
/// Hits reach a key out of clock order (a caller that read its clock before waiting its
/// turn, or whose clock lags another's); judging them at the later time keeps a log in
/// order and stops a fixed window from being turned back, and only ever errs strict.
fn settle(quota: &Quota, state: &State, now: u64) -> u64 {
    match state {
        State::FixedWindow { window, count } if *count > 0 => {
            now.max(window.saturating_mul(quota.window_ticks()))
        }
        State::SlidingLog(log) => now.max(log.hits().last().map_or(0, |(at, _)| at)),
        _ => now,
    }
}

/// Takes back a recorded hit of `cost` made at `at` from `state`.
fn undo(quota: &Quota, state: &mut State, at: u64, cost: u64) {
    match state {
        State::Gcra { tat } => {
            *tat = tat.saturating_sub(cost.saturating_mul(quota.interval_ticks()))
        }
        State::FixedWindow { window, count } if *window == at / quota.window_ticks() => {
            *count = count.saturating_sub(cost);
        }
        State::SlidingLog(log) => {
            let mut left = cost;
            let hits = log.hits().filter_map(|(when, c)| {
                if when == at && left > 0 {
                    let cut = c.min(left);
                    left -= cut;
                    (c > cut).then_some((when, c - cut))
                } else {
                    Some((when, c))
                }
            });
            *log = sluice_core::algorithm::sliding_log::Log::from_hits(hits.collect::<Vec<_>>());
        }
        _ => {}
    }
}

/// The verdict of a hit taken near a sub-window boundary (the only hits `Mode::Take` judges
/// alone): a refusal there may come from hits racing across the boundary, each counted, each
/// seeing the other's count on its re-read, and each giving its cost back, so the unit is
/// free again a round trip later. Such a refusal promises no wait (`Retry::Now`: denied,
/// `retry_after` zero), so a near cache keeps none of them, and hits one at a time once the
/// race is over take what is left. A cost above the capacity stays `Retry::Never`.
fn racing(mode: Mode, mut verdict: Verdict) -> Verdict {
    if mode == Mode::Take && !verdict.allowed && matches!(verdict.retry, Retry::After(_)) {
        verdict.retry = Retry::Now;
    }
    verdict
}

/// Nanoseconds a value must still have to live for its disappearance to be an eviction
/// (memcached's clock ticks in whole seconds, and ours may differ a little).
pub const LIVE_MARGIN: u64 = 2_000_000_000;

impl Inner {
    /// Judges leaf `keys` of `quota` for a hit of `cost` at `now`, recording it as `mode` says;
    /// a concurrency leaf takes `lease` when it records (see [`crate::concurrency`]).
    #[allow(clippy::too_many_arguments)] // each argument is one plain fact of the hit
    pub async fn judge(
        self: &Arc<Self>,
        keys: &Keys,
        quota: &Quota,
        now: u64,
        cost: u64,
        mode: Mode,
        lease: Option<u64>,
        deadline: Deadline,
    ) -> Result<Judged, MemcachedError> {
        supported(quota)?;
        if quota.algorithm() == Algorithm::Concurrency {
            return self
                .judge_leases(keys, quota, now, cost, mode, lease, deadline)
                .await;
        }
        if quota.algorithm() == Algorithm::SlidingWindow {
            return self
                .judge_counter(keys, quota, now, cost, mode, deadline)
                .await;
        }
        if mode == Mode::Peek || cost == 0 {
            let read = self
                .pool
                .get(keys.route(), &[keys.state()], deadline)
                .await?;
            let state = leaf_state(quota, keys, read.values().next().map(Vec::as_slice))?;
            let verdict = quota.verdict(&state, settle(quota, &state, now), cost);
            return Ok(Judged {
                verdict,
                recorded: None,
                after: None,
            });
        }
        let (quota, keys_owned) = (*quota, keys.clone());
        let plan = Box::new(move |value: Option<&[u8]>| {
            let state = leaf_state(&quota, &keys_owned, value)?;
            let now = settle(&quota, &state, now);
            let verdict = quota.verdict(&state, now, cost);
            if !mode.records(&verdict) {
                return Ok(Plan::Keep(Answer::Judged(Judged {
                    verdict,
                    recorded: None,
                    after: None,
                })));
            }
            let mut next = state.clone();
            quota.record(&mut next, now, cost);
            Ok(Plan::Write {
                value: encode_state(&next),
                expires_at: quota.expires_at(&next),
                was_live: value.is_some() && quota.expires_at(&state) > now + LIVE_MARGIN,
                answer: Answer::Judged(Judged {
                    verdict,
                    recorded: Some(Recorded::State { at: now, cost }),
                    after: Some(next),
                }),
            })
        });
        match update(self, keys, now, deadline, plan).await? {
            Answer::Judged(judged) => Ok(judged),
            other => unreachable!("a leaf update answers a judgement, not {other:?}"),
        }
    }

    async fn judge_counter(
        self: &Arc<Self>,
        keys: &Keys,
        quota: &Quota,
        now: u64,
        cost: u64,
        mode: Mode,
        deadline: Deadline,
    ) -> Result<Judged, MemcachedError> {
        if mode == Mode::Take && cost > 0 && !self.near_boundary(quota, now) {
            // Combined with the other hits on this counter (see `crate::combine`).
            return self.take_combined(keys, quota, now, cost, deadline).await;
        }
        let g = u64::from(quota.windows());
        let current = now / quota.sub_window_ticks();
        let oldest = (current + 1).saturating_sub(g);
        let names: Vec<String> = (oldest..=current).map(|n| keys.window(n)).collect();
        let (older, key) = names.split_at(names.len() - 1);
        let key = &key[0];
        // Counts past twice the limit say nothing more (and a foreign value must not
        // overflow the sum).
        let ceiling = quota.limit().saturating_mul(2);
        let counts = |read: &HashMap<String, Vec<u8>>| -> Result<Vec<u64>, MemcachedError> {
            // Oldest first, g of them (sub-windows before number 0 count nothing).
            let mut counts = vec![0; (g - (current + 1 - oldest)) as usize];
            for name in &names {
                counts.push(match read.get(name) {
                    Some(value) => count(name, value)?.min(ceiling),
                    None => 0,
                });
            }
            Ok(counts)
        };
        let state = |counts: &[u64]| State::SlidingWindow(Counters::from_parts(current, counts));

        let (mut counts, total, mut ahead_count) = if mode == Mode::Force && cost > 0 {
            // Recorded whatever it finds: read the older sub-windows and count the hit in
            // one round trip.
            let route = keys.route();
            let (read, counted) = self
                .pool
                .get_and_incr(route, older, key, cost, deadline)
                .await?;
            let read: HashMap<String, Vec<u8>> = (older.iter().cloned().zip(read))
                .filter_map(|(name, value)| Some((name, value?)))
                .collect();
            let total = match counted {
                Some(total) => total,
                None => {
                    self.increment(keys, current, quota, now, cost, false, deadline)
                        .await?
                }
            };
            (counts(&read)?, total, 0)
        } else {
            // The next sub-window too when app servers whose clocks run ahead may count
            // into it.
            let ahead = keys.window(current + 1);
            let mut asked = names.clone();
            if self.ahead_may_count(quota, current, deadline) {
                asked.push(ahead.clone());
            }
            let read = self.pool.get(keys.route(), &asked, deadline).await?;
            let mut counts = counts(&read)?;
            let ahead_count = match read.get(&ahead) {
                Some(value) => count(&ahead, value)?.min(ceiling),
                None => 0,
            };
            // Hits counted ahead of us are taken as this sub-window's: never too few.
            let last = counts.len() - 1;
            counts[last] = counts[last].saturating_add(ahead_count);
            let verdict = quota.sliding_window_verdict(current, &counts, now, cost);
            if !mode.records(&verdict) || cost == 0 {
                return Ok(Judged {
                    verdict: racing(mode, verdict),
                    recorded: None,
                    after: None,
                });
            }
            let present = read.contains_key(key);
            let total = self
                .increment(keys, current, quota, now, cost, present, deadline)
                .await?;
            (counts, total, ahead_count)
        };

        let last = counts.len() - 1;
        let mine = if total < cost {
            // Below what we just added: a wrapped or foreign value. Deny, and let it expire.
            Stats::bump(&self.pool.counters.wrapped);
            ceiling
        } else {
            (total - cost).min(ceiling)
        };
        counts[last] = mine.saturating_add(ahead_count);
        // The verdict at the moment the hit reached the counter.
        let mut verdict = quota.sliding_window_verdict(current, &counts, now, cost);
        if verdict.allowed && mode != Mode::Force && self.near_boundary(quota, now) {
            // App servers whose clocks differ a little from ours count into the neighbouring
            // sub-windows right now: read those again, after our own count. Of two hits
            // racing across the boundary, at least one sees the other (each counts, then
            // reads), so the two cannot both take the last unit.
            let mut neighbours = vec![keys.window(current + 1)];
            if g > 1 && current >= 1 {
                neighbours.push(keys.window(current - 1));
            }
            let read = self.pool.get(keys.route(), &neighbours, deadline).await?;
            let fresh = |name: &String| -> Result<u64, MemcachedError> {
                read.get(name)
                    .map_or(Ok(0), |value| Ok(count(name, value)?.min(ceiling)))
            };
            ahead_count = ahead_count.max(fresh(&neighbours[0])?);
            counts[last] = mine.saturating_add(ahead_count);
            if let Some(before) = neighbours.get(1) {
                counts[last - 1] = counts[last - 1].max(fresh(before)?);
            }
            verdict = quota.sliding_window_verdict(current, &counts, now, cost);
        }
        let keep = match mode {
            Mode::Take => verdict.allowed,
            _ => total >= cost,
        };
        if !keep {
            self.decrement(keys, key, cost, deadline).await;
            return Ok(Judged {
                verdict: racing(mode, verdict),
                recorded: None,
                after: None,
            });
        }
        // Denied hits recorded anyway stop counting at twice the limit, as in the core.
        let mut kept = cost;
        if total > ceiling {
            let excess = (total - ceiling).min(cost);
            self.decrement(keys, key, excess, deadline).await;
            kept -= excess;
        }
        counts[last] = mine.saturating_add(kept);
        Ok(Judged {
            verdict,
            recorded: (kept > 0).then_some(Recorded::Counter {
                number: current,
                cost: kept,
            }),
            after: Some(state(&counts)),
        })
    }

    /// Adds `by` to the counter of sub-window `number`, creating it if needed (and the
    /// identifier's `|m` record with it); returns the new total. `present`: the counter was
    /// there when the window was read, so finding it gone is an eviction.
    #[allow(clippy::too_many_arguments)] // each argument is one plain fact of the increment
    pub(crate) async fn increment(
        &self,
        keys: &Keys,
        number: u64,
        quota: &Quota,
        now: u64,
        by: u64,
        mut present: bool,
        deadline: Deadline,
    ) -> Result<u64, MemcachedError> {
        let route = keys.route();
        let key = keys.window(number);
        let (expiry, meta) = counter_record(quota, number, now);
        for _ in 0..VANISH_TRIES {
            if present {
                if let Some(total) = self.pool.incr(route, &key, by, true, deadline).await? {
                    return Ok(total);
                }
                // It was there when we read it (or another client just made it): evicted.
                Stats::bump(&self.pool.counters.evictions);
            }
            // A sub-window's first hit creates its counter: `add` straight away, without an
            // `incr` bound to find nothing.
            let created = self
                .pool
                .add_with(
                    route,
                    (&key, itoa::Buffer::new().format(by).as_bytes()),
                    (&keys.meta(), meta.as_bytes()),
                    expiry,
                    deadline,
                )
                .await?;
            if created == StoreReply::Stored {
                return Ok(by);
            }
            present = true; // another client created it first: add to theirs
        }
        Err(MemcachedError::Server {
            server: route.to_owned(),
            message: format!(
                "counter {key} vanished {VANISH_TRIES} times in a row (memory too small?)"
            ),
        })
    }

    /// Takes `by` back from a counter. A failure is counted, not returned: the decision is
    /// made, and the counter only holds one hit too many until it expires.
    pub(crate) async fn decrement(&self, keys: &Keys, key: &str, by: u64, deadline: Deadline) {
        match self.pool.incr(keys.route(), key, by, false, deadline).await {
            Ok(Some(_)) => {}
            Ok(None) => Stats::bump(&self.pool.counters.evictions),
            Err(_) => Stats::bump(&self.pool.counters.unfinished),
        }
    }

    /// Takes back a hit recorded in leaf `keys` (the rule denied it after all).
    pub async fn give_back(
        self: &Arc<Self>,
        keys: &Keys,
        quota: &Quota,
        recorded: &Recorded,
        deadline: Deadline,
    ) -> Result<(), MemcachedError> {
        match recorded {
            Recorded::Counter { number, cost } => {
                self.decrement(keys, &keys.window(*number), *cost, deadline)
                    .await;
                Ok(())
            }
            Recorded::Lease { id } => {
                let now = self.clock.now();
                self.release_lease(keys, now, *id, deadline).await?;
                Ok(())
            }
            Recorded::State { at, cost } => {
                let (at, cost, quota, keys_owned) = (*at, *cost, *quota, keys.clone());
                let plan = Box::new(move |value: Option<&[u8]>| {
                    if value.is_none() {
                        return Ok(Plan::Keep(Answer::Absent));
                    }
                    let mut state = leaf_state(&quota, &keys_owned, value)?;
                    undo(&quota, &mut state, at, cost);
                    Ok(Plan::Write {
                        value: encode_state(&state),
                        expires_at: quota.expires_at(&state),
                        was_live: true,
                        answer: Answer::Done,
                    })
                });
                if let Answer::Absent = update(self, keys, at, deadline, plan).await? {
                    Stats::bump(&self.pool.counters.evictions);
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{Leaf, Rate, Span, Unit};

    fn quota(algorithm: Algorithm, limit: u64) -> Quota {
        let rate = Rate::new(limit, Span::new(1, Unit::Hour).unwrap()).unwrap();
        Quota::from_leaf(&Leaf::new(rate), algorithm).unwrap()
    }

    #[test]
    fn undo_takes_back_exactly_one_hit() {
        let now = 1_700_000_000_000_000_000;
        for algorithm in [
            Algorithm::Gcra,
            Algorithm::FixedWindow,
            Algorithm::SlidingLog,
        ] {
            let q = quota(algorithm, 10);
            let mut state = q.fresh_state();
            q.record(&mut state, now - 5, 2);
            let before = state.clone();
            q.record(&mut state, now, 3);
            q.record(&mut state, now + 1, 1);
            undo(&q, &mut state, now, 3);
            let mut expected = before;
            q.record(&mut expected, now + 1, 1);
            assert_eq!(
                q.verdict(&state, now + 2, 1),
                q.verdict(&expected, now + 2, 1),
                "{algorithm}"
            );
        }
    }

    #[test]
    fn counts_read_strictly() {
        assert_eq!(count("k", b"12").unwrap(), 12);
        assert_eq!(count("k", b"9  ").unwrap(), 9);
        for bad in [&b""[..], b" ", b"x", b"-1", b" 9", b"1 2"] {
            assert!(count("k", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn refuses_what_memcached_cannot_hold() {
        assert!(supported(&quota(Algorithm::SlidingLog, MAX_LOG_LIMIT)).is_ok());
        assert!(supported(&quota(Algorithm::SlidingLog, MAX_LOG_LIMIT + 1)).is_err());
        let most = sluice_core::rate::MAX_COUNT;
        assert!(supported(&quota(Algorithm::SlidingWindow, most)).is_ok());
        assert!(supported(&quota(Algorithm::Gcra, most)).is_ok());
    }
}
