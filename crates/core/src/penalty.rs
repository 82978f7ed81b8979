//! Penalties: timeouts that grow with repeated abuse and heal by themselves, never lockouts.
//!
//! When a policy denies a key, the key serves `base * factor^(strikes-1)`, capped at `max`.
//! Strikes are forgotten once `forget_after` passes without a new one.

use std::time::Duration;

/// A validated penalty configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Penalty {
    base: u64,
    factor: u32,
    max: u64,
    forget_after: u64,
    /// Nanoseconds per tick of the values above (1 unless [`Penalty::with_tick`]).
    tick: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PenaltyError {
    #[error("penalty base must be longer than zero")]
    ZeroBase,
    #[error("penalty factor must be at least 1")]
    ZeroFactor,
    #[error("penalty max must be at least its base")]
    MaxBelowBase,
    #[error("penalty forget_after must be longer than zero")]
    ZeroForget,
    #[error("penalty durations above ten years are not meaningful")]
    TooLong,
}

/// One key's penalty record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PenaltyState {
    pub strikes: u32,
    /// Nanoseconds (caller's epoch) until which the key is boxed.
    pub until: u64,
    pub last_strike: u64,
}

const TEN_YEARS: Duration = Duration::from_secs(10 * 365 * 86_400);

impl Penalty {
    pub fn new(
        base: Duration,
        factor: u32,
        max: Duration,
        forget_after: Duration,
    ) -> Result<Penalty, PenaltyError> {
        if base.is_zero() {
            return Err(PenaltyError::ZeroBase);
        }
        if factor == 0 {
            return Err(PenaltyError::ZeroFactor);
        }
        if max < base {
            return Err(PenaltyError::MaxBelowBase);
        }
        if forget_after.is_zero() {
            return Err(PenaltyError::ZeroForget);
        }
        if max > TEN_YEARS || forget_after > TEN_YEARS {
            return Err(PenaltyError::TooLong);
        }
        Ok(Penalty {
            base: base.as_nanos() as u64,
            factor,
            max: max.as_nanos() as u64,
            forget_after: forget_after.as_nanos() as u64,
            tick: 1,
        })
    }

    /// The same penalty counted in ticks of `tick_ns` nanoseconds (see
    /// [`crate::Quota::with_tick`]), rounding each duration up to a whole tick.
    pub fn with_tick(&self, tick_ns: u64) -> Penalty {
        let tick_ns = tick_ns.max(1);
        Penalty {
            base: self.base.div_ceil(tick_ns),
            factor: self.factor,
            max: self.max.div_ceil(tick_ns),
            forget_after: self.forget_after.div_ceil(tick_ns),
            tick: tick_ns * self.tick,
        }
    }

    /// Nanoseconds per tick of this penalty's record.
    pub fn tick(&self) -> u64 {
        self.tick
    }

    pub fn base(&self) -> Duration {
        crate::decision::ticks(self.base, self.tick)
    }
    pub fn factor(&self) -> u32 {
        self.factor
    }
    pub fn max(&self) -> Duration {
        crate::decision::ticks(self.max, self.tick)
    }
    pub fn forget_after(&self) -> Duration {
        crate::decision::ticks(self.forget_after, self.tick)
    }
    /// Raw values in ticks: base, factor, max, forget_after (for stores that run the
    /// arithmetic elsewhere, such as a Lua script).
    pub fn ticks(&self) -> (u64, u32, u64, u64) {
        (self.base, self.factor, self.max, self.forget_after)
    }

    /// Nanoseconds left in the box at `now`, if boxed.
    pub fn remaining(&self, state: &PenaltyState, now: u64) -> Option<u64> {
        (state.until > now).then(|| state.until - now)
    }

    /// Adds a strike at `now` and boxes the key; returns the nanoseconds it must wait.
    pub fn strike(&self, state: &mut PenaltyState, now: u64) -> u64 {
        if state.strikes > 0 && now.saturating_sub(state.last_strike) >= self.forget_after {
            state.strikes = 0;
        }
        state.strikes = state.strikes.saturating_add(1);
        let growth = (self.factor as u64).saturating_pow(state.strikes - 1);
        let timeout = self.base.saturating_mul(growth).min(self.max);
        state.until = now + timeout;
        state.last_strike = now;
        timeout
    }

    /// When the record no longer matters: the box is over and the strikes are forgotten.
    pub fn expires_at(&self, state: &PenaltyState) -> u64 {
        if state.strikes == 0 {
            return 0;
        }
        state
            .until
            .max(state.last_strike.saturating_add(self.forget_after))
    }
}
