//! The checkout on a highly available PostgreSQL as an operator deploys one (Patroni, etcd,
//! HAProxy; Debian's packages, no stand-in).

use checkout_testkit::patroni::HaCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cluster_fails_over_when_the_leaders_postgres_is_killed() {
    let started = std::time::Instant::now();
    let cluster = HaCluster::start().await;
    eprintln!(
        "up in {:?}: {:?}",
        started.elapsed(),
        cluster.members().await
    );
    let leader = cluster.leader().await.unwrap();
    let killed = std::time::Instant::now();
    cluster.kill_postgres(leader);
    cluster.until_writable().await;
    eprintln!(
        "writable again after {:?}: {:?}",
        killed.elapsed(),
        cluster.members().await
    );
    assert_ne!(cluster.leader().await, Some(leader));
    cluster.until_whole().await;
    eprintln!(
        "whole again after {:?}: {:?}",
        killed.elapsed(),
        cluster.members().await
    );
}
