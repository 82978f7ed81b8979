//! Running `sluice simulate` as a user does, for the tests of its pictures and its command
//! line.

#![allow(dead_code)] // each test file uses its own part of the harness

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use roxmltree::{Document, ParsingOptions};
use serde_json::Value;

/// Runs the `sluice` binary this build made.
pub fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .unwrap()
}

/// A file under `tests/golden/`.
pub fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name)
}

/// A fresh directory for one test.
pub fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-simulate-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// stdout and stderr as text.
pub fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8(output.stdout.clone()).unwrap(),
        String::from_utf8(output.stderr.clone()).unwrap(),
    )
}

/// Runs `sluice` and returns its stdout's JSON lines, failing on a non-zero exit.
pub fn json_lines(args: &[&str]) -> Vec<Value> {
    let output = sluice(args);
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{args:?}: {stderr}");
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Parses a picture or page as XML, failing the test when it is not well-formed.
pub fn parse(xml: &str) -> Document<'_> {
    let options = ParsingOptions {
        allow_dtd: true,
        ..ParsingOptions::default()
    };
    Document::parse_with_options(xml, options).unwrap_or_else(|e| panic!("not well-formed: {e}"))
}
