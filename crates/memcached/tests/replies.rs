//! The store against a scripted server: malformed replies are protocol errors (never a
//! panic), and state that vanishes while it should have lived is counted as an eviction.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_core::{Algorithm, Evaluation, Leaf, Quota, Rate, Recording, Shape, Span, Unit};
use sluice_limiter::{Clock, Hit, Identifier, Store, StoreError, SystemClock};
use sluice_memcached::MemcachedStore;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// What the scripted server answers to one command (its line, and its data block if any).
type Script = Arc<dyn Fn(&str, &[u8]) -> Vec<u8> + Send + Sync>;

/// A server on a free port answering every command by `script` (`version` is answered).
async fn scripted(script: Script) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let script = script.clone();
            tokio::spawn(async move {
                let (read, mut write) = socket.into_split();
                let mut read = BufReader::new(read);
                let mut line = String::new();
                while read.read_line(&mut line).await.unwrap_or(0) > 0 {
                    let command = line.trim_end().to_owned();
                    line.clear();
                    let words: Vec<&str> = command.split(' ').collect();
                    let mut data = Vec::new();
                    if matches!(words[0], "set" | "add" | "cas") {
                        let length: usize = words[4].parse().unwrap();
                        data.resize(length + 2, 0);
                        read.read_exact(&mut data).await.unwrap();
                        data.truncate(length);
                    }
                    let reply = if words[0] == "version" {
                        b"VERSION scripted\r\n".to_vec()
                    } else {
                        script(&command, &data)
                    };
                    if write.write_all(&reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    format!("memcached://{address}")
}

fn quota(algorithm: Algorithm) -> Quota {
    let rate = Rate::new(100, Span::new(1, Unit::Hour).unwrap()).unwrap();
    Quota::from_leaf(&Leaf::new(rate), algorithm).unwrap()
}

async fn decide(store: &MemcachedStore, algorithm: Algorithm) -> Result<bool, StoreError> {
    let identifiers = [Identifier::new("ns:k:user:alice:100/h")];
    let shape = Shape::Leaf(0);
    let quotas = [quota(algorithm)];
    let hit = Hit {
        identifiers: &identifiers,
        evaluation: Evaluation {
            shape: &shape,
            quotas: &quotas,
            cost: 1,
            recording: Recording::Admitted,
            penalty: None,
        },
        penalty_identifier: None,
    };
    store.decide(&hit).await.map(|d| d.allowed())
}

async fn connect(url: &str) -> MemcachedStore {
    MemcachedStore::builder(url)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap()
}

#[tokio::test]
async fn malformed_replies_are_protocol_errors() {
    let garbage: [&[u8]; 6] = [
        b"VALUE ns:k:user:alice:100/h|s 0 x 1\r\n",
        b"VALUE ns:k:user:alice:100/h|s 0 3 1\r\ng 1xx\r\nEND\r\n",
        b"VALUE somebody-else 0 1 1\r\nx\r\nEND\r\n",
        b"HELLO\r\n",
        b"STORED\r\n",
        // A lone LF is part of the line: the line read is `END\nHELLO`, which no command
        // expects. (`END\n` alone is a line still waiting for its CR LF: the timeout.)
        b"END\nHELLO\r\n",
    ];
    for reply in garbage {
        let url = scripted(Arc::new(move |_, _| reply.to_vec())).await;
        let store = connect(&url).await;
        for algorithm in [Algorithm::Gcra, Algorithm::SlidingWindow] {
            let error = decide(&store, algorithm)
                .await
                .expect_err("garbage decided");
            let shown = String::from_utf8_lossy(reply);
            assert!(
                matches!(error, StoreError::Protocol(_)),
                "{shown:?} {algorithm}: {error}"
            );
        }
    }
}

#[tokio::test]
async fn a_server_error_is_transient() {
    let url = scripted(Arc::new(|_, _| b"SERVER_ERROR out of memory\r\n".to_vec())).await;
    let error = decide(&connect(&url).await, Algorithm::Gcra).await;
    assert!(error.expect_err("decided").is_transient());
}

#[tokio::test]
async fn a_state_gone_between_read_and_write_is_an_eviction() {
    // The first `gets` finds a live GCRA state (10 hits of debt); the `cas` finds it gone.
    let tat = SystemClock::new().now() + 10 * 36_000_000_000;
    let reads = Arc::new(Mutex::new(0));
    let script: Script = Arc::new(move |command, _| {
        let word = command.split(' ').next().unwrap();
        match word {
            "gets" => {
                let mut reads = reads.lock().unwrap();
                *reads += 1;
                if *reads == 1 {
                    let value = format!("g {tat}");
                    let key = command.split(' ').nth(1).unwrap();
                    format!("VALUE {key} 0 {} 7\r\n{value}\r\nEND\r\n", value.len()).into_bytes()
                } else {
                    b"END\r\n".to_vec()
                }
            }
            "cas" => b"NOT_FOUND\r\n".to_vec(),
            "add" => b"STORED\r\n".to_vec(),
            other => panic!("unexpected {other}"),
        }
    });
    let store = connect(&scripted(script).await).await;
    assert!(decide(&store, Algorithm::Gcra).await.unwrap());
    assert_eq!(store.stats().evictions, 1);
}

#[tokio::test]
async fn a_counter_gone_between_read_and_incr_is_an_eviction() {
    // The window's `get` finds the current sub-window at 5 (so the `add` guessing it absent
    // fails); `incr` finds it gone.
    let adds = Arc::new(Mutex::new(0));
    let script: Script = Arc::new(move |command, _| {
        let words: Vec<&str> = command.split(' ').collect();
        match words[0] {
            "get" if words.len() > 2 => {
                // The window's keys, oldest first, then the next sub-window's.
                let current = words[words.len() - 2];
                format!("VALUE {current} 0 1\r\n5\r\nEND\r\n").into_bytes()
            }
            "incr" => b"NOT_FOUND\r\n".to_vec(),
            "add" => {
                let mut adds = adds.lock().unwrap();
                *adds += 1;
                if *adds == 1 {
                    b"NOT_STORED\r\n".to_vec()
                } else {
                    b"STORED\r\n".to_vec()
                }
            }
            "set" => b"STORED\r\n".to_vec(),
            _ => b"END\r\n".to_vec(),
        }
    });
    let store = connect(&scripted(script).await).await;
    assert!(decide(&store, Algorithm::SlidingWindow).await.unwrap());
    assert_eq!(store.stats().evictions, 1);
}
