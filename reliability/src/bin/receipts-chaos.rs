//! The receipts consumer with the fault injection of `RECEIPTS_FAULTS` (see `checkout-faults`).
//! For the tests and the campaign only; never shipped.

fn main() -> std::process::ExitCode {
    checkout_faults::receipts_main()
}
