//! `checkout-bench`: the service against PostgreSQL's own limit, side by side in one run on one
//! machine, one throwaway cluster, the same concurrency levels. Writes BENCHMARKS.md and an SVG.

mod load;
mod report;
mod sqlite_loop;

use std::time::Instant;

use checkout_testkit::{Api, Backend, Server, TestDb, new_key, payment};
use clap::Parser;
use futures::future::join_all;
use load::{Requests, Run};
use reqwest::StatusCode;

#[derive(Parser)]
#[command(about = "Benchmarks the checkout against its databases' own limits, side by side")]
struct Args {
    /// Seconds per measured run.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Concurrency levels (clients).
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,128")]
    levels: Vec<usize>,
    /// Where the report goes.
    #[arg(long, default_value = "BENCHMARKS.md")]
    out: String,
    #[arg(long, default_value = "bench/throughput.svg")]
    svg: String,
    /// Connections per server to PostgreSQL (default: the server's own, 4 per core).
    #[arg(long)]
    pool: Option<String>,
    /// RUST_LOG of the servers under load.
    #[arg(long, default_value = "info,sqlx=warn")]
    server_log: String,
    /// A `checkout-server-bench` built from the code before the SQLite writer (scripts/bench
    /// builds it), measured beside the new one on SQLite.
    #[arg(long)]
    old_server: Option<String>,
    /// The commit that old server was built from, for the report.
    #[arg(long, default_value = "")]
    old_commit: String,
}

/// Accounts the "many accounts" workloads spread over.
const ACCOUNTS: usize = 64;

/// What was measured; the report computes its ratios from these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    PgbenchKeyed,
    PgbenchUnkeyed,
    PgbenchComposed,
    Keyed,
    Unkeyed,
    Replays,
    HotAccount,
    SqliteLoop,
    SqliteGroupCommit,
    SqliteCommitPerRequest,
    SqliteOldPath,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::PgbenchKeyed => {
                "PostgreSQL: pgbench, the server's keyed transaction (the limit)"
            }
            Workload::PgbenchUnkeyed => "PostgreSQL: pgbench, the un-keyed transaction",
            Workload::PgbenchComposed => "PostgreSQL: pgbench, keyed, claim and charge composed",
            Workload::Keyed => "PostgreSQL: service, keyed",
            Workload::Unkeyed => "PostgreSQL: service, un-keyed",
            Workload::Replays => "PostgreSQL: service, replays",
            Workload::HotAccount => "PostgreSQL: service, keyed, one hot account",
            Workload::SqliteLoop => {
                "SQLite: the same transaction in a loop, a commit each (the limit)"
            }
            Workload::SqliteGroupCommit => "SQLite: service, keyed, group commit",
            Workload::SqliteCommitPerRequest => "SQLite: service, keyed, a commit per request",
            Workload::SqliteOldPath => "SQLite: service, keyed, the old path (pooled sqlx writer)",
        }
    }
}

pub struct Series {
    pub workload: Workload,
    pub runs: Vec<(usize, Run)>,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let dir = tempfile::tempdir().unwrap();
    let server_bin = std::env::current_exe()
        .unwrap()
        .with_file_name("checkout-server-bench");
    let server_bin = server_bin.to_str().unwrap().to_owned();
    // Durable (fsync on), like SQLite's synchronous=FULL: the comparison is fair.
    let cluster = checkout_testkit::postgres::durable_cluster();
    eprintln!("PostgreSQL cluster on port {}", cluster.port);

    // pgbench gets as many connections as the server's pool at most: the same statements at the
    // same concurrency in the database (more backends than that only fight over the cores).
    let pool: usize = args
        .pool
        .as_deref()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| 4 * std::thread::available_parallelism().map_or(2, |n| n.get()));
    let mut env = vec![("RUST_LOG", args.server_log.as_str())];
    if let Some(pool) = &args.pool {
        env.push(("CHECKOUT_DB_POOL_SIZE", pool.as_str()));
    }
    let pg_db = TestDb::on(cluster).await;
    let pg = Server::start_with(&server_bin, &pg_db, &env).await;
    let pg_tokens = shoppers(&pg, &pg_db, ACCOUNTS).await;
    let limit_db = limit_database(cluster).await;
    // Keys executed once, to be replayed.
    let executed = execute_keys(&pg.api(), &pg_tokens, 2_000).await;

    let sqlite_server = |binary: String, env: Vec<(&'static str, String)>| async move {
        let db = TestDb::new(Backend::Sqlite).await;
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let server = Server::start_with(&binary, &db, &env).await;
        let tokens = shoppers(&server, &db, ACCOUNTS).await;
        (db, server, tokens)
    };
    let log = ("RUST_LOG", args.server_log.clone());
    let group = sqlite_server(server_bin.clone(), vec![log.clone()]).await;
    let single = sqlite_server(
        server_bin.clone(),
        vec![log.clone(), ("CHECKOUT_SQLITE_BATCH", "1".into())],
    )
    .await;
    let old = match &args.old_server {
        Some(binary) => Some(sqlite_server(binary.clone(), vec![log.clone()]).await),
        None => None,
    };

    let mut workloads = vec![
        Workload::PgbenchKeyed,
        Workload::PgbenchUnkeyed,
        Workload::PgbenchComposed,
        Workload::Keyed,
        Workload::Unkeyed,
        Workload::Replays,
        Workload::HotAccount,
        Workload::SqliteLoop,
        Workload::SqliteGroupCommit,
        Workload::SqliteCommitPerRequest,
    ];
    if old.is_some() {
        workloads.push(Workload::SqliteOldPath);
    }
    let mut series: Vec<Series> = workloads
        .into_iter()
        .map(|workload| Series {
            workload,
            runs: Vec::new(),
        })
        .collect();
    let fresh = |tokens| Requests::Fresh {
        path: "/api/payments",
        tokens,
        keyed: true,
    };
    for &clients in &args.levels {
        let (s, d) = (args.seconds, dir.path());
        for series in &mut series {
            let run = match series.workload {
                Workload::PgbenchKeyed => load::pgbench(
                    cluster.port,
                    &limit_db,
                    load::PAYMENT_TRANSACTION,
                    ACCOUNTS,
                    clients.min(pool),
                    s,
                    d,
                ),
                Workload::PgbenchUnkeyed => load::pgbench(
                    cluster.port,
                    &limit_db,
                    load::UNKEYED_TRANSACTION,
                    ACCOUNTS,
                    clients.min(pool),
                    s,
                    d,
                ),
                Workload::PgbenchComposed => load::pgbench(
                    cluster.port,
                    &limit_db,
                    load::COMPOSED_TRANSACTION,
                    ACCOUNTS,
                    clients.min(pool),
                    s,
                    d,
                ),
                Workload::Keyed => load::wrk(&pg.base, &fresh(&pg_tokens), clients, s, d),
                Workload::Unkeyed => load::wrk(
                    &pg.base,
                    &Requests::Fresh {
                        path: "/api/bench/unkeyed-payments",
                        tokens: &pg_tokens,
                        keyed: false,
                    },
                    clients,
                    s,
                    d,
                ),
                Workload::Replays => load::wrk(
                    &pg.base,
                    &Requests::Replays {
                        tokens_keys_orders: &executed,
                    },
                    clients,
                    s,
                    d,
                ),
                Workload::HotAccount => load::wrk(&pg.base, &fresh(&pg_tokens[..1]), clients, s, d),
                Workload::SqliteLoop => {
                    let d = d.to_owned();
                    tokio::task::spawn_blocking(move || sqlite_loop::run(&d, ACCOUNTS, s))
                        .await
                        .unwrap()
                }
                Workload::SqliteGroupCommit => {
                    load::wrk(&group.1.base, &fresh(&group.2), clients, s, d)
                }
                Workload::SqliteCommitPerRequest => {
                    load::wrk(&single.1.base, &fresh(&single.2), clients, s, d)
                }
                Workload::SqliteOldPath => {
                    let (_, server, tokens) = old.as_ref().expect("an old server");
                    load::wrk(&server.base, &fresh(tokens), clients, s, d)
                }
            };
            eprintln!(
                "{clients:>4} clients  {:<66} {:>8.0} req/s  p50 {:>7.2} ms  p99 {:>7.2} ms  errors {}",
                series.workload.name(),
                run.throughput(),
                run.p50_ms,
                run.p99_ms,
                run.errors
            );
            series.runs.push((clients, run));
        }
    }

    let storms = vec![
        ("PostgreSQL", storm(&pg, &pg_db, &pg_tokens[0]).await),
        ("SQLite", storm(&group.1, &group.0, &group.2[0]).await),
    ];
    let peak_rss = [
        ("PostgreSQL", peak_rss_kib(pg.pid())),
        ("SQLite (group commit)", peak_rss_kib(group.1.pid())),
    ];
    report::write(
        &report::Context {
            out: &args.out,
            svg: &args.svg,
            levels: &args.levels,
            seconds: args.seconds,
            old_commit: &args.old_commit,
        },
        &series,
        &storms,
        &peak_rss,
    );
    eprintln!("wrote {} and {}", args.out, args.svg);
}

/// Demo shoppers, each given enough money for any run (with its opening entry in the ledger).
async fn shoppers(server: &Server, db: &TestDb, n: usize) -> Vec<String> {
    let mut tokens = Vec::new();
    for _ in 0..n {
        tokens.push(server.api().shopper().await.token.unwrap());
    }
    db.execute("UPDATE accounts SET balance = balance + 100000000000")
        .await;
    db.execute("INSERT INTO ledger (account_id, amount, kind, created_at) SELECT account_id, 100000000000, 'opening', 0 FROM accounts").await;
    tokens
}

/// A database with the server's schema and rich accounts `bench-1..`, for pgbench alone.
async fn limit_database(cluster: &checkout_testkit::postgres::Cluster) -> String {
    let url = cluster.create_database().await;
    let mut conn: sqlx::AnyConnection = sqlx::Connection::connect(&url).await.unwrap();
    sqlx::raw_sql(include_str!("../../migrations/postgres/0001_checkout.sql"))
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::raw_sql(&format!(
        "INSERT INTO accounts (account_id, token_hash, currency, balance, created_at)
           SELECT 'bench-' || i, md5(i::text), 'RUB', 1000000000000, 0 FROM generate_series(1, {ACCOUNTS}) i"
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    url.rsplit('/').next().unwrap().to_owned()
}

async fn execute_keys(api: &Api, tokens: &[String], n: usize) -> Vec<(String, String, String)> {
    let triples: Vec<_> = (0..n)
        .map(|i| {
            (
                tokens[i % tokens.len()].clone(),
                new_key(),
                format!("replay-{i}"),
            )
        })
        .collect();
    for chunk in triples.chunks(32) {
        join_all(chunk.iter().map(|(token, key, order)| {
            let api = Api {
                token: Some(token.clone()),
                ..api.clone()
            };
            async move {
                let answer = api.pay(key, &payment(order, 1)).await;
                assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
            }
        }))
        .await;
    }
    triples
}

pub struct Storm {
    pub copies: usize,
    pub firsts: usize,
    pub replays: usize,
    pub in_use: usize,
    pub debits: i64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// 1 000 concurrent copies of one request: exactly one debit, and how long the copies took.
async fn storm(server: &Server, db: &TestDb, token: &str) -> Storm {
    let api = Api {
        token: Some(token.to_owned()),
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(1_000)
            .build()
            .unwrap(),
        ..server.api()
    };
    let key = new_key();
    let body = payment("storm", 1);
    let before = db.scalar("SELECT COUNT(*) FROM payments").await;
    let answers = join_all((0..1_000).map(|_| {
        let (api, key, body) = (api.clone(), key.clone(), body.clone());
        async move {
            let start = Instant::now();
            let answer = api.try_pay(&key, &body).await;
            (answer, start.elapsed())
        }
    }))
    .await;
    let mut histogram = hdrhistogram::Histogram::<u64>::new(3).unwrap();
    let (mut firsts, mut replays, mut in_use) = (0, 0, 0);
    for (answer, took) in &answers {
        histogram.record(took.as_micros() as u64).unwrap();
        match answer {
            Ok(a) if a.status == StatusCode::CREATED && a.replayed() => replays += 1,
            Ok(a) if a.status == StatusCode::CREATED => firsts += 1,
            Ok(a) if a.status == StatusCode::CONFLICT => in_use += 1,
            other => panic!("storm: unexpected answer {other:?}"),
        }
    }
    let debits = db.scalar("SELECT COUNT(*) FROM payments").await - before;
    assert_eq!(
        (firsts, debits),
        (1, 1),
        "the storm must execute exactly once"
    );
    let ms = |q: f64| histogram.value_at_quantile(q) as f64 / 1e3;
    Storm {
        copies: answers.len(),
        firsts,
        replays,
        in_use,
        debits,
        p50_ms: ms(0.5),
        p99_ms: ms(0.99),
        max_ms: histogram.max() as f64 / 1e3,
    }
}

fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
