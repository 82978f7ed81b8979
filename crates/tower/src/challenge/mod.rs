//! Proving good faith instead of waiting: a denied client may be offered a challenge; a
//! request carrying a correct answer is admitted, within a hard ceiling.
//!
//! Built in: [`ProofOfWork`]. Other challenges (a CAPTCHA service) implement [`Challenge`].
//! The layer owns the rules around them: a solved request is counted against a separate
//! *ceiling* policy, so solving never lets a client past that ceiling, and the challenge is
//! told how often this client has already solved (its *level*) so it can ask for more.

#[cfg(feature = "pow")]
mod nonces;
#[cfg(feature = "pow")]
mod proof_of_work;

use std::future::Future;
use std::pin::Pin;

use http::request::Parts;
use http::{HeaderName, HeaderValue};
use serde_json::{Map, Value};

#[cfg(feature = "pow")]
pub use proof_of_work::{ProofOfWork, SOLUTION_HEADER, leading_zero_bits, solve};

/// Who a challenge is for: the policy and a digest of the client's selector values, so an
/// answer earned by one client (or for one username) is worthless to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subject<'a> {
    pub policy: &'a str,
    /// SHA-256 of the policy name and the selector values.
    pub digest: &'a [u8; 32],
    /// How many solved requests this client has in the ceiling's window: 0 for a first
    /// offence. A challenge may grow harder with it.
    pub level: u64,
}

/// A challenge put in a denial: headers, and fields for the problem+json body's
/// `challenge` member.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Offer {
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub fields: Map<String, Value>,
}

/// The judgement on an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verification {
    Solved,
    /// Wrong, expired, meant for another client, or already used; says which.
    Refused(String),
}

/// A boxed future, so challenges can be trait objects (a CAPTCHA check is a network call).
pub type VerifyFuture<'a> = Pin<Box<dyn Future<Output = Verification> + Send + 'a>>;

/// A way for a denied client to prove good faith.
pub trait Challenge: Send + Sync + 'static {
    /// The answer the request carries, if any (cheap: called on every limited request).
    fn answer<'r>(&self, request: &'r Parts) -> Option<&'r str>;

    /// Judges `answer` for `subject`. An answer must be usable once only.
    fn verify<'a>(&'a self, answer: &'a str, subject: Subject<'a>) -> VerifyFuture<'a>;

    /// The challenge to put in a denial for `subject`.
    fn offer(&self, subject: Subject<'_>) -> Offer;
}
