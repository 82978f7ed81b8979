//! Heavy hitters and recent refusals: `GET /v1/top?policy=P&n=20` (without `policy`, every
//! policy) and `GET /v1/refusals?n=50`, newest first. The JSON shapes are the types'
//! `Serialize` (see [`crate::top`]). A bad `n` or an unknown parameter gets 400, an unknown
//! policy 404, and nothing is changed by either.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use super::problem;
use crate::service::Service;
use crate::top::{SLOT, SLOTS};

/// Values of each kind answered when `n` is not given (fewer if K is smaller).
const DEFAULT_TOP: usize = 20;
/// Refusals answered when `n` is not given (fewer if fewer are kept).
const DEFAULT_REFUSALS: usize = 50;

/// The routes over `service`, to merge into the main router.
pub(super) fn router(service: Arc<Service>) -> Router {
    Router::new()
        .route("/v1/top", get(top))
        .route("/v1/refusals", get(refusals))
        .with_state(service)
}

type Params = Result<Query<Vec<(String, String)>>, QueryRejection>;

/// A request answered 400 with this message.
type BadRequest = String;

fn bad_request(message: BadRequest) -> Response {
    problem(StatusCode::BAD_REQUEST, message)
}

/// The query's parameters, each of `known` at most once; anything else is a bad request.
fn read<const N: usize>(
    params: Params,
    known: [&str; N],
) -> Result<[Option<String>; N], BadRequest> {
    let Query(pairs) = params.map_err(|e| format!("invalid query: {e}"))?;
    let mut values = [const { None }; N];
    for (name, value) in pairs {
        let Some(i) = known.iter().position(|k| *k == name) else {
            let name: String = name.chars().take(64).collect();
            return Err(format!(
                "unknown parameter `{name}` (known: {})",
                known.join(", ")
            ));
        };
        if values[i].replace(value).is_some() {
            return Err(format!("parameter `{name}` given twice"));
        }
    }
    Ok(values)
}

/// `n` as given, or `default`, within `1..=most`.
fn count(n: Option<String>, default: usize, most: usize) -> Result<usize, BadRequest> {
    let Some(text) = n else {
        return Ok(default.min(most));
    };
    match text.parse::<usize>() {
        Ok(n) if (1..=most).contains(&n) => Ok(n),
        _ => {
            let text: String = text.chars().take(32).collect();
            Err(format!(
                "`n` must be a whole number from 1 to {most}, not `{text}`"
            ))
        }
    }
}

async fn top(State(service): State<Arc<Service>>, params: Params) -> Response {
    answer_top(&service, params).unwrap_or_else(bad_request)
}

fn answer_top(service: &Service, params: Params) -> Result<Response, BadRequest> {
    let [policy, n] = read(params, ["policy", "n"])?;
    let k = service.heavy_hitters().capacity();
    if k == 0 {
        return Ok(problem(
            StatusCode::NOT_FOUND,
            "heavy hitters are off (ServiceBuilder::top(0))".into(),
        ));
    }
    let n = count(n, DEFAULT_TOP, k)?;
    Ok(match policy {
        Some(name) => match service.top(&name, n) {
            Some(top) => Json(top).into_response(),
            None => problem(
                StatusCode::NOT_FOUND,
                sluice_limiter::Error::unknown_policy(&name).to_string(),
            ),
        },
        None => Json(json!({
            "window_seconds": (SLOT * SLOTS as u32).as_secs(),
            "policies": service.top_all(n),
        }))
        .into_response(),
    })
}

async fn refusals(State(service): State<Arc<Service>>, params: Params) -> Response {
    answer_refusals(&service, params).unwrap_or_else(bad_request)
}

fn answer_refusals(service: &Service, params: Params) -> Result<Response, BadRequest> {
    let [n] = read(params, ["n"])?;
    let kept = service.heavy_hitters().refusals_capacity();
    if kept == 0 {
        return Ok(problem(
            StatusCode::NOT_FOUND,
            "recent refusals are off (ServiceBuilder::refusals(0))".into(),
        ));
    }
    let n = count(n, DEFAULT_REFUSALS, kept)?;
    Ok(Json(json!({ "refusals": service.recent_refusals(n) })).into_response())
}
