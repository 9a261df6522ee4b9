//! A throwaway RabbitMQ node (Debian's `rabbitmq-server`) for one test: its own ports (AMQP,
//! Erlang distribution, epmd), data directory and cookie, started in the background and
//! stopped (with its epmd) when dropped or when the test process is gone. It can be killed and
//! started again on the same data: durable queues and persistent messages survive.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::postgres::{free_port, run_after_tests_exit, stable_port};

/// Erlang's flags for schedulers that sleep when there is no work (RabbitMQ's advice for
/// hosts shared with other busy processes).
pub const IDLE_SCHEDULERS_SLEEP: &str = "+sbwt none +sbwtdcpu none +sbwtdio none";

pub struct Broker {
    pub port: u16,
    dir: PathBuf,
    /// `HOME` of the node: its Erlang cookie (one for every node of a cluster).
    home: PathBuf,
    epmd_port: u16,
    dist_port: u16,
    node: String,
    /// The node's process as started (waited for once killed).
    process: Mutex<Option<Child>>,
}

fn bin_dir() -> PathBuf {
    let dir = std::env::var_os("CHECKOUT_RABBITMQ_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/rabbitmq/bin"));
    assert!(
        dir.join("rabbitmq-server").exists(),
        "RabbitMQ is required for these tests and was not found in {}: install it (the README's \
         test command does: Debian's rabbitmq-server)",
        dir.display()
    );
    dir
}

impl Broker {
    /// A new node, up and accepting AMQP connections (about 8 s).
    pub fn start() -> Broker {
        let dir = tempfile::Builder::new()
            .prefix("checkout-rabbitmq-")
            .tempdir()
            .unwrap()
            .keep();
        let broker = Broker::new(dir.clone(), dir, free_port());
        broker.launch();
        broker.stop_when_tests_exit();
        broker
    }

    /// A node in `dir`, its cookie in `home`, registered with the epmd on `epmd_port`.
    fn new(dir: PathBuf, home: PathBuf, epmd_port: u16) -> Broker {
        std::fs::write(dir.join("enabled_plugins"), "[].\n").unwrap();
        // Ports it comes back on after a kill: outside the ephemeral range.
        let port = stable_port();
        Broker {
            port,
            node: format!("checkout{port}@localhost"),
            dir,
            home,
            epmd_port,
            dist_port: stable_port(),
            process: Mutex::new(None),
        }
    }

    /// `rabbitmqctl -n <this node> args…`, which must succeed (else its output and the node's
    /// log say why).
    fn ctl(&self, args: &[&str]) {
        let out = Command::new(bin_dir().join("rabbitmqctl"))
            .args(["-n", &self.node])
            .args(args)
            .env("HOME", &self.home)
            .env("ERL_EPMD_PORT", self.epmd_port.to_string())
            .output()
            .expect("rabbitmqctl runs");
        assert!(
            out.status.success(),
            "rabbitmqctl {args:?}: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(self.dir.join("node.log")).unwrap_or_default()
        );
    }

    /// A connection with a durable (classic) queue `queue` bound by `routing_key` to the
    /// checkout's exchange `checkout.events` (declared here too, as the checkout declares it).
    /// Classic: a quorum queue on a node just restarted refuses consumers until its leader is
    /// elected again, and this is the test's own window on the exchange.
    pub async fn bound_queue(
        &self,
        queue: &str,
        routing_key: &str,
    ) -> (lapin::Connection, lapin::Channel) {
        use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
        use lapin::types::FieldTable;
        let connection =
            lapin::Connection::connect(&self.url(), lapin::ConnectionProperties::default())
                .await
                .expect("the test connects to the broker");
        let channel = connection.create_channel().await.unwrap();
        channel
            .exchange_declare(
                "checkout.events".into(),
                lapin::ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions::durable(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        channel
            .queue_bind(
                queue.into(),
                "checkout.events".into(),
                routing_key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        (connection, channel)
    }

    /// `amqp://` of the node's default virtual host.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    fn launch(&self) {
        let dir = &self.dir;
        let log = std::fs::File::create(dir.join("node.log")).unwrap();
        let process = Command::new("setsid")
            .arg(bin_dir().join("rabbitmq-server"))
            .current_dir(dir)
            .env("HOME", &self.home)
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("ERL_EPMD_PORT", self.epmd_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", dir.join("log"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
            .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq"))
            .env("RABBITMQ_PID_FILE", dir.join("pid"))
            // The Erlang schedulers spin while idle by default: on two cores shared with the
            // databases and the programs under test, that spinning is CPU taken from them.
            .env("RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS", IDLE_SCHEDULERS_SLEEP)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("rabbitmq-server starts");
        *self.process.lock().unwrap() = Some(process);
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "RabbitMQ accepts connections within 60 s: {}",
                std::fs::read_to_string(dir.join("node.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // Listening is not ready: `await_startup` returns once the broker has booted, its
        // queues recovered.
        self.ctl(&["await_startup", "--timeout", "60"]);
    }

    /// SIGKILL to the node (its data stays).
    pub fn kill(&self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("pid")) {
            let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = std::fs::remove_file(self.dir.join("pid"));
        }
        if let Some(mut process) = self.process.lock().unwrap().take() {
            let _ = process.kill();
            let _ = process.wait();
        }
    }

    /// Stops the node as an operator would (`rabbitmqctl stop`): it closes its connections
    /// and writes what it holds; its data stays.
    pub fn stop(&self) {
        self.ctl(&["stop"]);
        if let Some(mut process) = self.process.lock().unwrap().take() {
            let _ = process.wait();
        }
        let _ = std::fs::remove_file(self.dir.join("pid"));
    }

    /// Started again on its data, after [`Broker::kill`] or [`Broker::stop`].
    pub fn start_again(&self) {
        self.launch();
    }

    /// Killed, then started again on its data.
    pub fn restart(&self) {
        self.kill();
        self.launch();
    }

    /// A shell line that stops the node and its epmd.
    fn stop_script(&self) -> String {
        format!(
            "kill -KILL $(cat {dir}/pid 2>/dev/null) 2>/dev/null; epmd -port {epmd} -kill \
             >/dev/null 2>&1; rm -rf {dir}",
            dir = self.dir.display(),
            epmd = self.epmd_port
        )
    }

    fn stop_when_tests_exit(&self) {
        run_after_tests_exit("the broker's", &self.stop_script());
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = Command::new("sh")
            .args(["-c", &self.stop_script()])
            .status();
    }
}

/// Three nodes (or `n`) of one RabbitMQ cluster on loopback: one cookie, one epmd, the second
/// and later nodes joined to the first. Quorum queues (the consumers declare theirs so) keep a
/// replica on each node and survive the loss of any one.
pub struct BrokerCluster {
    pub nodes: Vec<Broker>,
}

impl BrokerCluster {
    pub fn start(n: usize) -> BrokerCluster {
        let home = tempfile::Builder::new()
            .prefix("checkout-rabbitmq-cluster-")
            .tempdir()
            .unwrap()
            .keep();
        let cookie = home.join(".erlang.cookie");
        std::fs::write(
            &cookie,
            format!("checkout{}", uuid::Uuid::new_v4().simple()),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&cookie, std::fs::Permissions::from_mode(0o400)).unwrap();
        let epmd_port = free_port();
        let nodes: Vec<Broker> = (0..n)
            .map(|i| {
                let dir = home.join(format!("node{i}"));
                std::fs::create_dir(&dir).unwrap();
                Broker::new(dir, home.clone(), epmd_port)
            })
            .collect();
        for node in &nodes {
            node.stop_when_tests_exit();
        }
        run_after_tests_exit(
            "the broker cluster's",
            &format!("rm -rf {}", home.display()),
        );
        // The nodes boot at once (each takes seconds, mostly waiting), then join the first.
        std::thread::scope(|scope| {
            for node in &nodes {
                scope.spawn(|| node.launch());
            }
        });
        for node in &nodes[1..] {
            node.ctl(&["stop_app"]);
            node.ctl(&["join_cluster", &nodes[0].node]);
            node.ctl(&["start_app"]);
            node.ctl(&["await_startup", "--timeout", "60"]);
        }
        BrokerCluster { nodes }
    }

    /// Every node's `amqp://`, comma-separated: what the checkout and the consumers are given.
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(Broker::url)
            .collect::<Vec<_>>()
            .join(",")
    }
}
