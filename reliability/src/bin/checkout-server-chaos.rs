//! `checkout-server` with fault injection, for the campaign only; never shipped.

fn main() -> std::process::ExitCode {
    checkout_backend::cli::main()
}
