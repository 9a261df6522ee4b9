//! The failover campaign, bounded: one loss of the PostgreSQL primary under load, with a
//! synchronous standby (nothing acknowledged may be lost) and with an asynchronous one (the
//! loss is counted; still no double charge, and the books balance).

use std::time::Duration;

use checkout_reliability::failover::{FailoverPlan, run};
use checkout_testkit::postgres::Replication;

const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server-chaos");

fn plan(replication: Replication) -> FailoverPlan {
    FailoverPlan {
        replication,
        failovers: 1,
        requests: 300,
        clients: 8,
        load_before: Duration::from_secs(2),
        detection: Duration::from_millis(300),
        standby_delay: Duration::from_millis(20),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn losing_the_primary_with_a_synchronous_standby_loses_nothing_acknowledged() {
    let report = run(&plan(Replication::Synchronous), SERVER).await;
    eprintln!("{}", report.summary());
    assert_eq!(report.failovers, 1);
    assert!(report.payments_acknowledged > 0 && report.refunds_acknowledged > 0);
    assert_eq!(
        (
            report.acknowledged_lost,
            report.sessions_lost,
            report.refusals_lost
        ),
        (0, 0, 0),
        "{}",
        report.summary()
    );
    assert_eq!(report.double_charges, 0);
    assert_eq!(report.other_5xx, 0, "{:#?}", report.violations);
    assert!(
        report.answered_after_last > 0,
        "the checkout recovered without a restart"
    );
    assert!(report.verify_holds);
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn losing_the_primary_with_an_asynchronous_standby_never_charges_twice() {
    let report = run(&plan(Replication::Asynchronous), SERVER).await;
    eprintln!("{}", report.summary());
    assert_eq!(report.failovers, 1);
    assert_eq!(report.double_charges, 0);
    assert_eq!(report.other_5xx, 0, "{:#?}", report.violations);
    assert!(report.verify_holds);
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
}
