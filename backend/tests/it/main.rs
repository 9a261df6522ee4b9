//! The server's integration tests, in one binary (the server and the test kit linked once),
//! a module per area: each starts real `checkout-server` processes over real databases.

mod api;
mod broker;
mod changes;
mod dashboard;
mod docs;
mod events;
mod floors;
mod fuzz;
mod metrics;
mod modes;
mod operations;
mod protocol;
mod shops;
mod site;
mod verify;

/// The project's root, where the docs, the tools and the migrations are.
fn workspace() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("backend/ is in the workspace")
        .to_path_buf()
}
