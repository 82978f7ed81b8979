//! Load on a limiter from many tasks at once, for the stores' fault tests.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_limiter::{Checked, Denial, FailureMode, Limiter, Policy};
use tokio::task::JoinSet;

/// Runs `per_task` checks of `policy` for `user` (selector `user`) on each of `tasks` tasks,
/// and returns every answer with how long it took. A check that returns an error panics:
/// the failure modes under test answer with decisions.
pub async fn checks(
    limiter: &Arc<Limiter>,
    policy: &'static str,
    user: &'static str,
    tasks: usize,
    per_task: usize,
) -> Vec<(Checked, Duration)> {
    let mut set = JoinSet::new();
    for _ in 0..tasks {
        let limiter = limiter.clone();
        set.spawn(async move {
            let mut answers = Vec::new();
            for _ in 0..per_task {
                let started = Instant::now();
                let checked = limiter
                    .check(policy, &[("user", user)], 1)
                    .await
                    .expect("a decision");
                answers.push((checked, started.elapsed()));
            }
            answers
        });
    }
    let mut all = Vec::new();
    while let Some(answers) = set.join_next().await {
        all.extend(answers.expect("no panic"));
    }
    all
}

/// The policies the failure-mode tests use: `open`, `closed` and `local` (1% of the rule),
/// each `user:1000/h`; `open` with `open_options` appended (an algorithm, say).
pub fn failure_policies(open_options: &str) -> Vec<Policy> {
    vec![
        Policy::new("open", &format!("user:1000/h {open_options}"))
            .unwrap()
            .failure(FailureMode::Open),
        Policy::new("closed", "user:1000/h")
            .unwrap()
            .failure(FailureMode::Closed),
        Policy::new("local", "user:1000/h")
            .unwrap()
            .failure(FailureMode::local(0.01).unwrap()),
    ]
}

/// With the store down, checks of [`failure_policies`] for user `a` each answer without
/// it as their mode says (open admits, closed denies with `StoreUnavailable`, local decides
/// in process), none taking longer than `bound`; `local` admits exactly 10 for user `b`.
pub async fn assert_failure_modes(limiter: &Arc<Limiter>, bound: Duration) {
    for (policy, check) in [
        (
            "open",
            (|c: &Checked| c.decision.allowed()) as fn(&Checked) -> bool,
        ),
        ("closed", |c: &Checked| {
            c.decision.denial == Some(Denial::StoreUnavailable)
        }),
        ("local", |c: &Checked| c.without_store.is_some()),
    ] {
        for (checked, took) in &checks(limiter, policy, "a", 8, 10).await {
            assert!(checked.without_store.is_some(), "{policy}: {checked:?}");
            assert!(check(checked), "{policy}: {checked:?}");
            assert!(*took < bound, "{policy} took {took:?}");
        }
    }
    // Local with 1% of 1000/h: 10 admitted for user `b` while the store is away.
    let local_admitted = checks(limiter, "local", "b", 4, 10)
        .await
        .iter()
        .filter(|(c, _)| c.decision.allowed())
        .count();
    assert_eq!(local_admitted, 10);
}

/// Checks the `closed` policy until a decision comes from the store again (it must admit),
/// for at most `within`.
pub async fn until_the_store_answers(limiter: &Limiter, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let checked = limiter.check("closed", &[("user", "c")], 1).await.unwrap();
        if checked.without_store.is_none() {
            assert!(checked.decision.allowed());
            return;
        }
        assert!(
            Instant::now() < deadline,
            "decisions did not return to the store within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await; // waiting on a real restart
    }
}

/// [`until_the_store_answers`] for every one of `limiters` at once.
pub async fn until_all_answer(limiters: &[Arc<Limiter>], within: Duration) {
    let mut waiting = JoinSet::new();
    for limiter in limiters {
        let limiter = limiter.clone();
        waiting.spawn(async move { until_the_store_answers(&limiter, within).await });
    }
    while let Some(done) = waiting.join_next().await {
        done.expect("no panic");
    }
}

/// Sockets this process holds open that are connected to `port` on any address: the
/// client side of every connection to a server (or proxy) listening there. Read from
/// `/proc/net/tcp{,6}`, kept to the socket inodes among this process's file descriptors, so
/// what other tests of the same process open at the same time never counts (a count of all
/// file descriptors would).
pub fn sockets_to(port: u16) -> usize {
    let mine: std::collections::HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_owned(),
            )
        })
        .collect();
    let mut held = 0;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        // Columns: sl, local address, remote address (hex address:port), state, queues,
        // timer, retransmits, uid, timeout, inode.
        for row in text.lines().skip(1) {
            let columns: Vec<&str> = row.split_whitespace().collect();
            let (Some(remote), Some(inode)) = (columns.get(2), columns.get(9)) else {
                continue;
            };
            let remote_port = remote
                .rsplit(':')
                .next()
                .and_then(|hex| u16::from_str_radix(hex, 16).ok());
            if remote_port == Some(port) && mine.contains(*inode) {
                held += 1;
            }
        }
    }
    held
}

/// Waits up to `within` for [`sockets_to`] `port` to come down to `most` (a closed
/// connection's socket is released by the task that owned it, a moment later), and returns
/// the last count: more than `most` is a leak.
pub async fn sockets_settle(port: u16, most: usize, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let held = sockets_to(port);
        if held <= most || Instant::now() >= deadline {
            return held;
        }
        // Polling: nothing signals another task's drop of a socket.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
