//! Concurrency: at most N leases held at once, each with an expiry.
//!
//! The state is the set of held leases, `(id, expires_at)`. Acquiring drops the expired ones,
//! admits when fewer than N remain and adds the new lease, expiring one lease time later.
//! Releasing removes a lease at once; renewing pushes its expiry one lease time past `now`.
//! A holder that vanishes without releasing loses its slot when its lease expires.
//!
//! Exact: no interleaving of acquires can hold more than N unexpired leases, since every
//! step here runs on the whole set at once (a store runs it under a lock or in one script).
//!
//! In a verdict, `remaining` is the number of free slots and `reset_after` the time until
//! every lease held has expired. A denied acquire's `retry` is the time until enough held
//! leases *expire*: a bound, not a promise. A holder may release sooner (a slot frees at
//! once) or renew (its expiry moves later); [`crate::Denial::Occupied`] says so to callers.
//!
//! ```
//! use sluice_core::algorithm::concurrency::{self, Leases, Released};
//! use sluice_core::{Algorithm, Quota, Rule};
//!
//! let rule: Rule = "user:2 concurrent lease=30s".parse().unwrap();
//! let quota = Quota::from_leaf(rule.leaves()[0], Algorithm::Gcra).unwrap();
//! let mut leases = Leases::default();
//! let s = 1_000_000_000;
//! assert!(concurrency::acquire(&quota, &mut leases, 0, 1).allowed);
//! assert!(concurrency::acquire(&quota, &mut leases, 0, 2).allowed);
//! assert!(!concurrency::acquire(&quota, &mut leases, s, 3).allowed); // both slots held
//! assert_eq!(concurrency::release(&mut leases, s, 1), Released::Released);
//! assert!(concurrency::acquire(&quota, &mut leases, s, 3).allowed);
//! // Lease 2 was never renewed: it expired 30 s after it was taken, and says so.
//! assert_eq!(concurrency::release(&mut leases, 31 * s, 2), Released::Expired);
//! ```

use crate::algorithm::{Quota, Retry, Verdict};

/// Most concurrent slots one leaf may hold: the state keeps one entry per held lease.
pub const MAX_CONCURRENT: u64 = 1_000_000;

/// The default lease time, when a concurrency leaf names none: 60 s.
pub const DEFAULT_LEASE_NANOS: u64 = 60 * 1_000_000_000;

/// Held leases as `(id, expires_at)`, in the order they were taken. Expired leases may
/// linger until the next step that drops them; no answer counts them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Leases {
    held: Vec<(u64, u64)>,
}

impl Leases {
    /// Rebuilds a set from `(id, expires_at)` pairs.
    pub fn from_leases(held: impl IntoIterator<Item = (u64, u64)>) -> Leases {
        Leases {
            held: held.into_iter().collect(),
        }
    }

    /// Every lease kept, expired or not, as `(id, expires_at)`.
    pub fn leases(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.held.iter().copied()
    }

    /// Leases not expired at `now` (a lease expiring exactly at `now` has expired).
    pub fn held(&self, now: u64) -> u64 {
        self.held.iter().filter(|(_, at)| *at > now).count() as u64
    }

    /// The expiry of lease `id`, if it is held at `now`.
    pub fn expiry(&self, id: u64, now: u64) -> Option<u64> {
        self.held
            .iter()
            .find(|(held, at)| *held == id && *at > now)
            .map(|(_, at)| *at)
    }

    /// Drops the leases expired at `now`; returns how many (a store counts them: a lease that
    /// expired instead of being released belonged to a holder that vanished).
    pub fn drop_expired(&mut self, now: u64) -> u64 {
        let before = self.held.len();
        self.held.retain(|(_, at)| *at > now);
        (before - self.held.len()) as u64
    }

    /// When every lease held has expired (0 when none is held).
    pub fn expires_at(&self) -> u64 {
        self.held.iter().map(|(_, at)| *at).max().unwrap_or(0)
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

/// What an acquire of `cost` slots at `now` would get. Changes nothing.
///
/// Admitted when the unexpired leases plus `cost` fit in the limit. `retry` is the time until
/// enough of the held leases expire (see the module docs), `Never` when `cost` is above the
/// limit.
pub fn verdict(quota: &Quota, leases: &Leases, now: u64, cost: u64) -> Verdict {
    let limit = quota.limit();
    let held = leases.held(now);
    let lease = quota.window_ticks();
    let last = leases.expires_at().saturating_sub(now);
    if held.saturating_add(cost) <= limit {
        return Verdict {
            allowed: true,
            limit,
            remaining: limit - held - cost,
            reset_after: if cost > 0 { last.max(lease) } else { last },
            retry: Retry::Now,
        };
    }
    let retry = if cost > limit {
        Retry::Never
    } else {
        // `cost` slots are free once the `held + cost - limit` earliest leases have expired.
        let mut expiries: Vec<u64> = leases
            .held
            .iter()
            .map(|(_, at)| *at)
            .filter(|at| *at > now)
            .collect();
        expiries.sort_unstable();
        // `held` counts exactly these expiries, and `cost <= limit`, so `needed <= held`.
        let needed = (held + cost - limit) as usize;
        let at = expiries.get(needed.saturating_sub(1)).copied();
        Retry::After(at.map_or(0, |at| at - now))
    };
    Verdict {
        allowed: false,
        limit,
        remaining: limit.saturating_sub(held),
        reset_after: last,
        retry,
    }
}

/// Takes lease `id` at `now` if a slot is free: drops the expired leases, then adds `id`
/// expiring one lease time later. A denied acquire still drops the expired leases (that
/// changes no answer). Taking an id already held renews it instead of holding two slots.
#[inline]
pub fn acquire(quota: &Quota, leases: &mut Leases, now: u64, id: u64) -> Verdict {
    leases.drop_expired(now);
    // Every lease left is unexpired: one pass finds `id` and the latest expiry, and the
    // count is the length, so the common acquire (a free slot) makes no other pass. The
    // separate passes cost 45 of the memory store's 752 instructions per acquire and
    // release (callgrind, `benches/leases.rs`); `tests/concurrency_vectors.rs` checks that
    // this is the definition below, step by step.
    let (mut last, mut renewing) = (0, false);
    for (held, at) in &leases.held {
        if *held == id {
            renewing = true;
            break;
        }
        last = last.max(*at);
    }
    if renewing {
        renew(quota, leases, now, id);
        return verdict(quota, leases, now, 0);
    }
    let (limit, held) = (quota.limit(), leases.held.len() as u64);
    if held < limit {
        let lease = quota.window_ticks();
        leases.held.push((id, now.saturating_add(lease)));
        return Verdict {
            allowed: true,
            limit,
            remaining: limit - held - 1,
            reset_after: last.saturating_sub(now).max(lease),
            retry: Retry::Now,
        };
    }
    verdict(quota, leases, now, 1)
}

/// Adds lease `id` at `now` whether a slot is free or not (renewing it if already held).
///
/// For a rule that admitted the hit as a whole: as every leaf records an admitted hit, every
/// concurrency leaf holds its lease, even one that an `and` let past its limit (it then
/// holds more than its count until leases go). Alone or in an `or`, a leaf admits only when
/// a slot is free, and never holds more than its count.
pub fn hold(quota: &Quota, leases: &mut Leases, now: u64, id: u64) {
    if renew(quota, leases, now, id).is_none() {
        leases
            .held
            .push((id, now.saturating_add(quota.window_ticks())));
    }
}

/// What a release found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Released {
    /// The lease was held; its slot is free now.
    Released,
    /// The lease had expired (its slot was already free); it is gone now.
    Expired,
    /// No such lease: released before, expired and dropped, or never taken. Harmless.
    NotHeld,
}

impl Released {
    /// `released`, `expired` or `not_held`, for answers and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Released::Released => "released",
            Released::Expired => "expired",
            Released::NotHeld => "not_held",
        }
    }
}

/// Releases lease `id` at `now`. Releasing twice, or a lease that expired, changes nothing
/// but is reported.
#[inline]
pub fn release(leases: &mut Leases, now: u64, id: u64) -> Released {
    match leases.held.iter().position(|(held, _)| *held == id) {
        Some(at) => {
            let (_, expires_at) = leases.held.swap_remove(at);
            if expires_at > now {
                Released::Released
            } else {
                Released::Expired
            }
        }
        None => Released::NotHeld,
    }
}

/// Extends lease `id` to one lease time past `now`: its new expiry, or `None` if it is not
/// held (released, or expired: an expired lease may already have lost its slot to another
/// holder, so it cannot come back).
pub fn renew(quota: &Quota, leases: &mut Leases, now: u64, id: u64) -> Option<u64> {
    let lease = leases
        .held
        .iter_mut()
        .find(|(held, at)| *held == id && *at > now)?;
    lease.1 = now.saturating_add(quota.window_ticks()).max(lease.1);
    Some(lease.1)
}
