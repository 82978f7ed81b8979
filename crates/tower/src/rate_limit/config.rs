//! A built layer's validated configuration, shared by every service it makes, with the
//! limiter behind it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice_limiter::{Decided, Error, Limiter, PolicyWatch, Selectors};

use crate::challenge::Challenge;
use crate::denied::Hooks;
use crate::filter::Filters;
use crate::headers::{Headers, PolicyFields};
use crate::key::{ClientIpResolver, Key};
use crate::outcome::Outcomes;
use crate::reserve::ReserveConfig;

use super::refusal::Refusal;

/// `check`, or `peek` when `peek`, without a future when the store can answer at once.
pub(crate) fn try_now(
    limiter: &Limiter,
    policy: &PolicyWatch,
    selectors: &Selectors<'_>,
    cost: u64,
    peek: bool,
) -> Option<Result<Decided, Error>> {
    if peek {
        limiter.try_peek_decision_now(policy, selectors, cost)
    } else {
        limiter.try_check_decision_now(policy, selectors, cost)
    }
}

/// What to do with a request that lacks the value of some key (no `X-Api-Key` header, no
/// `username` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum WhenMissing {
    /// Limit all such requests together, as if the value were empty. The default: leaving
    /// a value out must not be a way around the limit.
    #[default]
    Share,
    /// Do not limit such requests at all (another layer or the handler refuses them).
    Skip,
    /// Answer 400 with a problem+json body naming the missing selector.
    Reject,
}

/// Counters a layer keeps about itself (read with `RateLimitLayer::stats`).
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub denied: AtomicU64,
    pub shadow_denied: AtomicU64,
    pub deny_listed: AtomicU64,
    pub failed_open: AtomicU64,
    pub failed_closed: AtomicU64,
    pub outcome_unrecorded: AtomicU64,
    pub challenges_offered: AtomicU64,
    pub challenges_solved: AtomicU64,
    pub challenges_refused: AtomicU64,
    pub reservations_settled: AtomicU64,
    pub reservations_unsettled: AtomicU64,
}

/// A snapshot of a layer's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LayerStats {
    /// Requests refused with 429 (the ceiling included).
    pub denied: u64,
    /// Requests a shadow layer or policy would have refused, let through.
    pub shadow_denied: u64,
    /// Requests refused with 403 by the deny list.
    pub deny_listed: u64,
    /// Requests admitted because the limiter could not decide and the layer fails open.
    pub failed_open: u64,
    /// Requests answered 503 because the limiter could not decide.
    pub failed_closed: u64,
    /// Matching outcomes that could not be recorded (the limiter failed after the response).
    pub outcome_unrecorded: u64,
    pub challenges_offered: u64,
    pub challenges_solved: u64,
    pub challenges_refused: u64,
    /// Reservations settled at the actual cost their response reported (counted once the
    /// store has settled them).
    pub reservations_settled: u64,
    /// Admitted reservations whose estimate stands: the response reported no actual cost
    /// (or an unreadable one), the inner service failed, or settling failed.
    pub reservations_unsettled: u64,
}

impl Stats {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> LayerStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LayerStats {
            denied: get(&self.denied),
            shadow_denied: get(&self.shadow_denied),
            deny_listed: get(&self.deny_listed),
            failed_open: get(&self.failed_open),
            failed_closed: get(&self.failed_closed),
            outcome_unrecorded: get(&self.outcome_unrecorded),
            challenges_offered: get(&self.challenges_offered),
            challenges_solved: get(&self.challenges_solved),
            challenges_refused: get(&self.challenges_refused),
            reservations_settled: get(&self.reservations_settled),
            reservations_unsettled: get(&self.reservations_unsettled),
        }
    }
}

/// The challenge offered to denied clients, and the ceiling on what solving can buy.
pub(crate) struct ChallengeConfig {
    pub challenge: Arc<dyn Challenge>,
    pub ceiling: String,
    pub ceiling_fields: PolicyFields,
    pub pardon: bool,
}

/// What the layer takes for each admitted request: a rate check (the usual), a lease held
/// until the response body ends (a policy with a concurrency leaf), or a reservation settled
/// at the response's actual cost.
pub(crate) enum Hold {
    Check,
    Lease,
    Reserve(ReserveConfig),
}

pub(crate) struct Config {
    pub limiter: Arc<Limiter>,
    /// The policy, by name: follows the limiter's reloads.
    pub policy: PolicyWatch,
    pub fields: PolicyFields,
    /// This policy's refusals, pre-rendered.
    pub refusal: Refusal,
    /// Selector name and the key supplying it, in the order given.
    pub keys: Vec<(String, Key)>,
    /// The one key is the client address, unmapped, and outcomes are not counted: the
    /// selector is the address's key itself, with no list of values to build.
    pub client_ip_only: bool,
    /// Decided on the request in place (see `quick.rs`): set from the rest once built.
    pub quick: bool,
    pub needs_body: bool,
    /// Body keys, leases and reservations always take the async path.
    pub always_slow: bool,
    pub hold: Hold,
    pub needs_client_ip: bool,
    pub client_ip: ClientIpResolver,
    /// Leave the resolved address in the request's extensions.
    pub client_ip_extension: bool,
    pub filters: Filters,
    pub shadow: bool,
    pub outcomes: Option<Outcomes>,
    pub headers: Headers,
    pub when_missing: WhenMissing,
    pub hooks: Hooks,
    pub challenge: Option<ChallengeConfig>,
    pub fail_open: bool,
    pub wait_up_to: Option<Duration>,
    pub max_body: usize,
    pub stats: Stats,
}
