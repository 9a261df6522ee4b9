//! `checkout-server` with the fault injection of `CHECKOUT_FAULTS` (see `checkout-faults`).
//! For the tests only; never shipped.

fn main() -> std::process::ExitCode {
    checkout_faults::main()
}
