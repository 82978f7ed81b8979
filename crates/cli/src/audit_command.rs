//! `sluice audit`: who was refused most, read from the audit trail a server writes (see
//! `[audit]` in the config).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::SystemTime;

use clap::{ArgGroup, Args};
use sluice_server::audit::read::{self, Query, Report};
use sluice_server::config::parse_duration;

use crate::INVALID_INPUT;

#[derive(Args)]
#[command(
    group(ArgGroup::new("sink").required(true).args(["file", "postgres"])),
    after_help = "Examples:\n  sluice audit --since 1h --file /var/log/sluice/denials.jsonl\n  sluice audit --since 1d --policy login --top 5 --postgres postgres://sluice@db/app --json"
)]
pub struct AuditArgs {
    /// Count denials this recent: a number and a unit (30s, 15m, 1h, 2d).
    #[arg(long, default_value = "1h", value_name = "DURATION")]
    since: String,
    /// Only this policy's denials.
    #[arg(long, value_name = "POLICY")]
    policy: Option<String>,
    /// How many offenders to show, most refused first.
    #[arg(long, default_value_t = 20, value_name = "N")]
    top: usize,
    /// Read the JSON-lines file `[audit] file` names, and its rotated files beside it
    /// (PATH.1, PATH.2, ...).
    #[arg(long, value_name = "PATH")]
    file: Option<PathBuf>,
    /// Read the table `[audit] postgres` writes (postgres:// or postgresql:// URL).
    #[arg(
        long,
        value_name = "URL",
        env = "SLUICE_AUDIT_POSTGRES",
        hide_env_values = true
    )]
    postgres: Option<String>,
    /// The table's schema, as `[audit] schema` says.
    #[arg(long, default_value = "sluice", value_name = "SCHEMA")]
    schema: String,
    /// Print the report as one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: AuditArgs) -> anyhow::Result<ExitCode> {
    let since = match parse_duration(&args.since) {
        Ok(since) => since,
        Err(message) => {
            eprintln!("sluice: --since: {message}");
            return Ok(ExitCode::from(INVALID_INPUT));
        }
    };
    if args.top == 0 {
        eprintln!("sluice: --top: must be at least 1");
        return Ok(ExitCode::from(INVALID_INPUT));
    }
    let query = Query {
        since: SystemTime::now()
            .checked_sub(since)
            .unwrap_or(SystemTime::UNIX_EPOCH),
        policy: args.policy,
        top: args.top,
    };
    let report: Result<Report, read::ReadError> = match (&args.file, &args.postgres) {
        (Some(path), _) => read::from_files(path, &query),
        (None, Some(url)) => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(read::from_postgres(url, &args.schema, &query))
        }
        (None, None) => {
            eprintln!("sluice: give --file PATH or --postgres URL");
            return Ok(ExitCode::from(INVALID_INPUT));
        }
    };
    let report = match report {
        Ok(report) => report,
        Err(error) => {
            eprintln!("sluice: {error}");
            return Ok(ExitCode::from(INVALID_INPUT));
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", read::render_table(&report));
    }
    Ok(ExitCode::SUCCESS)
}
