//! The login example as a user meets it: its app served on a real socket, driven by curl
//! with the commands of the README.

#[path = "../examples/login/app.rs"]
#[allow(dead_code)]
mod app;

use std::net::SocketAddr;
use std::process::Command;

use serde_json::Value;

/// Serves the example app on a free port, on a thread of its own, for the test's lifetime.
fn start() -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr: SocketAddr = listener.local_addr().unwrap();
            tx.send(addr).unwrap();
            app::serve(listener).await.unwrap();
        });
    });
    format!("http://{}", rx.recv().unwrap())
}

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }
}

fn curl(args: &[&str]) -> Reply {
    let output = Command::new("curl")
        .args(["-s", "-i", "--max-time", "10"])
        .args(args)
        .output()
        .expect("curl is installed (scripts/test.sh installs it)");
    assert!(output.status.success(), "curl {args:?} failed: {output:?}");
    let text = String::from_utf8(output.stdout).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a full HTTP response");
    let mut lines = head.lines();
    let status = lines.next().unwrap().split(' ').nth(1).unwrap();
    Reply {
        status: status.parse().unwrap(),
        headers: lines
            .filter_map(|l| l.split_once(": "))
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
            .collect(),
        body: body.to_owned(),
    }
}

fn login(base: &str, user: &str, password: &str) -> Reply {
    let url = format!("{base}/login");
    let user = format!("username={user}");
    let password = format!("password={password}");
    curl(&["-X", "POST", "-d", &user, "-d", &password, &url])
}

#[test]
fn after_the_allowed_failures_login_answers_429_with_retry_after() {
    let base = start();
    for _ in 0..2 {
        assert_eq!(login(&base, "alice", "wrong").status, 401);
    }
    // A success in between does not count.
    let ok = login(&base, "alice", "correct");
    assert_eq!((ok.status, ok.body.as_str()), (200, "welcome, alice\n"));
    for _ in 0..3 {
        assert_eq!(login(&base, "alice", "wrong").status, 401);
    }
    let blocked = login(&base, "alice", "wrong");
    assert_eq!(blocked.status, 429, "{blocked:?}");
    assert_eq!(blocked.header("retry-after"), Some("60"));
    assert_eq!(
        blocked.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        blocked.header("ratelimit-policy"),
        Some("\"login\";q=5;w=60")
    );
    assert_eq!(blocked.json()["reason"], "penalized");
    assert!(blocked.header("sluice-challenge").is_some());

    // Another username from the same IP is not blocked by alice's failures.
    assert_eq!(login(&base, "bob", "wrong").status, 401);
    assert_eq!(login(&base, "bob", "correct").status, 200);
    // Usernames are compared trimmed and lowercased: ALICE is alice.
    assert_eq!(login(&base, "ALICE", "correct").status, 429);
}

#[test]
fn a_browser_gets_the_custom_page() {
    let base = start();
    for _ in 0..5 {
        login(&base, "carol", "wrong");
    }
    let url = format!("{base}/login");
    let page = curl(&[
        "-H",
        "Accept: text/html",
        "-d",
        "username=carol",
        "-d",
        "password=x",
        &url,
    ]);
    assert_eq!(page.status, 429);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert!(
        page.body.contains("Please try again in 60 seconds."),
        "{page:?}"
    );
    assert_eq!(page.header("retry-after"), Some("60"));
}

#[test]
fn the_proof_of_work_round_trip_with_curl() {
    let base = start();
    for _ in 0..5 {
        login(&base, "dave", "wrong");
    }
    let challenge = login(&base, "dave", "wrong").json()["challenge"].clone();
    let nonce = challenge["nonce"].as_str().unwrap();
    let difficulty = challenge["difficulty"].as_u64().unwrap() as u8;
    let counter = sluice_tower::challenge::solve(nonce, difficulty);
    let answer = format!("Sluice-Pow: {nonce}:{counter}");
    let url = format!("{base}/login");
    let args = [
        "-H",
        &answer,
        "-d",
        "username=dave",
        "-d",
        "password=correct",
        &url,
    ];

    let admitted = curl(&args);
    assert_eq!(admitted.status, 200, "{admitted:?}");
    let replayed = curl(&args);
    assert_eq!(replayed.status, 429);
    assert_eq!(
        replayed.json()["challenge_error"],
        "this nonce was already used"
    );
}

#[test]
fn api_items_are_limited_per_api_key() {
    let base = start();
    let url = format!("{base}/api/items");
    for left in (0..10).rev() {
        let reply = curl(&["-H", "X-Api-Key: k1", &url]);
        assert_eq!(reply.status, 200);
        let left = left.to_string();
        assert_eq!(reply.header("x-ratelimit-remaining"), Some(left.as_str()));
    }
    let limited = curl(&["-H", "X-Api-Key: k1", &url]);
    assert_eq!(limited.status, 429);
    assert_eq!(limited.header("retry-after"), Some("6"));
    assert_eq!(curl(&["-H", "X-Api-Key: k2", &url]).status, 200);
}
