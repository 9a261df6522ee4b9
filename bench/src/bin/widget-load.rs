//! `widget-load`: how long a shop's page takes to offer «Оплатить» for a known session, and what
//! the shopper downloads for it: the widget in its frame (the loader, then `/pay/{id}`; the
//! shop's page on another site, and on the same site) against the widget as it was, inside the
//! shop's page (its release build from the commit before the
//! frame, given as `--baseline`), in one run, on one machine, each load in a fresh Chromium
//! (cold cache, empty storage). Both are served by the same checkout server (the baseline's
//! files compressed as the frame's are), so the difference is the design, not the transport.
//!
//! The time is Chromium's own: from the shop's page's `timeOrigin` to the widget's
//! `checkout:pay-enabled` performance mark (in the frame; for the baseline, made by the page the
//! moment its button is enabled). Writes a Markdown report (`--out`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use checkout_testkit::{Backend, Server, TestDb, chromium};
use clap::Parser;
use fantoccini::{Client, Locator};
use serde_json::Value;

#[derive(Parser)]
#[command(
    about = "Time to an enabled «Оплатить» and bytes downloaded: the frame against the widget in the page"
)]
struct Args {
    /// Loads of each variant (the median is reported).
    #[arg(long, default_value_t = 20)]
    loads: usize,
    /// The widget's build (scripts/test and scripts/run make it).
    #[arg(long, default_value = "dist")]
    dist: PathBuf,
    /// The widget-in-the-page build to compare with (scripts/bench-widget makes it from git).
    #[arg(long, default_value = "target/baseline-widget/dist")]
    baseline: PathBuf,
    /// Where the report goes.
    #[arg(long, default_value = "bench/widget-load.md")]
    out: PathBuf,
}

/// One load: milliseconds from the shop's page's start to an enabled «Оплатить», and bytes
/// transferred for the widget, by what they are.
#[derive(Debug, Default)]
struct Load {
    ready_ms: f64,
    /// What the shop's page itself fetched from the checkout (the loader; the baseline has none).
    shop_page: u64,
    /// The frame's document (the payment page); none for the baseline.
    document: u64,
    wasm: u64,
    js: u64,
    css: u64,
}

impl Load {
    fn total(&self) -> u64 {
        self.shop_page + self.document + self.wasm + self.js + self.css
    }
}

const WAIT: Duration = Duration::from_secs(30);

/// The widget-in-the-page baseline as a shop's page used it: an element with the session, the
/// module script; plus a mark when its «Оплатить» is first enabled.
const BASELINE_PAGE: &str = r#"<!doctype html>
<html lang="ru"><head><meta charset="utf-8"><title>Книжная лавка</title>
<script type="module" src="checkout.js"></script></head>
<body><h1>Ваш заказ</h1><div id="checkout"></div>
<script src="page.js"></script></body></html>
"#;

const BASELINE_SCRIPT: &str = r#"// The session named in the address, and a mark the moment «Оплатить» can be clicked.
const element = document.getElementById("checkout");
element.dataset.checkoutSession = new URLSearchParams(location.search).get("session");
new MutationObserver((_, observer) => {
  if (element.querySelector("button.pay:not([disabled])")) {
    performance.mark("checkout:pay-enabled");
    observer.disconnect();
  }
}).observe(element, { subtree: true, childList: true, attributes: true });
"#;

/// The page's resources (and, for a frame, its own document), as `[name, transferSize, type]`.
const RESOURCES: &str = "return { origin: performance.timeOrigin, \
    mark: (performance.getEntriesByName('checkout:pay-enabled')[0] || {}).startTime, \
    document: performance.getEntriesByType('navigation')[0].transferSize, \
    resources: performance.getEntriesByType('resource').map((r) => [r.name, r.transferSize, r.initiatorType]) };";

#[tokio::main]
async fn main() {
    let args = Args::parse();
    for (what, dir, file) in [
        ("the widget", &args.dist, "index.html"),
        ("the baseline", &args.baseline, "checkout.js"),
    ] {
        assert!(
            dir.join(file).exists(),
            "{what}: no {file} in {} (scripts/bench-widget builds both)",
            dir.display()
        );
    }
    // One directory served by the checkout: the widget, and the baseline under /baseline/.
    let site = tempfile::tempdir().unwrap();
    copy_dir(&args.dist, site.path());
    let baseline = site.path().join("baseline");
    copy_dir(&args.baseline, &baseline);
    std::fs::write(baseline.join("shop.html"), BASELINE_PAGE).unwrap();
    std::fs::write(baseline.join("page.js"), BASELINE_SCRIPT).unwrap();

    let server_bin = std::env::current_exe()
        .unwrap()
        .with_file_name("checkout-server-bench");
    let db = TestDb::new(Backend::Sqlite).await;
    let static_dir = site.path().display().to_string();
    let server = Server::start_with(
        server_bin.to_str().unwrap(),
        &db,
        &[("CHECKOUT_STATIC_DIR", &static_dir)],
    )
    .await;
    let shop = server.add_shop("Книжная лавка").await;
    // The shop's page on another site than the checkout's 127.0.0.1, as a real shop is; and,
    // to show what that costs, on the same site (another port of 127.0.0.1).
    let shop_page = shop_server(&server.base, "localhost").await;
    let same_site = shop_server(&server.base, "127.0.0.1").await;
    let (ok, out, err) = server
        .operator(&[
            "shop",
            "set-origins",
            "--shop",
            &shop.shop_id,
            "--origin",
            &shop_page,
            "--origin",
            &same_site,
        ])
        .await;
    assert!(ok, "set-origins: {out} {err}");

    // Two loads of each first, not counted: the server's compressed copies are made, the
    // machine's caches of Chromium's own files are warm.
    for n in 0..2 {
        let session = shop.session(&format!("ORD-WF{n}"), 30_000).await;
        load_framed(&format!("{shop_page}/?session={session}")).await;
        let session = shop.session(&format!("ORD-WP{n}"), 30_000).await;
        load_in_page(&format!(
            "{}/baseline/shop.html?session={session}",
            server.base
        ))
        .await;
    }
    let (mut framed, mut same, mut in_page) = (Vec::new(), Vec::new(), Vec::new());
    for n in 0..args.loads {
        // In turn, so that a noisy moment of the machine falls on all.
        let session = shop.session(&format!("ORD-F{n}"), 30_000).await;
        framed.push(load_framed(&format!("{shop_page}/?session={session}")).await);
        let session = shop.session(&format!("ORD-S{n}"), 30_000).await;
        same.push(load_framed(&format!("{same_site}/?session={session}")).await);
        let session = shop.session(&format!("ORD-P{n}"), 30_000).await;
        in_page.push(
            load_in_page(&format!(
                "{}/baseline/shop.html?session={session}",
                server.base
            ))
            .await,
        );
        eprintln!(
            "load {}/{}: frame {:.0} ms (same site {:.0} ms), in the page {:.0} ms",
            n + 1,
            args.loads,
            framed[n].ready_ms,
            same[n].ready_ms,
            in_page[n].ready_ms
        );
    }
    let report = report(&framed, &same, &in_page);
    std::fs::write(&args.out, &report).unwrap();
    println!("{report}");
}

/// The widget in its frame: the shop's page (on its own origin) with the loader; the time is
/// the frame's mark on the shop's page's clock.
async fn load_framed(url: &str) -> Load {
    let (_chromium, client) = chromium::open(520, 900).await;
    client.goto(url).await.unwrap();
    let frame = client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css("iframe"))
        .await
        .expect("the loader made a frame");
    frame.enter_frame().await.unwrap();
    let inside = marked(&client).await;
    client.enter_frame(None).await.unwrap();
    let page: Value = client.execute(RESOURCES, vec![]).await.unwrap();
    let mut load = Load {
        ready_ms: inside["origin"].as_f64().unwrap() + inside["mark"].as_f64().unwrap()
            - page["origin"].as_f64().unwrap(),
        document: inside["document"].as_u64().unwrap_or(0),
        ..Load::default()
    };
    for resource in page["resources"].as_array().unwrap() {
        if resource[0]
            .as_str()
            .is_some_and(|n| n.contains("/v1/checkout.js"))
        {
            load.shop_page += resource[1].as_u64().unwrap_or(0);
        }
    }
    add_widget_files(&mut load, &inside);
    let _ = client.close().await;
    load
}

/// The widget as it was, in the shop's page.
async fn load_in_page(url: &str) -> Load {
    let (_chromium, client) = chromium::open(520, 900).await;
    client.goto(url).await.unwrap();
    let page = marked(&client).await;
    let mut load = Load {
        ready_ms: page["mark"].as_f64().unwrap(),
        ..Load::default()
    };
    add_widget_files(&mut load, &page);
    let _ = client.close().await;
    load
}

/// What the page reports once it has its mark.
async fn marked(client: &Client) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let seen: Value = client.execute(RESOURCES, vec![]).await.unwrap();
        if seen["mark"].is_number() {
            return seen;
        }
        assert!(Instant::now() < deadline, "«Оплатить» never became enabled");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The widget's own files among the page's resources (not the API's answers, not the shop's
/// page and script).
fn add_widget_files(load: &mut Load, page: &Value) {
    for resource in page["resources"].as_array().unwrap() {
        let (name, bytes, initiator) = (
            resource[0].as_str().unwrap_or(""),
            resource[1].as_u64().unwrap_or(0),
            resource[2].as_str().unwrap_or(""),
        );
        let path = name.split('?').next().unwrap_or("");
        if initiator == "fetch" && path.contains("/api/") || path.ends_with("/page.js") {
            continue;
        }
        if path.ends_with(".wasm") {
            load.wasm += bytes;
        } else if path.ends_with(".js") {
            load.js += bytes;
        } else if path.ends_with(".css") {
            load.css += bytes;
        }
    }
}

/// The shop's side for the frame: its page at `/?session=…`, the element written by the server
/// as a shop's server writes it, then the checkout's loader (as the README shows).
async fn shop_server(checkout: &str, host: &str) -> String {
    let checkout = checkout.to_owned();
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(
            move |axum::extract::Query(query): axum::extract::Query<
                std::collections::HashMap<String, String>,
            >| {
                let session = query.get("session").cloned().unwrap_or_default();
                let checkout = checkout.clone();
                async move {
                    axum::response::Html(format!(
                        r#"<!doctype html>
<html lang="ru"><head><meta charset="utf-8"><title>Книжная лавка</title>
</head>
<body><h1>Ваш заказ</h1><div id="checkout" data-checkout-session="{session}"></div>
<script src="{checkout}/v1/checkout.js"></script></body></html>
"#
                    ))
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{host}:{}", listener.local_addr().unwrap().port());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    base
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn report(framed: &[Load], same_site: &[Load], in_page: &[Load]) -> String {
    let times = |loads: &[Load]| loads.iter().map(|l| l.ready_ms).collect::<Vec<_>>();
    let spread = |loads: &[Load]| {
        let t = times(loads);
        (
            median(t.clone()),
            t.iter().copied().fold(f64::INFINITY, f64::min),
            t.iter().copied().fold(0.0, f64::max),
        )
    };
    let (f, s, p) = (spread(framed), spread(same_site), spread(in_page));
    let bytes = |loads: &[Load], part: fn(&Load) -> u64| {
        median(loads.iter().map(|l| part(l) as f64).collect()) as u64
    };
    let kb = |b: u64| format!("{:.1} KB", b as f64 / 1000.0);
    let row = |name: &str, part: fn(&Load) -> u64| {
        format!(
            "| {name} | {} | {} |\n",
            kb(bytes(framed, part)),
            kb(bytes(in_page, part))
        )
    };
    let machine = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut out = format!(
        "# The widget's load: in its frame against in the shop's page\n\n\
         Written by `scripts/bench-widget` ({} loads of each, in turn, each in a fresh headless \
         Chromium: cold cache, empty storage; {machine} cores; loopback, so the network costs \
         round trips, not bandwidth). All are served by the same checkout server, compressed \
         alike. The baseline is the widget in the page at the commit before the frame.\n\n\
         ## Time to an enabled «Оплатить» (ms from the shop's page's start)\n\n\
         | | median | fastest | slowest |\n|---|---|---|---|\n\
         | in its frame, the shop's page on another site (`localhost`) | {:.0} | {:.0} | {:.0} |\n\
         | in its frame, the shop's page on the same site (`127.0.0.1`, another port) | {:.0} | {:.0} | {:.0} |\n\
         | in the shop's page (baseline) | {:.0} | {:.0} | {:.0} |\n\n\
         The frame's median is **{:.2}×** the baseline's ({:.2}× for a page of the same site: a frame \
         of another site gets a renderer process of its own, Chromium's site isolation, which is \
         the point of the frame).\n\n\
         ## Transferred (bytes on the wire, Resource Timing `transferSize`, headers included)\n\n\
         | | in its frame | in the shop's page |\n|---|---|---|\n",
        framed.len(),
        f.0,
        f.1,
        f.2,
        s.0,
        s.1,
        s.2,
        p.0,
        p.1,
        p.2,
        f.0 / p.0,
        s.0 / p.0,
    );
    out += &row("the shop's page: the loader", |l| l.shop_page);
    out += &row("the payment page (the frame's document)", |l| l.document);
    out += &row("WebAssembly", |l| l.wasm);
    out += &row("JavaScript (the widget's glue and modules)", |l| l.js);
    out += &row("styles", |l| l.css);
    out += &row("**all of it**", Load::total);
    out += &format!(
        "\nWebAssembly + JavaScript of the frame: **{}** (the goal: at most 100 KB); the shop's page \
         downloads **{}** to show the loader (the goal: at most 5 KB).\n",
        kb(bytes(framed, |l| l.wasm + l.js)),
        kb(bytes(framed, |l| l.shop_page)),
    );
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}
