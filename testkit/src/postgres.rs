//! A throwaway PostgreSQL cluster for one test binary: initdb + pg_ctl in a temp dir, on a free
//! port, as the `postgres` user when the tests run as root. A missing PostgreSQL fails loudly.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

pub struct Cluster {
    pub port: u16,
    pub dir: PathBuf,
    bin: PathBuf,
}

static CLUSTER: OnceLock<Cluster> = OnceLock::new();

/// The cluster shared by every test of this binary, started on first use.
pub fn cluster() -> &'static Cluster {
    CLUSTER.get_or_init(Cluster::start)
}

fn bin_dir() -> PathBuf {
    let debian = PathBuf::from("/usr/lib/postgresql/15/bin");
    if debian.join("initdb").exists() {
        return debian;
    }
    let which = Command::new("sh").args(["-c", "command -v initdb"]).output();
    match which {
        Ok(out) if out.status.success() => {
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).parent().unwrap().to_path_buf()
        }
        _ => panic!(
            "PostgreSQL is required for these tests and was not found: install it \
             (the README's test command does) so that `initdb` and `pg_ctl` exist"
        ),
    }
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0\n")).unwrap_or(false)
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

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Cluster {
    fn start() -> Cluster {
        let bin = bin_dir();
        let dir = tempfile::Builder::new().prefix("checkout-pg-").tempdir().unwrap().keep();
        if is_root() {
            let status = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).status().unwrap();
            assert!(status.success(), "chown of the cluster directory failed");
        }
        let data = dir.join("data");
        let out = pg_command(&bin, "initdb")
            .args(["-D"]).arg(&data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "--locale=C"])
            .output()
            .expect("initdb runs");
        assert!(out.status.success(), "initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        let port = free_port();
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c max_connections=300 \
             -c fsync=off -c full_page_writes=off",
            dir.display()
        );
        let out = pg_command(&bin, "pg_ctl")
            .args(["-D"]).arg(&data)
            .args(["-o", &options, "-l"]).arg(dir.join("server.log"))
            .args(["-w", "-t", "60", "start"])
            .output()
            .expect("pg_ctl runs");
        assert!(out.status.success(), "pg_ctl start failed: {}", String::from_utf8_lossy(&out.stderr));
        let cluster = Cluster { port, dir, bin };
        cluster.stop_when_tests_exit();
        cluster
    }

    /// Statics are never dropped, so a watcher stops the cluster once this process is gone.
    fn stop_when_tests_exit(&self) {
        let runas = if is_root() { "runuser -u postgres -- " } else { "" };
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; \
             {runas}{pg_ctl} -D {data} -m immediate stop >/dev/null 2>&1; rm -rf {dir}",
            pid = std::process::id(),
            pg_ctl = self.bin.join("pg_ctl").display(),
            data = self.dir.join("data").display(),
            dir = self.dir.display(),
        );
        // Deliberately not waited for: it outlives this process to clean up after it.
        let _watcher = Command::new("setsid")
            .args(["sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the cluster's watcher starts");
        #[allow(clippy::zombie_processes)]
        std::mem::forget(_watcher);
    }

    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// A new empty database for one test.
    pub async fn create_database(&self) -> String {
        let name = format!("t_{}", uuid::Uuid::new_v4().simple());
        let mut admin: sqlx::AnyConnection =
            sqlx::Connection::connect(&self.url("postgres")).await.expect("connect to the test cluster");
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut admin).await.unwrap();
        self.url(&name)
    }
}
