//! `widget-load`: how long a shop's page takes to offer «Оплатить» for a known session, and what
//! the shopper downloads for it: the widget in its frame (the loader, then `/pay/{id}`; the
//! shop's page on another site, and on the same site) against the widget as it was, inside the
//! shop's page (its release build from the commit before the
//! frame, given as `--baseline`), in one run, on one machine. Each variant's round is a fresh
//! Chromium (cold cache, empty storage) loading one session's page (cold), then, in the same
//! tab, another session's (warm: a returning shopper, the files cached, the tab's shopper
//! known). Both are served by the same checkout server (the baseline's files compressed as the
//! frame's are), so the difference is the design, not the transport.
//!
//! The time is Chromium's own: from the shop's page's `timeOrigin` to the widget's
//! `checkout:pay-enabled` performance mark (in the frame; for the baseline, made by the page the
//! moment its button is enabled). Writes a Markdown report (`--out`), with the moments before
//! it (the frame made, its document in, the widget's code in) from Resource and Navigation
//! Timing, and the frame's first script (its `checkout:first-script` mark: the floor of any
//! frame), on the same clock.

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
    /// Rounds of each variant, a cold and a warm load each (medians are reported).
    #[arg(long, default_value_t = 20)]
    loads: usize,
    /// The widget's build (scripts/test and scripts/run make it).
    #[arg(long, default_value = "dist")]
    dist: PathBuf,
    /// The widget-in-the-page build to compare with (scripts/bench-widget makes it from git).
    #[arg(long, default_value = "target/baseline-widget/dist")]
    baseline: PathBuf,
    /// Where the report goes (there, BENCHMARKS.md shows it too).
    #[arg(long, default_value = DEFAULT_OUT)]
    out: PathBuf,
}

/// One load: milliseconds from the shop's page's start to an enabled «Оплатить», and bytes
/// transferred for the widget, by what they are.
#[derive(Debug, Default)]
struct Load {
    ready_ms: f64,
    /// The moments before it, on the same clock: the frame made (by the loader), its document
    /// received, the widget's code (WebAssembly and JavaScript) received. The baseline has only
    /// the last.
    frame_made_ms: Option<f64>,
    document_in_ms: Option<f64>,
    /// The frame's first script ran (its `checkout:first-script` mark, before anything the
    /// frame loads): the earliest any code of a frame can do anything.
    first_script_ms: Option<f64>,
    code_in_ms: f64,
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

/// The report's place, which BENCHMARKS.md shows (`checkout_bench::kept`).
const DEFAULT_OUT: &str = "bench/widget-load.md";

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

/// The page's resources (and, for a frame, its own document), as `[name, transferSize, type,
/// startTime, responseEnd]`.
const RESOURCES: &str = "return { origin: performance.timeOrigin, \
    mark: (performance.getEntriesByName('checkout:pay-enabled')[0] || {}).startTime, \
    first_script: (performance.getEntriesByName('checkout:first-script')[0] || {}).startTime, \
    document: performance.getEntriesByType('navigation')[0].transferSize, \
    document_end: performance.getEntriesByType('navigation')[0].responseEnd, \
    resources: performance.getEntriesByType('resource').map((r) => \
      [r.name, r.transferSize, r.initiatorType, r.startTime, r.responseEnd]) };";

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

    let variants = [
        Variant::Framed(shop_page.clone()),
        Variant::Framed(same_site.clone()),
        Variant::InPage(server.base.clone()),
    ];
    // A round of each first, not counted: the server's compressed copies are made, the
    // machine's caches of Chromium's own files are warm.
    for (n, variant) in variants.iter().enumerate() {
        variant.round(&shop, &format!("W{n}")).await;
    }
    let mut rounds: [Vec<Round>; 3] = Default::default();
    for n in 0..args.loads {
        // In turn, so that a noisy moment of the machine falls on all.
        for (v, variant) in variants.iter().enumerate() {
            rounds[v].push(variant.round(&shop, &format!("{v}-{n}")).await);
        }
        let [framed, same, in_page] = &rounds;
        eprintln!(
            "round {}/{}: cold, warm ms: frame {:.0}, {:.0} (same site {:.0}, {:.0}); in the page {:.0}, {:.0}",
            n + 1,
            args.loads,
            framed[n].cold.ready_ms,
            framed[n].warm.ready_ms,
            same[n].cold.ready_ms,
            same[n].warm.ready_ms,
            in_page[n].cold.ready_ms,
            in_page[n].warm.ready_ms,
        );
    }
    let [framed, same, in_page] = &rounds;
    let report = report(framed, same, in_page);
    std::fs::write(&args.out, &report).unwrap();
    println!("{report}");
    if args.out == Path::new(DEFAULT_OUT) {
        checkout_bench::kept::rewrite("BENCHMARKS.md");
        eprintln!("wrote BENCHMARKS.md");
    }
}

/// What is measured: the widget in its frame (the shop's page at this base), or in the page.
enum Variant {
    Framed(String),
    InPage(String),
}

/// One browser's two loads: a first visit, then a returning shopper's.
struct Round {
    cold: Load,
    warm: Load,
}

impl Variant {
    /// A fresh Chromium loads a new session's page, then another's in the same tab.
    async fn round(&self, shop: &checkout_testkit::Shop, name: &str) -> Round {
        let (_chromium, client) = chromium::open(520, 900).await;
        let mut loads = Vec::new();
        for visit in ["A", "B"] {
            let session = shop.session(&format!("ORD-{name}{visit}"), 30_000).await;
            loads.push(match self {
                Variant::Framed(shop_page) => {
                    load_framed(&client, &format!("{shop_page}/?session={session}")).await
                }
                Variant::InPage(checkout) => {
                    let url = format!("{checkout}/baseline/shop.html?session={session}");
                    load_in_page(&client, &url).await
                }
            });
        }
        let _ = client.close().await;
        let warm = loads.pop().unwrap();
        let cold = loads.pop().unwrap();
        Round { cold, warm }
    }
}

/// The widget in its frame: the shop's page (on its own origin) with the loader; the time is
/// the frame's mark on the shop's page's clock.
async fn load_framed(client: &Client, url: &str) -> Load {
    client.goto(url).await.unwrap();
    let frame = client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css("iframe"))
        .await
        .expect("the loader made a frame");
    frame.enter_frame().await.unwrap();
    let inside = marked(client).await;
    client.enter_frame(None).await.unwrap();
    let page: Value = client.execute(RESOURCES, vec![]).await.unwrap();
    // The frame's clock starts later than the page's: its times, moved onto the page's.
    let offset = inside["origin"].as_f64().unwrap() - page["origin"].as_f64().unwrap();
    let mut load = Load {
        ready_ms: offset + inside["mark"].as_f64().unwrap(),
        document: inside["document"].as_u64().unwrap_or(0),
        document_in_ms: inside["document_end"].as_f64().map(|t| offset + t),
        first_script_ms: inside["first_script"].as_f64().map(|t| offset + t),
        ..Load::default()
    };
    for resource in page["resources"].as_array().unwrap() {
        let name = resource[0].as_str().unwrap_or("");
        if name.contains("/v1/checkout.js") {
            load.shop_page += resource[1].as_u64().unwrap_or(0);
        }
        if resource[2] == "iframe" && name.contains("/pay/") {
            load.frame_made_ms = resource[3].as_f64();
        }
    }
    add_widget_files(&mut load, &inside, offset);
    load
}

/// The widget as it was, in the shop's page.
async fn load_in_page(client: &Client, url: &str) -> Load {
    client.goto(url).await.unwrap();
    let page = marked(client).await;
    let mut load = Load {
        ready_ms: page["mark"].as_f64().unwrap(),
        ..Load::default()
    };
    add_widget_files(&mut load, &page, 0.0);
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
/// page and script); `offset` moves the page's times onto the shop's page's clock.
fn add_widget_files(load: &mut Load, page: &Value, offset: f64) {
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
        if path.ends_with(".wasm") || path.ends_with(".js") {
            let end = offset + resource[4].as_f64().unwrap_or(0.0);
            load.code_in_ms = load.code_in_ms.max(end);
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

fn report(framed: &[Round], same_site: &[Round], in_page: &[Round]) -> String {
    let cold = |rounds: &[Round]| rounds.iter().map(|r| r.cold.ready_ms).collect::<Vec<_>>();
    let warm = |rounds: &[Round]| rounds.iter().map(|r| r.warm.ready_ms).collect::<Vec<_>>();
    let spread = |t: Vec<f64>| {
        format!(
            "{:.0} | {:.0} | {:.0}",
            median(t.clone()),
            t.iter().copied().fold(f64::INFINITY, f64::min),
            t.iter().copied().fold(0.0, f64::max),
        )
    };
    // The frame's first script in each round (NaN where a build has no such mark).
    let floor = |rounds: &[Round], load: fn(&Round) -> &Load| {
        rounds
            .iter()
            .map(|r| load(r).first_script_ms.unwrap_or(f64::NAN))
            .collect::<Vec<_>>()
    };
    // Each round's ratio to the baseline's round beside it; their median.
    let ratio =
        |of: Vec<f64>, to: Vec<f64>| median(of.iter().zip(&to).map(|(a, b)| a / b).collect());
    let machine = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut out = format!(
        "# The widget's load: in its frame against in the shop's page\n\n\
         Written by `scripts/bench-widget` ({} rounds of each variant, in turn; a round is a fresh \
         headless Chromium loading one session's page (**cold**: empty cache and storage), then \
         another session's in the same tab (**warm**: a returning shopper, the files cached, the \
         tab's test shopper known); {machine} cores; loopback, so the network costs round trips, \
         not bandwidth). All are served by the same checkout server, compressed alike. The \
         baseline is the widget in the page at the commit before the frame.\n\n\
         ## Time to an enabled «Оплатить» (ms from the shop's page's start)\n\n\
         | | cold: median | fastest | slowest | warm: median | fastest | slowest |\n\
         |---|---|---|---|---|---|---|\n\
         | in its frame, the shop's page on another site (`localhost`) | {} | {} |\n\
         | in its frame, the shop's page on the same site (`127.0.0.1`, another port) | {} | {} |\n\
         | in the shop's page (baseline) | {} | {} |\n\n\
         The frame ÷ the baseline, the median of the rounds' ratios: **{:.2}×** cold, **{:.2}×** \
         warm ({:.2}× and {:.2}× for a shop's page of the same site: a frame of another site gets \
         a renderer process of its own, Chromium's site isolation, which is the point of the \
         frame).\n\n\
         ## Where the time goes (medians, ms from the shop's page's start)\n\n\
         | | frame, cold | in the page, cold | frame, warm | in the page, warm |\n\
         |---|---|---|---|---|\n{}\n\
         No frame of another site can do better than its first script (a mark in its `<head>`, \
         before anything it loads): **{:.2}×** cold and **{:.2}×** warm the moment the widget in \
         the page enables «Оплатить» (the median of the rounds' ratios; medians {} and {} ms \
         against {} and {}).\n\n\
         ## Transferred, cold (bytes on the wire, Resource Timing `transferSize`, headers included)\n\n\
         | | in its frame | in the shop's page |\n|---|---|---|\n",
        framed.len(),
        spread(cold(framed)),
        spread(warm(framed)),
        spread(cold(same_site)),
        spread(warm(same_site)),
        spread(cold(in_page)),
        spread(warm(in_page)),
        ratio(cold(framed), cold(in_page)),
        ratio(warm(framed), warm(in_page)),
        ratio(cold(same_site), cold(in_page)),
        ratio(warm(same_site), warm(in_page)),
        steps(framed, in_page),
        ratio(floor(framed, |r| &r.cold), cold(in_page)),
        ratio(floor(framed, |r| &r.warm), warm(in_page)),
        median_of(framed, |r| r.cold.first_script_ms),
        median_of(framed, |r| r.warm.first_script_ms),
        median_of(in_page, |r| Some(r.cold.ready_ms)),
        median_of(in_page, |r| Some(r.warm.ready_ms)),
    );
    let bytes = |rounds: &[Round], part: fn(&Load) -> u64| {
        median(rounds.iter().map(|r| part(&r.cold) as f64).collect()) as u64
    };
    let kb = |b: u64| format!("{:.1} KB", b as f64 / 1000.0);
    let row = |name: &str, part: fn(&Load) -> u64| {
        format!(
            "| {name} | {} | {} |\n",
            kb(bytes(framed, part)),
            kb(bytes(in_page, part))
        )
    };
    out += &row("the shop's page: the loader", |l| l.shop_page);
    out += &row("the payment page (the frame's document)", |l| l.document);
    out += &row("WebAssembly", |l| l.wasm);
    out += &row("JavaScript (the widget's glue and modules)", |l| l.js);
    out += &row("styles", |l| l.css);
    out += &row("**all of it**", Load::total);
    out += &format!(
        "\nWebAssembly + JavaScript of the frame: **{}** (the goal: at most 100 KB); the shop's page \
         downloads **{}** to show the loader (the goal: at most 5 KB). Warm, the frame's files \
         come from the cache: {} on the wire (the payment page itself, asked afresh).\n",
        kb(bytes(framed, |l| l.wasm + l.js)),
        kb(bytes(framed, |l| l.shop_page)),
        kb(median(framed.iter().map(|r| r.warm.total() as f64).collect()) as u64),
    );
    out
}

/// The median of a moment of the rounds that have it, in whole ms ("—" if none has).
fn median_of(rounds: &[Round], moment: impl Fn(&Round) -> Option<f64>) -> String {
    let times: Vec<f64> = rounds.iter().filter_map(moment).collect();
    if times.is_empty() {
        "—".to_owned()
    } else {
        format!("{:.0}", median(times))
    }
}

/// The moments of a load, as medians: when the frame was made, when its document was in and
/// its first script ran, when the widget's code was in, when «Оплатить» was enabled; the
/// frame's against the baseline's.
fn steps(framed: &[Round], in_page: &[Round]) -> String {
    type Step = fn(&Load) -> Option<f64>;
    let at = |rounds: &[Round], load: fn(&Round) -> &Load, step: Step| {
        median_of(rounds, |r| step(load(r)))
    };
    let cold: fn(&Round) -> &Load = |r| &r.cold;
    let warm: fn(&Round) -> &Load = |r| &r.warm;
    let rows: [(&str, Step); 5] = [
        ("the loader has made the frame", |l| l.frame_made_ms),
        ("the frame's document is in", |l| l.document_in_ms),
        (
            "the frame's first script runs (the earliest any of its code can)",
            |l| l.first_script_ms,
        ),
        ("the widget's code is in (WebAssembly, JavaScript)", |l| {
            Some(l.code_in_ms)
        }),
        ("«Оплатить» is enabled", |l| Some(l.ready_ms)),
    ];
    rows.iter()
        .map(|(name, step)| {
            format!(
                "| {name} | {} | {} | {} | {} |\n",
                at(framed, cold, *step),
                at(in_page, cold, *step),
                at(framed, warm, *step),
                at(in_page, warm, *step),
            )
        })
        .collect()
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
