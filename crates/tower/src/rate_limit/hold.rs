//! Leases and reservations: the decision for a policy with a concurrency leaf (acquire a
//! lease, held by the response body until it ends) or a layer that reserves (admit on an
//! estimate, settle at the response's actual cost). The rate check path never comes here.

use std::sync::Arc;

use http::Response;
use sluice_limiter::{Lease, Reservation};

use super::answer::{failed, unavailable};
use super::config::{Config, Hold, Stats};
use super::decide::{admit, before, refuse_with};
use super::flow::{Before, Ctx};
use super::mode::LayerBody;
use crate::denied::Reason;
use crate::reserve::{NoActual, ReserveConfig};

/// What an admitted request holds until its response is done.
pub(super) enum Held {
    Lease(Lease),
    Reservation(Reservation),
}

/// The decision before the inner service runs, and what the request then holds: a lease
/// or a reservation when the layer takes one and the limiter admitted the request (a
/// shadow denial is admitted without one).
pub(super) async fn before_holding(ctx: &Ctx<'_>) -> (Before, Option<Held>) {
    let config = ctx.config;
    let limiter = &config.limiter;
    let result = match &config.hold {
        Hold::Check => return (before(ctx).await, None),
        Hold::Lease => limiter
            .acquire(&config.policy, ctx.selectors)
            .await
            .map(|acquired| (acquired.checked, acquired.lease.map(Held::Lease))),
        Hold::Reserve(reserve) => {
            let estimate = reserve.estimate(ctx.parts);
            limiter
                .reserve(&config.policy, ctx.selectors, estimate)
                .await
                .map(|reserved| {
                    let held = reserved.reservation.map(Held::Reservation);
                    (reserved.checked, held)
                })
        }
    };
    let (checked, held) = match result {
        Ok(answer) => answer,
        Err(error) => return (failed(ctx, &error), None),
    };
    if checked.decision.allowed() {
        return (admit(ctx, checked.into(), false), held);
    }
    if Reason::of(&checked.decision).is_none() {
        return (unavailable(ctx, &checked.decision), None);
    }
    // Denied: nothing is held. Leases and reservations offer no challenge (build refuses
    // one), and the refusal is already counted by the store.
    (refuse_with(ctx, checked.decision, true, None, None), None)
}

/// The response is ready: a lease moves into its body, a reservation is settled.
pub(super) fn after<B, O: LayerBody<B>>(
    config: &Arc<Config>,
    held: Held,
    response: Response<O>,
) -> Response<O> {
    match held {
        Held::Lease(lease) => response.map(|body| body.holding(lease)),
        Held::Reservation(reservation) => {
            let (head, body) = response.into_parts();
            if let Hold::Reserve(reserve) = &config.hold {
                settle(config, reserve, reservation, &head);
            }
            Response::from_parts(head, body)
        }
    }
}

/// The inner service failed: a lease is released, a reservation keeps its estimate.
pub(super) fn abandon(config: &Config, held: Held) {
    if let Held::Reservation(_) = held {
        Stats::bump(&config.stats.reservations_unsettled);
    }
}

/// Settles `reservation` at the actual cost `head` reports, on a spawned task so the
/// response is not held up by the store. Without an actual cost the estimate stands.
fn settle(
    config: &Arc<Config>,
    reserve: &ReserveConfig,
    reservation: Reservation,
    head: &http::response::Parts,
) {
    let stats = &config.stats;
    let actual = match reserve.actual(head) {
        Ok(actual) => actual,
        Err(why) => {
            if why == NoActual::Unreadable {
                tracing::warn!(
                    policy = %config.policy,
                    "a response's actual cost is not a decimal integer; its estimate stands"
                );
            }
            Stats::bump(&stats.reservations_unsettled);
            return;
        }
    };
    if actual == reservation.estimate() {
        Stats::bump(&stats.reservations_settled);
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(policy = %config.policy, "no tokio runtime to settle a reservation on; its estimate stands");
        Stats::bump(&stats.reservations_unsettled);
        return;
    };
    let config = config.clone();
    runtime.spawn(async move {
        match reservation.settle(actual).await {
            Ok(()) => Stats::bump(&config.stats.reservations_settled),
            Err(error) => {
                tracing::warn!(policy = %config.policy, %error, "could not settle a reservation; its estimate stands");
                Stats::bump(&config.stats.reservations_unsettled);
            }
        }
    });
}
