//! Errors of the memcached store, and which of them a retry may cure.

use std::time::Duration;

use sluice_limiter::StoreError;

/// What went wrong talking to memcached.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum MemcachedError {
    #[error("bad store URL {0}")]
    Url(String),
    /// The server could not be reached, or dropped the connection.
    #[error("memcached {server}: {message}")]
    Io { server: String, message: String },
    #[error("memcached did not answer within {0:?}")]
    Timeout(Duration),
    /// The server answered `SERVER_ERROR` (out of memory, say).
    #[error("memcached {server} failed: {message}")]
    Server { server: String, message: String },
    /// A reply broke the protocol, or the server did not understand a command.
    #[error("memcached {server}: protocol error: {message}")]
    Protocol { server: String, message: String },
    /// A value under one of our keys that no sluice version wrote.
    #[error("memcached key {key}: cannot read the stored value: {why}")]
    Corrupt { key: String, why: String },
    /// Other clients kept changing the key between our read and our write.
    #[error("memcached key {key}: contention exhausted {tries} compare-and-swap tries")]
    Contention { key: String, tries: u32 },
    /// Every server of the pool is marked down.
    #[error("no memcached server is available")]
    NoServer,
    #[error("not supported on memcached: {0}")]
    Unsupported(String),
}

impl MemcachedError {
    /// Whether the same call may succeed later (a server down, busy or contended), as
    /// opposed to a mistake that will repeat.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            MemcachedError::Io { .. }
                | MemcachedError::Timeout(_)
                | MemcachedError::Server { .. }
                | MemcachedError::Contention { .. }
                | MemcachedError::NoServer
        )
    }
}

impl From<MemcachedError> for StoreError {
    fn from(error: MemcachedError) -> StoreError {
        match error {
            MemcachedError::Timeout(after) => StoreError::Timeout(after),
            e if e.is_transient() => StoreError::Unavailable(e.to_string()),
            e => StoreError::Protocol(e.to_string()),
        }
    }
}
