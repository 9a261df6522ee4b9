//! The test's database: a fresh SQLite file or a database in a throwaway PostgreSQL cluster
//! (directly or through PgBouncer), the invariants checked in it, and the macros that run one
//! scenario on each.

use checkout_backend::store::invariants::verify_database;
use checkout_backend::store::invariants::{Scope, Verified};

use crate::*;

/// One test per scenario and database: `on_both_databases!(a, b)` makes `sqlite::a`,
/// `postgres::a`, … each calling the scenario `async fn a(backend: Backend)` of the caller.
#[macro_export]
macro_rules! on_both_databases {
    ($($scenario:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    super::$scenario($crate::Backend::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    super::$scenario($crate::Backend::Postgres).await
                }
            )*
        }
    };
}

/// As [`on_both_databases!`], and a third time with the servers reaching PostgreSQL through
/// PgBouncer in transaction pooling mode (`pgbouncer::a`, …).
#[macro_export]
macro_rules! on_every_database {
    ($($scenario:ident),* $(,)?) => {
        $crate::on_both_databases!($($scenario),*);
        mod pgbouncer {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    super::$scenario($crate::Backend::PgBouncer).await
                }
            )*
        }
    };
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
    /// PostgreSQL, the servers reaching it through PgBouncer (transaction pooling); the test's
    /// own checks read the database directly.
    PgBouncer,
}

/// One test's database, kept until the test ends.
pub struct TestDb {
    /// The database itself, for the test's own reads and the operator's commands.
    pub url: String,
    /// What a server is given as `DATABASE_URL` (the same, or through PgBouncer).
    pub server_url: String,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    pub async fn new(backend: Backend) -> TestDb {
        sqlx::any::install_default_drivers();
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let url = format!("sqlite://{}", dir.path().join("checkout.db").display());
                TestDb {
                    server_url: url.clone(),
                    url,
                    _dir: Some(dir),
                }
            }
            Backend::Postgres => TestDb::on(postgres::cluster()).await,
            Backend::PgBouncer => {
                let db = TestDb::on(postgres::cluster()).await;
                // Behind a transaction pooler the server does not migrate: the operator's
                // `checkout-server migrate` does, on PostgreSQL itself.
                checkout_backend::store::Store::migrate(&db.url)
                    .await
                    .expect("the migrations run on PostgreSQL itself");
                TestDb {
                    server_url: pgbouncer::bouncer().url_of(&db.url),
                    ..db
                }
            }
        }
    }

    /// A database some other part of the test made (behind HAProxy, say).
    pub fn at(url: String) -> TestDb {
        sqlx::any::install_default_drivers();
        TestDb {
            server_url: url.clone(),
            url,
            _dir: None,
        }
    }

    /// The same database, its servers reaching it at `server_url` (a pooler in transaction
    /// mode in front of it).
    pub fn served_through(self, server_url: String) -> TestDb {
        TestDb { server_url, ..self }
    }

    /// A fresh database on this PostgreSQL cluster.
    pub async fn on(cluster: &postgres::Cluster) -> TestDb {
        sqlx::any::install_default_drivers();
        let url = cluster.create_database().await;
        TestDb {
            server_url: url.clone(),
            url,
            _dir: None,
        }
    }

    pub async fn connect(&self) -> sqlx::AnyConnection {
        sqlx::Connection::connect(&self.url)
            .await
            .expect("the test connects to its database")
    }

    pub async fn scalar(&self, sql: &str) -> i64 {
        let mut conn = self.connect().await;
        sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap()
    }

    /// A text the database answers (one row, one column).
    pub async fn scalar_text(&self, sql: &str) -> String {
        let mut conn = self.connect().await;
        sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap()
    }

    /// Everything the payments of `session_id` wrote, counted (payments, their ledger rows,
    /// their waiting credits, their events), and the session's `status/payment_id`.
    pub async fn payment_footprint(&self, session_id: &str) -> (i64, i64, i64, i64, String) {
        let of_payments = |table: &str, column: &str| {
            format!(
                "SELECT COUNT(*) FROM {table} WHERE {column} IN \
                   (SELECT payment_id FROM payments WHERE checkout_session_id = '{session_id}')"
            )
        };
        (
            self.scalar(&format!(
                "SELECT COUNT(*) FROM payments WHERE checkout_session_id = '{session_id}'"
            ))
            .await,
            self.scalar(&of_payments("ledger", "payment_id")).await,
            self.scalar(&of_payments("unfolded_credits", "payment_id"))
                .await,
            self.scalar(&of_payments("webhook_events", "subject_id"))
                .await,
            self.scalar_text(&format!(
                "SELECT status || '/' || COALESCE(payment_id, '-') FROM checkout_sessions \
                  WHERE session_id = '{session_id}'"
            ))
            .await,
        )
    }

    /// A column of texts the database answers.
    pub async fn texts(&self, sql: &str) -> Vec<String> {
        let mut conn = self.connect().await;
        sqlx::query_scalar(sql).fetch_all(&mut conn).await.unwrap()
    }

    pub async fn execute(&self, sql: &str) {
        let mut conn = self.connect().await;
        sqlx::query(sql).execute(&mut conn).await.unwrap();
    }

    /// Every invariant of the books (the server's own list, as `checkout-server verify` runs
    /// it), in one snapshot; panics naming each one broken and the ids breaking it.
    pub async fn assert_invariants(&self) {
        self.assert_invariants_in(Scope::KeysNeverReused).await;
    }

    /// As [`assert_invariants`], for a test that lets a key expire and be used again (so one
    /// key string may have moved money twice, each time under its own claim).
    pub async fn assert_invariants_after_key_reuse(&self) {
        self.assert_invariants_in(Scope::Service).await;
    }

    async fn assert_invariants_in(&self, scope: Scope) {
        let verified = self.verify(scope).await;
        let broken: Vec<String> = verified
            .checked
            .iter()
            .filter(|c| !c.violations.is_empty())
            .map(|c| {
                format!(
                    "{} ({}): {:?}",
                    c.invariant.name, c.invariant.says, c.violations
                )
            })
            .collect();
        assert!(broken.is_empty(), "invariants broken: {broken:#?}");
    }

    /// The invariants checked in one snapshot, by the code `checkout-server verify` runs.
    pub async fn verify(&self, scope: Scope) -> Verified {
        verify_database(&self.url, scope)
            .await
            .expect("the invariants can be read")
    }

    /// The names of the invariants that the tables break right now.
    pub async fn broken_invariants(&self) -> Vec<&'static str> {
        self.verify(Scope::KeysNeverReused).await.broken()
    }
}
