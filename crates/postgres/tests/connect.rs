//! Connecting: bad URLs and unreachable servers give clear errors without the password,
//! servers starting at once share one migration, and a schema from a newer sluice is
//! refused rather than used.

use std::time::{Duration, Instant};

use sluice_limiter::{Limiter, Policy, StoreError};
use sluice_postgres::{PostgresError, PostgresStore};
use sluice_testkit::PostgresServer;

async fn refused(url: &str) -> String {
    match PostgresStore::connect(url).await {
        Ok(_) => panic!("`{url}` connected"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn bad_urls_and_absent_servers_are_clear_errors() {
    for (url, says) in [
        (
            "postgres://u:hunter22@127.0.0.1:5432/app?pool_size=none",
            "pool_size `none`",
        ),
        (
            "postgres://u:hunter22@127.0.0.1:5432/app?schema=a-b",
            "schema `a-b`",
        ),
        (
            "postgres://u:hunter22@127.0.0.1:5432/app?bogus_option=1",
            "bogus_option",
        ),
        (
            "postgres://u:hunter22@127.0.0.1:5432/app?sslmode=disable&sslrootcert=/x",
            "sslrootcert",
        ),
        (
            "postgres://u:hunter22@127.0.0.1:5432/app?sslrootcert=/no/such/ca.pem",
            "/no/such/ca.pem",
        ),
    ] {
        let message = refused(url).await;
        assert!(message.contains(says), "{url}: {message}");
        assert!(!message.contains("hunter22"), "{url}: {message}");
    }
    // Nothing listens on a port just freed.
    let port = sluice_testkit::free_port().unwrap();
    let url = format!("postgres://u:hunter22@127.0.0.1:{port}/app?connect_timeout_ms=500");
    let started = Instant::now();
    let message = refused(&url).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert!(message.contains("cannot connect"), "{message}");
    assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
    assert!(!message.contains("hunter22"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_starting_at_once_share_one_migration() {
    let server = PostgresServer::start().expect("postgres");
    let url = format!("{}?schema=shared&pool_size=2", server.url());
    let mut starting = Vec::new();
    for _ in 0..6 {
        let url = url.clone();
        starting.push(tokio::spawn(
            async move { PostgresStore::connect(&url).await },
        ));
    }
    let mut stores = Vec::new();
    for start in starting {
        stores.push(start.await.unwrap().expect("every server starts"));
    }
    assert_eq!(
        server
            .psql("SELECT value FROM shared.meta WHERE name = 'schema_version'")
            .unwrap()
            .trim(),
        "2"
    );
    // They share one limit.
    let mut admitted = 0;
    for store in &stores {
        let limiter = Limiter::builder(store.clone())
            .policy(Policy::new("api", "user:3/h").unwrap())
            .build()
            .unwrap();
        for _ in 0..2 {
            let checked = limiter.check("api", &[("user", "u")], 1).await.unwrap();
            admitted += usize::from(checked.decision.allowed());
        }
    }
    assert_eq!(admitted, 3);
}

#[tokio::test]
async fn a_schema_from_a_newer_sluice_is_refused_and_a_missing_database_is_no_outage() {
    let server = PostgresServer::start().expect("postgres");
    let store = PostgresStore::connect(&server.url())
        .await
        .expect("connect");
    drop(store);
    server
        .psql("UPDATE sluice.meta SET value = '99' WHERE name = 'schema_version'")
        .unwrap();
    let error = PostgresStore::connect(&server.url())
        .await
        .err()
        .expect("refused");
    assert!(matches!(error, PostgresError::Unsupported(_)), "{error}");
    assert!(error.to_string().contains("version 99"), "{error}");

    let url = format!("{}/no_such_db", server.url().rsplit_once('/').unwrap().0);
    let error = PostgresStore::connect(&url).await.err().expect("refused");
    assert!(error.to_string().contains("no_such_db"), "{error}");
    // A database that does not exist will not appear by retrying: not transient.
    assert!(!error.is_transient(), "{error}");
    assert!(matches!(StoreError::from(error), StoreError::Protocol(_)));
}
