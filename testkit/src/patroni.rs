//! A highly available PostgreSQL as an operator deploys one, on loopback, from Debian's packages:
//! three etcd members (the consensus store), three PostgreSQL nodes each under Patroni
//! (`synchronous_mode`: a commit is acknowledged only once a standby has it; or, to show what
//! that buys, asynchronous replication), and HAProxy in front, routing connections to whichever
//! node Patroni's REST API says is the primary (`GET /primary` answers `200` there only).
//! Clients know one address: HAProxy's. The nodes can be made to stream to each other over a
//! [`SlowLink`] (another zone's distance): each advertises the link as its `connect_address`,
//! so replication, base backups and `pg_rewind` cross it while HAProxy reaches each directly.
//!
//! Faults a test can cause: SIGKILL the leader's PostgreSQL (Patroni gives up on restarting it,
//! `master_start_timeout: 0`, and the synchronous standby is promoted), SIGKILL an etcd member
//! (two of three keep the quorum), SIGKILL HAProxy and start it again on the same port. Every
//! process goes when the cluster is dropped, or when the test process is gone.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::postgres::{is_root, run_after_tests_exit, stable_port};
use crate::slow_link::SlowLink;

/// The programs: where Debian keeps them, unless the installer's settings say otherwise.
fn program(setting: &str, debian: &str) -> String {
    std::env::var(setting).unwrap_or_else(|_| debian.to_owned())
}

fn patroni() -> String {
    program("CHECKOUT_PATRONI", "/usr/bin/patroni")
}

fn etcd() -> String {
    program("CHECKOUT_ETCD", "/usr/bin/etcd")
}

fn haproxy() -> String {
    program("CHECKOUT_HAPROXY", "/usr/sbin/haproxy")
}

fn pg_bin() -> String {
    program("CHECKOUT_PG_BIN", "/usr/lib/postgresql/15/bin")
}

/// Attempts at a password or a code per client address and minute, at HAProxy, over every
/// checkout instance behind it (the checkout's own default per instance).
pub const EDGE_GUESSES_PER_MINUTE: u32 = 30;

/// How long the whole cluster may take to come up, or to settle after a fault.
const SETTLE_WITHIN: Duration = Duration::from_secs(90);

/// What kind of cluster [`HaCluster::start_with`] makes.
#[derive(Clone, Debug)]
pub struct HaSettings {
    /// Checkout instances HAProxy balances (the test starts them on `web_ports`).
    pub web_instances: usize,
    /// Patroni's `synchronous_mode`: a commit waits for a standby, and only a synchronous
    /// standby is promoted. Off: replicas follow as fast as they can.
    pub synchronous: bool,
    /// One way, between the nodes (replication's network); zero: none of ours in between.
    pub link_delay: Duration,
}

impl Default for HaSettings {
    fn default() -> HaSettings {
        HaSettings {
            web_instances: 0,
            synchronous: true,
            link_delay: Duration::ZERO,
        }
    }
}

pub struct HaCluster {
    settings: HaSettings,
    dir: PathBuf,
    etcd: Vec<EtcdMember>,
    pub nodes: Vec<PgNode>,
    /// Where clients connect: HAProxy, to the primary.
    pub port: u16,
    /// Where the checkout's clients connect: HAProxy, to any live instance of `web_ports`.
    pub web_port: u16,
    /// The ports the checkout's instances listen on (started by the test, behind HAProxy).
    pub web_ports: Vec<u16>,
    haproxy: Mutex<Option<Child>>,
    http: reqwest::Client,
}

struct EtcdMember {
    name: String,
    client_port: u16,
    peer_port: u16,
    process: Mutex<Option<Child>>,
}

pub struct PgNode {
    pub name: String,
    /// PostgreSQL's own port (clients use HAProxy's).
    pub pg_port: u16,
    /// Patroni's REST API.
    pub rest_port: u16,
    /// The other nodes' way to it (its `connect_address`): the slow link, if there is one.
    link: Option<SlowLink>,
    data: PathBuf,
    config: PathBuf,
    process: Mutex<Option<Child>>,
}

/// A member as Patroni's `GET /cluster` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    /// `leader`, `sync_standby`, `replica`.
    pub role: String,
    /// `running`, `streaming`, `starting`, `stopped`…
    pub state: String,
}

/// `program args…` as `postgres` when we are root (PostgreSQL refuses root), the same process
/// (no `runuser` in between), so that its pid is the program's.
fn as_postgres(program: &str) -> Command {
    if is_root() {
        let mut command = Command::new("setpriv");
        command.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            "--reset-env",
        ]);
        command.arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn log_file(dir: &Path, name: &str) -> Stdio {
    Stdio::from(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{name}.log")))
            .expect("a log file"),
    )
}

fn sigkill(process: &Mutex<Option<Child>>) {
    if let Some(mut child) = process.lock().unwrap().take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl HaCluster {
    /// The whole cluster, up: a leader, a synchronous standby and a replica, all streaming,
    /// and HAProxy sending connections to the leader (about 10 s).
    pub async fn start() -> HaCluster {
        HaCluster::start_with(HaSettings::default()).await
    }

    /// The same, HAProxy also in front of `instances` checkout instances, which the test
    /// starts on [`web_ports`](Self::web_ports).
    pub async fn start_with_web(instances: usize) -> HaCluster {
        HaCluster::start_with(HaSettings {
            web_instances: instances,
            ..HaSettings::default()
        })
        .await
    }

    /// A cluster as `settings` say.
    pub async fn start_with(settings: HaSettings) -> HaCluster {
        for program in [patroni(), etcd(), haproxy()] {
            assert!(
                Path::new(&program).exists(),
                "{program} is required for these tests: install Debian's patroni, etcd-server \
                 and haproxy (the README's test command does)"
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("checkout-ha-")
            .tempdir()
            .unwrap()
            .keep();
        // Everything in it is the cluster's: killed, then removed, once the tests are gone.
        // The watcher's own command line must not match: it names the directory in two
        // halves (`c` + `heckout-ha-…`), and `[c]heckout-ha-…` matches only whole names.
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let parent = dir.parent().unwrap().display().to_string();
        run_after_tests_exit(
            "the HA cluster's",
            &format!(
                "n='{rest}'; pkill -KILL -f \"[{first}]$n\"; sleep 1; rm -rf \"{parent}/{first}$n\"",
                first = &name[..1],
                rest = &name[1..],
            ),
        );
        let etcd: Vec<EtcdMember> = (0..3)
            .map(|i| EtcdMember {
                name: format!("etcd{i}"),
                client_port: stable_port(),
                peer_port: stable_port(),
                process: Mutex::new(None),
            })
            .collect();
        let mut nodes = Vec::new();
        for i in 0..3 {
            let pg_port = stable_port();
            let link = if settings.link_delay.is_zero() {
                None
            } else {
                Some(SlowLink::start(pg_port, settings.link_delay).await)
            };
            nodes.push(PgNode {
                name: format!("pg{i}"),
                pg_port,
                rest_port: stable_port(),
                link,
                data: dir.join(format!("pg{i}")),
                config: dir.join(format!("pg{i}.yml")),
                process: Mutex::new(None),
            });
        }
        let cluster = HaCluster {
            port: stable_port(),
            web_port: stable_port(),
            web_ports: (0..settings.web_instances).map(|_| stable_port()).collect(),
            settings,
            dir,
            etcd,
            nodes,
            haproxy: Mutex::new(None),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(2))
                .build()
                .unwrap(),
        };
        for i in 0..cluster.etcd.len() {
            cluster.start_etcd(i);
        }
        for node in &cluster.nodes {
            cluster.write_patroni_config(node);
        }
        if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&cluster.dir)
                .status()
                .unwrap();
            assert!(status.success(), "chown of the cluster's directory");
        }
        // The first node bootstraps alone (it becomes the leader); the others then copy it.
        cluster.start_patroni(0);
        cluster
            .settle("the first node leads", |members| {
                members
                    .iter()
                    .any(|m| m.role == "leader" && m.state == "running")
            })
            .await;
        for i in 1..cluster.nodes.len() {
            cluster.start_patroni(i);
        }
        cluster.write_haproxy_config();
        cluster.start_haproxy();
        cluster.until_whole().await;
        cluster
    }

    /// A leader and two replicas streaming (one a synchronous standby, in synchronous mode);
    /// HAProxy reaches the leader.
    pub async fn until_whole(&self) {
        // (Patroni 3.0 calls a replica that streams `running`; later ones `streaming`.)
        let up = |m: &Member| m.state == "running" || m.state == "streaming";
        let synchronous = self.settings.synchronous;
        self.settle("a leader and two replicas streaming", |members| {
            members.len() == 3
                && members.iter().all(up)
                && members.iter().any(|m| m.role == "leader")
                && (!synchronous || members.iter().any(|m| m.role == "sync_standby"))
        })
        .await;
        self.until_writable().await;
    }

    /// Waits until `done` holds of the members as any node's Patroni lists them.
    async fn settle(&self, what: &str, done: impl Fn(&[Member]) -> bool) {
        let deadline = Instant::now() + SETTLE_WITHIN;
        loop {
            let members = self.members().await;
            if done(&members) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the HA cluster never settled ({what}): {members:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The members as the first Patroni that answers lists them (none: empty).
    pub async fn members(&self) -> Vec<Member> {
        for node in &self.nodes {
            let url = format!("http://127.0.0.1:{}/cluster", node.rest_port);
            let Ok(answer) = self.http.get(&url).send().await else {
                continue;
            };
            let Ok(body) = answer.json::<Value>().await else {
                continue;
            };
            let text = |m: &Value, field: &str| m[field].as_str().unwrap_or_default().to_owned();
            return body["members"]
                .as_array()
                .map(|members| {
                    members
                        .iter()
                        .map(|m| Member {
                            name: text(m, "name"),
                            role: text(m, "role"),
                            state: text(m, "state"),
                        })
                        .collect()
                })
                .unwrap_or_default();
        }
        Vec::new()
    }

    /// The node that leads now.
    pub async fn leader(&self) -> Option<usize> {
        let members = self.members().await;
        let leader = members.iter().find(|m| m.role == "leader")?;
        self.nodes.iter().position(|n| n.name == leader.name)
    }

    /// Until a write through HAProxy commits (a connection reaches a primary).
    pub async fn until_writable(&self) {
        let deadline = Instant::now() + SETTLE_WITHIN;
        while !self.writable().await {
            assert!(
                Instant::now() < deadline,
                "no write through HAProxy within {SETTLE_WITHIN:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn writable(&self) -> bool {
        sqlx::any::install_default_drivers();
        let connected: Result<sqlx::AnyConnection, _> =
            sqlx::Connection::connect(&self.url("postgres")).await;
        match connected {
            Ok(mut connection) => {
                sqlx::query("SELECT pg_is_in_recovery()")
                    .fetch_one(&mut connection)
                    .await
                    .ok()
                    .and_then(|row| sqlx::Row::try_get::<bool, _>(&row, 0).ok())
                    == Some(false)
            }
            Err(_) => false,
        }
    }

    /// Where its configuration files (Patroni's `pgN.yml`, `haproxy.cfg`), data and logs are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// A new empty database, on the leader (and so on every node).
    pub async fn create_database(&self) -> String {
        crate::postgres::create_database(|database| self.url(database)).await
    }

    /// SIGKILL to node `i`'s postmaster and every process under it at once (Patroni lives on);
    /// its link, if it has one, is cut with whatever WAL was still on its way.
    pub fn kill_postgres(&self, i: usize) {
        crate::postgres::kill_postmaster(&self.nodes[i].data);
        if let Some(link) = &self.nodes[i].link {
            link.cut();
        }
    }

    /// SIGKILL to etcd member `i`.
    pub fn kill_etcd(&self, i: usize) {
        sigkill(&self.etcd[i].process);
    }

    /// Etcd member `i` again, on its data (it rejoins its peers).
    pub fn restart_etcd(&self, i: usize) {
        self.start_etcd(i);
    }

    /// SIGKILL to HAProxy: every connection through it is cut.
    pub fn kill_haproxy(&self) {
        sigkill(&self.haproxy);
    }

    /// HAProxy (again) on its ports.
    pub fn start_haproxy(&self) {
        let child = Command::new(haproxy())
            .arg("-db")
            .arg("-f")
            .arg(self.dir.join("haproxy.cfg"))
            .stdin(Stdio::null())
            .stdout(log_file(&self.dir, "haproxy"))
            .stderr(log_file(&self.dir, "haproxy"))
            .spawn()
            .expect("haproxy starts");
        *self.haproxy.lock().unwrap() = Some(child);
    }

    /// The last lines of every log: what a failed wait prints.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        let mut names: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
        names.extend(self.etcd.iter().map(|e| e.name.clone()));
        names.push("haproxy".into());
        for name in names {
            let text =
                std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(15)..].join("\n");
            out += &format!("--- {name}.log\n{tail}\n");
        }
        out
    }

    fn start_etcd(&self, i: usize) {
        let member = &self.etcd[i];
        let peers: Vec<String> = self
            .etcd
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect();
        let client = format!("http://127.0.0.1:{}", member.client_port);
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let child = Command::new(etcd())
            .args(["--name", &member.name, "--data-dir"])
            .arg(self.dir.join(&member.name))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &peers.join(",")])
            .args(["--initial-cluster-state", "new", "--initial-cluster-token"])
            .arg(self.dir.file_name().unwrap())
            // Loopback: quick heartbeats, a quick election.
            .args(["--heartbeat-interval", "100", "--election-timeout", "1000"])
            .args(["--logger", "zap", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(log_file(&self.dir, &member.name))
            .stderr(log_file(&self.dir, &member.name))
            .spawn()
            .expect("etcd starts");
        *member.process.lock().unwrap() = Some(child);
    }

    fn write_patroni_config(&self, node: &PgNode) {
        let hosts: Vec<String> = self
            .etcd
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect();
        let config = format!(
            r#"scope: checkout
name: {name}
log:
  level: WARNING
restapi:
  listen: 127.0.0.1:{rest}
  connect_address: 127.0.0.1:{rest}
etcd3:
  hosts: {hosts}
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 4
    maximum_lag_on_failover: 1048576
    # A commit is acknowledged once a standby has it (unless this cluster shows what
    # asynchronous replication loses); the leader's PostgreSQL that crashes is not restarted as
    # the leader (a standby with every acknowledged commit is promoted).
    synchronous_mode: {synchronous}
    master_start_timeout: 0
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_level: replica
        hot_standby: "on"
        wal_log_hints: "on"
        max_connections: 300
        max_wal_senders: 10
        max_replication_slots: 10
        fsync: "off"
        full_page_writes: "on"
  initdb:
    - encoding: UTF8
    - locale: C
postgresql:
  listen: 127.0.0.1:{pg}
  connect_address: 127.0.0.1:{connect}
  data_dir: {data}
  bin_dir: {bin}
  pgpass: {dir}/{name}.pgpass
  authentication:
    superuser:
      username: postgres
      password: postgres
    replication:
      username: postgres
      password: postgres
    rewind:
      username: postgres
      password: postgres
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
  parameters:
    unix_socket_directories: '{dir}'
"#,
            name = node.name,
            rest = node.rest_port,
            hosts = hosts.join(","),
            synchronous = self.settings.synchronous,
            pg = node.pg_port,
            connect = node.link.as_ref().map_or(node.pg_port, |link| link.port),
            data = node.data.display(),
            bin = pg_bin(),
            dir = self.dir.display(),
        );
        std::fs::write(&node.config, config).unwrap();
    }

    fn start_patroni(&self, i: usize) {
        let node = &self.nodes[i];
        let child = as_postgres(&patroni())
            .arg(&node.config)
            .stdin(Stdio::null())
            .stdout(log_file(&self.dir, &node.name))
            .stderr(log_file(&self.dir, &node.name))
            .spawn()
            .expect("patroni starts");
        *node.process.lock().unwrap() = Some(child);
    }

    fn write_haproxy_config(&self) {
        let servers: String = self
            .nodes
            .iter()
            .map(|n| {
                format!(
                    "    server {} 127.0.0.1:{} check port {}\n",
                    n.name, n.pg_port, n.rest_port
                )
            })
            .collect();
        // Patroni answers `GET /primary` with 200 on the leader only. A node marked down has its
        // connections cut at once (a client must not keep writing to a demoted node).
        let config = format!(
            "global\n    maxconn 1000\n\
             defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30m\n    \
             timeout server 30m\n    timeout check 1s\n\
             listen primary\n    bind 127.0.0.1:{port}\n    option httpchk\n    \
             http-check send meth GET uri /primary\n    http-check expect status 200\n    \
             default-server inter 300ms fall 2 rise 1 on-marked-down shutdown-sessions\n{servers}",
            port = self.port
        );
        // The checkout's instances: round robin over those that accept connections; a request
        // whose connection is refused (an instance just died) goes to another before any byte
        // of it is sent, so retrying it is safe. (A TCP check: `/healthz` asks the database,
        // and a database failover must not take every instance out: each answers `503` with
        // `Retry-After` by itself.)
        let web: String = self
            .web_ports
            .iter()
            .enumerate()
            .map(|(i, port)| format!("    server checkout{i} 127.0.0.1:{port} check\n"))
            .collect();
        // An instance that dies mid-request leaves HAProxy without an answer: it says so as the
        // checkout would (a `503` problem, `Retry-After`, resend with the same key), never as
        // a bare `502`.
        let unanswered = self.dir.join("unanswered.http");
        let detail = "the checkout did not answer; retry with the same key: the answer will \
                      say what happened, and nothing is charged twice";
        let body = format!(
            "{{\"type\":\"urn:problem:checkout:service_unavailable\",\"title\":\"The service is \
             temporarily unavailable\",\"status\":503,\"detail\":\"{detail}\",\
             \"code\":\"service_unavailable\"}}"
        );
        std::fs::write(
            &unanswered,
            format!(
                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/problem+json\r\n\
                 Retry-After: 1\r\nCache-Control: no-store\r\nConnection: close\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                body.len()
            ),
        )
        .unwrap();
        // The abuse limits at the edge, for every instance at once: each instance counts only
        // what reaches it, so alone they would let a client try the limit times the instances.
        // Attempts at a password or a code, per client address, as the checkout answers them.
        let limited = format!(
            "    stick-table type ip size 100k expire 2m store http_req_rate(60s)\n    \
             acl guess method POST\n    \
             acl guess_path path /api/shoppers /api/shoppers/confirm /api/shoppers/recovery \
             /api/shoppers/recovery/confirm /api/shoppers/sign-in /api/shoppers/passkeys/sign-in\n    \
             http-request track-sc0 src if guess guess_path\n    \
             http-request return status 429 content-type application/problem+json \
             hdr Retry-After 60 hdr Cache-Control no-store string '{{\"type\":\
             \"urn:problem:checkout:too_many_requests\",\"title\":\"Too many attempts\",\
             \"status\":429,\"detail\":\"too many attempts from this address; try again in 60 s\",\
             \"code\":\"too_many_requests\"}}' if guess guess_path {{ sc_http_req_rate(0) gt {EDGE_GUESSES_PER_MINUTE} }}\n"
        );
        let config = if web.is_empty() {
            config
        } else {
            format!(
                "{config}listen checkout\n    bind 127.0.0.1:{port}\n    mode http\n    \
                 balance roundrobin\n    retries 3\n    option redispatch 1\n    \
                 timeout client 60s\n    timeout server 60s\n    \
                 errorfile 502 {file}\n    errorfile 503 {file}\n    errorfile 504 {file}\n\
                 {limited}    default-server inter 300ms fall 1 rise 1\n{web}",
                port = self.web_port,
                file = unanswered.display(),
            )
        };
        std::fs::write(self.dir.join("haproxy.cfg"), config).unwrap();
    }
}

impl Drop for HaCluster {
    fn drop(&mut self) {
        sigkill(&self.haproxy);
        for node in &self.nodes {
            sigkill(&node.process);
        }
        // The PostgreSQL servers Patroni started outlive it: every process named by the
        // cluster's directory goes.
        let _ = Command::new("pkill")
            .args(["-KILL", "-f"])
            .arg(&self.dir)
            .status();
        for member in &self.etcd {
            sigkill(&member.process);
        }
    }
}
