//! The campaign on the engines an operator deploys beyond one machine, bounded: Patroni (three
//! PostgreSQL nodes, synchronous mode) over three etcd members, HAProxy in front of the database
//! and of two checkout instances, a three-node RabbitMQ cluster and two `receipts` consumers,
//! all from Debian's packages. Under load, one fault of each kind in turn: the leader's
//! PostgreSQL SIGKILLed, an etcd member SIGKILLed, a RabbitMQ node SIGKILLed, a checkout
//! instance SIGKILLed, HAProxy restarted. Nothing acknowledged is lost, nothing is charged
//! twice, every answer is right or a `503` with `Retry-After`, the books hold and every
//! payment and refund has exactly one receipt.

use std::time::Duration;

use checkout_reliability::failover::{FailoverPlan, Fault, run};

const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server-chaos");
const RECEIPTS: &str = env!("CARGO_BIN_EXE_receipts-chaos");

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_patroni_etcd_and_haproxy_no_fault_loses_or_doubles_a_payment() {
    let plan = FailoverPlan {
        faults: Fault::ALL.to_vec(),
        requests: 300,
        clients: 8,
        load_before: Duration::from_secs(2),
        synchronous: true,
        link_delay: Duration::ZERO,
        receipts: true,
    };
    let report = run(&plan, SERVER, RECEIPTS).await;
    eprintln!("{}", report.summary());
    for (fault, outage) in &report.outages_by_fault {
        eprintln!("  {fault}: first payment after it answered in {outage:.2?}");
    }
    assert_eq!(
        report.outages_by_fault.len(),
        Fault::ALL.len(),
        "{:#?}",
        report.violations
    );
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
        "the checkout recovered by itself"
    );
    assert!(report.verify_holds);
    let receipts = report.receipts.expect("receipts were listed");
    assert!(
        receipts as u64 >= report.payments_acknowledged,
        "{receipts} receipts"
    );
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
}
