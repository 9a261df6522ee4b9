//! A throwaway PostgreSQL cluster for one test binary: initdb + pg_ctl in a temp dir, on a free
//! port, as the `postgres` user when the tests run as root. A missing PostgreSQL fails loudly.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

pub struct Cluster {
    pub port: u16,
    pub dir: PathBuf,
    bin: PathBuf,
    data: PathBuf,
}

static CLUSTER: OnceLock<Cluster> = OnceLock::new();
static DURABLE_CLUSTER: OnceLock<Cluster> = OnceLock::new();

/// The cluster shared by every test of this binary, started on first use. Tests kill servers,
/// never the machine, so it runs without fsync.
pub fn cluster() -> &'static Cluster {
    CLUSTER.get_or_init(|| Cluster::start(false))
}

/// A cluster with PostgreSQL's durable defaults (fsync on), for measurements that compare it
/// with SQLite's `synchronous=FULL`, and for crash campaigns.
pub fn durable_cluster() -> &'static Cluster {
    DURABLE_CLUSTER.get_or_init(|| Cluster::start(true))
}

fn bin_dir() -> PathBuf {
    let debian = PathBuf::from("/usr/lib/postgresql/15/bin");
    if debian.join("initdb").exists() {
        return debian;
    }
    let which = Command::new("sh")
        .args(["-c", "command -v initdb"])
        .output();
    match which {
        Ok(out) if out.status.success() => {
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
                .parent()
                .unwrap()
                .to_path_buf()
        }
        _ => panic!(
            "PostgreSQL is required for these tests and was not found: install it \
             (the README's test command does) so that `initdb` and `pg_ctl` exist"
        ),
    }
}

pub(crate) fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0\n"))
        .unwrap_or(false)
}

/// Runs a PostgreSQL program, as `postgres` when we are root (the server refuses root).
pub fn pg_command(bin: &Path, program: &str) -> Command {
    let path = bin.join(program);
    if is_root() {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(path);
        cmd
    } else {
        Command::new(path)
    }
}

/// Runs `script` (a shell line) once this test process is gone, to clean up what it started: a
/// detached watcher, deliberately never waited for (it outlives this process).
pub(crate) fn run_after_tests_exit(whose: &str, script: &str) {
    let script = format!(
        "while kill -0 {me} 2>/dev/null; do sleep 1; done; {script}",
        me = std::process::id()
    );
    let watcher = Command::new("setsid")
        .args(["sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{whose} watcher starts: {e}"));
    #[allow(clippy::zombie_processes)]
    std::mem::forget(watcher);
}

/// A free port below the kernel's ephemeral range, for a listener that must come back on the
/// same port after a kill: a port of the ephemeral range may meanwhile be taken as the local end
/// of some outgoing connection (a load that opens a connection per request churns through
/// them), and the listener could not bind it again.
pub fn stable_port() -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let span = u32::from(low.saturating_sub(10_000).max(1));
    loop {
        let port = 10_000 + (uuid::Uuid::new_v4().as_u128() % u128::from(span)) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() && first_hand_out(port) {
            return port;
        }
    }
}

/// Whether `port` was never handed out before in this process. A port is free when it is picked
/// but bound only later by the process it is for; until then a second pick (the next etcd member,
/// a test running beside) would find it free too, and one of the two listeners would die on
/// "address already in use" (an etcd member did: a cluster of two never elected a leader).
fn first_hand_out(port: u16) -> bool {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    HANDED_OUT.lock().unwrap().insert(port)
}

/// SIGKILL to the postmaster of the cluster in `data` and every process under it at once.
/// Stopped first, the postmaster forks no backend between the listing of its children and
/// their death (an orphan backend would go on committing on a dead primary).
pub(crate) fn kill_postmaster(data: &Path) {
    let pid_file = data.join("postmaster.pid");
    let pid = std::fs::read_to_string(&pid_file)
        .unwrap_or_else(|e| panic!("{}: {e}", pid_file.display()))
        .lines()
        .next()
        .unwrap()
        .trim()
        .to_owned();
    let status = Command::new("sh")
        .args([
            "-c",
            &format!("kill -STOP {pid} && kill -KILL $(pgrep -P {pid}) {pid}"),
        ])
        .status()
        .unwrap();
    assert!(
        status.success(),
        "the postmaster {pid} and its processes were killed"
    );
}

/// A new empty database (`t_…`) on the server whose URL for a database `url` makes: that URL.
pub(crate) async fn create_database(url: impl Fn(&str) -> String) -> String {
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    sqlx::any::install_default_drivers();
    let mut admin: sqlx::AnyConnection = sqlx::Connection::connect(&url("postgres"))
        .await
        .expect("connect to the test cluster");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .unwrap();
    url(&name)
}

/// A free port the kernel picks, never one handed out before in this process.
pub fn free_port() -> u16 {
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if first_hand_out(port) {
            return port;
        }
    }
}

/// A directory the cluster's user owns, removed by the cluster's watcher.
fn cluster_dir() -> PathBuf {
    let dir = tempfile::Builder::new()
        .prefix("checkout-pg-")
        .tempdir()
        .unwrap()
        .keep();
    if is_root() {
        let status = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(status.success(), "chown of the cluster directory failed");
    }
    dir
}

impl Cluster {
    fn start(durable: bool) -> Cluster {
        let bin = bin_dir();
        let dir = cluster_dir();
        let data = dir.join("data");
        let out = pg_command(&bin, "initdb")
            .args(["-D"])
            .arg(&data)
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--locale=C",
            ])
            .output()
            .expect("initdb runs");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        // In postgresql.conf, not on the command line, so that a restart keeps them.
        let speed = if durable {
            ""
        } else {
            "fsync = off\nfull_page_writes = off\n"
        };
        let settings = format!(
            "port = {port}\nunix_socket_directories = '{}'\nlisten_addresses = '127.0.0.1'\n\
             max_connections = 300\n{speed}",
            dir.display()
        );
        let conf = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).expect("initdb wrote postgresql.conf");
        text.push_str(&settings);
        std::fs::write(&conf, text).unwrap();
        let cluster = Cluster {
            port,
            dir,
            bin,
            data,
        };
        cluster.start_server();
        cluster.stop_when_tests_exit();
        cluster
    }

    /// Statics are never dropped, so a watcher stops the cluster once this process is gone.
    fn stop_when_tests_exit(&self) {
        let runas = if is_root() {
            "runuser -u postgres -- "
        } else {
            ""
        };
        run_after_tests_exit(
            "the cluster's",
            &format!(
                "{runas}{pg_ctl} -D {data} -m immediate stop >/dev/null 2>&1; rm -rf {dir}",
                pg_ctl = self.bin.join("pg_ctl").display(),
                data = self.dir.join("data").display(),
                dir = self.dir.display(),
            ),
        );
    }

    /// `pg_ctl stop -m immediate` then start again: a database crash, as the WAL sees it.
    pub fn crash_and_restart(&self) {
        let out = pg_command(&self.bin, "pg_ctl")
            .args(["-D"])
            .arg(&self.data)
            .args(["-m", "immediate", "stop"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl stop failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.start_server();
    }

    fn start_server(&self) {
        let out = pg_command(&self.bin, "pg_ctl")
            .args(["-D"])
            .arg(&self.data)
            .args(["-l"])
            .arg(self.dir.join("server.log"))
            .args(["-w", "-t", "60", "start"])
            .output()
            .expect("pg_ctl runs");
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// A new empty database for one test.
    pub async fn create_database(&self) -> String {
        create_database(|database| self.url(database)).await
    }
}
