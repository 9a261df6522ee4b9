//! Pages of some other site, served for a test's browser.

use futures::StreamExt as _;

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

/// Serves a page at `/` in two parts: `first` at once, `rest` only once the page asks for
/// `/rest` (a script in `first` does, as the parser reaches it): the parser waits between the
/// two at a known point, as it would for a slow network. Its base URL.
pub async fn serve_page_in_two_parts(first: String, rest: String) -> String {
    use std::sync::Arc;
    let asked = Arc::new(tokio::sync::Notify::new());
    let page = {
        let asked = asked.clone();
        move || {
            let (first, rest, asked) = (first.clone(), rest.clone(), asked.clone());
            async move {
                let rest = async move {
                    // A permit is kept if `/rest` came first: no ask is missed.
                    asked.notified().await;
                    Ok::<_, std::io::Error>(rest)
                };
                let parts =
                    futures::stream::once(async { Ok(first) }).chain(futures::stream::once(rest));
                (
                    [(axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8")],
                    axum::body::Body::from_stream(parts),
                )
            }
        }
    };
    serve(
        axum::Router::new()
            .route("/", axum::routing::get(page))
            .route(
                "/rest",
                axum::routing::get(move || async move {
                    asked.notify_one();
                    ""
                }),
            ),
    )
    .await
}
