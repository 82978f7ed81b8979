//! Who may see the live page: nobody (the default), anyone on a loopback listener, or the
//! holders of a token.

use axum::http::{HeaderMap, header};
use serde::Deserialize;

/// Who may see the live page.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum UiAccess {
    /// No page: `/ui` and `/v1/ui/state` answer 404 (the default).
    #[default]
    Off,
    /// Anyone who reaches the listener (for a listener on loopback).
    Open,
    /// Requests carrying this token, as `?token=` or `Authorization: Bearer`.
    Token(String),
}

impl UiAccess {
    pub(super) fn allows(&self, query: &TokenQuery, headers: &HeaderMap) -> bool {
        match self {
            UiAccess::Off => false,
            UiAccess::Open => true,
            UiAccess::Token(expected) => {
                let bearer = headers
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "));
                [query.token.as_deref(), bearer]
                    .into_iter()
                    .flatten()
                    .any(|given| same(given.as_bytes(), expected.as_bytes()))
            }
        }
    }
}

/// Compares without stopping at the first difference, so the time taken tells nothing of
/// how much of a guessed token was right.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[derive(Debug, Deserialize)]
pub(super) struct TokenQuery {
    token: Option<String>,
}
