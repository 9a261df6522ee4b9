//! The OpenAPI document and its page, as a running server serves them.

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
