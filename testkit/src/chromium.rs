//! Debian's headless Chromium, driven through chromedriver (started here on a free port) with
//! a fresh profile: for the browser tests and the widget's load bench.

use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder};
use serde_json::json;

/// chromedriver (and the Chromium it started) and the profile directory; all go when the last
/// holder drops it, even after a panic: chromedriver leads a process group of its own, and the
/// whole group is killed (killing chromedriver alone leaves its Chromium running).
pub struct Chromium {
    driver: Child,
    profile: tempfile::TempDir,
}

impl Drop for Chromium {
    fn drop(&mut self) {
        let group = format!("-{}", self.driver.id());
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// A new Chromium session in a window of `width` × `height`, with an empty cache, storage and
/// cookies. Keep the [`Chromium`] as long as the client is used.
pub async fn open(width: u32, height: u32) -> (Arc<Chromium>, Client) {
    let port = crate::postgres::free_port();
    let driver = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts (the README's test command installs it)");
    let chromium = Arc::new(Chromium {
        driver,
        profile: tempfile::tempdir().unwrap(),
    });
    let listening = || async { TcpStream::connect(("127.0.0.1", port)).is_ok() };
    crate::wait_until(
        &format!("chromedriver did not listen on {port}"),
        Duration::from_secs(30),
        listening,
    )
    .await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": "/usr/bin/chromium",
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--disable-popup-blocking",
                format!("--window-size={width},{height}"),
                format!("--user-data-dir={}", chromium.profile.path().display()),
            ],
        }),
    );
    let client = ClientBuilder::rustls()
        .expect("rustls")
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("a Chromium session");
    (chromium, client)
}
