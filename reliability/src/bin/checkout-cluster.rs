//! `scripts/cluster`: the checkout beyond one machine, on this one (loopback). Three etcd
//! members, three PostgreSQL nodes under Patroni (synchronous mode), HAProxy in front of the
//! database and of two checkout instances, a three-node RabbitMQ cluster (quorum queues) and two
//! `receipts` consumers; the same pieces the HA campaign kills (`reliability/tests/ha.rs`),
//! from the same test kit. Prints the addresses and where each configuration file is; Ctrl-C
//! stops everything.
//!
//! `checkout-cluster CHECKOUT_SERVER RECEIPTS [STATIC_DIR]` (scripts/cluster passes the release
//! builds).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use checkout_testkit::patroni::HaCluster;
use checkout_testkit::postgres::free_port;
use checkout_testkit::rabbitmq::BrokerCluster;

/// A program of ours, its output in `log`, until it listens on `port`.
fn start(program: &str, env: &[(&str, String)], port: u16, log: &std::path::Path) -> Child {
    let file = std::fs::File::create(log).expect("a log file");
    let mut command = Command::new(program);
    command
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("RUST_LOG", "info,sqlx=warn")
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file);
    let mut child = command.spawn().unwrap_or_else(|e| panic!("{program}: {e}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{program} exited ({status}): {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "{program} listens within 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    child
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, server, receipts, rest @ ..] = args.as_slice() else {
        eprintln!("usage: checkout-cluster CHECKOUT_SERVER RECEIPTS [STATIC_DIR]");
        std::process::exit(2);
    };
    let static_dir = rest.first().cloned().unwrap_or_else(|| "dist".into());
    let logs = tempfile::Builder::new()
        .prefix("checkout-cluster-logs-")
        .tempdir()
        .unwrap();
    let started = Instant::now();
    eprintln!("starting RabbitMQ (3 nodes) and PostgreSQL under Patroni (3 nodes, 3 etcd)…");
    let broker = tokio::task::spawn_blocking(|| BrokerCluster::start(3));
    let cluster = HaCluster::start_with_web(2).await;
    let broker = broker.await.unwrap();
    let amqp = broker.urls();
    let checkout_db = cluster.create_database().await;
    let receipts_db = cluster.create_database().await;

    let mut children = Vec::new();
    for (i, port) in cluster.web_ports.iter().enumerate() {
        let env = [
            ("DATABASE_URL", checkout_db.clone()),
            ("CHECKOUT_ADDR", format!("127.0.0.1:{port}")),
            ("CHECKOUT_AMQP_URL", amqp.clone()),
            ("CHECKOUT_STATIC_DIR", static_dir.clone()),
            ("CHECKOUT_DEMO", "1".into()),
        ];
        let log = logs.path().join(format!("checkout{i}.log"));
        children.push(start(server, &env, *port, &log));
    }
    let token = format!("rct_{}", uuid_like());
    let mut receipts_ports = Vec::new();
    for i in 0..2 {
        let port = free_port();
        let env = [
            ("RECEIPTS_DATABASE_URL", receipts_db.clone()),
            ("RECEIPTS_ADDR", format!("127.0.0.1:{port}")),
            ("RECEIPTS_AMQP_URL", amqp.clone()),
            ("RECEIPTS_TOKEN", token.clone()),
        ];
        let log = logs.path().join(format!("receipts{i}.log"));
        children.push(start(receipts, &env, port, &log));
        receipts_ports.push(port);
    }

    println!("up in {:.1} s", started.elapsed().as_secs_f64());
    println!(
        "the checkout (2 instances behind HAProxy): http://127.0.0.1:{}/  (a demo purchase)",
        cluster.web_port
    );
    println!(
        "  its instances: {}",
        cluster
            .web_ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("PostgreSQL, the primary through HAProxy: {checkout_db}");
    for node in &cluster.nodes {
        println!(
            "  {}: PostgreSQL 127.0.0.1:{}, Patroni http://127.0.0.1:{}/cluster",
            node.name, node.pg_port, node.rest_port
        );
    }
    println!(
        "RabbitMQ (3 nodes, quorum queues): {}",
        amqp.replace(",", " ")
    );
    for port in &receipts_ports {
        println!("receipts: http://127.0.0.1:{port}/receipts  (Authorization: Bearer {token})");
    }
    println!(
        "configuration (Patroni pgN.yml, haproxy.cfg) and the databases' logs: {}",
        cluster.dir().display()
    );
    println!("the programs' logs: {}", logs.path().display());
    println!("Ctrl-C stops everything");
    let _ = tokio::signal::ctrl_c().await;
    for mut child in children {
        let _ = child.kill();
        let _ = child.wait();
    }
    drop(cluster);
    drop(broker);
}

/// 32 random hex digits (from the kernel), for the receipts' token.
fn uuid_like() -> String {
    let mut bytes = [0u8; 16];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("random bytes");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
