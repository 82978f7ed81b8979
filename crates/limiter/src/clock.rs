//! Clocks. The only place in sluice that reads the system clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of time: nanoseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> u64;
}

/// Wall-clock time that never goes backwards: read once from the system clock at creation,
/// then advanced by the monotonic clock, so a wall-clock step cannot rewind a limit.
#[derive(Debug, Clone)]
pub struct SystemClock {
    anchor_wall: u64,
    anchor: Instant,
}

impl SystemClock {
    pub fn new() -> SystemClock {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        SystemClock {
            anchor_wall: wall.as_nanos() as u64,
            anchor: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> u64 {
        self.anchor_wall + self.anchor.elapsed().as_nanos() as u64
    }
}

/// A clock that moves only when told to. Clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at `start` nanoseconds.
    pub fn new(start: u64) -> ManualClock {
        ManualClock {
            nanos: Arc::new(AtomicU64::new(start)),
        }
    }

    pub fn advance(&self, by: Duration) {
        self.nanos.fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }

    pub fn set(&self, nanos: u64) {
        self.nanos.store(nanos, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> u64 {
        self.nanos.load(Ordering::SeqCst)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> u64 {
        (**self).now()
    }
}
