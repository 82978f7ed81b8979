//! The login example: `cargo run --release -p sluice-tower --example login -- --listen ADDR`.
//! Prints `login example listening on http://ADDR` once bound (useful with port 0).

mod app;

use std::io::Write;
use std::process::ExitCode;

const USAGE: &str = "usage: login [--listen ADDR]   (default 127.0.0.1:3000)";

#[tokio::main]
async fn main() -> ExitCode {
    let mut listen = "127.0.0.1:3000".to_owned();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--listen", Some(addr)) => listen = addr,
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let listener = match tokio::net::TcpListener::bind(&listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("login: cannot listen on {listen}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let addr = listener.local_addr().expect("a bound address");
    println!("login example listening on http://{addr}");
    let _ = std::io::stdout().flush();
    match app::serve(listener).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("login: {e}");
            ExitCode::FAILURE
        }
    }
}
