//! Clocks. The only place in sluice that reads the system clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of time: nanoseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> u64;
}

/// Wall-clock time that never goes backwards: read once from the system clock at creation,
/// then advanced by a monotonic clock, so a wall-clock step cannot rewind a limit.
///
/// The monotonic part is quanta's (the CPU's time-stamp counter where it is reliable, the
/// OS clock otherwise): reading it costs a few nanoseconds instead of a system clock call,
/// which matters on a path that decides a hit in tens of nanoseconds.
#[derive(Debug, Clone)]
pub struct SystemClock {
    anchor_wall: u64,
    clock: quanta::Clock,
    anchor: u64,
}

impl SystemClock {
    pub fn new() -> SystemClock {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let clock = quanta::Clock::new();
        SystemClock {
            anchor_wall: wall.as_nanos() as u64,
            anchor: clock.raw(),
            clock,
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> u64 {
        self.anchor_wall + self.clock.delta_as_nanos(self.anchor, self.clock.raw())
    }
}

/// The memory store's clock: the system clock called directly, so that reading it inlines
/// into the store's steps (an acquire + release through [`Slots`](crate::Slots) reads it
/// twice, and the call through a pointer was about 3 ns of each read, `benches/leases.rs`),
/// and any other clock through a pointer.
#[derive(Clone)]
pub(crate) enum StoreClock {
    System(SystemClock),
    Other(Arc<dyn Clock>),
}

impl StoreClock {
    pub(crate) fn new<C: Clock>(clock: C) -> StoreClock {
        let any: &dyn std::any::Any = &clock;
        if let Some(system) = any.downcast_ref::<SystemClock>() {
            return StoreClock::System(system.clone());
        }
        match any.downcast_ref::<Arc<dyn Clock>>() {
            // A limiter's clock, already shared: not wrapped again.
            Some(shared) => StoreClock::Other(shared.clone()),
            None => StoreClock::Other(Arc::new(clock)),
        }
    }

    #[inline]
    pub(crate) fn now(&self) -> u64 {
        match self {
            StoreClock::System(clock) => clock.now(),
            StoreClock::Other(clock) => clock.now(),
        }
    }
}

/// Real monotonic time in nanoseconds (since this process first asked), for measuring
/// against a remote store's clock (a lease's age): never a limiter's [`Clock`], which a test
/// may hold still while the store's time runs on. A number, so a lease can keep it in an
/// atomic that a renew through a shared reference moves.
pub(crate) fn real_nanos() -> u64 {
    static BASE: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(std::time::Instant::now);
    base.elapsed().as_nanos() as u64
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
