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
}
