//! The demo shop with the fault injection of `SHOP_FAULTS` (see `checkout-faults`).
//! For the campaign only; never shipped.

fn main() -> std::process::ExitCode {
    checkout_faults::shop_main()
}
