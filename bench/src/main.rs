//! `checkout-bench`: the service against PostgreSQL's own limit, side by side in one run on one
//! machine, one throwaway cluster, the same concurrency levels. Writes BENCHMARKS.md and an SVG.

mod load;
mod report;

use std::time::Instant;

use checkout_testkit::{Api, Backend, Server, TestDb, new_key, payment};
use clap::Parser;
use futures::future::join_all;
use load::{Requests, Run};
use reqwest::StatusCode;

#[derive(Parser)]
#[command(about = "Benchmarks the checkout against pgbench running the same transaction")]
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
}

/// Accounts the "many accounts" workloads spread over.
const ACCOUNTS: usize = 64;

pub struct Series {
    pub name: &'static str,
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

    let pg_db = TestDb::on(cluster).await;
    let mut env = vec![("RUST_LOG", args.server_log.as_str())];
    if let Some(pool) = &args.pool {
        env.push(("CHECKOUT_DB_POOL_SIZE", pool.as_str()));
    }
    let pg = Server::start_with(&server_bin, &pg_db, &env).await;
    let sqlite_db = TestDb::new(Backend::Sqlite).await;
    let sqlite = Server::start_with(&server_bin, &sqlite_db, &env).await;
    let pg_tokens = shoppers(&pg, &pg_db, ACCOUNTS).await;
    let sqlite_tokens = shoppers(&sqlite, &sqlite_db, ACCOUNTS).await;
    let hot = &pg_tokens[..1];
    let limit_db = limit_database(cluster).await;

    // Keys executed once, to be replayed.
    let executed = execute_keys(&pg.api(), &pg_tokens, 2_000).await;

    let mut series: Vec<Series> = [
        "pgbench (the limit)",
        "service, keyed",
        "service, un-keyed",
        "service, replays",
        "service, keyed, one hot account",
        "service, keyed, SQLite",
    ]
    .into_iter()
    .map(|name| Series {
        name,
        runs: Vec::new(),
    })
    .collect();
    for &clients in &args.levels {
        let s = args.seconds;
        let d = dir.path();
        let runs = [
            load::pgbench(cluster.port, &limit_db, ACCOUNTS, clients, s, d),
            load::wrk(
                &pg.base,
                &Requests::Fresh {
                    path: "/api/payments",
                    tokens: &pg_tokens,
                    keyed: true,
                },
                clients,
                s,
                d,
            ),
            load::wrk(
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
            load::wrk(
                &pg.base,
                &Requests::Replays {
                    tokens_keys_orders: &executed,
                },
                clients,
                s,
                d,
            ),
            load::wrk(
                &pg.base,
                &Requests::Fresh {
                    path: "/api/payments",
                    tokens: hot,
                    keyed: true,
                },
                clients,
                s,
                d,
            ),
            load::wrk(
                &sqlite.base,
                &Requests::Fresh {
                    path: "/api/payments",
                    tokens: &sqlite_tokens,
                    keyed: true,
                },
                clients,
                s,
                d,
            ),
        ];
        for (series, run) in series.iter_mut().zip(runs) {
            eprintln!(
                "{clients:>4} clients  {:<34} {:>8.0} req/s  p50 {:>7.2} ms  p99 {:>7.2} ms  errors {}",
                series.name,
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
        (
            "SQLite",
            storm(&sqlite, &sqlite_db, &sqlite_tokens[0]).await,
        ),
    ];
    let peak_rss = [
        ("PostgreSQL", peak_rss_kib(pg.pid())),
        ("SQLite", peak_rss_kib(sqlite.pid())),
    ];
    report::write(
        &args.out,
        &args.svg,
        &args.levels,
        &series,
        &storms,
        &peak_rss,
        args.seconds,
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
