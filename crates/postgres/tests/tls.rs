//! TLS against a PostgreSQL server that speaks it (a certificate from a private CA):
//! `sslmode=require` with the CA in `sslrootcert` decides over TLS; without the CA the
//! certificate is refused rather than trusted, and never traded for plain text; `prefer`
//! uses TLS when the server offers it; `require` against a server without TLS fails clearly.

use sluice_limiter::{Limiter, Policy};
use sluice_postgres::PostgresStore;
use sluice_testkit::PostgresServer;

const ALICE: &[(&str, &str)] = &[("user", "alice")];

/// Sessions of the store's user now open with TLS, and without, as the server sees them.
fn sessions(server: &PostgresServer) -> (u32, u32) {
    let sql = "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl) \
               FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
               WHERE a.application_name = 'sluice-tls-test'";
    let out = server.psql(sql).expect("psql");
    let (tls, plain) = out.trim().split_once('|').expect("two counts");
    (tls.parse().unwrap(), plain.parse().unwrap())
}

/// Five decisions of `user:3/h` through a store on `url`: three admitted, two denied.
async fn decides(url: &str, namespace: &str) {
    let store = PostgresStore::connect(url)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let limiter = Limiter::builder(store)
        .policy(Policy::new("tls", "user:3/h").unwrap().namespace(namespace))
        .build()
        .unwrap();
    let mut admitted = 0;
    for _ in 0..5 {
        let checked = limiter.check("tls", ALICE, 1).await.unwrap();
        assert!(checked.without_store.is_none(), "the store did not decide");
        admitted += u32::from(checked.decision.allowed());
    }
    assert_eq!(admitted, 3);
}

#[tokio::test]
async fn require_with_the_ca_decides_over_tls() {
    let (server, ca) = PostgresServer::start_tls().expect("postgres with TLS");
    let base = format!("{}?application_name=sluice-tls-test", server.url());
    let url = format!("{base}&sslmode=require&sslrootcert={}", ca.display());
    let store = PostgresStore::connect(&url)
        .await
        .expect("connect over TLS");
    store.round_trip().await.expect("SELECT 1 over TLS");
    let (tls, plain) = sessions(&server);
    assert!(tls >= 1 && plain == 0, "{tls} TLS sessions, {plain} plain");
    decides(&url, "require").await;

    // `prefer` takes TLS when the server offers it.
    let url = format!("{base}&sslmode=prefer&sslrootcert={}", ca.display());
    let prefer = PostgresStore::connect(&url).await.expect("connect, prefer");
    prefer.round_trip().await.expect("SELECT 1, prefer");
    let (_, plain) = sessions(&server);
    assert_eq!(plain, 0, "prefer fell back to plain text");
}

#[tokio::test]
async fn an_unknown_ca_is_refused_not_trusted() {
    let (server, _ca) = PostgresServer::start_tls().expect("postgres with TLS");
    let url = format!(
        "{}?application_name=sluice-tls-test&sslmode=require&connect_timeout_ms=3000",
        server.url()
    );
    let message = match PostgresStore::connect(&url).await {
        Ok(_) => panic!("a certificate from an unknown CA was trusted"),
        Err(e) => e.to_string(),
    };
    assert!(
        message.to_lowercase().contains("certificate"),
        "the error does not say why: {message}"
    );
    assert_eq!(sessions(&server), (0, 0), "a session was opened anyway");
}

#[tokio::test]
async fn require_against_a_server_without_tls_fails_clearly() {
    let server = PostgresServer::start().expect("postgres");
    let url = format!("{}?sslmode=require&connect_timeout_ms=3000", server.url());
    let message = match PostgresStore::connect(&url).await {
        Ok(_) => panic!("sslmode=require connected without TLS"),
        Err(e) => e.to_string(),
    };
    assert!(
        message.to_lowercase().contains("tls") || message.to_lowercase().contains("ssl"),
        "the error does not say TLS: {message}"
    );
}
