//! `sluice simulate` on traces with a `duration` column, for rules with a concurrency leaf:
//! each admitted request holds a lease from `t` to `t + duration`.

mod simulate_support;

use serde_json::Value;
use simulate_support::{json_lines, scratch, sluice, text};

/// Writes `trace` to a file of `dir` and returns its path as text.
fn trace_file(dir: &std::path::Path, name: &str, trace: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, trace).unwrap();
    path.to_str().unwrap().to_owned()
}

fn allowed(lines: &[Value]) -> Vec<bool> {
    lines
        .iter()
        .filter(|l| l.get("summary").is_none())
        .map(|l| l["allowed"].as_bool().unwrap())
        .collect()
}

#[test]
fn leases_are_held_for_their_duration_and_released_in_time_order() {
    let dir = scratch("lease-durations");
    // Two slots per user. Alice's first two requests hold theirs until 2 s; the ones at 0 and
    // 1 find both taken. Bob's lasts 120 s, past its 60 s lease: it expires instead. At 2 s
    // both of alice's are released before the arrivals of that instant, which take them.
    let trace = trace_file(
        &dir,
        "trace.csv",
        "t,user,duration\n0,alice,2\n0,alice,2\n0,alice,1\n1,alice,0.5\n1,bob,120\n\
         2,alice,1\n2,alice,1\n2.5,alice,1\n",
    );
    let lines = json_lines(&[
        "simulate",
        "--rule",
        "user:2 concurrent lease=1m",
        "--trace",
        &trace,
    ]);
    assert_eq!(
        allowed(&lines),
        [true, true, false, false, true, true, true, false]
    );
    assert_eq!(lines[2]["denial"], "occupied");
    assert_eq!(lines[2]["remaining"], 0);
    assert_eq!(lines[4]["remaining"], 1, "bob has his own slots");
    let summary = &lines.last().unwrap()["summary"];
    assert_eq!(summary["requests"], 8);
    assert_eq!(summary["allowed"], 5);
    assert_eq!(
        summary["leases"],
        serde_json::json!([{"leaf": "user:2 concurrent", "max_held": 2, "expired": 1}])
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_lease_outliving_its_lease_time_frees_its_slot_at_expiry() {
    let dir = scratch("lease-expiry");
    // One slot, 10 s leases. The request at 0 lasts 30 s: its lease expires at 10, so the
    // one at 5 is refused and the one at 10 admitted. That one ends at 11, so 10.5 is
    // refused and 11 (a release and an arrival at the same instant) admitted.
    let trace = trace_file(
        &dir,
        "trace.csv",
        "t,duration,user\n0,30,a\n5,1,a\n10,1,a\n10.5,1,a\n11,1,a\n",
    );
    let lines = json_lines(&[
        "simulate",
        "--rule",
        "user:1 concurrent lease=10s",
        "--trace",
        &trace,
    ]);
    assert_eq!(allowed(&lines), [true, false, true, false, true]);
    assert_eq!(lines[1]["retry_after"], 5.0, "the lease's expiry bounds it");
    let leases = &lines.last().unwrap()["summary"]["leases"][0];
    assert_eq!(
        (&leases["max_held"], &leases["expired"]),
        (&1.into(), &1.into())
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rate_and_concurrency_leaves_replay_together_and_side_by_side() {
    let dir = scratch("lease-mixed");
    // Ten requests a second apart, each lasting 2.5 s: three overlap at once.
    let mut trace = String::from("t,user,duration\n");
    for i in 0..10 {
        trace.push_str(&format!("{i},a,2.5\n"));
    }
    let trace = trace_file(&dir, "trace.csv", &trace);
    let mixed = json_lines(&[
        "simulate",
        "--rule",
        "user:5/m; user:3 concurrent",
        "--trace",
        &trace,
    ]);
    // The rate leaf admits five; the slots never run out (three held at most).
    assert_eq!(allowed(&mixed).iter().filter(|&&a| a).count(), 5);
    assert_eq!(mixed[5]["denial"], "limited");
    let summary = &mixed.last().unwrap()["summary"];
    assert_eq!(summary["leases"][0]["max_held"], 3);
    assert_eq!(summary["leases"][0]["expired"], 0);

    // Several rules: one summary line each, the leases only where there are some.
    let lines = json_lines(&[
        "simulate",
        "--rule",
        "user:2 concurrent",
        "--rule",
        "user:5/m",
        "--trace",
        &trace,
    ]);
    assert_eq!(lines.len(), 2);
    // Two slots, three overlapping requests: every third is refused (0, 1 in; 2 out; 3 in
    // once 0 ended at 2.5; ...).
    assert_eq!(lines[0]["summary"]["allowed"], 7);
    assert_eq!(lines[0]["summary"]["leases"][0]["max_held"], 2);
    assert_eq!(lines[1]["summary"]["allowed"], 5);
    assert!(lines[1]["summary"].get("leases").is_none());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn durations_on_a_rule_without_concurrency_are_ignored_with_a_warning() {
    let dir = scratch("lease-ignored");
    let with = trace_file(&dir, "with.csv", "t,user,duration\n0,a,5\n0,a,5\n0,a,5\n");
    let without = trace_file(&dir, "without.csv", "t,user\n0,a\n0,a\n0,a\n");
    let run = |trace: &str| sluice(&["simulate", "--rule", "user:2/s", "--trace", trace]);
    let (with_out, without_out) = (run(&with), run(&without));
    assert!(with_out.status.success());
    assert_eq!(with_out.stdout, without_out.stdout, "the same decisions");
    let (_, warning) = text(&with_out);
    assert!(
        warning.contains("warning") && warning.contains("`duration` column is ignored"),
        "{warning}"
    );
    assert!(text(&without_out).1.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_durations_exit_2_naming_the_line() {
    let dir = scratch("lease-bad");
    let cases = [
        (
            "t,user,duration\n0,a,1\n1,a,-2\n",
            "user:1 concurrent",
            "trace line 3: duration `-2` is not a time in seconds",
        ),
        (
            "t,user,duration\n0,a,soon\n",
            "user:1 concurrent",
            "trace line 2: duration `soon` is not a time in seconds",
        ),
        // Checked on rules that ignore durations too: a bad value is a bad trace.
        (
            "t,user,duration\n0,a,1e3\n",
            "user:1/s",
            "trace line 2: duration `1e3`",
        ),
        (
            "t,user,duration\n0,a,1\n1,a,\n",
            "user:1 concurrent",
            "trace line 3: no duration",
        ),
        (
            "t,user\n0,a\n",
            "user:1 concurrent",
            "needs a `duration` column",
        ),
        (
            "t,user,duration,cost\n0,a,1,3\n",
            "user:1 concurrent",
            "trace line 2: cost 3: a request takes one lease",
        ),
    ];
    for (i, (trace, rule, message)) in cases.into_iter().enumerate() {
        let path = trace_file(&dir, &format!("{i}.csv"), trace);
        let output = sluice(&["simulate", "--rule", rule, "--trace", &path]);
        let (_, stderr) = text(&output);
        assert_eq!(output.status.code(), Some(2), "{trace:?}: {stderr}");
        assert!(stderr.contains(message), "{trace:?}: {stderr}");
        assert_eq!(
            stderr.lines().filter(|l| !l.contains("warning")).count(),
            1,
            "{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
