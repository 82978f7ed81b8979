//! `Top` as the service drives it: decisions in, heavy hitters, refusals and metrics out,
//! on a clock that is an argument.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::{Decision, Denial};
use sluice_limiter::{Checked, Policy, PolicyRef};

use sluice_limiter::policy::CompiledPolicy;

use super::*;

const T0: u64 = 1_700_000_040 * 1_000_000_000;
const SECOND: u64 = 1_000_000_000;

fn policy(rule: &str) -> PolicyRef {
    Arc::new(CompiledPolicy::compile(Policy::new("login", rule).unwrap()).unwrap())
}

fn checked(policy: &PolicyRef, denial: Option<Denial>) -> Checked {
    Checked {
        decision: Decision {
            denial,
            limit: 5,
            remaining: 0,
            reset_after: Duration::from_secs(12),
            leaf: 0,
        },
        shadow_denied: false,
        cached: false,
        without_store: None,
        policy: policy.clone(),
    }
}

const LIMITED: Option<Denial> = Some(Denial::Limited {
    retry_after: Duration::from_secs(3),
});

fn top() -> Top {
    let top = Top::new(8, 4);
    top.track(["login".to_owned(), "other".to_owned()]);
    top
}

fn summary(hitters: &[HeavyHitter]) -> Vec<(&str, u64)> {
    hitters
        .iter()
        .map(|h| (h.selectors.as_str(), h.count))
        .collect()
}

#[test]
fn counts_hits_and_refusals_by_the_values_the_policy_counts_by() {
    let top = top();
    let login = policy("ip:5/m");
    let alice: &Selectors = &[("ip", "203.0.113.9"), ("request", "1")];
    let bob: &Selectors = &[("request", "2"), ("ip", "198.51.100.7")];
    for i in 0..3 {
        top.observe(T0 + i, "login", alice, &checked(&login, None));
    }
    for i in 0..2 {
        top.observe(T0 + i, "login", alice, &checked(&login, LIMITED));
    }
    top.observe(T0, "login", bob, &checked(&login, None));
    let read = top.policy(T0 + SECOND, "login", 10).unwrap();
    assert_eq!((read.hits, read.refusals), (6, 2));
    assert_eq!(read.window, Duration::from_secs(300));
    assert_eq!(
        summary(&read.active),
        [("ip=203.0.113.9", 5), ("ip=198.51.100.7", 1)]
    );
    assert_eq!(summary(&read.refused), [("ip=203.0.113.9", 2)]);
    assert!(read.active.iter().all(|h| h.error == 0));
    assert_eq!(top.policy(T0, "other", 10).unwrap().hits, 0);
    assert_eq!(top.policy(T0, "nope", 10), None);
    let names: Vec<String> = top.all(T0, 1).into_iter().map(|t| t.policy).collect();
    assert_eq!(names, ["login", "other"]);

    let refusals = top.recent_refusals(10);
    assert_eq!(refusals.len(), 2);
    assert_eq!(
        refusals[0],
        Refusal {
            at: T0 + 1,
            policy: "login".into(),
            selectors: "ip=203.0.113.9".into(),
            denial: Some("limited"),
            retry_after: Some(Duration::from_secs(3)),
            shadow: false,
        }
    );
}

#[test]
fn shadow_refusals_count_as_refusals_and_say_so() {
    let top = top();
    let login = policy("user:5/m");
    let mut shadow = checked(&login, None);
    shadow.shadow_denied = true;
    top.observe(T0, "login", &[("user", "eve")], &shadow);
    assert_eq!(top.policy(T0, "login", 5).unwrap().refusals, 1);
    let refusal = &top.recent_refusals(1)[0];
    assert_eq!((refusal.shadow, refusal.denial), (true, None));
}

#[test]
fn a_reload_keeps_kept_policies_and_drops_removed_ones() {
    let top = top();
    let login = policy("ip:5/m");
    top.observe(T0, "login", &[("ip", "1")], &checked(&login, None));
    top.observe(T0, "other", &[("ip", "1")], &checked(&login, None));
    top.track(["login".to_owned(), "new".to_owned()]);
    assert_eq!(top.policy(T0, "login", 5).unwrap().hits, 1);
    assert_eq!(top.policy(T0, "other", 5), None);
    assert_eq!(top.policy(T0, "new", 5).unwrap().hits, 0);
    // Hits of a name no longer tracked are dropped, not counted somewhere.
    top.observe(T0, "other", &[("ip", "1")], &checked(&login, None));
    assert_eq!(top.all(T0, 5).iter().map(|t| t.hits).sum::<u64>(), 1);
}

#[test]
fn a_flood_of_unique_values_keeps_k_counters_a_minute() {
    let top = top();
    let login = policy("ip:5/m");
    for i in 0..50_000u64 {
        let ip = i.to_string();
        let now = T0 + i * (10 * SECOND / 50_000); // 10 s: one minute
        top.observe(now, "login", &[("ip", &ip)], &checked(&login, LIMITED));
    }
    let map = top.policies.read();
    let streams = map["login"].lock();
    assert_eq!(streams.active.len(), 8);
    assert_eq!(streams.refused.len(), 8);
    drop(streams);
    drop(map);
    let read = top.policy(T0 + 10 * SECOND, "login", 8).unwrap();
    assert_eq!(read.refusals, 50_000);
    // Nothing stands out: every count is mostly error, within N / K.
    assert!(
        read.refused.iter().all(|h| h.error <= 50_000 / 8),
        "{read:?}"
    );
    assert_eq!(top.recent_refusals(100).len(), 4);
}

#[test]
fn off_counts_nothing_but_still_keeps_refusals_if_asked() {
    let top = Top::new(0, 2);
    top.track(["login".to_owned()]);
    let login = policy("ip:5/m");
    top.observe(T0, "login", &[("ip", "1")], &checked(&login, LIMITED));
    assert_eq!(top.policy(T0, "login", 5), None);
    assert_eq!(top.recent_refusals(5).len(), 1);
    let mut text = String::new();
    top.render_metrics(T0, &mut text);
    assert_eq!(text, "");
}

#[test]
fn metrics_show_the_top_refused_with_hostile_values_escaped() {
    let top = Top::new(8, 0);
    top.track(["login".to_owned()]);
    let login = policy("user:5/m");
    let hostile = "x\"} 1\nsluice_fake{a=\"\\";
    for (user, times) in [
        (hostile, 3),
        ("a", 1),
        ("b", 1),
        ("c", 1),
        ("d", 1),
        ("e", 1),
    ] {
        for _ in 0..times {
            top.observe(T0, "login", &[("user", user)], &checked(&login, LIMITED));
        }
    }
    let mut text = String::new();
    top.render_metrics(T0, &mut text);
    let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(samples.len(), METRICS_TOP, "{text}");
    assert_eq!(
        samples[0],
        r#"sluice_top_refused{policy="login",selectors="user=x\"} 1\nsluice_fake{a=\"\\"} 3"#
    );
    assert_eq!(
        samples[1],
        r#"sluice_top_refused{policy="login",selectors="user=a"} 1"#
    );
    assert!(!text.contains("\nsluice_fake"), "{text}");
    assert!(text.starts_with("# HELP sluice_top_refused "));
}
