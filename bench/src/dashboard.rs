//! What the shop's dashboard costs a shop the size of a busy year: the service pays sessions of
//! one shop until it holds `payments` payments; an owner invited by mail signs in; then each
//! page is asked for one after another, and its latencies are taken (p50, p95, p99) beside the
//! server's cheapest answer (`/healthz`) asked for in turns with it, as the baseline of the run.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use checkout_testkit::TestDb;
use checkout_testkit::dashboard::Dashboard;

use crate::{ONE_SHOP, SessionNumbers, Target};

/// Requests per page (after a few to warm its statements).
const ASKS: usize = 200;
const WARM: usize = 10;
/// Clients paying while the shop's history is built.
const CLIENTS: usize = 32;

pub struct Page {
    pub name: &'static str,
    pub p50: Duration,
    pub p95: Duration,
    pub p99: Duration,
    /// `/healthz` asked in turns with the page: its p95.
    pub baseline_p95: Duration,
    pub bytes: usize,
}

pub struct Measured {
    pub database: &'static str,
    pub payments: i64,
    pub pages: Vec<Page>,
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

pub async fn measure(
    database: &'static str,
    target: &Target,
    numbers: &mut SessionNumbers,
    payments: i64,
    dir: &std::path::Path,
) -> Measured {
    let count = |db: &TestDb| {
        let url = db.url.clone();
        async move {
            TestDb::at(url)
                .scalar("SELECT COUNT(*) FROM payments WHERE shop_account_id = 'shop-0'")
                .await
        }
    };
    loop {
        let have = count(&target.db).await;
        if have >= payments {
            break;
        }
        eprintln!("{database}: shop-0 has {have} payments of {payments}, paying more");
        target.pay_fresh(numbers, ONE_SHOP, CLIENTS, 20, dir).await;
    }
    if database == "PostgreSQL" {
        // What autovacuum does to a table that grew: statistics and the visibility map.
        target.db.execute("VACUUM ANALYZE").await;
    }
    let email = format!("owner-{}@bench.example.ru", uuid::Uuid::new_v4().simple());
    let link = target.server.invite("shop_bench_0", &email, "owner").await;
    let mut owner = Dashboard::new(&target.server.base);
    owner.accept(&link, "пароль-для-замера").await;
    let pick = |sql: &'static str| {
        let db = TestDb::at(target.db.url.clone());
        async move { db.scalar_text(sql).await }
    };
    let payment = pick(
        "SELECT payment_id FROM payments WHERE shop_account_id = 'shop-0' \
          ORDER BY created_at, payment_id LIMIT 1",
    )
    .await;
    let order = pick(
        "SELECT order_id FROM payments WHERE shop_account_id = 'shop-0' \
          ORDER BY created_at DESC, payment_id DESC LIMIT 1 OFFSET 5000",
    )
    .await;
    let event = pick(
        "SELECT event_id FROM webhook_events WHERE shop_account_id = 'shop-0' \
          ORDER BY seq LIMIT 1",
    )
    .await;
    let today = time::OffsetDateTime::now_utc()
        .to_offset(time::UtcOffset::from_hms(3, 0, 0).unwrap())
        .date();
    let pages: Vec<(&'static str, String)> = vec![
        ("overview: 30 days of charts", "/dashboard".into()),
        ("payments, newest 50", "/dashboard/payments".into()),
        (
            "payments, found by order id",
            format!("/dashboard/payments?q={order}"),
        ),
        (
            "payments, an amount none has (every row looked at)",
            "/dashboard/payments?amount=0%2C02".into(),
        ),
        (
            "payments, today and not refunded",
            format!("/dashboard/payments?from={today}&to={today}&state=paid"),
        ),
        (
            "payments, the 40th page (cursor)",
            "/dashboard/payments?before=PLACEHOLDER".into(),
        ),
        (
            "a payment with its ledger and events",
            format!("/dashboard/payments/{payment}"),
        ),
        ("events, newest 50", "/dashboard/events".into()),
        (
            "an event with its attempts",
            format!("/dashboard/events/{event}"),
        ),
    ];
    // The 40th page: the cursor of the 2 000th newest payment.
    let cursor = TestDb::at(target.db.url.clone())
        .scalar_text(
            "SELECT CAST(created_at AS TEXT) || '_' || payment_id FROM payments \
              WHERE shop_account_id = 'shop-0' \
              ORDER BY created_at DESC, payment_id DESC LIMIT 1 OFFSET 2000",
        )
        .await;
    let mut measured = Vec::new();
    for (name, path) in pages {
        let path = path.replace("PLACEHOLDER", &cursor);
        let mut page_times = Vec::with_capacity(ASKS);
        let mut base_times = Vec::with_capacity(ASKS);
        let mut bytes = 0;
        for i in 0..WARM + ASKS {
            let started = Instant::now();
            let page = owner.get(&path).await;
            let took = started.elapsed();
            assert_eq!(page.status, 200, "{path}: {page:?}");
            bytes = page.html.len();
            let started = Instant::now();
            let health = owner.get("/healthz").await;
            let base = started.elapsed();
            assert_eq!(health.status, 200);
            if i >= WARM {
                page_times.push(took);
                base_times.push(base);
            }
        }
        page_times.sort();
        base_times.sort();
        let page = Page {
            name,
            p50: quantile(&page_times, 0.5),
            p95: quantile(&page_times, 0.95),
            p99: quantile(&page_times, 0.99),
            baseline_p95: quantile(&base_times, 0.95),
            bytes,
        };
        eprintln!(
            "{database}: {name}: p50 {:.1} ms, p95 {:.1} ms, p99 {:.1} ms ({} bytes)",
            ms(page.p50),
            ms(page.p95),
            ms(page.p99),
            page.bytes
        );
        measured.push(page);
    }
    Measured {
        database,
        payments: count(&target.db).await,
        pages: measured,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub fn markdown(runs: &[Measured]) -> String {
    let mut md = String::new();
    for run in runs {
        writeln!(
            md,
            "\n{}: one shop holding {} payments.\n",
            run.database, run.payments
        )
        .unwrap();
        writeln!(
            md,
            "| page | p50 | p95 | p99 | `/healthz` p95 in turns | page ÷ baseline (p95) | bytes |"
        )
        .unwrap();
        writeln!(md, "|---|---|---|---|---|---|---|").unwrap();
        for p in &run.pages {
            writeln!(
                md,
                "| {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} | {} |",
                p.name,
                ms(p.p50),
                ms(p.p95),
                ms(p.p99),
                ms(p.baseline_p95),
                p.p95.as_secs_f64() / p.baseline_p95.as_secs_f64().max(1e-6),
                p.bytes
            )
            .unwrap();
        }
    }
    writeln!(md, "\n{ASKS} requests per page by one signed-in owner, one at a time, each followed by a `/healthz` (the baseline, in the same run); the first {WARM} not counted. One run on this shared 2-core machine.").unwrap();
    md
}
