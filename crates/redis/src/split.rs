//! Rules whose keys fall in several Redis Cluster slots.
//!
//! One script cannot touch keys in two slots, so such a rule is decided in steps, one call
//! per slot (in slot order), and never over-admits:
//!
//! 1. If the policy has a penalty, its record is checked first.
//! 2. Each slot's leaves are judged, and the hit is *reserved* (recorded) in every leaf
//!    that admits it, atomically per slot.
//! 3. The tree is folded over all verdicts (the same fold as every other store).
//! 4. Admitted: leaves that denied (possible inside `and`) record the hit too. Denied: the
//!    reservations are taken back (or kept, and the other leaves recorded, when the policy
//!    counts denied attempts), and the penalty strikes.
//!
//! At every moment each counter holds at least the hits admitted through it, so no
//! interleaving admits more than a leaf allows. That argument needs every leaf's consent, so
//! it holds for `or` rules (a list of limits) only: under `and`, a hit admitted by one leaf
//! may reach another leaf after hits judged on that leaf's stale count. The limiter keeps
//! every `and` rule whose leaves share no selector in one slot (tagged by namespace and
//! key), and this path refuses an `and` rather than risk it. The price: 2 to 4 round trips instead of
//! one, and, under contention, a reservation that is later taken back may deny another
//! hit in between (under-admission, bounded by the hits in flight). If the store fails
//! between steps, a reservation may stay until its window passes: again only
//! under-admission. With count-denied, `retry_after` is the wait before the denied attempt
//! was counted (the single-slot path reports the longer wait after it).

use std::collections::BTreeMap;

use sluice_core::decision::ticks;
use sluice_core::{Algorithm, Decision, Denial, Recording, Retry, Verdict, decide_verdicts};
use sluice_limiter::{Hit, LeaseKeys};

use crate::RedisError;
use crate::script::{SPLIT, TICK_NS, micro};
use crate::slot::{key, slot_of};
use crate::store::RedisStore;

struct Call<'a> {
    mode: &'a str,
    keys: Vec<String>,
    args: Vec<String>,
}

/// The Redis keys of `leaves` of `hit`.
fn keys_of(hit: &Hit<'_>, leaves: &[usize]) -> Vec<String> {
    leaves.iter().map(|&i| key(&hit.identifiers[i])).collect()
}

impl RedisStore {
    async fn split_call<T: redis::FromRedisValue>(&self, call: Call<'_>) -> Result<T, RedisError> {
        let mut args = Vec::with_capacity(call.args.len() + 1);
        args.push(call.mode.to_owned());
        args.extend(call.args);
        self.eval(&SPLIT, &call.keys, &args).await
    }
}

/// ARGV after the mode for `leaves` of `hit`: cost, token, count, then each leaf's index
/// and quota.
fn leaf_args(hit: &Hit<'_>, leaves: &[usize], token: u64) -> Result<Vec<String>, RedisError> {
    let mut args = vec![
        hit.evaluation.cost.to_string(),
        format!("{token:x}"),
        leaves.len().to_string(),
    ];
    for &i in leaves {
        let q = micro(&hit.evaluation.quotas[i])?;
        let code = crate::script::algorithm_code(q.algorithm())?;
        args.push(i.to_string());
        for n in [
            u64::from(code),
            q.limit(),
            q.window_ticks(),
            q.interval_ticks(),
            q.burst(),
            u64::from(q.windows()),
        ] {
            args.push(n.to_string());
        }
    }
    Ok(args)
}

fn penalty_args(hit: &Hit<'_>) -> Vec<String> {
    let penalty = hit
        .evaluation
        .penalty
        .expect("called with a penalty")
        .with_tick(TICK_NS);
    let (base, factor, max, forget) = penalty.ticks();
    ["0".to_owned(), "0".to_owned(), "0".to_owned()]
        .into_iter()
        .chain([base, u64::from(factor), max, forget].map(|n| n.to_string()))
        .collect()
}

/// Decides `hit` across slots (see the module documentation). With `lease` (an acquire),
/// each concurrency leaf holds the lease where it admits, as a reservation; a denied
/// acquire then releases it.
pub async fn decide_across_slots(
    store: &RedisStore,
    hit: &Hit<'_>,
    lease: Option<u64>,
) -> Result<Decision, RedisError> {
    let ev = &hit.evaluation;
    if lease.is_some() && ev.recording == Recording::Never {
        return Err(RedisError::Unsupported(
            "an acquire that records nothing across cluster slots".into(),
        ));
    }
    if ev.shape.has_and() {
        return Err(RedisError::Unsupported(
            "an `and` rule across cluster slots: give its leaves a common selector or hash tag"
                .into(),
        ));
    }
    if let Some(penalty_key) = hit.penalty_identifier {
        let call = Call {
            mode: "pcheck",
            keys: vec![key(penalty_key)],
            args: penalty_args(hit),
        };
        let wait: u64 = store.split_call(call).await?;
        if wait > 0 {
            let quota = micro(&ev.quotas[0])?;
            return Ok(Decision {
                denial: Some(Denial::Penalized {
                    retry_after: ticks(wait, TICK_NS),
                }),
                limit: quota.capacity(),
                remaining: 0,
                reset_after: ticks(wait, TICK_NS),
                leaf: 0,
            });
        }
    }

    let mut groups: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
    for (i, id) in hit.identifiers.iter().enumerate() {
        groups.entry(slot_of(id)).or_default().push(i);
    }
    let token = store.next_token();
    let mode = if ev.recording == Recording::Never {
        "judge"
    } else {
        "reserve"
    };
    let mut verdicts: Vec<Option<Verdict>> = vec![None; hit.identifiers.len()];
    let mut reserved: Vec<(Vec<usize>, u64)> = Vec::new();
    let mut denied_leaves: Vec<usize> = Vec::new();
    for leaves in groups.values() {
        let mut args = leaf_args(hit, leaves, token)?;
        args.extend(lease.map(|id| id.to_string()));
        let call = Call {
            mode,
            keys: keys_of(hit, leaves),
            args,
        };
        let reply: Vec<i64> = store.split_call(call).await?;
        if reply.len() != 1 + leaves.len() * 6 {
            return Err(RedisError::Reply(format!("reserve answered {reply:?}")));
        }
        let at = reply[0] as u64;
        let mut taken = Vec::new();
        for (n, &i) in leaves.iter().enumerate() {
            let r = &reply[1 + n * 6..7 + n * 6];
            let retry = match r[4] {
                -1 => Retry::Now,
                -2 => Retry::Never,
                after => Retry::After(after as u64),
            };
            verdicts[i] = Some(Verdict {
                allowed: r[0] == 1,
                limit: r[1] as u64,
                remaining: r[2] as u64,
                reset_after: r[3] as u64,
                retry,
            });
            if r[5] == 1 {
                taken.push(i);
            } else {
                denied_leaves.push(i);
            }
        }
        if !taken.is_empty() {
            reserved.push((taken, at));
        }
    }
    let verdicts: Vec<Verdict> = verdicts
        .into_iter()
        .map(|v| v.expect("every leaf judged"))
        .collect();
    let mut decision = decide_verdicts(ev.shape, &verdicts, TICK_NS);

    if ev.recording != Recording::Never && ev.cost > 0 {
        if ev.recording.records_decision(&decision) {
            // Record the hit where it was not reserved, slot by slot.
            let mut by_slot: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
            for &i in &denied_leaves {
                by_slot
                    .entry(slot_of(&hit.identifiers[i]))
                    .or_default()
                    .push(i);
            }
            for leaves in by_slot.values() {
                let call = Call {
                    mode: "commit",
                    keys: keys_of(hit, leaves),
                    args: leaf_args(hit, leaves, token)?,
                };
                let _: i64 = store.split_call(call).await?;
            }
        } else {
            for (leaves, at) in &reserved {
                let keys = keys_of(hit, leaves);
                let mut args = leaf_args(hit, leaves, token)?;
                args.push(at.to_string());
                let _: i64 = store
                    .split_call(Call {
                        mode: "undo",
                        keys,
                        args,
                    })
                    .await?;
            }
        }
    }

    if let Some(id) = lease.filter(|_| !decision.allowed()) {
        // Denied: the leases held as reservations go (kept ones included, when the policy
        // counts denied attempts: those count the rate leaves only).
        let held: Vec<usize> = reserved
            .iter()
            .flat_map(|(leaves, _)| leaves.iter().copied())
            .filter(|&i| ev.quotas[i].algorithm() == Algorithm::Concurrency)
            .collect();
        if !held.is_empty() {
            let identifiers: Vec<_> = held.iter().map(|&i| hit.identifiers[i].clone()).collect();
            let quotas: Vec<_> = held.iter().map(|&i| ev.quotas[i]).collect();
            let keys = LeaseKeys {
                identifiers: &identifiers,
                quotas: &quotas,
                held_for: None,
            };
            store.release_lease(&keys, id).await?;
        }
    }

    if let (Some(penalty_key), Some(Denial::Limited { retry_after })) =
        (hit.penalty_identifier, decision.denial)
        && ev.recording != Recording::Never
    {
        let call = Call {
            mode: "pstrike",
            keys: vec![key(penalty_key)],
            args: penalty_args(hit),
        };
        let wait: u64 = store.split_call(call).await?;
        let wait = ticks(wait, TICK_NS);
        if retry_after < wait {
            decision.denial = Some(Denial::Penalized { retry_after: wait });
            decision.reset_after = decision.reset_after.max(wait);
        }
    }
    Ok(decision)
}
