//! A thread's lean checks keep their last identifier and write it again only when the next
//! check names another counter. Checked against a model: a long sequence of checks on one
//! thread, with values that differ by a byte at either end, values written hashed, a global
//! leaf, a leaf of two selectors, a missing selector and reloads that change a rule, each
//! answer's `remaining` compared with the hits the model counted for that counter. A check
//! charged to the previous check's counter would show as a wrong `remaining`.

use std::collections::HashMap;

use sluice_limiter::{Error, Limiter, ManualClock, MemoryStore, Policy};

const LIMIT: u64 = 10_000;

fn policies(user_rate: &str) -> Vec<Policy> {
    vec![
        Policy::new("user", &format!("user:{LIMIT}/{user_rate}")).unwrap(),
        Policy::new("other", &format!("user:{LIMIT}/d")).unwrap(),
        Policy::new("global", &format!("{LIMIT}/h")).unwrap(),
        Policy::new("pair", &format!("user+ip:{LIMIT}/h")).unwrap(),
    ]
}

/// A small deterministic generator (a 64-bit LCG's high bits): the sequence is the same on
/// every run.
struct Steps(u64);

impl Steps {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

#[test]
fn a_thread_s_last_identifier_is_reused_only_for_the_same_counter() {
    let long = "v".repeat(70);
    // `a b` is written hashed: `#` and hex digits, which as a value would be hashed again.
    let hashed = sluice_limiter::selector_value("a b");
    let values = [
        "alice", "alic", "alicee", "xalice", "bob", "a b", &hashed, "", "ali:ce", &long,
    ];
    let names = ["user", "other", "global", "pair"];
    let clock = ManualClock::new(1_000_000_000_000_000);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let limiter = Limiter::builder(store)
        .clock(clock)
        .policies(policies("h"))
        .build()
        .unwrap();
    // The model: hits per counter, by the rule in force and the values it reads.
    let mut hits: HashMap<(String, String), u64> = HashMap::new();
    let mut user_rate = "h";
    let mut steps = Steps(7);
    let mut repeats = 0;
    let mut last = None;
    for step in 0..4_000 {
        if step % 500 == 499 {
            // A reload: `user` gets another rate, so its counters are new ones.
            user_rate = if user_rate == "h" { "m" } else { "h" };
            limiter.replace_policies(policies(user_rate)).unwrap();
        }
        // Often the same policy and value again, as a client's next request on its
        // connection.
        let name = match last {
            Some((name, _)) if steps.next(3) > 0 => name,
            _ => names[steps.next(names.len())],
        };
        let value = match last {
            Some((_, value)) if steps.next(3) > 0 => value,
            _ => values[steps.next(values.len())],
        };
        let ip = values[steps.next(2)];
        if step % 97 == 0 && name != "global" {
            let missing = limiter.try_check_decision_now(name, &[("ip", ip)], 1);
            assert!(
                matches!(missing, Some(Err(Error::MissingSelector { .. }))),
                "step {step}: {missing:?}"
            );
        }
        let rule = match name {
            "user" => format!("user/{user_rate}"),
            _ => name.to_owned(),
        };
        let counter = match name {
            "global" => String::new(),
            "pair" => format!("{value}\u{0}{ip}"),
            _ => value.to_owned(),
        };
        let count = hits.entry((rule, counter)).or_default();
        *count += 1;
        let decided = limiter
            .try_check_decision_now(name, &[("user", value), ("ip", ip)], 1)
            .expect("the memory store answers at once")
            .unwrap();
        assert!(decided.decision.allowed(), "step {step}");
        assert_eq!(
            decided.decision.remaining,
            LIMIT - *count,
            "step {step}: {name} for {value:?} (ip {ip:?})"
        );
        if last == Some((name, value)) {
            repeats += 1;
        }
        last = Some((name, value));
    }
    // The sequence exercises the reuse (a check of the same counter as the last), and
    // enough changes of counter around it.
    assert!((1_000..3_000).contains(&repeats), "{repeats} repeats");
}
