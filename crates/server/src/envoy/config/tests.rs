//! The YAML loader and the tree, on envoyproxy/ratelimit's examples.

use super::*;

const EXAMPLE: &str = r#"
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: remote_address
    rate_limit:
      unit: 5 minutes
      requests_per_unit: 10
      algorithm: gcra
      burst: 20
  - key: path
    value: "/foo*"
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: { unlimited: true }
"#;

fn config() -> EnvoyConfig {
    parse([(Path::new("a.yaml"), EXAMPLE)]).unwrap()
}

#[test]
fn matches_like_envoyproxy_ratelimit() {
    let c = config();
    let limit = |entries: &[(&str, &str)]| match c.limit_for("mongo_cps", entries) {
        Some(Limit::Limited(l)) => Some(l.policy.clone()),
        Some(Limit::Unlimited) => Some("unlimited".into()),
        _ => None,
    };
    assert_eq!(
        limit(&[("database", "users")]).as_deref(),
        Some("envoy.mongo_cps.database=users")
    );
    assert_eq!(limit(&[("database", "other")]), None);
    assert_eq!(
        limit(&[("remote_address", "10.0.0.1")]).as_deref(),
        Some("envoy.mongo_cps.remote_address")
    );
    assert!(limit(&[("path", "/foo/bar")]).is_some());
    assert_eq!(limit(&[("path", "/bar")]), None);
    assert_eq!(limit(&[("key1", "value1")]), None);
    assert_eq!(
        limit(&[("key1", "value1"), ("subkey1", "x")]).as_deref(),
        Some("unlimited")
    );
    assert_eq!(c.policies.len(), 4);
}

#[test]
fn units_take_multipliers() {
    assert_eq!(parse_unit("5 minutes").unwrap().duration().as_secs(), 300);
    assert_eq!(parse_unit("HOUR").unwrap().duration().as_secs(), 3600);
    assert!(parse_unit("fortnight").is_err());
}

#[test]
fn rejects_bad_files_naming_the_descriptor() {
    let bad = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: parsec, requests_per_unit: 1 }\n";
    let e = parse([(Path::new("bad.yaml"), bad)]).unwrap_err();
    assert!(e.to_string().contains("bad.yaml: descriptor `k`"), "{e}");
    let unknown = "domain: d\ndescriptors:\n  - key: k\n    rate_limt: {}\n";
    assert!(parse([(Path::new("u.yaml"), unknown)]).is_err());
}

/// Written from envoyproxy/ratelimit's wildcard tests: a `*` anywhere in a value matches
/// any run of characters; an exact value is tried first; no `*`, no wildcard.
#[test]
fn stars_match_anywhere_in_a_value() {
    let yaml = r#"
domain: d
descriptors:
  - key: wild
    value: foo*
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: noWild
    value: foo
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: midWild
    value: bar*b
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: multiWild
    value: foo*bar*baz
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit: { unit: minute, requests_per_unit: 20 }
"#;
    let c = parse([(Path::new("w.yaml"), yaml)]).unwrap();
    let matched = |entries: &[(&str, &str)]| c.limit_for("d", entries).is_some();
    assert!(matched(&[("wild", "foo1")]));
    assert!(matched(&[("wild", "foo")]));
    assert!(!matched(&[("wild", "bar")]));
    assert!(!matched(&[("noWild", "foo1")]), "no star, no prefix match");
    assert!(matched(&[("midWild", "barab")]));
    assert!(matched(&[("midWild", "bar123b")]));
    assert!(matched(&[("midWild", "barb")]));
    assert!(
        !matched(&[("midWild", "bab")]),
        "prefix and suffix may not overlap"
    );
    assert!(!matched(&[("midWild", "bara")]));
    assert!(matched(&[("multiWild", "foobarbaz")]));
    assert!(matched(&[("multiWild", "foo-1-bar-2-baz")]));
    assert!(!matched(&[("multiWild", "foobaz")]));
    assert!(!matched(&[("multiWild", "foobazbar")]), "parts in order");
    assert!(matched(&[("nestedWild", "val1"), ("wild", "goo2")]));
    assert!(!matched(&[("nestedWild", "val1"), ("wild", "foo2")]));
}

/// As envoyproxy/ratelimit: `replaces` may not be empty nor name its own limit, and
/// `unlimited` refuses a `unit` but ignores a lone `requests_per_unit`.
#[test]
fn replaces_and_unlimited_are_checked_as_envoyproxy_ratelimit_does() {
    let with = |rate_limit: &str| {
        let yaml = format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n{rate_limit}");
        parse([(Path::new("r.yaml"), yaml.as_str())]).map(|c| c.policies.len())
    };
    let error = |rate_limit: &str| with(rate_limit).unwrap_err().to_string();
    let unit = "      unit: second\n      requests_per_unit: 5\n";
    assert!(
        error(&format!(
            "      name: self\n      replaces:\n        - name: self\n{unit}"
        ))
        .contains("`replaces` names this limit itself (`self`)")
    );
    assert!(
        error(&format!(
            "      name: self\n      replaces:\n        - name:\n{unit}"
        ))
        .contains("a `replaces` entry has an empty `name`")
    );
    assert_eq!(
        with(&format!(
            "      name: a\n      replaces:\n        - name: b\n{unit}"
        )),
        Ok(1)
    );
    assert!(
        error("      unlimited: true\n      unit: day\n      requests_per_unit: 25\n")
            .contains("`unlimited` takes no `unit`")
    );
    assert_eq!(
        with("      unlimited: true\n      requests_per_unit: 25\n"),
        Ok(0)
    );
}

#[test]
fn share_threshold_needs_a_wildcard() {
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n";
    let e = parse([(Path::new("s.yaml"), yaml)]).unwrap_err();
    assert!(
        e.to_string()
            .contains("share_threshold needs a wildcard value"),
        "{e}"
    );
    let ok = yaml.replace("value: v", "value: v*");
    assert!(parse([(Path::new("s.yaml"), ok.as_str())]).is_ok());
}

/// The configs envoyproxy/ratelimit's own config tests refuse are refused here too
/// (duplicate domain, duplicate key, empty domain, empty key, a bad unit, an unknown
/// key), and its units mean what they mean there.
#[test]
fn refuses_what_envoyproxy_ratelimit_refuses() {
    let one = |text: &str| parse([(Path::new("c.yaml"), text)]);
    let two = |a: &str, b: &str| parse([(Path::new("a.yaml"), a), (Path::new("b.yaml"), b)]);
    let limited = "  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n";
    let file = format!("domain: d\ndescriptors:\n{limited}");
    assert!(one(&file).is_ok());
    assert!(
        two(&file, &file)
            .unwrap_err()
            .message
            .contains("defined twice")
    );
    assert!(one(&format!("domain: d\ndescriptors:\n{limited}{limited}")).is_err());
    assert!(one(&format!("domain: \"\"\ndescriptors:\n{limited}")).is_err());
    assert!(one(&file.replace("key: k", "key: \"\"")).is_err());
    assert!(one(&file.replace("unit: hour", "unit: fortnight")).is_err());
    assert!(one(&file.replace("rate_limit:", "ratelimit:")).is_err());
    for (unit, seconds) in [
        ("second", 1),
        ("minute", 60),
        ("hour", 3_600),
        ("day", 86_400),
        ("week", 7 * 86_400),
        ("month", 30 * 86_400),
        ("year", 365 * 86_400),
    ] {
        assert_eq!(
            parse_unit(unit).unwrap().duration().as_secs(),
            seconds,
            "{unit}"
        );
        assert_eq!(
            parse_unit(&unit.to_uppercase())
                .unwrap()
                .duration()
                .as_secs(),
            seconds
        );
    }
}
