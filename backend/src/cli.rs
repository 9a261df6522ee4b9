//! The `checkout-server` command: settings, logging, runtime. A library function so that a test
//! build with fault injection can be the very same program.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use crate::config::Config;

pub fn main() -> ExitCode {
    let config = match Config::try_parse() {
        Ok(config) => config,
        Err(error) if !error.use_stderr() => error.exit(), // --help, --version
        Err(error) => {
            // One clear line, not clap's usage block.
            let text = error.to_string();
            let line = text.lines().next().unwrap_or("invalid setting");
            eprintln!("checkout-server: {}", line.trim_start_matches("error: "));
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn")),
        )
        .with_ansi(std::io::stdout().is_terminal())
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("checkout-server: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(crate::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("checkout-server: {error}");
            ExitCode::FAILURE
        }
    }
}
