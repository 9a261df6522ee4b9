//! The checkout's own pages and files, against a real server: the payment page framed only by
//! the origins its shop registered (and talking only to one of them), a session's `return_url`,
//! the widget's files compressed and cached by their hashed names, and an API no other origin
//! can read from a browser (no CORS).

use checkout_testkit as support;

const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server");

use std::io::Read;

use reqwest::StatusCode;
use serde_json::json;
use support::{Backend, Server, Shop, TestDb, new_key, session_request};

checkout_testkit::on_both_databases!(
    the_payment_page_is_framed_only_by_its_shops_origins,
    a_return_url_is_a_secure_address_and_part_of_the_request,
);

/// A built widget, as far as the server can tell: its page (with an inline loader script),
/// hashed files, the loader.
const PAGE: &str = "<!doctype html><html lang=\"ru\"><head><title>Оплата</title>\
    <script type=\"module\">import init from '/app-0123456789abcdef.js';init();</script></head>\
    <body></body></html>";

/// The account window's page, built beside it (`account/`), with an inline loader of its own.
const ACCOUNT_PAGE: &str = "<!doctype html><html lang=\"ru\"><head><title>Вход</title>\
    <script type=\"module\">import init from '/account/acc-0123456789abcdef.js';init();</script>\
    </head><body></body></html>";

fn site() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("index.html"), PAGE).unwrap();
    let code = "export default function init() { return 'Оплатить'; }\n".repeat(200);
    std::fs::write(dir.path().join("app-0123456789abcdef.js"), &code).unwrap();
    std::fs::write(
        dir.path().join("app-0123456789abcdef_bg.wasm"),
        code.as_bytes(),
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("account")).unwrap();
    std::fs::write(dir.path().join("account/index.html"), ACCOUNT_PAGE).unwrap();
    std::fs::create_dir(dir.path().join("v1")).unwrap();
    std::fs::write(
        dir.path().join("v1/checkout.js"),
        format!(
            "const checkout = \"__CHECKOUT_ORIGIN__\";\n{}",
            "window.Checkout = {};\n".repeat(50)
        ),
    )
    .unwrap();
    dir
}

async fn start(backend: Backend, site: &tempfile::TempDir) -> (TestDb, Server, Shop) {
    let db = TestDb::new(backend).await;
    let dir = site.path().display().to_string();
    let server = Server::start_with(SERVER, &db, &[("CHECKOUT_STATIC_DIR", &dir)]).await;
    let shop = server.add_shop("Книжная лавка").await;
    (db, server, shop)
}

async fn set_origins(server: &Server, shop: &Shop, args: &[&str]) -> (bool, String) {
    let mut all = vec!["shop", "set-origins", "--shop", shop.shop_id.as_str()];
    all.extend_from_slice(args);
    let (ok, out, err) = server.operator(&all).await;
    (ok, format!("{out}{err}"))
}

async fn the_payment_page_is_framed_only_by_its_shops_origins(backend: Backend) {
    let site = site();
    let (db, server, shop) = start(backend, &site).await;
    let session = shop.session("ORD-1", 10_000).await;
    let page = |query: &str| {
        let api = server.api();
        let path = format!("/pay/{session}{query}");
        async move { api.get(&path).await }
    };

    // No origin registered: nobody frames it; it is still a page of its own.
    let alone = page("").await;
    assert_eq!(alone.status, StatusCode::OK);
    assert!(
        alone
            .header("content-security-policy")
            .unwrap()
            .ends_with("frame-ancestors 'none'")
    );
    assert_eq!(alone.header("x-frame-options"), Some("DENY"));
    assert!(alone.body.contains("<title>Оплата</title>"));
    assert!(!alone.body.contains("checkout-parent"));
    assert_eq!(alone.header("cache-control"), Some("no-cache"));

    // Bad origins are refused by the operator's command and change nothing.
    for bad in [
        "http://shop.example",
        "https://shop.example/pay",
        "shop.example",
        "javascript:x",
    ] {
        let (ok, said) = set_origins(&server, &shop, &["--origin", bad]).await;
        assert!(!ok, "{bad} was taken: {said}");
        assert!(said.contains("origin"), "{bad}: {said}");
    }
    assert!(
        page("")
            .await
            .header("content-security-policy")
            .unwrap()
            .ends_with("'none'")
    );

    let (ok, said) = set_origins(
        &server,
        &shop,
        &[
            "--origin",
            "https://Shop.Example:443",
            "--origin",
            "http://localhost:4000",
        ],
    )
    .await;
    assert!(ok, "{said}");
    let framed = page("?parent=https://shop.example").await;
    let policy = framed.header("content-security-policy").unwrap();
    assert!(
        policy.ends_with("frame-ancestors https://shop.example http://localhost:4000"),
        "{policy}"
    );
    assert!(
        policy.contains("script-src 'self' 'wasm-unsafe-eval' 'sha256-"),
        "{policy}"
    );
    assert_eq!(framed.header("x-frame-options"), None);
    assert!(
        framed
            .body
            .contains(r#"<meta name="checkout-parent" content="https://shop.example" />"#),
        "{}",
        framed.body
    );
    // A parent the shop did not register, or not an origin, is not vouched for.
    for claimed in [
        "?parent=https://evil.example",
        "?parent=https://shop.example/orders",
        "?parent=%22%3E%3Cscript%3Ealert(1)%3C/script%3E",
        "?parent=http://shop.example",
    ] {
        let answer = page(claimed).await;
        assert_eq!(answer.status, StatusCode::OK, "{claimed}");
        assert!(
            !answer.body.contains("checkout-parent"),
            "{claimed}: {}",
            answer.body
        );
        assert!(!answer.body.contains("<script>alert"), "{claimed}");
    }

    // An unknown session's page only says so: anyone may frame it. Not a session id: 404.
    let unknown = server
        .api()
        .get(&format!("/pay/cs_{}", "0".repeat(32)))
        .await;
    assert_eq!(unknown.status, StatusCode::OK);
    assert!(
        unknown
            .header("content-security-policy")
            .unwrap()
            .ends_with("frame-ancestors *")
    );
    assert_eq!(
        server.api().get("/pay/nonsense").await.status,
        StatusCode::NOT_FOUND
    );

    // `--clear`: not framable again.
    let (ok, said) = set_origins(&server, &shop, &["--clear"]).await;
    assert!(ok, "{said}");
    let cleared = page("?parent=https://shop.example").await;
    assert!(
        cleared
            .header("content-security-policy")
            .unwrap()
            .ends_with("'none'")
    );
    assert!(!cleared.body.contains("checkout-parent"));

    // A shop added with its origins.
    let (ok, out, err) = server
        .operator(&[
            "shop",
            "add",
            "--name",
            "Вторая",
            "--origin",
            "https://second.example",
        ])
        .await;
    assert!(ok, "{out}{err}");
    let (ok, _, err) = server
        .operator(&[
            "shop",
            "add",
            "--name",
            "Третья",
            "--origin",
            "http://third.example",
        ])
        .await;
    assert!(!ok && err.contains("origin"), "{err}");
    db.assert_invariants().await;
}

async fn a_return_url_is_a_secure_address_and_part_of_the_request(backend: Backend) {
    let site = site();
    let (db, server, shop) = start(backend, &site).await;
    let with = |order: &str, url: &str| {
        let mut body = session_request(order, 5_000);
        body["return_url"] = json!(url);
        body
    };
    for bad in [
        "http://shop.example/thanks",
        "javascript:alert(1)",
        "/orders/1",
        "ftp://127.0.0.1/x",
    ] {
        let answer = shop.try_session(&new_key(), &with("ORD-BAD", bad)).await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{bad}: {}",
            answer.body
        );
        assert_eq!(answer.json()["code"], "invalid_request");
        assert!(
            answer.json()["detail"]
                .as_str()
                .unwrap()
                .contains("return_url"),
            "{}",
            answer.body
        );
    }
    // A secure address, but on no origin the shop registered (none yet, then another): it would
    // send the shopper, from the checkout's page, wherever the request said.
    let url = "https://shop.example/orders/ORD-2?paid=1";
    let unregistered = shop.try_session(&new_key(), &with("ORD-2", url)).await;
    assert_eq!(
        unregistered.status,
        StatusCode::BAD_REQUEST,
        "{}",
        unregistered.body
    );
    let detail = unregistered.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("return_url") && detail.contains("origin"),
        "{detail}"
    );
    assert!(
        set_origins(&server, &shop, &["--origin", "https://shop.example"])
            .await
            .0
    );
    let elsewhere = shop
        .try_session(
            &new_key(),
            &with("ORD-2", "https://shop.example.evil.ru/orders/ORD-2"),
        )
        .await;
    assert_eq!(
        elsewhere.status,
        StatusCode::BAD_REQUEST,
        "{}",
        elsewhere.body
    );
    assert_eq!(db.scalar("SELECT COUNT(*) FROM checkout_sessions").await, 0);

    let key = new_key();
    let made = shop.try_session(&key, &with("ORD-2", url)).await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    assert_eq!(made.json()["return_url"], url);
    let id = made.json()["session_id"].as_str().unwrap().to_owned();
    let public = server
        .api()
        .get(&format!("/api/checkout-sessions/{id}"))
        .await;
    assert_eq!(public.json()["return_url"], url);
    let again = shop.try_session(&key, &with("ORD-2", url)).await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.body, made.body);
    let other = shop
        .try_session(&key, &with("ORD-2", "https://shop.example/x"))
        .await;
    assert_eq!(
        other.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        other.body
    );
    assert_eq!(other.json()["fields"], json!(["return_url"]));
    // Without one, none.
    let plain = shop.session("ORD-3", 100).await;
    let public = server
        .api()
        .get(&format!("/api/checkout-sessions/{plain}"))
        .await;
    assert!(public.json()["return_url"].is_null(), "{}", public.body);
    db.assert_invariants().await;
}

/// The widget's files: brotli or gzip as accepted (the same bytes once decompressed), hashed
/// names cached for a year, the loader briefly, nothing outside the directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn files_are_compressed_as_accepted_and_cached_by_their_names() {
    let site = site();
    let (_db, server, _shop) = start(Backend::Sqlite, &site).await;
    let http = reqwest::Client::new();
    let fetch = |path: &str, encoding: &str| {
        let request = http
            .get(format!("{}{path}", server.base))
            .header("accept-encoding", encoding);
        async move {
            let answer = request.send().await.unwrap();
            let headers = answer.headers().clone();
            (
                answer.status(),
                headers,
                answer.bytes().await.unwrap().to_vec(),
            )
        }
    };
    let header = |headers: &reqwest::header::HeaderMap, name: &str| {
        headers.get(name).map(|v| v.to_str().unwrap().to_owned())
    };
    let wasm = std::fs::read(site.path().join("app-0123456789abcdef_bg.wasm")).unwrap();
    for encoding in ["br", "gzip", "identity"] {
        let (status, headers, body) = fetch("/app-0123456789abcdef_bg.wasm", encoding).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            header(&headers, "content-type").as_deref(),
            Some("application/wasm")
        );
        assert_eq!(
            header(&headers, "cache-control").as_deref(),
            Some("public, max-age=31536000, immutable")
        );
        assert_eq!(header(&headers, "vary").as_deref(), Some("accept-encoding"));
        let plain = match encoding {
            "br" => {
                let mut out = Vec::new();
                brotli::Decompressor::new(&body[..], 4096)
                    .read_to_end(&mut out)
                    .unwrap();
                out
            }
            "gzip" => {
                let mut out = Vec::new();
                flate2::read::GzDecoder::new(&body[..])
                    .read_to_end(&mut out)
                    .unwrap();
                out
            }
            _ => body.clone(),
        };
        let sent = header(&headers, "content-encoding");
        assert_eq!(
            sent.as_deref(),
            (encoding != "identity").then_some(encoding)
        );
        assert_eq!(plain, wasm, "{encoding}");
        if encoding != "identity" {
            assert!(
                body.len() < wasm.len() / 10,
                "{encoding}: {} bytes",
                body.len()
            );
        }
    }
    let (status, headers, _) = fetch("/v1/checkout.js", "gzip, deflate, br").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        header(&headers, "cache-control").as_deref(),
        Some("public, max-age=300")
    );
    assert_eq!(header(&headers, "content-encoding").as_deref(), Some("br"));
    assert_eq!(
        header(&headers, "timing-allow-origin").as_deref(),
        Some("*")
    );
    assert_eq!(
        header(&headers, "content-type").as_deref(),
        Some("text/javascript; charset=utf-8")
    );
    // A shop may load it as a module (`<script type="module">` fetches in CORS mode): the
    // loader is public, so any origin may; the widget's own files are the frame's, same-origin.
    assert_eq!(
        header(&headers, "access-control-allow-origin").as_deref(),
        Some("*")
    );
    let (_, headers, _) = fetch("/app-0123456789abcdef_bg.wasm", "br").await;
    assert_eq!(header(&headers, "access-control-allow-origin"), None);
    // The account window: top-level only, its own inline script allowed (not the payment
    // page's), asked afresh each time; opener kept (no COOP: it hands the sign-in back).
    let (status, headers, body) = fetch("/account", "br").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(String::from_utf8_lossy(&body), ACCOUNT_PAGE);
    let policy = header(&headers, "content-security-policy").unwrap();
    assert!(policy.ends_with("frame-ancestors 'none'"), "{policy}");
    let own = checkout_backend::api::assets::inline_scripts(ACCOUNT_PAGE)
        .next()
        .unwrap();
    let pay = checkout_backend::api::assets::inline_scripts(PAGE)
        .next()
        .unwrap();
    let hash = |script: &str| {
        use base64::Engine;
        use sha2::Digest;
        base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(script))
    };
    assert!(policy.contains(&hash(own)), "{policy}");
    assert!(!policy.contains(&hash(pay)), "{policy}");
    assert_eq!(header(&headers, "x-frame-options").as_deref(), Some("DENY"));
    assert_eq!(
        header(&headers, "cache-control").as_deref(),
        Some("no-cache")
    );
    assert_eq!(header(&headers, "cross-origin-opener-policy"), None);
    // Nothing outside the directory; the pages only as `/pay/{id}` and `/account` (with their
    // policies).
    for outside in [
        "/../Cargo.toml",
        "/%2e%2e/Cargo.toml",
        "/.hidden",
        "/index.html",
        "/account/index.html",
        "/nothing.js",
    ] {
        let (status, _, _) = fetch(outside, "br").await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{outside}");
    }
}

/// The loader is told the checkout's origin by the server (its public origin; under the
/// development default, the host the browser asked), compressed or not; a `Host` that is not a
/// plain host and port is not believed. A `?parent` is written into the page escaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_loader_is_told_the_checkouts_origin_by_the_server() {
    let site = site();
    let (db, server, _shop) = start(Backend::Sqlite, &site).await;
    let told = |body: &str| {
        body.lines()
            .next()
            .unwrap_or_default()
            .trim_start_matches("const checkout = ")
            .to_owned()
    };
    for encoding in ["identity", "gzip"] {
        let answer = reqwest::Client::new()
            .get(format!("{}/v1/checkout.js", server.base))
            .header("accept-encoding", encoding)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        let gzipped = answer.headers().get("content-encoding").is_some();
        assert_eq!(gzipped, encoding == "gzip");
        let bytes = answer.bytes().await.unwrap();
        let mut body = String::new();
        if gzipped {
            flate2::read::GzDecoder::new(&bytes[..])
                .read_to_string(&mut body)
                .unwrap();
        } else {
            body = String::from_utf8(bytes.to_vec()).unwrap();
        }
        assert_eq!(told(&body), format!("{:?};", server.base), "{encoding}");
    }
    for host in ["evil.example/x", "a\"b.example", "user@evil.example"] {
        let answer = support::raw_request(
            &server.base,
            &format!("GET /v1/checkout.js HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
        )
        .await;
        if answer.status == StatusCode::OK {
            assert_eq!(told(&answer.body), "\"http://localhost\";", "{host}");
        } else {
            assert_eq!(
                answer.status,
                StatusCode::BAD_REQUEST,
                "{host}: {}",
                answer.body
            );
        }
    }
    let unknown = format!("/pay/cs_{}", "0".repeat(32));
    let page = reqwest::get(format!(
        "{}{unknown}?parent=http%3A%2F%2F127.0.0.1%3A1%22%3E%3Cscript%3E",
        server.base
    ))
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    assert!(!page.contains("\"><script>"), "{page}");
    drop(server);

    let dir = site.path().display().to_string();
    let public = Server::start_with(
        SERVER,
        &db,
        &[
            ("CHECKOUT_STATIC_DIR", &dir),
            ("CHECKOUT_PUBLIC_ORIGIN", "https://pay.example.ru"),
        ],
    )
    .await;
    let body = reqwest::get(format!("{}/v1/checkout.js", public.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(told(&body), "\"https://pay.example.ru\";");
}

/// No page of another origin can read the API from a browser: no CORS answer, to a preflight
/// or to a simple request. In demo mode `/` makes a demo purchase and sends the browser to its
/// payment page.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_api_answers_no_other_origin_and_the_demo_page_redirects() {
    let site = site();
    let (_db, server, shop) = start(Backend::Sqlite, &site).await;
    let session = shop.session("ORD-CORS", 100).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let preflight = http
        .request(
            reqwest::Method::OPTIONS,
            format!("{}/api/payments", server.base),
        )
        .header("origin", "https://shop.example")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization, idempotency-key, content-type",
        )
        .send()
        .await
        .unwrap();
    assert!(
        preflight
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );
    assert!(!preflight.status().is_success(), "{}", preflight.status());
    let simple = http
        .get(format!("{}/api/checkout-sessions/{session}", server.base))
        .header("origin", "https://shop.example")
        .send()
        .await
        .unwrap();
    assert_eq!(simple.status(), StatusCode::OK);
    assert!(
        simple
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );

    let demo = http.get(format!("{}/", server.base)).send().await.unwrap();
    assert!(demo.status().is_redirection(), "{}", demo.status());
    let location = demo.headers()["location"].to_str().unwrap().to_owned();
    assert!(location.starts_with("/pay/cs_"), "{location}");
    let page = http
        .get(format!("{}{location}", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
}

/// Answers that carry a token or a balance are never stored by a cache (`no-store`); the widget's
/// files keep their own caching. Served as `https://…` (`CHECKOUT_PUBLIC_ORIGIN`), every answer
/// tells the browser to come back only over https (HSTS); over plain http it does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_and_balances_are_never_cached_and_https_is_sticky() {
    let site = site();
    let (db, server, _shop) = start(Backend::Sqlite, &site).await;
    let made = reqwest::Client::new()
        .post(format!("{}/api/test/shoppers", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(made.headers()["cache-control"], "no-store");
    let token = made.json::<serde_json::Value>().await.unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let account = reqwest::Client::new()
        .get(format!("{}/api/account", server.base))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(account.headers()["cache-control"], "no-store");
    assert!(account.headers().get("strict-transport-security").is_none());
    let file = reqwest::get(format!("{}/app-0123456789abcdef.js", server.base))
        .await
        .unwrap();
    assert_eq!(
        file.headers()["cache-control"],
        "public, max-age=31536000, immutable"
    );
    drop(server);

    let dir = site.path().display().to_string();
    let https = Server::start_with(
        SERVER,
        &db,
        &[
            ("CHECKOUT_STATIC_DIR", &dir),
            ("CHECKOUT_PUBLIC_ORIGIN", "https://pay.example.ru"),
        ],
    )
    .await;
    for path in ["/healthz", "/account", "/app-0123456789abcdef.js"] {
        let answer = reqwest::get(format!("{}{path}", https.base)).await.unwrap();
        assert_eq!(
            answer.headers()["strict-transport-security"],
            "max-age=31536000; includeSubDomains",
            "{path}"
        );
    }
}
