//! The rule language by example: what parses to what, and where errors point.

use sluice_core::parse::{RuleError, parse_rule};
use sluice_core::rule::{MAX_DEPTH, MAX_LEAVES};
use sluice_core::{Algorithm, Leaf, LeafOptions, Rate, Rule, Selector, Span, Unit};

fn rate(count: u64, multiplier: u64, unit: Unit) -> Rate {
    Rate::new(count, Span::new(multiplier, unit).unwrap()).unwrap()
}

fn leaf(names: &[&str], count: u64, multiplier: u64, unit: Unit) -> Leaf {
    Leaf {
        selector: Selector::new(names.iter().copied()).unwrap(),
        ..Leaf::new(rate(count, multiplier, unit))
    }
}

fn global(count: u64, multiplier: u64, unit: Unit) -> Rule {
    Rule::Leaf(leaf(&[], count, multiplier, unit))
}

fn parse(text: &str) -> Rule {
    parse_rule(text).unwrap_or_else(|err| panic!("{text:?}: {err}"))
}

#[test]
fn plain_rates() {
    assert_eq!(parse("10/s"), global(10, 1, Unit::Second));
    assert_eq!(parse("15/m"), global(15, 1, Unit::Minute));
    assert_eq!(parse("100/5m"), global(100, 5, Unit::Minute));
    assert_eq!(parse("1000/day"), global(1000, 1, Unit::Day));
    assert_eq!(parse("3/10min"), global(3, 10, Unit::Minute));
    assert_eq!(parse("2/hour"), global(2, 1, Unit::Hour));
    assert_eq!(parse("1_000/2Weeks"), global(1000, 2, Unit::Week));
    assert_eq!(parse("  7 / 3y  "), global(7, 3, Unit::Year));
}

#[test]
fn rate_from_str() {
    assert_eq!("100/5m".parse::<Rate>(), Ok(rate(100, 5, Unit::Minute)));
    assert_eq!("1/year".parse::<Rate>(), Ok(rate(1, 1, Unit::Year)));
    let err = "10/s burst=2".parse::<Rate>().unwrap_err();
    assert_eq!((err.column, err.expected.as_str()), (6, "end of rate"));
}

#[test]
fn selectors() {
    let user = Rule::Leaf(leaf(&["user"], 10, 5, Unit::Minute));
    assert_eq!(parse("user:10/5m"), user);
    assert_eq!(parse("user : 10/5m"), user);
    assert_eq!(
        parse("ip+user:10/5m"),
        Rule::Leaf(leaf(&["ip", "user"], 10, 5, Unit::Minute))
    );
    // `or` is only a keyword before `(`; names that merely start with it are plain names.
    assert_eq!(
        parse("or:1/s"),
        Rule::Leaf(leaf(&["or"], 1, 1, Unit::Second))
    );
    assert_eq!(
        parse("order:1/s"),
        Rule::Leaf(leaf(&["order"], 1, 1, Unit::Second))
    );
    let dotted = leaf(&["x-forwarded-for", "_tenant.id"], 1, 1, Unit::Second);
    assert_eq!(parse("x-forwarded-for+_tenant.id:1/s"), Rule::Leaf(dotted));
}

#[test]
fn options() {
    let mut burst = leaf(&[], 5, 1, Unit::Minute);
    burst.options.burst = Some(10);
    assert_eq!(parse("5/m burst=10"), Rule::Leaf(burst));

    let mut hot = leaf(&[], 10_000, 1, Unit::Second);
    hot.options.prefetch = Some(100);
    assert_eq!(parse("10000/s prefetch=100"), Rule::Leaf(hot.clone()));
    assert_eq!(hot.to_string(), "10000/s prefetch=100");

    let mut log = leaf(&["user"], 100, 1, Unit::Hour);
    log.options.algorithm = Some(Algorithm::SlidingLog);
    assert_eq!(parse("user:100/h algorithm=sliding-log"), Rule::Leaf(log));

    let mut all = leaf(&[], 1, 1, Unit::Second);
    all.options = LeafOptions {
        algorithm: Some(Algorithm::SlidingWindow),
        burst: Some(3),
        windows: Some(6),
        prefetch: None,
    };
    let all = Rule::Leaf(all);
    assert_eq!(parse("1/s windows=6 algo=sliding_window burst=3"), all);
    assert_eq!(
        parse("1/s burst = 3 ALGORITHM=Sliding-Window windows=6"),
        all
    );
}

#[test]
fn groups() {
    let pair = vec![global(10, 1, Unit::Second), global(100, 1, Unit::Minute)];
    assert_eq!(parse("10/s; 100/m"), Rule::Or(pair.clone()));
    assert_eq!(parse("10/s; 100/m;"), Rule::Or(pair.clone()));
    assert_eq!(parse("10/s;"), global(10, 1, Unit::Second));
    assert_eq!(parse("or(10/s, 100/m)"), Rule::Or(pair.clone()));
    assert_eq!(parse("OR ( 10/s , 100/m )"), Rule::Or(pair.clone()));
    assert_eq!(
        parse("or(10/s)"),
        Rule::Or(vec![global(10, 1, Unit::Second)])
    );
    let and = Rule::And(vec![
        Rule::Leaf(leaf(&["apikey"], 100, 1, Unit::Hour)),
        global(10, 1, Unit::Second),
    ]);
    assert_eq!(parse("and(apikey:100/h, 10/s)"), and);
    assert_eq!(
        parse("or(10/s, 100/m); and(x:1/s)").to_string(),
        "or(or(10/s, 100/m), and(x:1/s))"
    );
}

#[test]
fn deep_nesting() {
    let mut text = "1/s".to_owned();
    let mut expected = global(1, 1, Unit::Second);
    for depth in 0..MAX_DEPTH {
        let (keyword, group): (_, fn(Vec<Rule>) -> Rule) = if depth % 2 == 0 {
            ("and", Rule::And)
        } else {
            ("or", Rule::Or)
        };
        text = format!("{keyword}({text}, {}/s)", depth + 2);
        expected = group(vec![expected, global(depth as u64 + 2, 1, Unit::Second)]);
    }
    assert_eq!(parse(&text), expected);

    // One more level is too deep, whether it is a group or a top-level list.
    // Errors point at the innermost group, the one that goes too deep.
    let innermost = text.find("and(1/s").unwrap() + 1;
    let err = parse_rule(&format!("or({text})")).unwrap_err();
    assert_eq!((err.column, err.found.as_str()), (innermost + 3, "\"and\""));
    let err = parse_rule(&format!("9/s; {text}")).unwrap_err();
    assert!(err.expected.contains("nested at most"), "{err}");
    let err = parse_rule(&format!("{text}; 9/s")).unwrap_err();
    assert_eq!(err.column, innermost, "{err}");
}

#[test]
fn leaf_limit() {
    let leaves = vec!["1/s"; MAX_LEAVES];
    assert_eq!(parse(&leaves.join("; ")).leaves().len(), MAX_LEAVES);
    let err = parse_rule(&format!("{}; ip:2/s", leaves.join("; "))).unwrap_err();
    assert_eq!(err.column, MAX_LEAVES * 5 + 1);
    assert_eq!(err.found, "\"ip\"");
    assert!(err.expected.contains("at most 64 leaves"), "{err}");
}

#[test]
fn error_display() {
    let err = parse_rule("10/s; 10/x").unwrap_err();
    assert_eq!(
        err.to_string(),
        "column 10: expected a unit (s, m, h, d, w, y or a long name), found \"x\""
    );
    let err = parse_rule("10/s or(").unwrap_err();
    assert_eq!(
        err.to_string(),
        "column 6: expected an option (burst, algorithm, windows or prefetch), found \"or\""
    );
}

#[test]
fn bad_rules() {
    #[rustfmt::skip]
    let cases: &[(&str, usize, &str, &str)] = &[
        // text, column, fragment of `expected`, found
        ("", 1, "a rule", "end of input"),
        ("   \t\n ", 1, "a rule", "end of input"),
        ("0/s", 1, "a count from 1 to 1000000000000", "\"0\""),
        ("1000000000001/s", 1, "a count from 1 to 1000000000000", "\"1000000000001\""),
        ("99999999999999999999/s", 1, "a count from 1 to 1000000000000", "\"99999999999999999999\""),
        ("10/0s", 4, "a span of at least one unit", "\"0s\""),
        ("10/x", 4, "a unit (s, m, h, d, w, y or a long name)", "\"x\""),
        ("10/5ms", 5, "a unit", "\"ms\""),
        ("10/5 m", 6, "right after the number", "\"m\""),
        ("10/5", 5, "a unit", "end of input"),
        ("1/11y", 3, "a span of at most ten years", "\"11y\""),
        ("1/99999999999999999999s", 3, "a span of at most ten years", "\"99999999999999999999s\""),
        ("10", 3, "`/`", "end of input"),
        ("10 s", 4, "`/`", "\"s\""),
        ("1.5/s", 2, "`/`", "\".\""),
        ("10/s burst=0", 12, "a burst size from 1 to 1000000000000", "\"0\""),
        ("10/s burst=", 12, "a burst size", "end of input"),
        ("10/s burst", 11, "`=`", "end of input"),
        ("10/s burst=1 burst=2", 14, "at most one `burst` option", "\"burst\""),
        ("10/s algo=gcra algorithm=gcra", 16, "at most one `algorithm` option", "\"algorithm\""),
        ("10/s windows=0", 14, "a number of windows from 1 to 3600", "\"0\""),
        ("10/s windows=3601", 14, "a number of windows from 1 to 3600", "\"3601\""),
        ("10/s algorithm=nope", 16, "an algorithm (gcra, sliding-window", "\"nope\""),
        ("10/s algorithm=5", 16, "an algorithm", "\"5\""),
        ("10/s foo=1", 6, "an option (burst, algorithm", "\"foo\""),
        ("10/s prefetch=1", 15, "a block size from 2 to 1000000000000", "\"1\""),
        ("10/s prefetch=0", 15, "a block size from 2 to 1000000000000", "\"0\""),
        ("10/s prefetch=x", 15, "a block size", "\"x\""),
        ("10/s prefetch=2 prefetch=3", 17, "at most one `prefetch` option", "\"prefetch\""),
        ("or(10/s", 8, "`)` or `,`", "end of input"),
        ("or(10/s,)", 9, "a rule", "\")\""),
        ("or()", 4, "a rule", "\")\""),
        ("xor(10/s)", 1, "`or` or `and` before `(`", "\"xor\""),
        ("user:", 6, "a count", "end of input"),
        ("user", 5, "`:` or `+`", "end of input"),
        ("user+:1/s", 6, "a selector name", "\":\""),
        (":1/s", 1, "a rule", "\":\""),
        ("a+a:1/s", 3, "a selector name not already in this selector", "\"a\""),
        ("10/s )", 6, "end of rule", "\")\""),
        ("10/s;;", 6, "a rule", "\";\""),
        (";", 1, "a rule", "\";\""),
        ("10/s, 5/m", 5, "end of rule", "\",\""),
        ("é/s", 1, "a rule", "\"é\""),
        ("ünïcode:1/x", 1, "a rule", "\"ü\""),
        ("ab:1/s; ü", 9, "a rule", "\"ü\""),
        ("1/s\u{0}", 4, "end of rule", "\"\\0\""),
    ];
    for &(text, column, expected, found) in cases {
        let err: RuleError = parse_rule(text).expect_err(text);
        assert_eq!(err.column, column, "{text:?}: {err}");
        assert!(err.expected.contains(expected), "{text:?}: {err}");
        assert_eq!(err.found, found, "{text:?}: {err}");
    }
}

#[test]
fn long_names_are_refused_and_cut_short() {
    let name = "n".repeat(65);
    let err = parse_rule(&format!("{name}:1/s")).unwrap_err();
    assert_eq!(
        (err.column, err.expected.as_str()),
        (1, "a selector name of at most 64 characters")
    );
    assert_eq!(err.found, format!("\"{}…\"", "n".repeat(32)));
}

#[test]
fn huge_inputs_fail_quickly() {
    let err = parse_rule(&"or(".repeat(100_000)).unwrap_err();
    assert_eq!(err.column, MAX_DEPTH * 3 + 1);
    let err = parse_rule(&"1/s;".repeat(100_000)).unwrap_err();
    assert_eq!(err.column, MAX_LEAVES * 4 + 1);
    let err = parse_rule(&" ".repeat(1_000_000)).unwrap_err();
    assert_eq!(err.column, 1);
    let err = parse_rule(&"9".repeat(1_000_000)).unwrap_err();
    assert_eq!(err.found.chars().count(), 35);
}
