//! The campaign, bounded: a few hundred requests and a few kills on every CI run.

use std::time::Duration;

use checkout_reliability::{Plan, run};
use checkout_testkit::Backend;

const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server-chaos");
const SHOP: &str = env!("CARGO_BIN_EXE_demo-shop-chaos");

async fn bounded(backend: Backend, servers: usize) {
    let plan = Plan {
        backend,
        servers,
        requests: 400,
        clients: 8,
        accounts: 6,
        shops: 3,
        cut_percent: 5,
        chaos_every: Duration::from_millis(300),
        min_chaos_acts: 4,
        late_webhook_percent: 10,
    };
    let report = run(&plan, SERVER, SHOP).await;
    eprintln!("{}", report.summary());
    assert!(
        report.server_kills >= 2,
        "the campaign must kill servers: {}",
        report.summary()
    );
    if backend == Backend::Postgres {
        assert!(
            report.database_restarts >= 1,
            "and restart the database: {}",
            report.summary()
        );
    }
    assert!(report.duplicates > 0 && report.payments > 0 && report.refunds > 0);
    assert_eq!(report.money_held, report.money_issued, "money conserved");
    assert!(
        report.live_payments > 0 && report.live_payments < report.payments as i64,
        "test and live money both moved: {} live of {}",
        report.live_payments,
        report.payments
    );
    assert!(
        report.shops_hold > 0,
        "the shops were paid: {}",
        report.summary()
    );
    assert!(
        report.shop_kills >= 1 && report.events > 0 && report.shop_orders > 0,
        "the shops were attacked and heard of it: {}",
        report.summary()
    );
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_servers_on_postgres_lose_nothing_under_kills_and_database_restarts() {
    bounded(Backend::Postgres, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_server_on_sqlite_loses_nothing_under_kills() {
    bounded(Backend::Sqlite, 1).await;
}
