//! Pipelining on real memcached, through a relay that counts what crosses it: many
//! concurrent decisions on one connection (`connections=1`) share it, written back to back,
//! and admit exactly the limit, hits on one key combined into far fewer reads; a connection
//! killed with requests in flight fails each of them (none admitted), and the store then
//! recovers. A lone caller's decisions take the round trips they should: one for a GCRA key
//! not yet stored, two for a stored one; two for a sliding-window hit that fits, one read
//! for a refusal.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use sluice_core::{Algorithm, Evaluation, Leaf, Quota, Rate, Recording, Shape, Span, Unit};
use sluice_limiter::{Clock, Hit, Identifier, ManualClock, Store, StoreError, SystemClock};
use sluice_memcached::MemcachedStore;
use sluice_testkit::MemcachedServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinSet;

/// What the relay saw, and the fault it applies.
#[derive(Default)]
struct Relay {
    /// Connections accepted.
    connections: AtomicUsize,
    /// Read commands (`get`, `gets`) the client wrote.
    reads: AtomicUsize,
    /// Most read commands in one chunk the client wrote.
    most_reads_per_chunk: AtomicUsize,
    /// Keys those read commands asked for.
    keys_read: AtomicUsize,
    /// Chunks the client wrote: a lone caller writes one per round trip.
    chunks: AtomicUsize,
    /// Commands the client wrote, by verb: `add`, `cas`, `incr`, `decr`.
    adds: AtomicUsize,
    cases: AtomicUsize,
    incrs: AtomicUsize,
    decrs: AtomicUsize,
    /// While set: the client's bytes are held, never forwarded, and once `kill_after` read
    /// commands have come the connection is closed.
    hold: AtomicBool,
    kill_after: AtomicUsize,
    held: AtomicUsize,
    killed: Notify,
}

/// Read commands in `chunk`: lines starting `get ` or `gets `.
fn reads_in(chunk: &[u8]) -> usize {
    chunk
        .split(|&b| b == b'\n')
        .filter(|line| line.starts_with(b"get ") || line.starts_with(b"gets "))
        .count()
}

/// Keys the read commands in `chunk` ask for.
fn keys_read_in(chunk: &[u8]) -> usize {
    chunk
        .split(|&b| b == b'\n')
        .filter(|line| line.starts_with(b"get ") || line.starts_with(b"gets "))
        .map(|line| line.trim_ascii().split(|&b| b == b' ').count() - 1)
        .sum()
}

/// Lines of `chunk` that start with `verb` and a space.
fn commands_in(chunk: &[u8], verb: &[u8]) -> usize {
    chunk
        .split(|&b| b == b'\n')
        .filter(|line| line.starts_with(verb) && line.get(verb.len()) == Some(&b' '))
        .count()
}

/// A relay on a free port to `upstream`, counting and applying `relay`'s fault.
async fn relay_to(upstream: String, relay: Arc<Relay>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            relay.connections.fetch_add(1, Ordering::SeqCst);
            let relay = relay.clone();
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let server = TcpStream::connect(upstream).await.unwrap();
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let down = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
                });
                let mut chunk = vec![0u8; 64 << 10];
                loop {
                    let n = match client_read.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    relay.chunks.fetch_add(1, Ordering::SeqCst);
                    for (verb, seen) in [
                        (&b"add"[..], &relay.adds),
                        (b"cas", &relay.cases),
                        (b"incr", &relay.incrs),
                        (b"decr", &relay.decrs),
                    ] {
                        seen.fetch_add(commands_in(&chunk[..n], verb), Ordering::SeqCst);
                    }
                    let keys = keys_read_in(&chunk[..n]);
                    relay.keys_read.fetch_add(keys, Ordering::SeqCst);
                    let reads = reads_in(&chunk[..n]);
                    relay.reads.fetch_add(reads, Ordering::SeqCst);
                    relay
                        .most_reads_per_chunk
                        .fetch_max(reads, Ordering::SeqCst);
                    if relay.hold.load(Ordering::SeqCst) {
                        let held = relay.held.fetch_add(reads, Ordering::SeqCst) + reads;
                        if held >= relay.kill_after.load(Ordering::SeqCst) {
                            break;
                        }
                        continue;
                    }
                    if server_write.write_all(&chunk[..n]).await.is_err() {
                        break;
                    }
                }
                // Dropping both halves of both sockets closes the connection.
                down.abort();
                relay.killed.notify_one();
            });
        }
    });
    format!("memcached://{address}")
}

fn quota(algorithm: Algorithm, limit: u64) -> Quota {
    let rate = Rate::new(limit, Span::new(1, Unit::Hour).unwrap()).unwrap();
    Quota::from_leaf(&Leaf::new(rate), algorithm).unwrap()
}

/// One hit of cost 1 on `identifier`, recorded when admitted.
async fn hit(store: &MemcachedStore, identifier: &str, quota: Quota) -> Result<bool, StoreError> {
    let identifiers = [Identifier::new(identifier)];
    let (shape, quotas) = (Shape::Leaf(0), [quota]);
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
    Ok(store.decide(&hit).await?.allowed())
}

/// `tasks` concurrent hits on `identifier`; the answers.
async fn burst(
    store: &MemcachedStore,
    identifier: &str,
    quota: Quota,
    tasks: usize,
) -> Vec<Result<bool, StoreError>> {
    let start = Arc::new(tokio::sync::Barrier::new(tasks));
    let mut set = JoinSet::new();
    for _ in 0..tasks {
        let (store, identifier, start) = (store.clone(), identifier.to_owned(), start.clone());
        set.spawn(async move {
            start.wait().await;
            hit(&store, &identifier, quota).await
        });
    }
    set.join_all().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_connection_carries_many_decisions_and_admits_exactly_the_limit() {
    let memcached = MemcachedServer::start().expect("memcached");
    let relay = Arc::new(Relay::default());
    let url = relay_to(memcached.address(), relay.clone()).await;
    let store = MemcachedStore::builder(&format!("{url}?connections=1"))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    for algorithm in [
        Algorithm::SlidingWindow,
        Algorithm::Gcra,
        Algorithm::FixedWindow,
    ] {
        let id = format!("ns:k:user:{algorithm}:100/h");
        let reads = relay.reads.load(Ordering::SeqCst);
        let answers = burst(&store, &id, quota(algorithm, 100), 300).await;
        let admitted = answers.iter().filter(|a| matches!(a, Ok(true))).count();
        assert!(
            answers.iter().all(Result::is_ok),
            "{algorithm}: {answers:?}"
        );
        assert_eq!(admitted, 100, "{algorithm}: 300 hits on a limit of 100");
        // Hits on one key are combined: far fewer reads than hits.
        let reads = relay.reads.load(Ordering::SeqCst) - reads;
        assert!(reads < 150, "{algorithm}: {reads} reads for 300 hits");
    }
    // Distinct keys: no combining of updates, every decision its own requests.
    let answers: Vec<_> = {
        let start = Arc::new(tokio::sync::Barrier::new(200));
        let mut set = JoinSet::new();
        for i in 0..200 {
            let (store, start) = (store.clone(), start.clone());
            set.spawn(async move {
                start.wait().await;
                let id = format!("ns:k:user:u{i}:1/h");
                let first = hit(&store, &id, quota(Algorithm::Gcra, 1)).await;
                let second = hit(&store, &id, quota(Algorithm::Gcra, 1)).await;
                (first, second)
            });
        }
        set.join_all().await
    };
    for (first, second) in answers {
        assert_eq!((first.unwrap(), second.unwrap()), (true, false));
    }
    assert_eq!(
        relay.connections.load(Ordering::SeqCst),
        1,
        "connections=1 opens one connection"
    );
    // Requests of several callers went out back to back, in one write.
    assert!(
        relay.most_reads_per_chunk.load(Ordering::SeqCst) >= 2,
        "at most {} read per chunk: not pipelined",
        relay.most_reads_per_chunk.load(Ordering::SeqCst)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_killed_mid_flight_fails_every_pending_decision_then_recovers() {
    const IN_FLIGHT: usize = 40;
    let memcached = MemcachedServer::start().expect("memcached");
    let relay = Arc::new(Relay::default());
    let url = relay_to(memcached.address(), relay.clone()).await;
    let store = MemcachedStore::builder(&format!("{url}?connections=1"))
        .timeout(Duration::from_secs(10))
        .down_for(Duration::from_millis(50))
        .connect()
        .await
        .unwrap();
    for algorithm in [Algorithm::SlidingWindow, Algorithm::Gcra] {
        let quota = quota(algorithm, 10);
        // Distinct keys, so no two decisions' requests are combined into one.
        let ids: Vec<String> = (0..IN_FLIGHT)
            .map(|i| format!("ns:k:user:killed-{algorithm}-{i}:10/h"))
            .collect();
        for id in &ids {
            assert!(hit(&store, id, quota).await.unwrap(), "{algorithm}");
        }
        // Every decision's first request reaches the relay, which holds them all, then
        // closes the connection with all of them in flight.
        relay.held.store(0, Ordering::SeqCst);
        relay.kill_after.store(IN_FLIGHT, Ordering::SeqCst);
        relay.hold.store(true, Ordering::SeqCst);
        let killed = relay.killed.notified();
        let mut set = JoinSet::new();
        for id in &ids {
            let (store, id) = (store.clone(), id.clone());
            set.spawn(async move { hit(&store, &id, quota).await });
        }
        let answers = set.join_all().await;
        tokio::time::timeout(Duration::from_secs(10), killed)
            .await
            .expect("the relay saw every decision's request in flight");
        relay.hold.store(false, Ordering::SeqCst);
        assert_eq!(relay.held.load(Ordering::SeqCst), IN_FLIGHT, "{algorithm}");
        // Each fails as unavailable when the connection dies, not by waiting out its
        // 10 s timeout.
        for answer in &answers {
            assert!(
                matches!(answer, Err(StoreError::Unavailable(_))),
                "{algorithm}: {answer:?} from a killed connection"
            );
        }
        // Recovered: a new connection, and nothing the failed decisions sent was counted
        // (9 of the limit left after the first hit).
        let mut admitted = None;
        for _ in 0..500 {
            match hit(&store, &ids[0], quota).await {
                Ok(allowed) => {
                    admitted = Some(usize::from(allowed));
                    break;
                }
                Err(e) => assert!(e.is_transient(), "{e:?}"),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut admitted = admitted.expect("the store recovers within 5 s");
        for _ in 0..20 {
            admitted += usize::from(hit(&store, &ids[0], quota).await.unwrap());
        }
        assert_eq!(admitted, 9, "{algorithm}: the rest of the limit, no more");
    }
}

/// What the relay has counted so far: chunks, `add`, `cas`, `incr`, `decr`, reads.
fn seen(relay: &Relay) -> [usize; 6] {
    [
        &relay.chunks,
        &relay.adds,
        &relay.cases,
        &relay.incrs,
        &relay.decrs,
        &relay.reads,
    ]
    .map(|n| n.load(Ordering::SeqCst))
}

/// What the relay counted during `step`, and what `step` answered.
async fn counting<T>(relay: &Relay, step: impl Future<Output = T>) -> ([usize; 6], T) {
    let before = seen(relay);
    let answer = step.await;
    let after = seen(relay);
    (std::array::from_fn(|i| after[i] - before[i]), answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_decision_takes_the_round_trips_it_should() {
    let memcached = MemcachedServer::start().expect("memcached");
    let relay = Arc::new(Relay::default());
    let url = relay_to(memcached.address(), relay.clone()).await;
    // Mid-way through a sub-window of the 1-hour limits (6 minutes), far from the clock-skew
    // margin around its boundaries (where a window hit reads its neighbours again).
    let sub = 360_000_000_000;
    let clock = ManualClock::new(SystemClock::new().now() / sub * sub + sub / 2);
    let store = MemcachedStore::builder(&format!("{url}?connections=1"))
        .timeout(Duration::from_secs(10))
        .clock(clock.clone())
        .connect()
        .await
        .unwrap();

    // GCRA, a key not yet stored: `gets` and `add` in one round trip, no `cas`.
    let gcra = quota(Algorithm::Gcra, 2);
    for i in 0..10 {
        let id = format!("ns:k:user:fresh-{i}:2/h");
        let (n, allowed) = counting(&relay, hit(&store, &id, gcra)).await;
        assert!(allowed.unwrap());
        // [chunks, add, cas, incr, decr, reads]
        assert_eq!(n, [1, 1, 0, 0, 0, 1], "a fresh GCRA key");
        // Stored now: the `add` fails, the state read goes on by `cas`.
        let (n, allowed) = counting(&relay, hit(&store, &id, gcra)).await;
        assert!(allowed.unwrap());
        assert_eq!(n, [2, 1, 1, 0, 0, 1], "a stored GCRA key");
        let (_, allowed) = counting(&relay, hit(&store, &id, gcra)).await;
        assert!(!allowed.unwrap(), "the third of 2/h");
    }

    // Sliding window: a counter this process has not seen is guessed absent, its `add`
    // (and a `set` of the identifier's record) sent with the read of the window: a
    // sub-window's first hit is one round trip. One seen is read, then counted by `incr`; a
    // refusal is the read alone.
    let window = quota(Algorithm::SlidingWindow, 2);
    let id = "ns:k:user:window:2/h";
    let (n, allowed) = counting(&relay, hit(&store, id, window)).await;
    assert!(allowed.unwrap());
    assert_eq!(n, [1, 1, 0, 0, 0, 1], "a sub-window's first hit");
    let (n, allowed) = counting(&relay, hit(&store, id, window)).await;
    assert!(allowed.unwrap());
    assert_eq!(n, [2, 0, 0, 1, 0, 1], "a hit that fits");
    let (n, allowed) = counting(&relay, hit(&store, id, window)).await;
    assert!(!allowed.unwrap());
    assert_eq!(n, [1, 0, 0, 0, 0, 1], "a refusal");
    // The next sub-window's first hit is guessed absent too and counted with the read,
    // which shows the window full: it gives its cost back (`decr`), leaving the new counter
    // at zero, and is refused.
    clock.advance(Duration::from_nanos(sub));
    let (n, allowed) = counting(&relay, hit(&store, id, window)).await;
    assert!(!allowed.unwrap());
    assert_eq!(n, [2, 1, 0, 0, 1, 1], "a guess the window refuses");
    let counter = format!("{id}|w{}", clock.now() / sub);
    assert_eq!(memcached.raw(&format!("incr {counter} 0")).unwrap(), "0");
    // A counter guessed absent that exists (made by another process) is counted by `incr`
    // after the read, as without a guess.
    let other = "ns:k:user:other:2/h";
    let counter = format!("{other}|w{}", clock.now() / sub);
    assert_eq!(
        memcached.raw(&format!("set {counter} 0 0 1\r\n1")).unwrap(),
        "STORED"
    );
    let (n, allowed) = counting(&relay, hit(&store, other, window)).await;
    assert!(allowed.unwrap());
    assert_eq!(n, [2, 1, 0, 1, 0, 1], "a guess that found the counter");
    assert_eq!(memcached.raw(&format!("incr {counter} 0")).unwrap(), "2");
    let (_, allowed) = counting(&relay, hit(&store, other, window)).await;
    assert!(!allowed.unwrap(), "the third of 2/h");
    // A window read once need not read its empty past again: the ten sub-windows of the
    // hour, then only the previous and the current. Minutes from the next sub-window, no
    // app server's clock can have reached it: its counter is not read.
    let keys = |relay: &Relay| relay.keys_read.load(Ordering::SeqCst);
    let fresh = "ns:k:user:fresh-window:2/h";
    let before = keys(&relay);
    assert!(hit(&store, fresh, window).await.unwrap());
    assert_eq!(keys(&relay) - before, 10, "the whole window, once");
    let before = keys(&relay);
    assert!(hit(&store, fresh, window).await.unwrap());
    assert_eq!(keys(&relay) - before, 2, "its empty past known");
    // Five seconds before the next sub-window starts (outside the skew's margin, so hits
    // are still combined), a clock running ahead by the skew reaches it within the call's
    // 10 s deadline: its counter is read too.
    let mid = clock.now();
    clock.set(mid / sub * sub + sub - 5_000_000_000);
    let near = "ns:k:user:near-the-end:2/h";
    let before = keys(&relay);
    assert!(hit(&store, near, window).await.unwrap());
    assert_eq!(keys(&relay) - before, 11, "the whole window and the next");
    let before = keys(&relay);
    assert!(hit(&store, near, window).await.unwrap());
    assert_eq!(
        keys(&relay) - before,
        3,
        "the previous, the current and the next"
    );
    clock.set(mid);
    // A past sub-window's counter is read every time, however many empty ones precede it:
    // two hits five sub-windows ago fill this 2/h window.
    let old = "ns:k:user:old-window:2/h";
    let five_ago = format!("{old}|w{}", clock.now() / sub - 5);
    assert_eq!(
        memcached
            .raw(&format!("set {five_ago} 0 0 1\r\n2"))
            .unwrap(),
        "STORED"
    );
    for attempt in 0..3 {
        let before = keys(&relay);
        assert!(
            !hit(&store, old, window).await.unwrap(),
            "attempt {attempt}"
        );
        let read = keys(&relay) - before;
        assert_eq!(read, if attempt == 0 { 10 } else { 6 }, "attempt {attempt}");
    }
    // Sub-windows of one second: only those that ended more than the skew and two seconds
    // ago are skipped, so a hit sent just before a boundary has long enough to arrive. Half
    // a second into one (away from its boundaries, where hits are combined), that leaves the
    // two before it read too.
    let rate = Rate::new(10, Span::new(10, Unit::Second).unwrap()).unwrap();
    let seconds = Quota::from_leaf(&Leaf::new(rate), Algorithm::SlidingWindow).unwrap();
    clock.advance(Duration::from_millis(500));
    let short = "ns:k:user:short-window:10/10s";
    let before = keys(&relay);
    assert!(hit(&store, short, seconds).await.unwrap());
    assert_eq!(keys(&relay) - before, 11, "the whole window, once");
    let before = keys(&relay);
    assert!(hit(&store, short, seconds).await.unwrap());
    assert_eq!(
        keys(&relay) - before,
        4,
        "sub-windows ended 1.5 s ago are read"
    );
}
