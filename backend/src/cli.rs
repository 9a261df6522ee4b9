//! The `checkout-server` command: settings, logging, runtime. A library function so that a test
//! or benchmark server (given [`Seams`]) is the very same program.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use crate::Seams;
use crate::config::Config;

/// `checkout-server` as shipped.
pub fn main() -> ExitCode {
    main_with(Seams::default())
}

/// The same program with test or benchmark seams.
pub fn main_with(seams: Seams) -> ExitCode {
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
    match runtime.block_on(crate::run(config, seams)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("checkout-server: {error}");
            ExitCode::FAILURE
        }
    }
}
