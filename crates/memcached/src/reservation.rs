//! Settling reservations on memcached: each leaf charged the difference between its estimate
//! and its actual cost, as [`sluice_core::algorithm::settle`] says, never refused.
//!
//! A reservation is decided and recorded as any hit (see [`crate::decide`]); the store
//! answers the time it recorded it at, in nanoseconds of its callers' clock (the unit of
//! every time this store keeps, as the memory store's answers are in its clock's). Settling
//! then changes each leaf on its own, leaf after leaf:
//!
//! - GCRA, fixed window, sliding log: a compare-and-swap of the `|s` state running the
//!   core's [`Quota::settle`] (combined with the other updates of that key, see
//!   [`crate::cas`]).
//! - Sliding window counter: the counter of the sub-window the reservation was recorded in,
//!   while it is still counted: `decr` for a refund (memcached stops at 0, as the core
//!   does), `incr` for a debt (created again if it was evicted). A debt is added up to twice
//!   the limit, beyond which a count says nothing more (see `crate::leaf`).
//! - Concurrency: nothing (a reservation holds no lease).
//!
//! Settling is not one atomic step across leaves: a failure between two leaves leaves the
//! first settled and the error is returned (the limiter's reservation settles once; what was
//! not charged stays charged at the estimate).

use std::sync::Arc;

use sluice_core::{Algorithm, Quota};
use sluice_limiter::Settlement;

use crate::MemcachedError;
use crate::cas::{Answer, Plan, update};
use crate::key::Keys;
use crate::leaf::{LIVE_MARGIN, leaf_state, supported};
use crate::pool::Deadline;
use crate::store::Inner;
use crate::value::encode_state;

impl Inner {
    /// Charges `settlement` its actual cost at `now` (see the module documentation).
    pub(crate) async fn settle(
        self: &Arc<Self>,
        settlement: &Settlement<'_>,
        now: u64,
        deadline: Deadline,
    ) -> Result<(), MemcachedError> {
        let Settlement {
            identifiers,
            quotas,
            taken_at,
            reserved,
            actual,
        } = *settlement;
        if actual == reserved {
            return Ok(());
        }
        for (identifier, quota) in identifiers.iter().zip(quotas) {
            let keys = Keys::new(identifier);
            match quota.algorithm() {
                Algorithm::Concurrency => {}
                Algorithm::SlidingWindow => {
                    self.settle_counter(&keys, quota, now, settlement, deadline)
                        .await?;
                }
                _ => {
                    supported(quota)?;
                    let (quota, keys_owned) = (*quota, keys.clone());
                    let plan = Box::new(move |value: Option<&[u8]>| {
                        let state = leaf_state(&quota, &keys_owned, value)?;
                        let mut next = state.clone();
                        if !quota.settle(&mut next, now, taken_at, reserved, actual) {
                            return Ok(Plan::Keep(Answer::Done));
                        }
                        Ok(Plan::Write {
                            value: encode_state(&next),
                            expires_at: quota.expires_at(&next),
                            was_live: value.is_some()
                                && quota.expires_at(&state) > now + LIVE_MARGIN,
                            answer: Answer::Done,
                        })
                    });
                    update(self, &keys, now, deadline, plan).await?;
                }
            }
        }
        Ok(())
    }

    /// Settles a sliding-window leaf: the counter of the reservation's sub-window.
    async fn settle_counter(
        &self,
        keys: &Keys,
        quota: &Quota,
        now: u64,
        settlement: &Settlement<'_>,
        deadline: Deadline,
    ) -> Result<(), MemcachedError> {
        let sub = quota.sub_window_ticks();
        let number = settlement.taken_at / sub;
        if number + u64::from(quota.windows()) <= now / sub {
            return Ok(()); // slid out of the window: the estimate stood
        }
        let (reserved, actual) = (settlement.reserved, settlement.actual);
        if reserved > actual {
            let key = keys.window(number);
            // Gone (evicted, or reset): nothing left to refund.
            self.pool
                .incr(keys.route(), &key, reserved - actual, false, deadline)
                .await?;
        } else {
            let debt = (actual - reserved).min(quota.limit().saturating_mul(2));
            self.increment(keys, number, quota, now, debt, true, deadline)
                .await?;
        }
        Ok(())
    }
}
