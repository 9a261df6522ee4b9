//! PgBouncer (Debian's) in transaction pooling mode in front of the test cluster, started once
//! per test binary on a free port, as the `postgres` user when the tests run as root (it refuses
//! root). Each client transaction gets whichever server connection is free: nothing of a
//! session (a `SET`, a named prepared statement, an advisory lock) outlives its transaction.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::postgres::{Cluster, cluster, free_port, is_root, run_after_tests_exit};

pub struct Bouncer {
    pub port: u16,
}

static BOUNCER: OnceLock<Bouncer> = OnceLock::new();

/// The program: Debian's, or `CHECKOUT_PGBOUNCER`.
fn program() -> PathBuf {
    let path = std::env::var_os("CHECKOUT_PGBOUNCER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/pgbouncer"));
    assert!(
        path.exists(),
        "PgBouncer is required for these tests and was not found at {}: install it (the README's \
         test command does: Debian's pgbouncer)",
        path.display()
    );
    path
}

/// The bouncer shared by every test of this binary, in front of [`cluster`].
pub fn bouncer() -> &'static Bouncer {
    BOUNCER.get_or_init(|| Bouncer::start(cluster()))
}

impl Bouncer {
    fn start(cluster: &Cluster) -> Bouncer {
        let program = program();
        let port = free_port();
        let dir = cluster.dir.join(format!("pgbouncer-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("userlist.txt"), "\"postgres\" \"\"\n").unwrap();
        // extra_float_digits: sqlx sends it at every connection; PgBouncer passes on only the
        // parameters it tracks, and refuses a connection asking for another unless told to
        // ignore it.
        let ini = format!(
            "[databases]\n* = host=127.0.0.1 port={pg}\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\n\
             listen_port = {port}\nunix_socket_dir =\nauth_type = trust\n\
             auth_file = {dir}/userlist.txt\npool_mode = transaction\nmax_client_conn = 2000\n\
             default_pool_size = 40\nignore_startup_parameters = extra_float_digits\n\
             logfile = {dir}/pgbouncer.log\npidfile = {dir}/pgbouncer.pid\n",
            pg = cluster.port,
            dir = dir.display()
        );
        let config = dir.join("pgbouncer.ini");
        std::fs::write(&config, ini).unwrap();
        let mut command = if is_root() {
            let _ = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status();
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&program);
            command
        } else {
            Command::new(&program)
        };
        // -d: it daemonizes, writes its pid file, and outlives this process only until the
        // watcher below stops it.
        let out = command
            .arg("-d")
            .arg(&config)
            .stdin(Stdio::null())
            .output()
            .expect("pgbouncer runs");
        assert!(
            out.status.success(),
            "pgbouncer failed to start: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "pgbouncer listens within 10 s: {}",
                std::fs::read_to_string(dir.join("pgbouncer.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        run_after_tests_exit(
            "the bouncer's",
            &format!("kill $(cat {}/pgbouncer.pid)", dir.display()),
        );
        Bouncer { port }
    }

    /// `url` (a database of the cluster behind it), reached through the bouncer.
    pub fn url_of(&self, url: &str) -> String {
        let database = url.rsplit('/').next().unwrap();
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }
}
