//! The demo shop (`checkout-demo-shop`), built as a binary of this crate so that the tests can
//! find it (`CARGO_BIN_EXE_demo-shop-for-tests`), with the faults of `SHOP_FAULTS` (see
//! `checkout-faults`). For the tests only; never shipped.

fn main() -> std::process::ExitCode {
    checkout_faults::shop_main()
}
