//! Leases and reservations through `PostgresStore` itself, on the database's clock: an
//! abandoned lease's row is deleted by the cleaner once the lease has expired (not before),
//! `reserve` answers the database's time in nanoseconds since the Unix epoch, and a schema
//! at version 1 is upgraded to 2.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sluice_core::{Algorithm, Leaf, Quota, Rate, Span, Unit};
use sluice_limiter::{Identifier, LeaseKeys, Released, Settlement, Store};
use sluice_postgres::PostgresStore;
use sluice_testkit::PostgresServer;
use sluice_testkit::bench::BenchRule;

fn lease_rows(server: &PostgresServer) -> usize {
    server
        .psql("SELECT count(*) FROM sluice.counters WHERE id = 'job:alice:concurrent'")
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

async fn store(server: &PostgresServer) -> PostgresStore {
    // The background cleaner waits an hour: the test sweeps when it chooses.
    PostgresStore::builder(&server.url())
        .cleanup_interval(Duration::from_secs(3600))
        .connect()
        .await
        .expect("connect")
}

#[tokio::test]
async fn the_cleaner_deletes_an_abandoned_lease_once_it_expired() {
    let server = PostgresServer::start().expect("postgres");
    let store = store(&server).await;
    // Three seconds: room for the steps below on a loaded machine before it expires.
    let lease = Span::new(3, Unit::Second).unwrap();
    let leaf = Leaf::concurrent(2, Some(lease)).unwrap();
    let quota = Quota::from_leaf(&leaf, Algorithm::Gcra).unwrap();
    let rule = BenchRule::one_leaf(quota);
    let ids = [Identifier::new("job:alice:concurrent".to_owned())];
    let keys = LeaseKeys {
        identifiers: &ids,
        quotas: &[quota],
        held_for: None,
    };
    let taken = Instant::now();
    let first = store.acquire(&rule.hit(&ids), 7).await.unwrap();
    assert!(first.allowed());
    assert_eq!(first.remaining, 1);
    // Not expired yet: a sweep keeps it.
    assert_eq!(store.clean_expired(1024).await.unwrap(), 0);
    assert!(taken.elapsed() < Duration::from_secs(3), "too slow to tell");
    assert_eq!(lease_rows(&server), 1);
    let deadline = taken + Duration::from_secs(10);
    loop {
        let deleted = store.clean_expired(1024).await.unwrap();
        if deleted > 0 {
            assert_eq!(deleted, 1);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the expired lease was never cleaned"
        );
        tokio::time::sleep(Duration::from_millis(50)).await; // the pace of the sweeps
    }
    assert!(taken.elapsed() >= Duration::from_millis(2_990));
    assert_eq!(lease_rows(&server), 0);
    assert_eq!(store.release(&keys, 7).await.unwrap(), Released::NotHeld);

    // A released lease empties the set, whose row stays, expired, for the next acquire
    // (the cleaner deletes it if none comes); releasing again says it is not held.
    assert!(store.acquire(&rule.hit(&ids), 8).await.unwrap().allowed());
    let left = store.renew(&keys, 8).await.unwrap().expect("held");
    let lease = Duration::from_secs(3);
    assert!(left <= lease && left > lease / 2, "{left:?}");
    assert_eq!(store.release(&keys, 8).await.unwrap(), Released::Released);
    let row = server
        .psql("SELECT v::text, expires_at FROM sluice.counters WHERE id = 'job:alice:concurrent'");
    assert_eq!(row.unwrap().trim(), "{}|0");
    assert_eq!(store.release(&keys, 8).await.unwrap(), Released::NotHeld);
    assert_eq!(store.renew(&keys, 8).await.unwrap(), None);
    assert_eq!(store.clean_expired(1024).await.unwrap(), 1);
    assert_eq!(lease_rows(&server), 0);
}

#[tokio::test]
async fn reserve_answers_the_database_time_in_nanoseconds() {
    let server = PostgresServer::start().expect("postgres");
    let store = store(&server).await;
    let rate = Rate::new(100, Span::new(1, Unit::Minute).unwrap()).unwrap();
    let quota = Quota::from_leaf(&Leaf::new(rate), Algorithm::Gcra).unwrap();
    let rule = BenchRule::one_leaf(quota);
    let ids = [Identifier::new("tokens:bob".to_owned())];
    let mut hit = rule.hit(&ids);
    hit.evaluation.cost = 40;
    let since_epoch = || SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let before = since_epoch();
    let (decision, taken_at) = store.reserve(&hit).await.unwrap();
    let after = since_epoch();
    assert_eq!(decision.remaining, 60);
    // The database's clock, on this machine: microseconds, in nanoseconds.
    let at = Duration::from_nanos(taken_at);
    let second = Duration::from_secs(1);
    assert!(
        at + second >= before && at <= after + second,
        "taken at {at:?}, between {before:?} and {after:?}"
    );
    assert_eq!(taken_at % 1_000, 0);
    let settlement = Settlement {
        identifiers: &ids,
        quotas: &[quota],
        taken_at,
        reserved: 40,
        actual: 10,
    };
    store.settle(&settlement).await.unwrap();
    hit.evaluation.cost = 0;
    let (peek, _) = store.reserve(&hit).await.unwrap();
    assert_eq!(peek.remaining, 90, "30 refunded");
}

#[tokio::test]
async fn a_schema_at_version_1_is_upgraded_to_2() {
    let server = PostgresServer::start().expect("postgres");
    drop(store(&server).await);
    let comment = "SELECT obj_description('sluice.counters'::regclass, 'pg_class') IS NOT NULL";
    assert_eq!(server.psql(comment).unwrap().trim(), "t");
    // Back to what the first version left: no comment, version 1.
    server
        .psql("COMMENT ON TABLE sluice.counters IS NULL")
        .unwrap();
    server
        .psql("UPDATE sluice.meta SET value = '1' WHERE name = 'schema_version'")
        .unwrap();
    assert_eq!(server.psql(comment).unwrap().trim(), "f");
    drop(store(&server).await);
    let version = "SELECT value FROM sluice.meta WHERE name = 'schema_version'";
    assert_eq!(server.psql(version).unwrap().trim(), "2");
    assert_eq!(server.psql(comment).unwrap().trim(), "t");
}
