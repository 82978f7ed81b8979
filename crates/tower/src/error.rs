//! Why a layer cannot be built. (Being limited is never an error: see `Decision`.)

/// A layer's configuration does not fit the limiter's policies.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("the limiter has no policy `{0}`")]
    UnknownPolicy(String),
    #[error("policy `{policy}` needs selector `{selector}`, but the layer has no key for it")]
    NoKey { policy: String, selector: String },
    #[error("the layer has a key for selector `{selector}`, which policy `{policy}` never uses")]
    UnusedKey { policy: String, selector: String },
    #[error("selector `{0}` has two keys")]
    DuplicateKey(String),
    #[error("IP prefixes must be at most 32 (IPv4) and 128 (IPv6)")]
    BadPrefix,
    /// A reservation's `actual_header` is not a valid header name.
    #[error("`{0}` is not a valid header name (for the reservation's actual cost)")]
    BadHeaderName(String),
    /// A reservation on a policy with a concurrency leaf (reservations charge rates).
    #[error(
        "policy `{0}` has a concurrency leaf: a layer reserves only on a policy of rate leaves"
    )]
    ReserveConcurrency(String),
    /// A layer option that does not combine with a concurrency policy or a reservation.
    #[error("policy `{policy}` {kind}: the layer option `{option}` does not apply to it")]
    Incompatible {
        policy: String,
        /// `takes leases` or `reserves`.
        kind: &'static str,
        option: &'static str,
    },
    /// A challenge's ceiling policy with a concurrency leaf (a ceiling is checked).
    #[error("policy `{0}` has a concurrency leaf and cannot be a challenge's ceiling")]
    ConcurrentCeiling(String),
}
