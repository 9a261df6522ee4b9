//! What a reader is told: the OpenAPI document and its page, as a running server serves them;
//! every link and path in the project's documents; the README's first payment, run as written.

use std::path::PathBuf;

use crate::workspace;
use checkout_testkit::{Backend, Server, TestDb};
use reqwest::StatusCode;

const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_serves_its_openapi_document_and_a_page_to_read_it() {
    let db = TestDb::new(Backend::Sqlite).await;
    let server = Server::start(SERVER, &db).await;
    let api = server.api();

    let document = api.get("/api/openapi.json").await;
    assert_eq!(document.status, StatusCode::OK);
    let document = document.json();
    assert_eq!(document["openapi"], "3.1.0");
    assert!(document["paths"]["/api/payments"]["post"].is_object());

    let http = reqwest::Client::new();
    let page = http
        .get(format!("{}/api/docs/", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let html = page.text().await.unwrap();
    assert!(html.contains("swagger-ui"), "{html}");
    // The page's script comes from this server (vendored), never from elsewhere.
    let script = http
        .get(format!("{}/api/docs/swagger-ui-bundle.js", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(script.status(), StatusCode::OK);
    assert!(!html.contains("https://"), "nothing fetched from elsewhere");
    let initializer = http
        .get(format!("{}/api/docs/swagger-initializer.js", server.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(initializer.contains("/api/openapi.json"), "{initializer}");
}

/// The documents a reader is pointed to: the README, the architecture, the figures, `docs/`.
fn documents() -> Vec<PathBuf> {
    let root = workspace();
    let mut documents: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "BENCHMARKS.md",
        "RELIABILITY.md",
    ]
    .iter()
    .map(|name| root.join(name))
    .collect();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    documents.extend(docs);
    documents
}

/// Every `](target)` of a Markdown text, with its line number.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let Some(end) = after.find(')') else { break };
            found.push((number + 1, after[..end].to_owned()));
            rest = &after[end..];
        }
    }
    found
}

/// The folders at the project's root: a code span starting with one of them names a path.
const TOP_FOLDERS: [&str; 16] = [
    "backend",
    "bench",
    "demo-shop",
    "docs",
    "e2e",
    "faults",
    "frontend",
    "idempotency",
    "migrations",
    "receipts",
    "reliability",
    "scripts",
    "shared",
    "testkit",
    "tools",
    ".ci",
];

/// Every `` `folder/…` `` code span of a Markdown text that names a path in the project.
fn named_paths(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate() {
        for (i, span) in line.split('`').enumerate() {
            let is_path = i % 2 == 1
                && !span.contains(' ')
                && !span.contains('…')
                && !span.contains('*')
                && span
                    .split_once('/')
                    .is_some_and(|(first, _)| TOP_FOLDERS.contains(&first));
            if is_path {
                // `backend/src/lib.rs::run` names an item in a file: the file must exist.
                let path = span.split("::").next().unwrap_or(span);
                found.push((number + 1, path.to_owned()));
            }
        }
    }
    found
}

/// A Markdown text's headings, outside its fenced code (where `#` starts a shell comment).
fn headings(text: &str) -> Vec<&str> {
    let mut in_code = false;
    let mut found = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        } else if !in_code && let Some(heading) = line.strip_prefix('#') {
            found.push(heading.trim_start_matches('#'));
        }
    }
    found
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as dashes.
fn anchor_of(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every relative link in the documents leads to a file that exists (and an anchor to one of
/// its headings), and every project path they name in a code span exists: a file moved or
/// renamed fails here, not in a reader's hands.
#[test]
fn every_link_and_path_in_the_docs_leads_somewhere() {
    let root = workspace();
    let mut broken = Vec::new();
    let mut checked = 0;
    for document in documents() {
        let text = std::fs::read_to_string(&document)
            .unwrap_or_else(|e| panic!("{}: {e}", document.display()));
        let name = document.strip_prefix(&root).unwrap().display().to_string();
        for (line, target) in links(&text) {
            if target.starts_with("http://")
                || target.starts_with("https://")
                || target.starts_with("mailto:")
            {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                document.clone()
            } else {
                document.parent().unwrap().join(path)
            };
            if !file.exists() {
                broken.push(format!("{name}:{line}: no {target}"));
                continue;
            }
            if let Some(anchor) = anchor {
                let target_text = std::fs::read_to_string(&file).unwrap_or_default();
                let found = headings(&target_text)
                    .iter()
                    .any(|heading| anchor_of(heading) == anchor);
                if !found {
                    broken.push(format!("{name}:{line}: no heading #{anchor} in {path}"));
                }
            }
        }
        for (line, path) in named_paths(&text) {
            checked += 1;
            if !root.join(&path).exists() {
                broken.push(format!("{name}:{line}: no {path}"));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{} of {checked}:\n{}",
        broken.len(),
        broken.join("\n")
    );
    assert!(
        checked > 100,
        "only {checked} links and paths found: is the parser right?"
    );
}

/// The README's first payment runs as a newcomer types it: against a real server in demo mode
/// (as `scripts/run` starts it, its shop's keys in `target/`), the payment is made, its resend
/// replayed, and the shopper charged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_first_payment_runs_as_written() {
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let (_, after) = readme
        .split_once("<!-- checked: backend/tests/it/docs.rs")
        .expect("the README marks its first payment's block");
    let block = after
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("\n```"))
        .map(|(block, _)| block)
        .expect("a sh block after the mark");

    let here = tempfile::tempdir().unwrap();
    std::fs::create_dir(here.path().join("target")).unwrap();
    let credentials = here.path().join("target/demo-shop-credentials.json");
    let db = TestDb::new(Backend::Sqlite).await;
    let server = Server::start_with(
        SERVER,
        &db,
        &[("CHECKOUT_DEMO_SHOP_FILE", credentials.to_str().unwrap())],
    )
    .await;
    checkout_testkit::wait_until(
        "the demo shop's keys were never written",
        std::time::Duration::from_secs(20),
        || async { std::fs::metadata(&credentials).is_ok_and(|m| m.len() > 0) },
    )
    .await;

    // `-x`: a failure shows the command it stopped at.
    let ran = tokio::process::Command::new("bash")
        .args(["-x", "-c"])
        .arg(format!("set -euo pipefail\n{block}"))
        .current_dir(here.path())
        .env("CHECKOUT", &server.base)
        .output()
        .await
        .expect("bash runs");
    let (out, err) = (
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr),
    );
    assert!(ran.status.success(), "the block failed:\n{out}\n{err}");
    let lines: Vec<String> = out.lines().map(|l| l.trim().to_lowercase()).collect();
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with("http/1.1 201"))
            .count(),
        2,
        "the payment and its resend both answered 201:\n{out}"
    );
    assert_eq!(
        lines
            .iter()
            .filter(|l| *l == "idempotent-replayed: true")
            .count(),
        1,
        "the resend says it is a replay:\n{out}"
    );
    assert!(out.contains("\"balance\":55000"), "charged once:\n{out}");
    assert_eq!(db.scalar("SELECT COUNT(*) FROM payments").await, 1);
    db.assert_invariants().await;
}
