//! `checkout-server`: every setting is an environment variable or the matching `--flag`.

fn main() -> std::process::ExitCode {
    checkout_backend::cli::main()
}
