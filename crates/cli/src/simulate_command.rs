//! `sluice simulate`: its arguments, and which of the library's replays they ask for.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use sluice_cli::compare::{Comparison, compare};
use sluice_cli::generate::{self, Kind};
use sluice_cli::plot::{self, Format};
use sluice_cli::replace_file::replace_file;
use sluice_cli::simulate::{self, TraceError, TraceReader};
use sluice_core::Algorithm;
use sluice_limiter::Policy;
use sluice_server::config;

use super::{INVALID_INPUT, parse_rule};

/// Most rules one picture draws side by side.
const MAX_PANELS: usize = 12;

#[derive(clap::Args)]
pub struct SimulateArgs {
    /// A rule to replay; repeat to compare several.
    #[arg(long, required_unless_present_any = ["config", "generate"])]
    rule: Vec<String>,
    /// The trace: a CSV file with `t` (seconds), a column per selector, optional `cost`,
    /// and `duration` (seconds each request holds its lease) for concurrency rules.
    #[arg(long, required_unless_present = "generate")]
    trace: Option<PathBuf>,
    /// Algorithm for leaves that name none [default: gcra, or the configured policy's];
    /// repeat (or separate with commas) to replay each rule under each algorithm.
    #[arg(long, value_delimiter = ',')]
    algorithm: Vec<Algorithm>,
    /// Replay the policies of this file: all of them, or those named by --policy.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// A policy of --config to replay; repeat for several.
    #[arg(long, value_name = "NAME", requires = "config")]
    policy: Vec<String>,
    /// Colour hits by these selector columns (comma-separated) [default: the first rule's
    /// selector, else the trace's first selector column].
    #[arg(long, value_name = "COLUMNS", value_delimiter = ',', requires = "plot")]
    by: Vec<String>,
    /// Draw the replay to FILE.svg or FILE.html (one panel per rule) and print one summary
    /// line per rule instead of each decision.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// Write an example trace instead: steady, bursty or attack.
    #[arg(
        long,
        value_name = "KIND",
        conflicts_with_all = ["rule", "trace", "algorithm", "config", "plot"]
    )]
    generate: Option<String>,
    /// How long the example trace lasts, in seconds [default: 300].
    #[arg(long, requires = "generate")]
    seconds: Option<u64>,
    /// The example trace's seed: the same seed, the same trace [default: 1].
    #[arg(long, requires = "generate")]
    seed: Option<u64>,
    /// Write the example trace to this file instead of stdout.
    #[arg(long, value_name = "FILE", requires = "generate")]
    out: Option<PathBuf>,
}

pub fn run(args: SimulateArgs) -> anyhow::Result<ExitCode> {
    if let Some(kind) = &args.generate {
        return write_example(kind, args.seconds, args.seed, args.out.as_deref());
    }
    let format = match &args.plot {
        None => None,
        Some(path) => match Format::from_path(path) {
            Some(format) => Some(format),
            None => {
                return invalid(format!(
                    "--plot {}: the file name must end in .svg or .html",
                    path.display()
                ));
            }
        },
    };
    let policies = match policies(&args) {
        Ok(policies) => policies,
        Err(code) => return Ok(code),
    };
    if format.is_some() && policies.len() > MAX_PANELS {
        return invalid(format!(
            "{} rules to draw; a picture holds at most {MAX_PANELS}",
            policies.len()
        ));
    }
    let trace = args
        .trace
        .expect("clap requires --trace without --generate");
    let open =
        || std::fs::File::open(&trace).with_context(|| format!("cannot open {}", trace.display()));
    if let Ok(reader) = TraceReader::new(open()?)
        && reader.header().has_durations()
        && !policies.iter().any(has_concurrency_leaf)
    {
        eprintln!(
            "sluice: warning: {}: the `duration` column is ignored: no rule has a \
             concurrency leaf (`user:3 concurrent`)",
            trace.display()
        );
    }
    let file = std::io::BufReader::new(open()?);

    if let ([policy], None) = (policies.as_slice(), format) {
        // One rule, no picture: each decision as a JSON line, as always.
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::new(stdout.lock());
        let result = simulate::simulate(policy.clone(), file, &mut out);
        out.flush()?;
        return trace_result(result.map(drop), &trace);
    }
    let comparison = match compare(policies, &args.by, file) {
        Ok(comparison) => comparison,
        Err(error) => return trace_result(Err(error), &trace),
    };
    if let (Some(format), Some(path)) = (format, &args.plot) {
        let source = trace.file_name().unwrap_or(trace.as_os_str());
        let picture = plot::render(&comparison, &source.to_string_lossy(), format);
        if let Err(error) = replace_file(path, picture.as_bytes()) {
            return invalid(format!("cannot write {}: {error}", path.display()));
        }
    }
    print_summaries(&comparison)?;
    Ok(ExitCode::SUCCESS)
}

fn has_concurrency_leaf(policy: &Policy) -> bool {
    policy
        .rule
        .leaves()
        .iter()
        .any(|leaf| leaf.is_concurrency())
}

/// One line on stderr and the exit code for input the user must fix.
fn invalid(message: String) -> anyhow::Result<ExitCode> {
    eprintln!("sluice: {message}");
    Ok(ExitCode::from(INVALID_INPUT))
}

fn trace_result(result: Result<(), TraceError>, trace: &Path) -> anyhow::Result<ExitCode> {
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(TraceError::Io(e)) => Err(e.into()),
        Err(e) => invalid(format!("{}: {e}", trace.display())),
    }
}

fn print_summaries(comparison: &Comparison) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for (panel, run) in comparison.runs.iter().enumerate() {
        writeln!(out, "{}", run.summary_json(panel))?;
    }
    out.flush()?;
    Ok(())
}

/// The policies to replay: each `--rule` under each `--algorithm`, then each configured
/// policy (under each `--algorithm`, when some are given).
fn policies(args: &SimulateArgs) -> Result<Vec<Policy>, ExitCode> {
    let under_each = |policy: Policy, default: Option<Algorithm>| -> Vec<Policy> {
        match (args.algorithm.as_slice(), default) {
            ([], None) => vec![policy],
            ([], Some(default)) => vec![policy.algorithm(default)],
            (algorithms, _) => algorithms
                .iter()
                .map(|&a| policy.clone().algorithm(a))
                .collect(),
        }
    };
    let mut policies = Vec::new();
    for text in &args.rule {
        let rule = parse_rule(text)?;
        policies.extend(under_each(
            Policy::from_rule("simulate", rule),
            Some(Algorithm::default()),
        ));
    }
    if let Some(path) = &args.config {
        let configured = config::load(path).map_err(|e| {
            eprintln!("sluice: {e}");
            ExitCode::from(INVALID_INPUT)
        })?;
        let chosen: Vec<Policy> = if args.policy.is_empty() {
            configured.policies
        } else {
            let mut chosen = Vec::new();
            for name in &args.policy {
                let Some(policy) = configured.policies.iter().find(|p| &p.name == name) else {
                    let names: Vec<&str> = configured
                        .policies
                        .iter()
                        .map(|p| p.name.as_str())
                        .collect();
                    eprintln!(
                        "sluice: {}: no policy `{name}` (it has: {})",
                        path.display(),
                        names.join(", ")
                    );
                    return Err(ExitCode::from(INVALID_INPUT));
                };
                chosen.push(policy.clone());
            }
            chosen
        };
        if chosen.is_empty() {
            eprintln!("sluice: {}: no policies to replay", path.display());
            return Err(ExitCode::from(INVALID_INPUT));
        }
        for policy in chosen {
            policies.extend(under_each(policy, None));
        }
    }
    Ok(policies)
}

/// `--generate KIND`: an example trace on stdout or in `--out`.
fn write_example(
    kind: &str,
    seconds: Option<u64>,
    seed: Option<u64>,
    out: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let Some(kind) = Kind::from_name(kind) else {
        return invalid(format!(
            "unknown trace kind `{kind}` (expected {})",
            Kind::NAMES
        ));
    };
    let seconds = seconds.unwrap_or(300);
    if !(1..=generate::MAX_SECONDS).contains(&seconds) {
        return invalid(format!(
            "--seconds {seconds}: expected 1 to {}",
            generate::MAX_SECONDS
        ));
    }
    let trace = generate::generate(kind, seconds, seed.unwrap_or(1));
    match out {
        Some(path) => {
            if let Err(error) = replace_file(path, trace.as_bytes()) {
                return invalid(format!("cannot write {}: {error}", path.display()));
            }
        }
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(trace.as_bytes())?;
            stdout.flush()?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
