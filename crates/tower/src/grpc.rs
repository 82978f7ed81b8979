//! gRPC answers: a denied gRPC call gets a trailers-only response with status
//! `RESOURCE_EXHAUSTED` (8) and the retry delay as a `google.rpc.RetryInfo` detail, the form
//! tonic and other gRPC clients read, plus a plain `retry-after` header.
//!
//! Written with plain headers and a few bytes of hand-encoded protobuf, so supporting tonic
//! costs no dependency on it.

use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderName, HeaderValue, Response};

use crate::denied::{Denied, Reason, detail};

static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
static GRPC_DETAILS: HeaderName = HeaderName::from_static("grpc-status-details-bin");

/// gRPC status codes used here.
pub const RESOURCE_EXHAUSTED: u32 = 8;
pub const PERMISSION_DENIED: u32 = 7;
pub const UNAVAILABLE: u32 = 14;

const RETRY_INFO_URL: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// Whether the request is a gRPC call (`content-type: application/grpc[+proto|...]`).
pub fn is_grpc(parts: &Parts) -> bool {
    parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

pub(crate) fn denied(denied: &Denied<'_>) -> Response<Bytes> {
    let code = match denied.reason {
        Reason::DenyListed => PERMISSION_DENIED,
        _ => RESOURCE_EXHAUSTED,
    };
    let retry = denied.decision.and_then(|d| d.retry_after());
    status(code, &detail(denied), retry)
}

pub(crate) fn unavailable() -> Response<Bytes> {
    status(UNAVAILABLE, "the rate limiter could not decide", None)
}

/// A trailers-only gRPC response carrying `code`, `message` and, when known, the delay.
pub fn status(code: u32, message: &str, retry: Option<Duration>) -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(GRPC_STATUS.clone(), code.into());
    headers.insert(
        GRPC_MESSAGE.clone(),
        HeaderValue::from_str(&percent_encode(message)).expect("percent-encoded is ASCII"),
    );
    if let Some(retry) = retry {
        let details = status_proto(code, message, retry);
        headers.insert(
            GRPC_DETAILS.clone(),
            HeaderValue::from_str(&crate::base64::encode(&details)).expect("base64 is ASCII"),
        );
    }
    crate::headers::retry_after(headers, retry);
    response
}

/// `google.rpc.Status { code, message, details: [Any(RetryInfo { retry_delay })] }`.
pub fn status_proto(code: u32, message: &str, retry: Duration) -> Vec<u8> {
    let mut delay = Vec::new();
    if retry.as_secs() > 0 {
        varint_field(&mut delay, 1, retry.as_secs());
    }
    if retry.subsec_nanos() > 0 {
        varint_field(&mut delay, 2, u64::from(retry.subsec_nanos()));
    }
    let mut retry_info = Vec::new();
    bytes_field(&mut retry_info, 1, &delay);
    let mut any = Vec::new();
    bytes_field(&mut any, 1, RETRY_INFO_URL.as_bytes());
    bytes_field(&mut any, 2, &retry_info);
    let mut status = Vec::new();
    varint_field(&mut status, 1, u64::from(code));
    bytes_field(&mut status, 2, message.as_bytes());
    bytes_field(&mut status, 3, &any);
    status
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn varint_field(out: &mut Vec<u8>, number: u64, value: u64) {
    varint(out, number << 3);
    varint(out, value);
}

fn bytes_field(out: &mut Vec<u8>, number: u64, bytes: &[u8]) {
    varint(out, (number << 3) | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// gRPC's `grpc-message` encoding: bytes outside printable ASCII, and `%`, as `%XX`.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for &b in text.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_info_is_encoded_by_hand_correctly() {
        let bytes = status_proto(8, "x", Duration::from_millis(1500));
        let mut expected = vec![0x08, 8, 0x12, 1, b'x', 0x1a];
        let mut any = vec![0x0a, RETRY_INFO_URL.len() as u8];
        any.extend_from_slice(RETRY_INFO_URL.as_bytes());
        // RetryInfo { retry_delay: Duration { seconds: 1, nanos: 500_000_000 } }
        let delay = [0x08, 1, 0x10, 0x80, 0xca, 0xb5, 0xee, 0x01];
        any.extend_from_slice(&[0x12, delay.len() as u8 + 2, 0x0a, delay.len() as u8]);
        any.extend_from_slice(&delay);
        expected.push(any.len() as u8);
        expected.extend_from_slice(&any);
        assert_eq!(bytes, expected);
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("100% é"), "100%25 %C3%A9");
    }
}
