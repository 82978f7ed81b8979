//! Throughput rounds for the stores' benchmarks, and the one-leaf hit they and some tests
//! send straight to a store.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_core::{Evaluation, Quota, Recording, Shape};
use sluice_limiter::{Hit, Identifier, Store};

/// The middle value (the upper one of an even count).
pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

/// A process's CPU time so far (user + system, from `/proc/PID/stat`), in seconds; `None` is
/// this process. With `children`, the time of its exited and waited-for children is added
/// (stat(5)'s cutime and cstime). `None` if the process is gone.
pub fn cpu_seconds(pid: Option<u32>, children: bool) -> Option<f64> {
    let path = pid.map_or("/proc/self/stat".to_owned(), |p| format!("/proc/{p}/stat"));
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split(' ').collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    // utime, stime, cutime and cstime are fields 14 to 17 of stat(5); `fields` starts at 3.
    let own = ticks(11)? + ticks(12)?;
    let waited = if children {
        ticks(13)? + ticks(14)?
    } else {
        0.0
    };
    // The kernel's clock ticks, 100 a second on Linux.
    Some((own + waited) / 100.0)
}

/// A single-leaf rule of one quota, cost 1, recorded when admitted: what a store sees for
/// the simplest policy.
pub struct OneLeaf {
    shape: Shape,
    quotas: [Quota; 1],
}

impl OneLeaf {
    pub fn new(quota: Quota) -> OneLeaf {
        OneLeaf {
            shape: Shape::Leaf(0),
            quotas: [quota],
        }
    }

    /// A hit of this rule on `identifier` (one element).
    pub fn hit<'a>(&'a self, identifier: &'a [Identifier]) -> Hit<'a> {
        Hit {
            identifiers: identifier,
            evaluation: Evaluation {
                shape: &self.shape,
                quotas: &self.quotas,
                cost: 1,
                recording: Recording::Admitted,
                penalty: None,
            },
            penalty_identifier: None,
        }
    }
}

/// Decisions per second from `callers` tasks deciding one-leaf hits of `quota` on `store`
/// for `round`, each walking `keys` from its own offset with a stride that visits all.
/// Panics unless nearly every hit was admitted (the quota is meant to admit all).
pub async fn decisions_per_second<S: Store + Clone>(
    store: &S,
    quota: Quota,
    keys: Arc<Vec<[Identifier; 1]>>,
    callers: usize,
    round: Duration,
) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for caller in 0..callers {
        let (store, keys, stop, done, admitted) = (
            store.clone(),
            keys.clone(),
            stop.clone(),
            done.clone(),
            admitted.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let rule = OneLeaf::new(quota);
            let mut i = caller * (keys.len() / callers).max(1);
            while !stop.load(Ordering::Relaxed) {
                let hit = rule.hit(&keys[i % keys.len()]);
                let decision = store.decide(&hit).await.expect("a decision");
                admitted.fetch_add(u64::from(decision.allowed()), Ordering::Relaxed);
                done.fetch_add(1, Ordering::Relaxed);
                i = i.wrapping_add(7919);
            }
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(round).await;
    stop.store(true, Ordering::Relaxed);
    let total = done.load(Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    for task in tasks {
        task.await.unwrap();
    }
    assert!(
        admitted.load(Ordering::Relaxed) * 10 >= total * 9,
        "the quota admits nearly all"
    );
    total as f64 / elapsed
}
