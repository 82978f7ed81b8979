//! Counting by outcome (only failed logins), with the penalty box: timeouts that double on
//! repeated abuse and are forgotten after a quiet period.

mod common;

use std::time::Duration;

use common::{Answer, app, clock, limiter, login_request, send};
use sluice_core::Penalty;
use sluice_limiter::{ManualClock, Policy};
use sluice_tower::{Headers, Key, Outcomes, RateLimitLayer};

const PEER: &str = "203.0.113.9:5000";

/// 3 failures a minute per address and username; then 60 s, 120 s, 240 s... (at most an
/// hour), forgotten after an hour without a new strike.
fn login_app(clock: &ManualClock) -> axum::Router {
    let penalty = Penalty::new(
        Duration::from_secs(60),
        2,
        Duration::from_secs(3600),
        Duration::from_secs(3600),
    )
    .unwrap();
    let policy = Policy::new("login", "ip+user:3/m")
        .unwrap()
        .penalty(penalty);
    let layer = RateLimitLayer::builder(limiter(clock, vec![policy]), "login")
        .selector("ip", Key::client_ip())
        .selector("user", Key::form_field("username"))
        .count_only(Outcomes::statuses([401, 403]))
        .headers(Headers::ALL)
        .build()
        .unwrap();
    app(layer)
}

async fn attempt(app: &axum::Router, user: &str, password: &str) -> Answer {
    send(app, login_request(PEER, user, password)).await
}

/// Three failures, all let through, each counted.
async fn fail_three_times(app: &axum::Router, user: &str) {
    for remaining in ["2", "1", "0"] {
        let a = attempt(app, user, "wrong").await;
        assert_eq!(a.status, 401);
        assert_eq!(a.header("x-ratelimit-remaining"), Some(remaining));
    }
}

#[tokio::test]
async fn only_failures_count_and_other_usernames_are_unaffected() {
    let clock = clock();
    let app = login_app(&clock);

    assert_eq!(attempt(&app, "alice", "wrong").await.status, 401);
    // Successes in between are not counted, and say so.
    for _ in 0..5 {
        let a = attempt(&app, "alice", "correct").await;
        assert_eq!(a.status, 200);
        assert_eq!(a.header("x-ratelimit-remaining"), Some("2"));
    }
    assert_eq!(attempt(&app, "alice", "wrong").await.status, 401);
    assert_eq!(attempt(&app, "alice", "wrong").await.status, 401);

    let blocked = attempt(&app, "alice", "wrong").await;
    assert_eq!(blocked.status, 429);
    assert_eq!(blocked.header("retry-after"), Some("60"));
    assert_eq!(blocked.json()["reason"], "penalized");
    // Blocked whatever the password: the key is timed out, not the guess.
    assert_eq!(attempt(&app, "alice", "correct").await.status, 429);

    // Same address, another username: not blocked by alice's failures.
    assert_eq!(attempt(&app, "bob", "wrong").await.status, 401);
    assert_eq!(attempt(&app, "bob", "correct").await.status, 200);
}

#[tokio::test]
async fn timeouts_double_then_are_forgotten() {
    let clock = clock();
    let app = login_app(&clock);

    let mut expected = 60;
    for round in 0..3 {
        fail_three_times(&app, "alice").await;
        let a = attempt(&app, "alice", "wrong").await;
        assert_eq!(a.status, 429, "round {round}");
        assert_eq!(
            a.header("retry-after"),
            Some(expected.to_string().as_str()),
            "round {round}"
        );

        // Knocking during the timeout neither helps nor lengthens it.
        clock.advance(Duration::from_secs(10));
        let a = attempt(&app, "alice", "correct").await;
        assert_eq!(a.status, 429);
        let left = (expected - 10).to_string();
        assert_eq!(a.header("retry-after"), Some(left.as_str()));

        clock.advance(Duration::from_secs(expected - 10));
        expected *= 2;
    }

    // An hour with no new strike: the next timeout is the base again.
    clock.advance(Duration::from_secs(3600));
    fail_three_times(&app, "alice").await;
    let a = attempt(&app, "alice", "wrong").await;
    assert_eq!(a.header("retry-after"), Some("60"));
    assert_eq!(a.json()["reason"], "penalized");
}

#[tokio::test]
async fn a_success_right_after_the_timeout_goes_through() {
    let clock = clock();
    let app = login_app(&clock);
    fail_three_times(&app, "alice").await;
    assert_eq!(attempt(&app, "alice", "wrong").await.status, 429);
    clock.advance(Duration::from_secs(60));
    assert_eq!(attempt(&app, "alice", "correct").await.status, 200);
}
