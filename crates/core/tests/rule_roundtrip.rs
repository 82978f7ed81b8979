//! parse(print(rule)) == rule for every valid rule, and no text makes the parser panic.

use proptest::prelude::*;
use proptest::sample::{Index, select};
use sluice_core::algorithm::concurrency::MAX_CONCURRENT;
use sluice_core::parse::parse_rule;
use sluice_core::rate::{MAX_COUNT, MAX_SPAN};
use sluice_core::rule::{MAX_LEAVES, MAX_WINDOWS};
use sluice_core::{Algorithm, Leaf, LeafOptions, Rate, Rule, Selector, Span, Unit};

fn rate() -> impl Strategy<Value = Rate> {
    let count = prop_oneof![1..=100u64, 1..=MAX_COUNT];
    (count, select(Unit::ALL.to_vec()))
        .prop_flat_map(|(count, unit)| {
            let longest = MAX_SPAN.as_secs() / unit.seconds();
            (Just(count), prop_oneof![1..=10u64, 1..=longest], Just(unit))
        })
        .prop_map(|(count, multiplier, unit)| {
            Rate::new(count, Span::new(multiplier, unit).unwrap()).unwrap()
        })
}

fn selector() -> impl Strategy<Value = Selector> {
    // Keywords and option names are valid selector names too; the printer must keep them apart.
    let name = prop_oneof![
        select(vec!["ip", "user", "or", "AND", "order", "burst", "s", "m5"]).prop_map(String::from),
        "[a-zA-Z_][a-zA-Z0-9_.-]{0,63}",
    ];
    prop::collection::hash_set(name, 0..4).prop_map(|names| Selector::new(names).unwrap())
}

fn options() -> impl Strategy<Value = LeafOptions> {
    let algorithm = prop::option::of(select(Algorithm::ALL.to_vec()));
    let burst = prop::option::of(prop_oneof![1..=100u64, 1..=MAX_COUNT]);
    let windows = prop::option::of(1..=MAX_WINDOWS);
    let prefetch = prop::option::of(prop_oneof![2..=1_000u64, 2..=MAX_COUNT]);
    (algorithm, burst, windows, prefetch).prop_map(|(algorithm, burst, windows, prefetch)| {
        LeafOptions {
            algorithm,
            burst,
            windows,
            prefetch,
        }
    })
}

fn rate_leaf() -> impl Strategy<Value = Rule> {
    (selector(), rate(), options()).prop_map(|(selector, rate, options)| {
        Rule::Leaf(Leaf {
            selector,
            rate,
            options,
        })
    })
}

/// `user:3 concurrent lease=30s`, the lease time given or not.
fn concurrency_leaf() -> impl Strategy<Value = Rule> {
    let count = prop_oneof![1..=10u64, 1..=MAX_CONCURRENT];
    let lease = prop::option::of(rate().prop_map(|rate| rate.span()));
    (selector(), count, lease).prop_map(|(selector, count, lease)| {
        let mut leaf = Leaf::concurrent(count, lease).unwrap();
        leaf.selector = selector;
        Rule::Leaf(leaf)
    })
}

fn leaf() -> impl Strategy<Value = Rule> {
    prop_oneof![3 => rate_leaf(), 1 => concurrency_leaf()]
}

/// Leaves joined by or/and, up to four groups deep.
fn rule() -> impl Strategy<Value = Rule> {
    leaf()
        .prop_recursive(4, 48, 4, |inner| {
            let children = prop::collection::vec(inner, 1..=4);
            prop_oneof![
                children.clone().prop_map(Rule::Or),
                children.prop_map(Rule::And)
            ]
        })
        .prop_filter("too many leaves", |rule| rule.leaves().len() <= MAX_LEAVES)
}

/// A printed rule with a few pieces of the language inserted and a few characters removed,
/// so the text gets deep into the parser before (maybe) going wrong.
fn rule_like_text() -> impl Strategy<Value = String> {
    let piece = select(vec![
        "or(",
        "and(",
        ")",
        ",",
        ";",
        " ",
        "0",
        "1_000",
        "99999999999999999999",
        "/",
        "s",
        "5m",
        ":",
        "+",
        "ip",
        "burst=",
        "algo=",
        "windows=",
        "concurrent",
        "lease=",
        "30s",
        "-",
        "gcra",
        "=",
        "é",
        "_",
    ]);
    let edit = (any::<Index>(), piece, 0..3usize);
    (rule(), prop::collection::vec(edit, 0..4)).prop_map(|(rule, edits)| {
        let mut chars: Vec<char> = rule.to_string().chars().collect();
        for (at, piece, removed) in edits {
            let at = at.index(chars.len() + 1);
            chars.drain(at..(at + removed).min(chars.len()));
            chars.splice(at..at, piece.chars());
        }
        chars.into_iter().collect()
    })
}

proptest! {
    #[test]
    fn printed_rules_parse_back(rule in rule()) {
        let text = rule.to_string();
        prop_assert_eq!(parse_rule(&text), Ok(rule), "{}", text);
    }

    #[test]
    fn printed_rates_parse_back(rate in rate()) {
        prop_assert_eq!(rate.to_string().parse::<Rate>(), Ok(rate));
    }

    #[test]
    fn any_text_is_parsed_or_refused(text in "\\PC{0,40}") {
        check_text(&text)?;
    }

    #[test]
    fn rule_like_text_is_parsed_or_refused(text in rule_like_text()) {
        check_text(&text)?;
    }

    #[test]
    fn alphabet_soup_is_parsed_or_refused(text in "[a-z0-9_/:+(),;= .-]{0,40}") {
        check_text(&text)?;
    }
}

/// No panic; errors point inside the text (or just past it); what parses prints stably.
fn check_text(text: &str) -> Result<(), TestCaseError> {
    match parse_rule(text) {
        Ok(rule) => {
            let printed = rule.to_string();
            prop_assert_eq!(
                parse_rule(&printed),
                Ok(rule),
                "{} printed as {}",
                text,
                printed
            );
        }
        Err(err) => {
            prop_assert!(
                err.column >= 1 && err.column <= text.chars().count() + 1,
                "{}",
                err
            );
        }
    }
    Ok(())
}
