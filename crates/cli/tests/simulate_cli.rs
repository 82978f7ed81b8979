//! `sluice simulate` on the command line: one rule's decisions exactly as before, example
//! traces, and arguments it refuses.

mod simulate_support;

use simulate_support::{golden, json_lines, scratch, sluice, text};

#[test]
fn one_rule_without_a_picture_prints_each_decision_as_before() {
    let dir = scratch("json-lines");
    let trace = dir.join("trace.csv");
    std::fs::write(&trace, "t,user\n0,a\n0,a\n0,a\n").unwrap();
    let output = sluice(&[
        "simulate",
        "--rule",
        "user:2/s",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert!(output.status.success());
    let decision = |allowed: bool, remaining: u8, reset: &str, retry: &str, denial: &str| {
        format!(
            r#"{{"t":0,"allowed":{allowed},"limit":2,"remaining":{remaining},"reset_after":{reset},"retry_after":{retry},"denial":{denial},"policy":"simulate","leaf":"user:2/s","shadow_denied":false}}"#
        )
    };
    let expected = [
        decision(true, 1, "0.5", "null", "null"),
        decision(true, 0, "1.0", "null", "null"),
        decision(false, 0, "1.0", "0.5", "\"limited\""),
        r#"{"summary":{"requests":3,"allowed":2,"denied":1}}"#.to_owned(),
    ];
    assert_eq!(text(&output).0, expected.join("\n") + "\n");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn generated_traces_are_deterministic_and_replay() {
    let dir = scratch("generate");
    for kind in ["steady", "bursty", "attack"] {
        let run = |seed: &str| {
            sluice(&[
                "simulate",
                "--generate",
                kind,
                "--seconds",
                "120",
                "--seed",
                seed,
            ])
        };
        let first = run("7");
        assert!(first.status.success(), "{kind}: {}", text(&first).1);
        assert_eq!(
            first.stdout,
            run("7").stdout,
            "{kind}: same seed, same trace"
        );
        assert_ne!(
            first.stdout,
            run("8").stdout,
            "{kind}: another seed, another trace"
        );

        let path = dir.join(format!("{kind}.csv"));
        let written = sluice(&[
            "simulate",
            "--generate",
            kind,
            "--seconds",
            "120",
            "--seed",
            "7",
            "--out",
            path.to_str().unwrap(),
        ]);
        assert!(written.status.success() && written.stdout.is_empty());
        assert_eq!(std::fs::read(&path).unwrap(), first.stdout);

        let hits = first.stdout.iter().filter(|&&b| b == b'\n').count() as u64 - 1;
        let lines = json_lines(&[
            "simulate",
            "--trace",
            path.to_str().unwrap(),
            "--rule",
            "ip:10/m; user:20/m",
        ]);
        assert_eq!(lines.last().unwrap()["summary"]["requests"], hits, "{kind}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_arguments_exit_2_with_one_line_and_change_nothing() {
    let dir = scratch("bad");
    let trace = golden("trace.csv");
    let trace = trace.to_str().unwrap();
    let kept = dir.join("kept.svg");
    std::fs::write(&kept, "an older picture").unwrap();
    let backwards = dir.join("backwards.csv");
    std::fs::write(&backwards, "t,user\n2,a\n1,a\n").unwrap();
    let missing_dir = dir.join("no-such-dir");
    let unwritable = missing_dir.join("picture.svg");
    let png = dir.join("picture.png");
    let rule = ["--rule", "user:5/10s"];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--generate", "tornado"],
            "unknown trace kind `tornado`",
        ),
        (
            vec!["--generate", "steady", "--seconds", "0"],
            "--seconds 0",
        ),
        (
            vec![
                "--generate",
                "steady",
                "--out",
                unwritable.to_str().unwrap(),
            ],
            "cannot write",
        ),
        (
            [
                &["--trace", trace, "--plot", png.to_str().unwrap()],
                &rule[..],
            ]
            .concat(),
            "must end in .svg or .html",
        ),
        (
            [
                &["--trace", trace, "--plot", unwritable.to_str().unwrap()],
                &rule[..],
            ]
            .concat(),
            "cannot write",
        ),
        (
            [
                &[
                    "--trace",
                    backwards.to_str().unwrap(),
                    "--plot",
                    kept.to_str().unwrap(),
                ],
                &rule[..],
            ]
            .concat(),
            "goes back in time",
        ),
        (
            [
                &[
                    "--trace",
                    trace,
                    "--plot",
                    kept.to_str().unwrap(),
                    "--by",
                    "host",
                ],
                &rule[..],
            ]
            .concat(),
            "no column `host`",
        ),
    ];
    for (args, message) in cases {
        let output = sluice(&[&["simulate"], &args[..]].concat());
        let (stdout, stderr) = text(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("sluice: ") && stderr.contains(message),
            "{stderr}"
        );
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
    }
    assert!(!png.exists() && !missing_dir.exists());
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), "an older picture");
    let mut left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    left.sort();
    assert_eq!(
        left,
        ["backwards.csv", "kept.svg"],
        "no temporary file left behind"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
