//! Trunk's entry point: mounts the widget into the page.

fn main() {
    #[cfg(target_arch = "wasm32")]
    checkout_frontend::start();
}
