//! `checkout-server` with the bench-only un-keyed route; for `checkout-bench` only.

fn main() -> std::process::ExitCode {
    checkout_backend::cli::main()
}
