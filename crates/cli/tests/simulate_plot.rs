//! `sluice simulate --plot` as a user runs it: the picture of a fixed trace against its golden
//! file, its structure and counts, the README's picture, several rules side by side, and the
//! HTML page.
//!
//! `SLUICE_BLESS=1 cargo test -p sluice-cli --test simulate_plot` rewrites the golden SVG and
//! `docs/simulate-comparison.svg`.

mod simulate_support;

use std::path::Path;

use roxmltree::{Document, Node};
use serde_json::Value;
use simulate_support::{golden, json_lines, parse, scratch, sluice};

fn class_is(node: &Node, class: &str) -> bool {
    node.attribute("class") == Some(class)
}

fn number(node: &Node, attribute: &str) -> u64 {
    node.attribute(attribute).unwrap().parse().unwrap()
}

/// What one panel of a picture shows: (allowed, denied) summed over its bins, the same summed
/// over its bars, and its rule and algorithm.
struct Drawn {
    bins: (u64, u64),
    bars: (u64, u64),
    rule: String,
    algorithm: String,
    has_level: bool,
}

fn panels(document: &Document) -> Vec<Drawn> {
    let panels = document
        .descendants()
        .filter(|n| n.tag_name().name() == "g" && class_is(n, "panel"));
    panels
        .map(|panel| {
            let bins: Vec<Node> = panel.children().filter(|n| class_is(n, "bin")).collect();
            let bars = |class: &str| -> u64 {
                let bars = bins.iter().flat_map(|b| b.children());
                bars.filter(|n| class_is(n, class))
                    .map(|n| number(&n, "data-hits"))
                    .sum()
            };
            let sum = |attribute: &str| bins.iter().map(|b| number(b, attribute)).sum::<u64>();
            assert!(
                panel.children().any(|n| class_is(&n, "axis")),
                "every panel has its axes"
            );
            assert!(panel.children().any(|n| class_is(&n, "tick")));
            assert!(panel.children().any(|n| class_is(&n, "axis-title")));
            Drawn {
                bins: (sum("data-admitted"), sum("data-refused")),
                bars: (bars("admitted"), bars("refused")),
                rule: panel.attribute("data-rule").unwrap().to_owned(),
                algorithm: panel.attribute("data-algorithm").unwrap().to_owned(),
                has_level: panel.children().any(|n| class_is(&n, "level")),
            }
        })
        .collect()
}

fn legend(document: &Document) -> Vec<String> {
    document
        .descendants()
        .filter(|n| class_is(n, "legend"))
        .map(|n| n.text().unwrap_or("").to_owned())
        .collect()
}

/// The counts each panel draws equal the summary line printed for it.
fn assert_counts_match(drawn: &[Drawn], summaries: &[Value]) {
    assert_eq!(drawn.len(), summaries.len());
    for (panel, line) in drawn.iter().zip(summaries) {
        let summary = &line["summary"];
        let expected = (
            summary["allowed"].as_u64().unwrap(),
            summary["denied"].as_u64().unwrap(),
        );
        assert_eq!(panel.bins, expected, "{line}");
        assert_eq!(panel.bars, expected, "{line}");
        assert_eq!(panel.rule, line["rule"].as_str().unwrap());
        assert_eq!(panel.algorithm, line["algorithm"].as_str().unwrap());
    }
}

#[test]
fn picture_of_a_fixed_trace_matches_its_golden_file() {
    let dir = scratch("golden");
    let svg_path = dir.join("picture.svg");
    let trace = golden("trace.csv");
    let summaries = json_lines(&[
        "simulate",
        "--trace",
        trace.to_str().unwrap(),
        "--rule",
        "user:5/10s",
        "--algorithm",
        "fixed-window,gcra",
        "--plot",
        svg_path.to_str().unwrap(),
    ]);
    let svg = std::fs::read_to_string(&svg_path).unwrap();

    let expected = golden("simulate.svg");
    if std::env::var_os("SLUICE_BLESS").is_some() {
        std::fs::write(&expected, &svg).unwrap();
    }
    let wanted = std::fs::read_to_string(&expected).unwrap();
    assert!(
        svg == wanted,
        "the picture differs from {}; if the change is meant, rerun with SLUICE_BLESS=1 and \
         look at the new file",
        expected.display()
    );

    let document = parse(&svg);
    let drawn = panels(&document);
    assert_counts_match(&drawn, &summaries);
    assert_eq!(
        drawn.iter().map(|p| p.has_level).collect::<Vec<_>>(),
        [false, true],
        "only the GCRA panel draws a bucket level"
    );
    let title = document.descendants().find(|n| class_is(n, "panel-title"));
    let title: String = title
        .unwrap()
        .descendants()
        .filter_map(|n| n.text())
        .collect();
    assert!(title.starts_with("user:5/10s · fixed-window"), "{title}");
    let legend = legend(&document);
    for entry in [
        "alice",
        "bob",
        "<eve & \"co's\">",
        "admitted (solid)",
        "refused (hatched)",
        "limit per bin",
        "GCRA bucket level (right axis)",
    ] {
        assert!(legend.iter().any(|l| l == entry), "{entry} in {legend:?}");
    }
    assert!(legend.iter().any(|l| l.starts_with("others (")));
    assert!(document.descendants().any(|n| class_is(&n, "limit")));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The comparison in the README is what the commands printed beside it make today.
#[test]
fn readme_picture_is_what_its_command_makes() {
    let dir = scratch("readme");
    let trace = dir.join("bursty.csv");
    let svg_path = dir.join("simulate-comparison.svg");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let generate = "sluice simulate --generate bursty --seed 1 --out bursty.csv";
    let plot = "sluice simulate --trace bursty.csv --rule 100/m \\\n    \
                --algorithm fixed-window,sliding-window,gcra --plot docs/simulate-comparison.svg";
    assert!(readme.contains(generate), "README shows: {generate}");
    assert!(readme.contains(plot), "README shows: {plot}");
    assert!(readme.contains("![") && readme.contains("(docs/simulate-comparison.svg)"));

    let (trace_arg, svg_arg) = (trace.to_str().unwrap(), svg_path.to_str().unwrap());
    let args = generate.replace("bursty.csv", trace_arg);
    let args: Vec<&str> = args.split(' ').skip(1).collect();
    assert!(sluice(&args).status.success());
    let args = plot
        .replace("\\\n    ", "")
        .replace("bursty.csv", trace_arg)
        .replace("docs/simulate-comparison.svg", svg_arg);
    let args: Vec<&str> = args.split(' ').skip(1).collect();
    let _ = json_lines(&args);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let committed = root.join("docs/simulate-comparison.svg");
    if std::env::var_os("SLUICE_BLESS").is_some() {
        std::fs::write(&committed, &svg).unwrap();
    }
    assert!(
        svg == std::fs::read_to_string(&committed).unwrap(),
        "docs/simulate-comparison.svg is stale: rerun with SLUICE_BLESS=1"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn several_rules_side_by_side_each_count_their_own() {
    let dir = scratch("side-by-side");
    let trace = dir.join("bursty.csv");
    let svg_path = dir.join("compare.svg");
    let generated = sluice(&["simulate", "--generate", "bursty", "--seed", "3"]);
    assert!(generated.status.success());
    std::fs::write(&trace, &generated.stdout).unwrap();
    let trace = trace.to_str().unwrap();
    let algorithms = ["fixed-window", "sliding-window", "gcra"];
    let mut args = vec!["simulate", "--trace", trace, "--rule", "100/m"];
    for algorithm in algorithms {
        args.extend(["--algorithm", algorithm]);
    }
    // Without --plot: one summary line per rule.
    let summaries = json_lines(&args);
    args.extend(["--plot", svg_path.to_str().unwrap()]);
    assert_eq!(json_lines(&args), summaries);

    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let drawn = panels(&parse(&svg));
    assert_eq!(drawn.len(), 3);
    assert_counts_match(&drawn, &summaries);
    for (panel, algorithm) in drawn.iter().zip(algorithms) {
        assert_eq!(panel.algorithm, algorithm);
        // The same rule alone, as `simulate` always printed it: its last line agrees.
        let alone = json_lines(&[
            "simulate",
            "--trace",
            trace,
            "--rule",
            "100/m",
            "--algorithm",
            algorithm,
        ]);
        let last = &alone.last().unwrap()["summary"];
        assert_eq!(panel.bins.0, last["allowed"].as_u64().unwrap());
        assert_eq!(panel.bins.1, last["denied"].as_u64().unwrap());
    }
    assert!(drawn[0].bins != drawn[2].bins, "the algorithms disagree");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn html_is_one_offline_file_holding_the_picture() {
    let dir = scratch("html");
    let html_path = dir.join("picture.html");
    let trace = golden("trace.csv");
    let summaries = json_lines(&[
        "simulate",
        "--trace",
        trace.to_str().unwrap(),
        "--rule",
        "user:5/10s",
        "--plot",
        html_path.to_str().unwrap(),
    ]);
    let html = std::fs::read_to_string(&html_path).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    let document = parse(&html);
    assert_eq!(document.root_element().tag_name().name(), "html");
    for node in document.descendants().filter(|n| n.is_element()) {
        for attribute in node.attributes() {
            assert!(
                !matches!(attribute.name(), "src" | "href"),
                "<{}> loads {}",
                node.tag_name().name(),
                attribute.value()
            );
        }
        assert!(!matches!(
            node.tag_name().name(),
            "link" | "img" | "iframe" | "object" | "embed"
        ));
    }
    let without_namespace = html.replace("http://www.w3.org/2000/svg", "");
    for network in ["http://", "https://", "//cdn", "@import"] {
        assert!(!without_namespace.contains(network), "{network}");
    }
    assert!(
        document
            .descendants()
            .any(|n| n.tag_name().name() == "script")
    );
    assert!(document.descendants().any(|n| n.tag_name().name() == "svg"));
    assert_counts_match(&panels(&document), &summaries);
    let _ = std::fs::remove_dir_all(&dir);
}
