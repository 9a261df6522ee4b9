//! Trunk's entry point for the account window (`account.html`, served at `/account`).

fn main() {
    #[cfg(target_arch = "wasm32")]
    checkout_frontend::account::start();
}
