//! `scripts/cluster`: the checkout beyond one machine, on this one (loopback). Three etcd
//! members, three PostgreSQL nodes under Patroni (synchronous mode), HAProxy in front of the
//! database and of two checkout instances, a three-node RabbitMQ cluster (quorum queues), two
//! `receipts` consumers, and the demo shop (its storefront, back office and webhook inbox)
//! paying through HAProxy; the same pieces the HA campaign kills (`reliability/tests/ha.rs`),
//! from the same test kit. Prints the addresses and where each configuration file is; Ctrl-C
//! stops everything.
//!
//! `checkout-cluster CHECKOUT_SERVER RECEIPTS DEMO_SHOP [STATIC_DIR]` (scripts/cluster passes
//! the release builds).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use checkout_testkit::add_shop_with;
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
    let [_, server, receipts, demo_shop, rest @ ..] = args.as_slice() else {
        eprintln!("usage: checkout-cluster CHECKOUT_SERVER RECEIPTS DEMO_SHOP [STATIC_DIR]");
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

    // The demo shop, a shop like any other (`shop add`, not the demo mode's, whose key each
    // instance would roll at its start): its storefront pays through HAProxy, and the
    // checkout's webhooks, from whichever instance, reach its inbox.
    let front = format!("http://127.0.0.1:{}", cluster.web_port);
    let shop_port = free_port();
    let shop_url = format!("http://127.0.0.1:{shop_port}");
    let shop = add_shop_with(
        server,
        &checkout_db,
        &front,
        "Кофейня «Зерно»",
        Some(&format!("{shop_url}/webhooks/checkout")),
        &[&shop_url],
    )
    .await;
    let credentials = logs.path().join("demo-shop-credentials.json");
    write_private(&credentials, &shop.credentials(false).to_string());
    let staff_password = uuid_like()[..12].to_owned();
    let env = [
        ("SHOP_ADDR", format!("127.0.0.1:{shop_port}")),
        (
            "SHOP_DATABASE_URL",
            format!("sqlite://{}", logs.path().join("demo-shop.db").display()),
        ),
        ("CHECKOUT_URL", format!("{front}/")),
        ("SHOP_CREDENTIALS_FILE", credentials.display().to_string()),
        (
            "SHOP_STAFF_PASSWORD_HASH",
            hash_password(demo_shop, &staff_password),
        ),
    ];
    children.push(start(
        demo_shop,
        &env,
        shop_port,
        &logs.path().join("demo-shop.log"),
    ));

    println!("up in {:.1} s", started.elapsed().as_secs_f64());
    println!("the demo shop (open this): {shop_url}/");
    println!("  its back office: {shop_url}/admin  (password {staff_password})");
    println!("the checkout (2 instances behind HAProxy): {front}/  (the API: {front}/api/docs)");
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

/// `demo-shop hash-password`: the back office's password as its Argon2id hash.
fn hash_password(demo_shop: &str, password: &str) -> String {
    use std::io::Write;
    let mut child = Command::new(demo_shop)
        .arg("hash-password")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{demo_shop}: {e}"));
    writeln!(child.stdin.take().unwrap(), "{password}").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "demo-shop hash-password failed");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// `text` in a file only its owner reads (the shop's secrets).
fn write_private(path: &std::path::Path, text: &str) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// 32 random hex digits (from the kernel), for the receipts' token and the staff's password.
fn uuid_like() -> String {
    let mut bytes = [0u8; 16];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("random bytes");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
