//! Connecting the way users write store URLs: an ACL user and password, a database number,
//! TLS with a private CA, and clear errors for what cannot work.

use sluice_limiter::{Limiter, Policy};
use sluice_redis::RedisStore;
use sluice_testkit::{RedisServer, free_port};

async fn admits(store: RedisStore) -> bool {
    let limiter = Limiter::builder(store)
        .policy(Policy::new("p", "user:10/h").unwrap().namespace("connect"))
        .build()
        .unwrap();
    limiter
        .check("p", &[("user", "u")], 1)
        .await
        .unwrap()
        .decision
        .allowed()
}

#[tokio::test]
async fn acl_user_and_database_number() {
    let server =
        RedisServer::start_with(&["--user", "alice", "on", ">wonderland", "~*", "&*", "+@all"])
            .expect("redis-server");
    let port = server.port();
    let good = format!("redis://alice:wonderland@127.0.0.1:{port}/3");
    assert!(admits(RedisStore::connect(&good).await.expect("connect as alice")).await);
    // The counter went to database 3.
    assert_eq!(server.cli(&["-n", "3", "DBSIZE"]).unwrap().trim(), "1");
    assert_eq!(server.cli(&["-n", "0", "DBSIZE"]).unwrap().trim(), "0");

    let wrong = format!("redis://alice:queen@127.0.0.1:{port}");
    let error = RedisStore::connect(&wrong)
        .await
        .err()
        .expect("a wrong password is refused");
    assert!(
        !error.to_string().contains("queen"),
        "no password in messages: {error}"
    );
}

#[tokio::test]
async fn tls_with_a_private_ca() {
    let dir = std::env::temp_dir().join(format!("sluice-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    sluice_testkit::tls::certificates(&dir).expect("test certificates");
    let tls_port = free_port().unwrap().to_string();
    let file = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let server = RedisServer::start_with(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &file("server.crt"),
        "--tls-key-file",
        &file("server.key"),
        "--tls-ca-cert-file",
        &file("ca.crt"),
        "--tls-auth-clients",
        "no",
    ])
    .expect("redis-server with TLS");

    let url = format!("rediss://127.0.0.1:{tls_port}?tls_ca={}", file("ca.crt"));
    assert!(
        admits(
            RedisStore::connect(&url)
                .await
                .expect("TLS with the private CA")
        )
        .await
    );
    // Without the CA the certificate is not trusted: no silent downgrade.
    let untrusted = format!("rediss://127.0.0.1:{tls_port}");
    assert!(RedisStore::connect(&untrusted).await.is_err());
    // Plain text to the TLS port fails too.
    assert!(
        RedisStore::builder(&format!("redis://127.0.0.1:{tls_port}"))
            .connect_timeout(std::time::Duration::from_millis(500))
            .timeout(std::time::Duration::from_millis(500))
            .connect()
            .await
            .is_err()
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn unusable_urls_fail_clearly() {
    for url in [
        "http://127.0.0.1:1",
        "redis+cluster://",
        "redis://127.0.0.1:6379?tls_ca=/x",
    ] {
        assert!(RedisStore::connect(url).await.is_err(), "{url}");
    }
    let closed = format!("redis://127.0.0.1:{}", free_port().unwrap());
    let error = RedisStore::builder(&closed)
        .connect_timeout(std::time::Duration::from_millis(300))
        .connect()
        .await
        .err()
        .expect("nothing listens there");
    assert!(
        error.is_transient(),
        "a refused connection may work later: {error}"
    );
}
