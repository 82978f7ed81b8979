//! `sluice`: distributed rate limiting as a service and a command-line tool.

#![forbid(unsafe_code)]

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sluice_core::{Algorithm, Rule};
use sluice_limiter::{Limiter, MemoryStore, Policy};
use sluice_server::decision_json;
use sluice_server::{EnvoyModes, Server, UiAccess, config};

mod audit_command;
mod simulate_command;

use audit_command::AuditArgs;
use simulate_command::SimulateArgs;

#[derive(Parser)]
#[command(name = "sluice", version, about = "Distributed rate limiting")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the rate limiting service (HTTP/JSON).
    Serve {
        /// Policies file (TOML). Without it the service starts with no policies.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// Where counters live: memory:// (the default).
        #[arg(long, default_value = "memory://")]
        store: String,
        /// Also serve Envoy's rate limit service (gRPC) on this address.
        #[arg(long, value_name = "ADDR")]
        grpc_listen: Option<SocketAddr>,
        /// Also serve the Redis protocol (CL.THROTTLE, SLUICE.CHECK) on this address.
        #[arg(long, value_name = "ADDR")]
        resp_listen: Option<SocketAddr>,
        /// A directory of envoyproxy/ratelimit YAML files (one domain each).
        #[arg(long, value_name = "DIR")]
        envoy_config: Option<PathBuf>,
        /// Add RateLimit-*, X-RateLimit-* and RateLimit headers to Envoy answers
        /// (envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED).
        #[arg(long)]
        envoy_headers: bool,
        /// Answer every Envoy request OK, even over the limit; statuses still say who is
        /// over (envoyproxy/ratelimit's SHADOW_MODE).
        #[arg(long)]
        envoy_shadow_mode: bool,
        /// Put every Envoy descriptor in quota mode: a request is over only when all its
        /// descriptors are (envoyproxy/ratelimit's QUOTA_MODE).
        #[arg(long)]
        envoy_quota_mode: bool,
        /// Logs on stderr as text or as one JSON object per line.
        #[arg(long, default_value = "text", value_parser = ["text", "json"])]
        log_format: String,
        /// Serve the live page at /ui (policies, decisions per second, heavy hitters, recent
        /// refusals). It shows client identifiers: on an address other than loopback it
        /// needs --ui-token.
        #[arg(long)]
        ui: bool,
        /// Serve the live page to requests carrying this token (`/ui?token=...` or
        /// `Authorization: Bearer ...`); implies --ui.
        #[arg(
            long,
            value_name = "TOKEN",
            env = "SLUICE_UI_TOKEN",
            hide_env_values = true
        )]
        ui_token: Option<String>,
        /// Worker threads deciding requests (default: one per core). Where the proxy or
        /// the load shares the machine's few cores, fewer threads wake each other less and
        /// decide more per second of CPU (the README's Benchmarks section has figures).
        #[arg(long, value_name = "N", env = "SLUICE_THREADS", value_parser = clap::value_parser!(u16).range(1..=1024))]
        threads: Option<u16>,
    },
    /// Decide one hit on a fresh in-memory store and print the decision as JSON.
    Check {
        #[arg(long)]
        rule: String,
        /// Algorithm for leaves that name none.
        #[arg(long, default_value = "gcra")]
        algorithm: Algorithm,
        /// A selector value, as name=value; repeat for several.
        #[arg(long = "selector", value_name = "NAME=VALUE")]
        selectors: Vec<String>,
        #[arg(long, default_value_t = 1)]
        cost: u64,
    },
    /// Replay a CSV trace (t, selector columns, optional cost, duration for concurrency
    /// rules) on a virtual clock, draw it, or write an example trace.
    Simulate(SimulateArgs),
    /// Check a policies file and report the first error with its file, line and field.
    Validate {
        #[arg(long)]
        config: PathBuf,
    },
    /// Show who was refused most over a recent span, from the audit trail a server writes
    /// (`[audit]` in its config): a JSON-lines file with its rotated files, or PostgreSQL.
    Audit(AuditArgs),
}

/// Exit code for input the user must fix (bad rule, config or trace).
const INVALID_INPUT: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve {
            config,
            listen,
            store,
            grpc_listen,
            resp_listen,
            envoy_config,
            envoy_headers,
            envoy_shadow_mode,
            envoy_quota_mode,
            log_format,
            ui,
            ui_token,
            threads,
        } => serve(Listeners {
            threads,
            config,
            listen,
            store,
            grpc_listen,
            resp_listen,
            envoy_config,
            envoy_modes: EnvoyModes {
                headers: envoy_headers,
                shadow: envoy_shadow_mode,
                quota: envoy_quota_mode,
            },
            json_logs: log_format == "json",
            ui: match ui_token {
                Some(token) => UiAccess::Token(token),
                None if ui => UiAccess::Open,
                None => UiAccess::Off,
            },
        }),
        Command::Check {
            rule,
            algorithm,
            selectors,
            cost,
        } => check(&rule, algorithm, &selectors, cost),
        Command::Simulate(args) => simulate_command::run(args),
        Command::Validate { config } => validate(&config),
        Command::Audit(args) => audit_command::run(args),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("sluice: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Parses a rule, or prints the parser's message under the rule with a caret and fails.
fn parse_rule(text: &str) -> Result<Rule, ExitCode> {
    text.parse::<Rule>().map_err(|e| {
        eprintln!("sluice: invalid rule: {e}");
        eprintln!("  {text}");
        eprintln!("  {}^", " ".repeat(e.column.saturating_sub(1)));
        ExitCode::from(INVALID_INPUT)
    })
}

fn check(
    rule: &str,
    algorithm: Algorithm,
    selectors: &[String],
    cost: u64,
) -> anyhow::Result<ExitCode> {
    let rule = match parse_rule(rule) {
        Ok(rule) => rule,
        Err(code) => return Ok(code),
    };
    let mut pairs = Vec::new();
    for s in selectors {
        match s.split_once('=') {
            Some((name, value)) => pairs.push((name, value)),
            None => {
                eprintln!("sluice: selector `{s}` is not name=value");
                return Ok(ExitCode::from(INVALID_INPUT));
            }
        }
    }
    let policy = Policy::from_rule("check", rule).algorithm(algorithm);
    let limiter = match Limiter::builder(MemoryStore::new()).policy(policy).build() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("sluice: {e}");
            return Ok(ExitCode::from(INVALID_INPUT));
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    match runtime.block_on(limiter.check("check", &pairs, cost)) {
        Ok(checked) => {
            println!("{}", decision_json(&checked));
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("sluice: {e}");
            Ok(ExitCode::from(INVALID_INPUT))
        }
    }
}

fn validate(path: &std::path::Path) -> anyhow::Result<ExitCode> {
    match config::load(path) {
        Ok(config) => {
            println!("{}: ok, {} policies", path.display(), config.policies.len());
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("sluice: {e}");
            Ok(ExitCode::from(INVALID_INPUT))
        }
    }
}

/// What `sluice serve` was asked to do.
struct Listeners {
    config: Option<PathBuf>,
    listen: SocketAddr,
    store: String,
    grpc_listen: Option<SocketAddr>,
    resp_listen: Option<SocketAddr>,
    envoy_config: Option<PathBuf>,
    envoy_modes: EnvoyModes,
    json_logs: bool,
    ui: UiAccess,
    threads: Option<u16>,
}

fn serve(args: Listeners) -> anyhow::Result<ExitCode> {
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr);
    if args.json_logs {
        logs.json().init();
    } else {
        logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init();
    }
    if args.config.is_none() && args.envoy_config.is_none() {
        tracing::warn!("no --config or --envoy-config given: serving with no policies");
    }
    // Connections are bounded below the file limit; raise the soft limit to the hard one
    // first, as servers do, so the bounds are as high as the machine allows.
    if let Err(error) = rlimit::increase_nofile_limit(u64::MAX) {
        tracing::warn!(%error, "could not raise the open file limit");
    }
    let mut builder = Server::builder()
        .http(args.listen)
        .store_url(args.store)
        .envoy_modes(args.envoy_modes)
        .ui(args.ui)
        .reload_on_hangup(true);
    if let Some(path) = args.config {
        builder = builder.policies_file(path);
    }
    if let Some(dir) = args.envoy_config {
        builder = builder.envoy_dir(dir);
    }
    if let Some(address) = args.grpc_listen {
        builder = builder.grpc(address);
    }
    if let Some(address) = args.resp_listen {
        builder = builder.resp(address);
    }
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = args.threads {
        runtime.worker_threads(usize::from(threads));
    }
    let runtime = runtime.enable_all().build()?;
    runtime.block_on(async move {
        let server = match builder.bind().await {
            Ok(server) => server,
            Err(error) if error.is_invalid_input() => {
                eprintln!("sluice: {error}");
                return Ok(ExitCode::from(INVALID_INPUT));
            }
            Err(error) => return Err(error.into()),
        };
        // One plain line on stdout per listener, so scripts and tests can find the port of
        // `--listen 127.0.0.1:0`.
        println!("sluice listening on http://{}", server.http_addr());
        if let Some(address) = server.grpc_addr() {
            println!("sluice grpc listening on {address}");
        }
        if let Some(address) = server.resp_addr() {
            println!("sluice resp listening on {address}");
        }
        std::io::stdout().flush()?;
        server.run(shutdown_signal()).await?;
        Ok(ExitCode::SUCCESS)
    })
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}
