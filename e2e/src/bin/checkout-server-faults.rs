//! `checkout-server` with the `fault-injection` feature: faults from `CHECKOUT_FAULTS`.
//! For the browser tests only; never shipped.

fn main() -> std::process::ExitCode {
    checkout_backend::cli::main()
}
