//! Proof of work instead of waiting: the round trip (wrong refused, right admitted, replay
//! refused), difficulty growing with abuse, the hard ceiling, and nonces bound to clients.

mod common;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use common::{Answer, app, clock, from, limiter, send};
use sha2::{Digest, Sha256};
use sluice_limiter::{ManualClock, Policy};
use sluice_tower::challenge::{leading_zero_bits, solve};
use sluice_tower::{Key, ProofOfWork, RateLimitLayer};

const PEER: &str = "203.0.113.9:5000";

/// `ip:2/m`, challenges at 8 bits growing to 12, solved requests capped by `ceiling`.
fn pow_app(clock: &ManualClock, ceiling: &str) -> (Router, RateLimitLayer) {
    let limiter = limiter(
        clock,
        vec![
            Policy::new("web", "ip:2/m").unwrap(),
            Policy::new("web-ceiling", ceiling).unwrap(),
        ],
    );
    let pow = ProofOfWork::with_secret([7; 32])
        .difficulty(8, 12)
        .ttl(Duration::from_secs(60))
        .clock(clock.clone());
    let layer = RateLimitLayer::builder(limiter, "web")
        .selector("ip", Key::client_ip())
        .challenge(pow, "web-ceiling")
        .build()
        .unwrap();
    (app(layer.clone()), layer)
}

fn request(peer: &str, answer: Option<&str>) -> Request<Body> {
    let mut builder = from(peer, "GET", "/other");
    if let Some(answer) = answer {
        builder = builder.header("sluice-pow", answer);
    }
    builder.body(Body::empty()).unwrap()
}

/// The nonce and difficulty a 429 offers, checked to agree between header and body.
fn offered(a: &Answer) -> (String, u8) {
    assert_eq!(a.status, 429, "{a:?}");
    let body = a.json();
    let challenge = &body["challenge"];
    assert_eq!(challenge["type"], "proof-of-work");
    let nonce = challenge["nonce"].as_str().unwrap().to_owned();
    let difficulty = challenge["difficulty"].as_u64().unwrap() as u8;
    let header = format!("pow; nonce=\"{nonce}\"; difficulty={difficulty}");
    assert_eq!(a.header("sluice-challenge"), Some(header.as_str()));
    (nonce, difficulty)
}

fn hash_bits(nonce: &str, counter: u64) -> u32 {
    leading_zero_bits(&Sha256::digest(format!("{nonce}{counter}")))
}

/// A counter that does *not* answer the challenge.
fn wrong(nonce: &str, difficulty: u8) -> u64 {
    (0..)
        .find(|&c| hash_bits(nonce, c) < u32::from(difficulty))
        .unwrap()
}

async fn exhaust(app: &Router, peer: &str) -> Answer {
    for _ in 0..2 {
        assert_eq!(send(app, request(peer, None)).await.status, 200);
    }
    send(app, request(peer, None)).await
}

#[tokio::test]
async fn wrong_is_refused_right_is_admitted_replay_is_refused() {
    let clock = clock();
    let (app, layer) = pow_app(&clock, "ip:10/h");
    let (nonce, difficulty) = offered(&exhaust(&app, PEER).await);
    assert_eq!(difficulty, 8, "first offence: the base difficulty");

    let bad = format!("{nonce}:{}", wrong(&nonce, difficulty));
    let a = send(&app, request(PEER, Some(&bad))).await;
    assert_eq!(a.status, 429);
    assert_eq!(a.json()["challenge_error"], "wrong solution");

    let counter = solve(&nonce, difficulty);
    assert!(hash_bits(&nonce, counter) >= 8);
    let good = format!("{nonce}:{counter}");
    assert_eq!(send(&app, request(PEER, Some(&good))).await.status, 200);

    let a = send(&app, request(PEER, Some(&good))).await;
    assert_eq!(a.status, 429);
    assert_eq!(a.json()["challenge_error"], "this nonce was already used");

    let stats = layer.stats();
    assert_eq!((stats.challenges_solved, stats.challenges_refused), (1, 2));
}

#[tokio::test]
async fn difficulty_grows_with_repeated_abuse() {
    let clock = clock();
    let (app, _) = pow_app(&clock, "ip:10/h");
    let mut a = exhaust(&app, PEER).await;
    let mut seen = Vec::new();
    for _ in 0..4 {
        let (nonce, difficulty) = offered(&a);
        seen.push(difficulty);
        let answer = format!("{nonce}:{}", solve(&nonce, difficulty));
        assert_eq!(send(&app, request(PEER, Some(&answer))).await.status, 200);
        a = send(&app, request(PEER, None)).await;
    }
    // One more bit each time the solved requests double: 0, 1, 2, 3 solved so far.
    assert_eq!(seen, [8, 9, 9, 10]);
}

#[tokio::test]
async fn solving_never_passes_the_ceiling() {
    let clock = clock();
    let (app, _) = pow_app(&clock, "ip:1/h");
    let (first, d1) = offered(&exhaust(&app, PEER).await);
    let (second, d2) = offered(&send(&app, request(PEER, None)).await);

    let answer = format!("{first}:{}", solve(&first, d1));
    assert_eq!(send(&app, request(PEER, Some(&answer))).await.status, 200);

    let answer = format!("{second}:{}", solve(&second, d2));
    let a = send(&app, request(PEER, Some(&answer))).await;
    assert_eq!(a.status, 429);
    assert_eq!(a.json()["reason"], "ceiling");
    assert_eq!(a.json()["policy"], "web-ceiling");
    assert_eq!(a.header("retry-after"), Some("3600"));

    // At the ceiling no challenge is offered: solving could not help.
    let a = send(&app, request(PEER, None)).await;
    assert_eq!(a.status, 429);
    assert!(a.json().get("challenge").is_none());
    assert_eq!(a.header("sluice-challenge"), None);
}

#[tokio::test]
async fn a_nonce_serves_only_its_client_and_only_until_it_expires() {
    let clock = clock();
    let (app, _) = pow_app(&clock, "ip:10/h");
    let (nonce, difficulty) = offered(&exhaust(&app, PEER).await);
    let answer = format!("{nonce}:{}", solve(&nonce, difficulty));

    let other = "192.0.2.77:1";
    exhaust(&app, other).await;
    let a = send(&app, request(other, Some(&answer))).await;
    assert_eq!(a.status, 429);
    assert_eq!(
        a.json()["challenge_error"],
        "this nonce was not issued to this client"
    );

    clock.advance(Duration::from_secs(60));
    exhaust(&app, PEER).await;
    let a = send(&app, request(PEER, Some(&answer))).await;
    assert_eq!(a.status, 429);
    assert_eq!(a.json()["challenge_error"], "expired nonce");

    let a = send(&app, request(PEER, Some("garbage"))).await;
    assert_eq!(a.status, 429);
    assert!(
        a.json()["challenge_error"]
            .as_str()
            .unwrap()
            .starts_with("malformed")
    );
}

#[tokio::test]
async fn an_answer_is_spent_only_when_needed() {
    let clock = clock();
    let (app, layer) = pow_app(&clock, "ip:10/h");
    let (nonce, difficulty) = offered(&exhaust(&app, PEER).await);
    let answer = format!("{nonce}:{}", solve(&nonce, difficulty));
    // 30 s later the limit has room for one: admitted normally, the answer kept.
    clock.advance(Duration::from_secs(30));
    assert_eq!(send(&app, request(PEER, Some(&answer))).await.status, 200);
    assert_eq!(layer.stats().challenges_solved, 0);
    // Limited again: now the answer is needed, and still good.
    assert_eq!(send(&app, request(PEER, Some(&answer))).await.status, 200);
    assert_eq!(layer.stats().challenges_solved, 1);
}
