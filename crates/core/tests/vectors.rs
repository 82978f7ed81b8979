//! The shared test vectors (DESIGN.md §3): `(states, now, quotas, cost) -> outcome` cases that
//! every translation of the core must reproduce. `vectors.json` is generated here from a
//! fixed seed, with the outcomes the Rust core computes; `crates/redis/tests/vectors.rs` runs
//! the same file through the Lua script.
//!
//! Regenerate (after a deliberate change to the core's semantics) with
//! `SLUICE_REGENERATE_VECTORS=1 cargo test -p sluice-core --test vectors`.
//!
//! Times are microsecond ticks, the unit the Redis store counts in, near a real epoch value
//! so that stores with double arithmetic meet realistic magnitudes. The cases and their JSON
//! form are `sluice_testkit::vectors`; the generator is `vectors/generate.rs`.

#[path = "vectors/generate.rs"]
mod generate;

use std::collections::BTreeMap;
use std::sync::Once;

use generate::generate;
use serde_json::{Value, json};
use sluice_core::{Decision, Evaluation, PenaltyState, Shape, State, evaluate};
use sluice_testkit::vectors::{
    self, Case, case_from, case_json, decision_json, penalty_record_from, penalty_record_json,
    recording_name, state_json, without_expected,
};

const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors.json");

/// The core's outcome: the decision, whether a state changed, the final states and the
/// final penalty record.
fn run(case: &Case) -> (Decision, bool, Vec<State>, Option<PenaltyState>) {
    let quotas = case.quotas();
    let penalty = case.penalty.map(|p| p.penalty());
    let mut states = case.states.clone();
    let mut record = case.penalty_record.unwrap_or_default();
    let evaluation = Evaluation {
        shape: &case.shape,
        quotas: &quotas,
        cost: case.cost,
        recording: case.recording,
        penalty: penalty.as_ref(),
    };
    let outcome = evaluate(
        &evaluation,
        &mut states,
        penalty.is_some().then_some(&mut record),
        case.now,
    );
    let record = penalty.is_some().then_some(record);
    (outcome.decision, outcome.changed, states, record)
}

/// The outcome as the file writes it.
fn expected(case: &Case) -> Value {
    let (decision, changed, states, record) = run(case);
    json!({
        "decision": decision_json(&decision),
        "changed": changed,
        "states": states.iter().map(state_json).collect::<Vec<_>>(),
        "penalty_record": record.as_ref().map(penalty_record_json),
    })
}

/// A case with its outcome: one vector.
fn vector(case: &Case) -> Value {
    let mut v = case_json(case);
    v["expected"] = expected(case);
    v
}

/// The vectors in the file, written first (once per test run) when
/// `SLUICE_REGENERATE_VECTORS=1`.
fn load() -> Vec<Value> {
    static REGENERATE: Once = Once::new();
    if std::env::var("SLUICE_REGENERATE_VECTORS").as_deref() == Ok("1") {
        REGENERATE.call_once(|| std::fs::write(FILE, generate()).expect("write vectors.json"));
    }
    vectors::parse(&std::fs::read_to_string(FILE).expect("tests/vectors.json"))
}

// The tests -----------------------------------------------------------------------------------

#[test]
fn core_reproduces_every_vector() {
    let vectors = load();
    let mut failures = Vec::new();
    for (index, vector) in vectors.iter().enumerate() {
        let case = case_from(vector);
        // The inputs must read back exactly as written.
        let mut inputs = case_json(&case);
        inputs["expected"] = vector["expected"].clone();
        assert_eq!(&inputs, vector, "vector {index} does not round-trip");
        let expected = expected(&case);
        if expected != vector["expected"] {
            failures.push(format!(
                "vector {index}:\n  file: {}\n  core: {expected}\n  case: {}",
                vector["expected"],
                without_expected(vector),
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "the core disagrees with {} of {} vectors (if the change is deliberate, regenerate \
         with SLUICE_REGENERATE_VECTORS=1):\n{}",
        failures.len(),
        vectors.len(),
        failures.join("\n"),
    );
    let text = std::fs::read_to_string(FILE).unwrap();
    assert!(
        text == generate(),
        "vectors.json is not the generator's output: regenerate with \
         SLUICE_REGENERATE_VECTORS=1"
    );
}

/// The file exercises every path a translation must get right.
#[test]
fn vectors_cover_every_path() {
    let vectors = load();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut note = |what: String| *seen.entry(what).or_default() += 1;
    for vector in &vectors {
        let case = case_from(vector);
        let expected = &vector["expected"];
        for (leaf, state) in case.leaves.iter().zip(&case.states) {
            note(format!("algorithm {}", leaf.algorithm));
            let fresh = *state == leaf.quota().fresh_state();
            note(format!(
                "{} state {}",
                leaf.algorithm,
                if fresh { "fresh" } else { "replayed" }
            ));
        }
        note(format!("leaves {}", case.leaves.len()));
        note(format!("shape {}", shape_kind(&case.shape)));
        note(format!("recording {}", recording_name(case.recording)));
        note(format!("denial {}", expected["decision"]["denial"]));
        note(format!(
            "{} with recording {}",
            if expected["decision"]["allowed"] == json!(true) {
                "allowed"
            } else {
                "denied"
            },
            recording_name(case.recording)
        ));
        if case.cost == 0 {
            note("cost 0".into());
        }
        if case.leaves.iter().any(|l| case.cost > l.quota().capacity()) {
            note("cost above a leaf's capacity".into());
        }
        if let (Some(p), record) = (&case.penalty, &case.penalty_record) {
            let penalty = p.penalty();
            let kind = match record {
                None => "none",
                Some(r) if r.until > case.now => "boxed",
                Some(r) if case.now - r.last_strike < penalty.ticks().3 => "served, remembered",
                Some(_) => "forgotten",
            };
            note(format!("penalty record {kind}"));
            let before = record.unwrap_or_default();
            if penalty_record_from(&expected["penalty_record"]).strikes > before.strikes {
                note("penalty strike".into());
            }
        }
    }
    let summary: Vec<String> = seen.iter().map(|(k, n)| format!("{k}: {n}")).collect();
    println!("{} vectors\n{}", vectors.len(), summary.join("\n"));
    for required in [
        "algorithm gcra",
        "algorithm sliding-window",
        "algorithm sliding-log",
        "algorithm fixed-window",
        "shape leaf",
        "shape or",
        "shape and",
        "shape nested",
        "recording admitted",
        "recording always",
        "recording never",
        "denied with recording always",
        "denial 0",
        "denial 1",
        "denial 2",
        "denial 3",
        "cost 0",
        "cost above a leaf's capacity",
        "penalty record none",
        "penalty record boxed",
        "penalty record served, remembered",
        "penalty record forgotten",
        "penalty strike",
    ] {
        assert!(
            seen.get(required).copied().unwrap_or(0) >= 5,
            "fewer than 5 vectors with {required}"
        );
    }
}

fn shape_kind(shape: &Shape) -> &'static str {
    let nested = |children: &[Shape]| children.iter().any(|c| !matches!(c, Shape::Leaf(_)));
    match shape {
        Shape::Leaf(_) => "leaf",
        Shape::Or(c) | Shape::And(c) if nested(c) => "nested",
        Shape::Or(_) => "or",
        Shape::And(_) => "and",
    }
}
