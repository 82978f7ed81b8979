//! The fuzz targets: one function per parser of outside input, each checking properties
//! beyond "does not panic". `src/bin/sluice-fuzz.rs` hands them to AFL++ (see `README.md`);
//! `tests/corpus.rs` replays the committed corpora through the same functions on every
//! `cargo test`.
//!
//! Every target also holds a memory bound: the heap an input may hold at its peak, beyond
//! what was held before, is at most [`Target::budget`] of its length. A parser that can be
//! made to allocate far more than it was sent is a denial of service waiting to happen.

#![forbid(unsafe_code)]

mod http;
mod resp;
mod stores;
mod text;

use std::sync::Mutex;

use peak_alloc::PeakAlloc;

/// Counts live and peak heap bytes, so a target can be held to its memory bound.
#[global_allocator]
static HEAP: PeakAlloc = PeakAlloc;

/// Every input a target reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A rule (`ip:10/s; user:100/m`): parses, and prints back to text that parses equal.
    Rule,
    /// A policies config file (TOML): a config that validates builds a limiter.
    Config,
    /// An envoyproxy/ratelimit YAML config: one that validates builds a limiter.
    EnvoyConfig,
    /// A stream sent to the Redis protocol listener: read the same however it is split,
    /// every command answered with one well-formed reply.
    Resp,
    /// A body sent to the HTTP API (`/v1/check`, `/v1/peek`, `/v1/reset`, `/json`):
    /// answered without a server error, in JSON.
    Http,
    /// Replies from a memcached server, and the values it holds: read the same however the
    /// stream is split.
    MemcachedReply,
    /// A store URL (`redis://`, `redis+cluster://`, `redis+sentinel://`, `memcached://`).
    StoreUrl,
    /// A reply of the Redis decision script: a decision read from it admits only when the
    /// reply says so.
    RedisReply,
    /// Forwarding headers and proof-of-work answers sent to the tower layer: an untrusted
    /// peer cannot name its own address, a forged answer never passes.
    Tower,
}

impl Target {
    pub const ALL: [Target; 9] = [
        Target::Rule,
        Target::Config,
        Target::EnvoyConfig,
        Target::Resp,
        Target::Http,
        Target::MemcachedReply,
        Target::StoreUrl,
        Target::RedisReply,
        Target::Tower,
    ];

    /// The name on the command line and of the corpus directory.
    pub fn name(self) -> &'static str {
        match self {
            Target::Rule => "rule",
            Target::Config => "config",
            Target::EnvoyConfig => "envoy_config",
            Target::Resp => "resp",
            Target::Http => "http",
            Target::MemcachedReply => "memcached_reply",
            Target::StoreUrl => "store_url",
            Target::RedisReply => "redis_reply",
            Target::Tower => "tower",
        }
    }

    pub fn from_name(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Most heap bytes an input of `len` bytes may hold at once while it is handled: a
    /// fixed allowance for the target's own structures plus a multiple of the input.
    pub fn budget(self, len: usize) -> usize {
        let (fixed, per_byte) = match self {
            Target::Rule | Target::StoreUrl | Target::RedisReply | Target::Tower => (64 << 10, 16),
            Target::Config | Target::EnvoyConfig => (256 << 10, 64),
            Target::Resp | Target::MemcachedReply => (256 << 10, 8),
            Target::Http => (1 << 20, 16),
        };
        fixed + per_byte * len
    }

    /// Runs the target on `data`, panicking (a crash, to the fuzzer) when a property or the
    /// memory bound fails.
    pub fn run(self, data: &[u8]) {
        // One input at a time in this process: the heap counters are process-wide, so a
        // target set up on another thread would count against this one's budget.
        static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
        let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        match self {
            Target::Rule => text::rule(data),
            Target::Config => text::config(data),
            Target::EnvoyConfig => text::envoy_config(data),
            Target::Resp => resp::stream(data),
            Target::Http => http::body(data),
            Target::MemcachedReply => stores::memcached_reply(data),
            Target::StoreUrl => stores::url(data),
            Target::RedisReply => stores::redis_reply(data),
            Target::Tower => http::tower(data),
        }
    }

    /// Runs `handle` (the part of the target that reads an input of `len` bytes; what the
    /// target sets up first, a runtime or a service, is not counted) and panics if it held
    /// more heap at once than [`Target::budget`].
    fn hold<T>(self, len: usize, handle: impl FnOnce() -> T) -> T {
        let before = HEAP.current_usage();
        HEAP.reset_peak_usage();
        let out = handle();
        let peak = HEAP.peak_usage().saturating_sub(before);
        let budget = self.budget(len);
        assert!(
            peak <= budget,
            "{}: {len} input bytes held {peak} heap bytes at the peak, over the budget of {budget}",
            self.name(),
        );
        out
    }
}

/// The split points a streaming property is checked at: every one for short inputs, an
/// even spread of 64 for long ones.
fn split_points(len: usize) -> impl Iterator<Item = usize> {
    let step = if len <= 256 { 1 } else { len / 64 };
    (0..=len).step_by(step.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_input_over_its_memory_budget_fails() {
        let result = std::panic::catch_unwind(|| {
            Target::Rule.hold(10, || std::hint::black_box(vec![0u8; 1 << 20]).len())
        });
        assert!(result.is_err(), "a megabyte for 10 bytes of rule passed");
        assert_eq!(Target::Rule.hold(10, || vec![0u8; 1000].len()), 1000);
    }
}
