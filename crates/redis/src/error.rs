//! Errors of the Redis store, and which of them a retry may cure.

use redis::{ErrorKind, ServerErrorKind};
use sluice_limiter::StoreError;

/// What went wrong talking to Redis.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RedisError {
    #[error("bad store URL {0}")]
    Url(String),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis did not answer within {0:?}")]
    Timeout(std::time::Duration),
    #[error("unexpected reply from the decision script: {0}")]
    Reply(String),
    #[error("not supported on redis: {0}")]
    Unsupported(String),
    #[error("the decision reached {acked} of the {wanted} replicas asked for in time")]
    Unreplicated { acked: i64, wanted: u32 },
}

impl RedisError {
    /// Whether the same call may succeed later (the server is down, busy, failing over or
    /// resharding), as opposed to a mistake that will repeat.
    pub fn is_transient(&self) -> bool {
        match self {
            RedisError::Timeout(_) | RedisError::Unreplicated { .. } => true,
            RedisError::Redis(e) => {
                e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.is_unrecoverable_error()
                    || matches!(
                        e.kind(),
                        ErrorKind::Io
                            | ErrorKind::ClusterConnectionNotFound
                            // Mid-failover the sentinels may name no master for a moment.
                            | ErrorKind::MasterNameNotFoundBySentinel
                            | ErrorKind::Server(
                                ServerErrorKind::BusyLoading
                                    | ServerErrorKind::TryAgain
                                    | ServerErrorKind::ClusterDown
                                    | ServerErrorKind::MasterDown
                                    | ServerErrorKind::Moved
                                    | ServerErrorKind::Ask
                                    | ServerErrorKind::ReadOnly
                            )
                    )
            }
            _ => false,
        }
    }
}

impl From<RedisError> for StoreError {
    fn from(error: RedisError) -> StoreError {
        match error {
            RedisError::Timeout(after) => StoreError::Timeout(after),
            e if e.is_transient() => StoreError::Unavailable(e.to_string()),
            e => StoreError::Protocol(e.to_string()),
        }
    }
}
