//! `checkout-server`: every setting is an environment variable or the matching `--flag`.

use std::io::IsTerminal;
use std::process::ExitCode;

use checkout_backend::config::Config;
use clap::Parser;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
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
    match runtime.block_on(checkout_backend::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("checkout-server: {error}");
            ExitCode::FAILURE
        }
    }
}
