//! Concurrency leases and reservations over HTTP: `POST /v1/acquire`, `/v1/release`,
//! `/v1/renew`, `/v1/reserve`, `/v1/settle`; and the counted calls the Redis protocol's
//! `SLUICE.ACQUIRE` and friends share with them.
//!
//! A lease or reservation is handed to the client as a token ([`Lease::token`],
//! [`Reservation::token`]) that carries what the store needs: any server on the same store
//! can release, renew or settle it. Tokens are not signed: the service trusts its callers
//! here as it does for `/v1/reset`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use sluice_limiter::lease::TokenError;
use sluice_limiter::{Acquired, Error, Lease, Released, Reservation, Reserved, Selectors};

use super::api::{bad_request, error_response, pairs, parse, read};
use super::decision::decision_json;
use super::problem;
use crate::metrics::LeaseEvent;
use crate::service::Service;

pub(super) fn router(service: Arc<Service>) -> Router {
    Router::new()
        .route("/v1/acquire", post(acquire_route))
        .route("/v1/release", post(release_route))
        .route("/v1/renew", post(renew_route))
        .route("/v1/reserve", post(reserve_route))
        .route("/v1/settle", post(settle_route))
        .with_state(service)
}

/// `/v1/check`'s body; a lease takes one slot, so `cost` may only be 1.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireRequest {
    policy: String,
    #[serde(default)]
    selectors: BTreeMap<String, String>,
    cost: Option<u64>,
}

/// `/v1/check`'s body with the estimate as `cost` or as `estimate`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReserveRequest {
    policy: String,
    #[serde(default)]
    selectors: BTreeMap<String, String>,
    cost: Option<u64>,
    estimate: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseRequest {
    policy: String,
    lease: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleRequest {
    policy: String,
    reservation: String,
    actual: u64,
}

/// Takes a lease on a configured policy, counting the decision as a check's (metrics, heavy
/// hitters, the audit trail of refusals) and the lease.
pub(crate) async fn acquire(
    service: &Service,
    policy: &str,
    selectors: &Selectors<'_>,
) -> Result<Acquired, Error> {
    let metrics = service.metrics();
    let Some(policy) = service.limiter().policy(policy) else {
        metrics.unknown_policy();
        return Err(Error::unknown_policy(policy));
    };
    let started = Instant::now();
    let result = service.limiter().acquire(&policy, selectors).await;
    let outcome = result.as_ref().map(|a| &a.checked);
    metrics.observe_outcome(policy.name(), outcome, started.elapsed());
    if let Ok(acquired) = &result {
        service.observe_checked(policy.name(), selectors, &acquired.checked);
        metrics.leases.count(match acquired.lease {
            Some(_) => LeaseEvent::Acquired,
            None => LeaseEvent::Denied,
        });
        if let Some(lease) = &acquired.lease {
            let now = service.limiter().clock().now();
            // Held until the longest lease time of the rule's concurrency leaves.
            let lease_time = policy
                .leaves
                .iter()
                .filter(|l| l.leaf.is_concurrency())
                .map(|l| l.quota.window_ticks().saturating_mul(l.quota.tick()))
                .max()
                .unwrap_or(0);
            let lease_time = Duration::from_nanos(lease_time);
            metrics
                .leases
                .held
                .granted(policy.name(), lease.id().0, lease_time, now);
        }
    }
    result
}

/// Releases the lease `token` names under `policy`.
pub(crate) async fn release(
    service: &Service,
    policy: &str,
    token: &str,
) -> Result<Released, TokenError> {
    let lease: Lease = service.limiter().lease(policy, token)?;
    let id = lease.id().0;
    let released = lease.release().await?;
    let leases = &service.metrics().leases;
    leases.count(LeaseEvent::Released(released));
    leases.held.ended(id);
    Ok(released)
}

/// Extends the lease `token` names by one lease time: the time it has left, or `None` when
/// it had expired (or was released).
pub(crate) async fn renew(
    service: &Service,
    policy: &str,
    token: &str,
) -> Result<Option<Duration>, TokenError> {
    let lease = service.limiter().lease(policy, token)?;
    let left = lease.renew().await?;
    let leases = &service.metrics().leases;
    leases.count(match left {
        Some(_) => LeaseEvent::Renewed,
        None => LeaseEvent::RenewExpired,
    });
    match left {
        Some(left) => {
            let now = service.limiter().clock().now();
            leases.held.renewed(lease.id().0, left, now);
        }
        None => leases.held.ended(lease.id().0),
    }
    Ok(left)
}

/// Reserves `estimate` on a configured policy, counting the decision as a check's and the
/// reservation.
pub(crate) async fn reserve(
    service: &Service,
    policy: &str,
    selectors: &Selectors<'_>,
    estimate: u64,
) -> Result<Reserved, Error> {
    let metrics = service.metrics();
    let Some(policy) = service.limiter().policy(policy) else {
        metrics.unknown_policy();
        return Err(Error::unknown_policy(policy));
    };
    let started = Instant::now();
    let result = service
        .limiter()
        .reserve(&policy, selectors, estimate)
        .await;
    let outcome = result.as_ref().map(|r| &r.checked);
    metrics.observe_outcome(policy.name(), outcome, started.elapsed());
    if let Ok(reserved) = &result {
        service.observe_checked(policy.name(), selectors, &reserved.checked);
        metrics.leases.count(match reserved.reservation {
            Some(_) => LeaseEvent::Reserved,
            None => LeaseEvent::ReserveDenied,
        });
    }
    result
}

/// Settles the reservation `token` names at its `actual` cost.
pub(crate) async fn settle(
    service: &Service,
    policy: &str,
    token: &str,
    actual: u64,
) -> Result<(), TokenError> {
    let reservation: Reservation = service.limiter().reservation(policy, token)?;
    reservation.settle(actual).await?;
    service.metrics().leases.count(LeaseEvent::Settled);
    Ok(())
}

/// A token error as HTTP: a token that is not one, or not of this policy, is the client's
/// mistake (400); the rest as the policy API answers limiter errors.
fn token_error(error: TokenError) -> Response {
    match error {
        TokenError::Limiter(error) => error_response(error),
        other => problem(StatusCode::BAD_REQUEST, other.to_string()),
    }
}

/// A decision as `/v1/check` answers it, plus `key` (the token, or null when denied).
fn with_token(mut decision: Value, key: &str, token: Option<String>) -> Response {
    if let Value::Object(fields) = &mut decision {
        fields.insert(key.to_owned(), token.map_or(Value::Null, Value::String));
    }
    Json(decision).into_response()
}

async fn acquire_route(State(service): State<Arc<Service>>, body: Bytes) -> Response {
    let request: AcquireRequest = match read(&body, |r: &AcquireRequest| &r.selectors) {
        Ok(r) => r,
        Err(problem) => return problem.into_response(),
    };
    if request.cost.is_some_and(|c| c != 1) {
        let message = "a lease takes one slot: `cost` must be 1 or left out".to_owned();
        return bad_request(message).into_response();
    }
    match acquire(&service, &request.policy, &pairs(&request.selectors)).await {
        Ok(acquired) => {
            let token = acquired.lease.as_ref().map(Lease::token);
            // The lease lives on in the store; its token is the client's handle now.
            if let Some(lease) = acquired.lease {
                lease.forget();
            }
            with_token(decision_json(&acquired.checked), "lease", token)
        }
        Err(e) => error_response(e),
    }
}

async fn release_route(State(service): State<Arc<Service>>, body: Bytes) -> Response {
    let request: LeaseRequest = match parse(&body) {
        Ok(r) => r,
        Err(problem) => return problem.into_response(),
    };
    match release(&service, &request.policy, &request.lease).await {
        Ok(released) => Json(json!({ "released": released.name() })).into_response(),
        Err(e) => token_error(e),
    }
}

async fn renew_route(State(service): State<Arc<Service>>, body: Bytes) -> Response {
    let request: LeaseRequest = match parse(&body) {
        Ok(r) => r,
        Err(problem) => return problem.into_response(),
    };
    match renew(&service, &request.policy, &request.lease).await {
        Ok(Some(left)) => {
            Json(json!({ "renewed": true, "expires_in": left.as_secs_f64() })).into_response()
        }
        Ok(None) => Json(json!({ "renewed": false })).into_response(),
        Err(e) => token_error(e),
    }
}

async fn reserve_route(State(service): State<Arc<Service>>, body: Bytes) -> Response {
    let request: ReserveRequest = match read(&body, |r: &ReserveRequest| &r.selectors) {
        Ok(r) => r,
        Err(problem) => return problem.into_response(),
    };
    let estimate = match (request.cost, request.estimate) {
        (Some(estimate), None) | (None, Some(estimate)) => estimate,
        (Some(_), Some(_)) => {
            let message = "give the estimate once: as `estimate` or as `cost`".to_owned();
            return bad_request(message).into_response();
        }
        (None, None) => {
            let message = "a reservation needs its `estimate` (or `cost`)".to_owned();
            return bad_request(message).into_response();
        }
    };
    let selectors = pairs(&request.selectors);
    match reserve(&service, &request.policy, &selectors, estimate).await {
        Ok(reserved) => {
            let token = reserved.reservation.as_ref().map(Reservation::token);
            with_token(decision_json(&reserved.checked), "reservation", token)
        }
        Err(e) => error_response(e),
    }
}

async fn settle_route(State(service): State<Arc<Service>>, body: Bytes) -> Response {
    let request: SettleRequest = match parse(&body) {
        Ok(r) => r,
        Err(problem) => return problem.into_response(),
    };
    let result = settle(
        &service,
        &request.policy,
        &request.reservation,
        request.actual,
    )
    .await;
    match result {
        Ok(()) => Json(json!({ "settled": true })).into_response(),
        Err(e) => token_error(e),
    }
}
