//! Pages of some other site, served for a test's browser.

/// Serves one HTML page at `/` on a free loopback port (a page of some other site, for a
/// test's browser): its base URL.
pub async fn serve_page(html: String) -> String {
    serve(axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let html = html.clone();
            async move { axum::response::Html(html) }
        }),
    ))
    .await
}

/// Serves one HTML page at every path on a free loopback port (a look-alike of another
/// server's pages, for a test's browser): its base URL.
pub async fn serve_page_at_every_path(html: String) -> String {
    serve(axum::Router::new().fallback(move || {
        let html = html.clone();
        async move { axum::response::Html(html) }
    }))
    .await
}

/// `app` on a free loopback port, for as long as the test runs: its base URL.
async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    base
}
