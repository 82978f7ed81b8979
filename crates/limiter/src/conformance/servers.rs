//! Two app servers on one store: what one admits, the other counts.

use sluice_core::Algorithm;

use super::StoreFactory;
use super::harness::*;
use crate::Denial;

/// Two limiters over two stores from the factory (two app servers, two connections), 64
/// tasks split between them on one identifier: exactly the limit passes, for every algorithm
/// and for compound rules, and each server then sees the limit spent.
pub async fn two_servers_share_one_limit<F: StoreFactory>(factory: &F) {
    let ns = Namespace::new("two_servers_share_one_limit");
    let mut policies: Vec<_> = Algorithm::ALL
        .iter()
        .map(|&algorithm| {
            let rule = format!("user:100/{}", long_span(algorithm));
            ns.policy(algorithm.name(), &rule).algorithm(algorithm)
        })
        .collect();
    policies.push(ns.policy("or", "or(user:100/h algorithm=sliding-log, 150/h)"));
    policies.push(ns.policy("and", "and(user:100/h, 150/h algorithm=sliding-window)"));
    let servers = [
        limiter(factory, policies.clone()),
        limiter(factory, policies),
    ];

    let alice = |_| Attempt::new(1).with("user", "alice");
    for algorithm in Algorithm::ALL {
        let name = algorithm.name();
        let outcomes = hammer(&servers, name, TASKS, 5, alice).await;
        assert_eq!(total(&outcomes), 100, "{name}: admitted over two servers");
        for (i, server) in servers.iter().enumerate() {
            let d = peek(server, name, ALICE, 1).await.decision;
            assert!(
                matches!(d.denial, Some(Denial::Limited { .. })),
                "{name}: server {i} after the race"
            );
        }
    }

    let four_users = |t: usize| Attempt::new(1).with("user", format!("user-{}", t % 4));
    let outcomes = hammer(&servers, "or", TASKS, 10, four_users).await;
    assert_eq!(total(&outcomes), 150, "or over two servers: admitted");
    for user in 0..4 {
        let user = format!("user-{user}");
        let mine = admitted(&outcomes, |a| a.value("user") == Some(&user));
        assert!(mine <= 100, "or over two servers: {user} admitted {mine}");
    }
    let outcomes = hammer(&servers, "and", TASKS, 5, alice).await;
    assert_eq!(total(&outcomes), 150, "and over two servers: admitted");
    for (i, server) in servers.iter().enumerate() {
        let d = peek(server, "and", ALICE, 1).await.decision;
        assert!(
            matches!(d.denial, Some(Denial::Limited { .. })),
            "and: server {i} after the race"
        );
    }
}
