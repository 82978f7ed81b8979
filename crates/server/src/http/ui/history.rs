//! The last minutes of each policy's decision counters, sampled once a second while the live
//! page is on, so a page opened now draws the minutes before it (the page computes the rates
//! from consecutive samples).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde::Serialize;

use crate::service::Service;

/// Samples kept: five minutes, one a second, and one more for the first difference.
const SAMPLES: usize = 301;
const EVERY: Duration = Duration::from_secs(1);

/// One moment's cumulative counts.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds since the Unix epoch.
    pub time: f64,
    /// `(policy, allowed, denied)` for each tracked policy, by name.
    pub counts: Vec<(String, u64, u64)>,
}

/// A bounded ring of samples (about 300 × the policies × 40 bytes).
#[derive(Debug, Default)]
pub struct History {
    samples: Mutex<VecDeque<Sample>>,
}

impl History {
    pub fn push(&self, sample: Sample) {
        let mut samples = self.samples.lock();
        if samples.len() == SAMPLES {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    /// Every sample kept, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().iter().cloned().collect()
    }
}

/// Seconds since the Unix epoch, as the page's times are given.
pub fn unix_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The service's counts now, as a sample.
pub fn sample(service: &Service) -> Sample {
    let time = unix_seconds();
    let mut counts: Vec<(String, u64, u64)> = service
        .metrics()
        .policy_counts()
        .into_iter()
        .map(|(name, c)| (name, c.allowed, c.denied))
        .collect();
    counts.sort();
    Sample { time, counts }
}

/// Samples `service` once a second until the task is aborted (when the server stops).
pub fn spawn(service: Arc<Service>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            service.history().push(sample(&service));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_five_minutes_only() {
        let history = History::default();
        for n in 0..400u32 {
            history.push(Sample {
                time: f64::from(n),
                counts: vec![("api".into(), n.into(), 0)],
            });
        }
        let samples = history.samples();
        assert_eq!(samples.len(), SAMPLES);
        assert_eq!(samples[0].time, 99.0);
        assert_eq!(samples[SAMPLES - 1].time, 399.0);
    }
}
