//! Losing the PostgreSQL primary, bounded: Patroni's leader SIGKILLed once under load while its
//! WAL crosses a link that delays every byte 20 ms (a standby in another zone; the link is cut
//! with whatever it still carried). With `synchronous_mode` nothing acknowledged may be lost;
//! with asynchronous replication the loss is counted, and still nobody is charged twice and the
//! books balance. The two runs take turns (each cluster wants the machine's two cores).

use std::time::Duration;

use checkout_reliability::failover::{FailoverPlan, FailoverReport, Fault, run};

const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server-chaos");
const RECEIPTS: &str = env!("CARGO_BIN_EXE_receipts-chaos");

static ONE_CLUSTER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn losing_the_leader(synchronous: bool) -> FailoverReport {
    let _turn = ONE_CLUSTER_AT_A_TIME.lock().await;
    let plan = FailoverPlan {
        faults: vec![Fault::LeaderPostgres],
        requests: 300,
        clients: 8,
        load_before: Duration::from_secs(2),
        synchronous,
        link_delay: Duration::from_millis(20),
        receipts: false,
    };
    let report = run(&plan, SERVER, RECEIPTS).await;
    eprintln!("{}", report.summary());
    assert_eq!(report.failovers, 1);
    assert_eq!(report.double_charges, 0);
    assert_eq!(report.other_5xx, 0, "{:#?}", report.violations);
    assert!(
        report.answered_after_last > 0,
        "the checkout recovered without a restart"
    );
    assert!(report.verify_holds);
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn losing_the_leader_with_a_synchronous_standby_loses_nothing_acknowledged() {
    let report = losing_the_leader(true).await;
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn losing_the_leader_with_asynchronous_replication_never_charges_twice() {
    losing_the_leader(false).await;
}
