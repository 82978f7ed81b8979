//! envoyproxy/ratelimit's `POST /json`: a `RateLimitRequest` as JSON (protobuf JSON names,
//! camelCase or snake_case), answered with a `RateLimitResponse` as JSON; 429 when over limit.
//! The answer is proto3 JSON as envoyproxy/ratelimit writes it: fields at their default
//! value (0, an empty string, the enum's zero) are left out, enums are names, durations are
//! `"<seconds>s"`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::decide::{Code, EnvoyDescriptor, EnvoyError, EnvoyRequest, unit};
use crate::service::Service;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonResponse<'a> {
    overall_code: &'static str,
    statuses: Vec<JsonStatus<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    response_headers_to_add: Vec<JsonHeader<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonStatus<'a> {
    code: &'static str,
    #[serde(skip_serializing_if = "is_zero")]
    limit_remaining: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    current_limit: Option<JsonLimitOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_until_reset: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonLimitOut<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    name: &'a str,
    #[serde(skip_serializing_if = "is_zero")]
    requests_per_unit: u32,
    #[serde(skip_serializing_if = "is_unknown")]
    unit: &'static str,
}

/// proto3 JSON leaves out a number at its default.
fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// proto3 JSON leaves out an enum at its zero value (`UNKNOWN` for the unit).
fn is_unknown(unit: &&'static str) -> bool {
    *unit == "UNKNOWN"
}

#[derive(Serialize)]
struct JsonHeader<'a> {
    key: &'a str,
    value: &'a str,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hitsAddend")]
    hits_addend: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonLimit>,
    #[serde(default, alias = "hitsAddend")]
    hits_addend: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonLimit {
    #[serde(alias = "requestsPerUnit")]
    requests_per_unit: u32,
    unit: Value,
}

const UNIT_NAMES: [(&str, i32); 8] = [
    ("UNKNOWN", unit::UNKNOWN),
    ("SECOND", unit::SECOND),
    ("MINUTE", unit::MINUTE),
    ("HOUR", unit::HOUR),
    ("DAY", unit::DAY),
    ("MONTH", unit::MONTH),
    ("YEAR", unit::YEAR),
    ("WEEK", unit::WEEK),
];

fn unit_number(v: &Value) -> Option<i32> {
    match v {
        Value::Number(n) => n.as_i64().and_then(|n| i32::try_from(n).ok()),
        Value::String(s) => UNIT_NAMES
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(s))
            .map(|(_, n)| *n),
        _ => None,
    }
}

fn unit_name(n: i32) -> &'static str {
    UNIT_NAMES
        .iter()
        .find(|(_, u)| *u == n)
        .map_or("UNKNOWN", |(name, _)| name)
}

fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::OverLimit => "OVER_LIMIT",
    }
}

fn error(status: StatusCode, message: String) -> Response {
    (status, axum::Json(json!({ "error": message }))).into_response()
}

/// `POST /json`.
pub async fn handler(State(service): State<Arc<Service>>, body: Bytes) -> Response {
    let raw: JsonRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid request: {e}")),
    };
    let mut descriptors = Vec::with_capacity(raw.descriptors.len());
    for d in raw.descriptors {
        let limit = match d.limit {
            Some(l) => match unit_number(&l.unit) {
                Some(u) => Some((l.requests_per_unit, u)),
                None => return error(StatusCode::BAD_REQUEST, "unknown limit unit".into()),
            },
            None => None,
        };
        descriptors.push(EnvoyDescriptor {
            entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
            limit,
            hits_addend: d.hits_addend,
        });
    }
    let request = EnvoyRequest {
        domain: raw.domain,
        descriptors,
        hits_addend: raw.hits_addend,
    };
    let response = match service.should_rate_limit(&request).await {
        Ok(r) => r,
        Err(EnvoyError::Invalid(m)) => return error(StatusCode::BAD_REQUEST, m),
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    let body = JsonResponse {
        overall_code: code_name(response.overall_code),
        statuses: response
            .statuses
            .iter()
            .map(|s| JsonStatus {
                code: code_name(s.code),
                limit_remaining: s.limit_remaining,
                current_limit: s.current_limit.as_ref().map(|l| JsonLimitOut {
                    name: &l.name,
                    requests_per_unit: l.requests_per_unit,
                    unit: unit_name(l.unit),
                }),
                duration_until_reset: s.duration_until_reset.map(|d| format!("{}s", d.as_secs())),
            })
            .collect(),
        response_headers_to_add: response
            .headers
            .iter()
            .map(|(key, value)| JsonHeader { key, value })
            .collect(),
    };
    let status = match response.overall_code {
        Code::Ok => StatusCode::OK,
        Code::OverLimit => StatusCode::TOO_MANY_REQUESTS,
    };
    (status, axum::Json(body)).into_response()
}
