//! Settling a reservation: a hit admitted on an estimated cost, charged its actual cost once
//! that is known.
//!
//! The reservation was recorded at `taken_at` with the estimate, as any hit. Settling charges
//! the difference, per algorithm:
//!
//! - GCRA: a refund moves the TAT back by the refunded cost's intervals, a debt moves it
//!   forward from `max(TAT, now)`: the next admissions wait for it. A refund never gives back
//!   more than the reservation took, and a bucket already full stays full.
//! - Fixed window: the counter of the window the reservation was taken in, if that window is
//!   still the one counted; after it ended, nothing changes (the estimate stood for that
//!   window, and a debt does not follow into the next).
//! - Sliding window: the counter of the sub-window the reservation was taken in, while it is
//!   still one of the counted sub-windows; after that, nothing changes.
//! - Sliding log: the entry at `taken_at`, while it is in the log (a debt is added to it, a
//!   refund taken from it); after it slid out, nothing changes.
//! - Concurrency: nothing (a reservation holds no lease).
//!
//! Bound: every admission is decided on the charges recorded when it is made, so in any
//! window the cost admitted on estimates stays within the limit. Settling for more than the
//! estimate is never refused: over a window, the total charged can exceed the limit by the
//! debts settled in it (each at most `actual - estimate`), and the debt then delays the next
//! admissions by as much. A reservation never settled keeps its estimate.

use crate::algorithm::{Quota, State};

impl Quota {
    /// Charges a reservation of `reserved` taken at `taken_at` its `actual` cost at `now`
    /// (see [`crate::algorithm::settle`] for what each algorithm does). Returns whether `state` changed.
    pub fn settle(
        &self,
        state: &mut State,
        now: u64,
        taken_at: u64,
        reserved: u64,
        actual: u64,
    ) -> bool {
        if actual == reserved || !self.fits(state) {
            return false;
        }
        let refund = reserved.saturating_sub(actual);
        let debt = actual.saturating_sub(reserved);
        match state {
            State::Gcra { tat } => {
                let interval = self.interval_ticks();
                let before = *tat;
                *tat = if refund > 0 {
                    tat.saturating_sub(refund.saturating_mul(interval))
                } else {
                    (*tat)
                        .max(now)
                        .saturating_add(debt.saturating_mul(interval))
                };
                *tat != before
            }
            State::FixedWindow { window, count } => {
                let taken = taken_at / self.window_ticks();
                if *window != taken || now / self.window_ticks() != taken {
                    return false;
                }
                *count = count.saturating_sub(refund).saturating_add(debt);
                true
            }
            State::SlidingWindow(counters) => {
                let number = taken_at / self.sub_window_ticks();
                let counted = number + u64::from(self.windows()) > now / self.sub_window_ticks();
                counted && counters.adjust(number, refund, debt)
            }
            State::SlidingLog(log) => {
                let counted = taken_at.saturating_add(self.window_ticks()) > now;
                counted && log.adjust(taken_at, refund, debt)
            }
            State::Concurrency(_) => false,
        }
    }
}
