//! `checkout-server` with the bench-only un-keyed route; for `checkout-bench` only.

fn main() -> std::process::ExitCode {
    checkout_backend::cli::main_with(checkout_backend::Seams {
        routes: Some(checkout_bench::unkeyed::routes()),
        ..Default::default()
    })
}
