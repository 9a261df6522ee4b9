//! `checkout-bench`: the service against its databases' own limits, side by side in one run on
//! one machine, one throwaway cluster, the same concurrency levels; and payments to one shop
//! against payments spread over many. Writes BENCHMARKS.md and an SVG.

mod dashboard;
mod load;
mod receipts;
mod report;
mod setup;
mod sqlite_loop;
mod transactions;
mod verify_cost;

use std::time::Instant;

use checkout_testkit::{Api, Backend, Server, TestDb, new_key, pay_session};
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
    /// Instead of the benchmark: what `checkout-server verify` costs once each database holds
    /// this many payments (its time, and the writers' throughput while it runs).
    #[arg(long)]
    verify_cost: Option<i64>,
    /// Instead of the benchmark: the receipts consumer's throughput with its inbox against
    /// without it (this many messages per run), and the lag from payment to receipt.
    #[arg(long)]
    receipts: Option<usize>,
    /// Where `--receipts` writes its tables.
    #[arg(long, default_value = "bench/receipts.md")]
    receipts_out: String,
    /// Instead of the benchmark: the shop's dashboard pages' latencies once one shop holds this
    /// many payments (each database).
    #[arg(long)]
    dashboard: Option<i64>,
    /// Where `--dashboard` writes its tables.
    #[arg(long, default_value = "bench/dashboard.md")]
    dashboard_out: String,
    /// Rounds of the goals' side-by-side runs at 32 clients (keyed service, un-keyed service,
    /// pgbench's 11 statements); each ratio is the median of its rounds.
    #[arg(long, default_value_t = 5)]
    pairs: usize,
    /// Where `--verify-cost` writes its table.
    #[arg(long, default_value = "bench/verify-cost.md")]
    verify_out: String,
}

/// Shoppers the workloads spread over.
const ACCOUNTS: usize = 64;

/// What was measured; the report computes its ratios from these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    PgbenchKeyed,
    PgbenchEleven,
    PgbenchUnkeyed,
    Keyed,
    OneShop,
    Unkeyed,
    Replays,
    SqliteLoop,
    SqliteGroupCommit,
    SqliteOneShop,
    SqliteCommitPerRequest,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::PgbenchKeyed => {
                "PostgreSQL: pgbench, the server's keyed transaction (the limit)"
            }
            Workload::PgbenchEleven => {
                "PostgreSQL: pgbench, the keyed transaction of before, 11 statements (fixed anchor)"
            }
            Workload::PgbenchUnkeyed => "PostgreSQL: pgbench, the un-keyed transaction",
            Workload::Keyed => "PostgreSQL: service, keyed, many shops",
            Workload::OneShop => "PostgreSQL: service, keyed, one shop",
            Workload::Unkeyed => "PostgreSQL: service, un-keyed, many shops",
            Workload::Replays => "PostgreSQL: service, replays",
            Workload::SqliteLoop => {
                "SQLite: the same transaction in a loop, a commit each (the limit)"
            }
            Workload::SqliteGroupCommit => "SQLite: service, keyed, many shops, group commit",
            Workload::SqliteOneShop => "SQLite: service, keyed, one shop, group commit",
            Workload::SqliteCommitPerRequest => {
                "SQLite: service, keyed, many shops, a commit per request"
            }
        }
    }

    /// Statements per request on PostgreSQL, each one round trip (`BEGIN` and `COMMIT`
    /// included).
    pub fn statements(self) -> String {
        use transactions::*;
        match self {
            Workload::PgbenchKeyed | Workload::Keyed | Workload::OneShop => {
                KEYED_STATEMENTS.to_string()
            }
            Workload::PgbenchEleven => ELEVEN_STATEMENTS.to_string(),
            Workload::PgbenchUnkeyed | Workload::Unkeyed => UNKEYED_STATEMENTS.to_string(),
            Workload::Replays => REPLAY_STATEMENTS.to_string(),
            // One read on a reader, then nine statements in a savepoint of the writer's batch,
            // on its own thread: no round trips.
            Workload::SqliteLoop
            | Workload::SqliteGroupCommit
            | Workload::SqliteOneShop
            | Workload::SqliteCommitPerRequest => "in process".into(),
        }
    }
}

pub struct Series {
    pub workload: Workload,
    pub runs: Vec<(usize, Run)>,
}

/// Hands out session numbers, so that no two runs (or wrk threads, or pgbench clients) ever
/// pay the same session.
struct SessionNumbers(u64);

impl SessionNumbers {
    fn take(&mut self, count: u64) -> u64 {
        let first = self.0;
        self.0 += count;
        first
    }
}

/// Sessions per wrk thread or pgbench client in one run: more than it can pay in `seconds`.
fn span(seconds: u64, runners: usize) -> u64 {
    seconds * 12_000 / runners as u64 + 2_000
}

/// What a workload sends: to which route, with keys or not, to one shop or many.
#[derive(Clone, Copy)]
struct Payments {
    path: &'static str,
    keyed: bool,
    one_shop: bool,
}

const KEYED: Payments = Payments {
    path: "/api/payments",
    keyed: true,
    one_shop: false,
};
const ONE_SHOP: Payments = Payments {
    one_shop: true,
    ..KEYED
};
const UNKEYED: Payments = Payments {
    path: "/api/bench/unkeyed-payments",
    keyed: false,
    one_shop: false,
};

/// A server under load and its database.
struct Target {
    db: TestDb,
    server: Server,
    backend: Backend,
    tokens: Vec<String>,
}

impl Target {
    async fn start(binary: &str, db: TestDb, backend: Backend, env: &[(&str, &str)]) -> Target {
        let server = Server::start_with(binary, &db, env).await;
        setup::shops(&db.url).await;
        let tokens = setup::shoppers(&server, &db, ACCOUNTS).await;
        Target {
            db,
            server,
            backend,
            tokens,
        }
    }

    /// wrk paying fresh sessions (made just before) with fresh keys.
    async fn pay_fresh(
        &self,
        numbers: &mut SessionNumbers,
        Payments {
            path,
            keyed,
            one_shop,
        }: Payments,
        clients: usize,
        seconds: u64,
        dir: &std::path::Path,
    ) -> Run {
        let span = span(seconds, load::wrk_threads(clients));
        let count = span * load::wrk_threads(clients) as u64;
        let first = numbers.take(count);
        setup::sessions(&self.db.url, self.backend, first, count, one_shop).await;
        let requests = Requests::Fresh {
            path,
            tokens: &self.tokens,
            keyed,
            first,
            span,
        };
        load::wrk(&self.server.base, &requests, clients, seconds, dir)
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let server_bin = std::env::current_exe()
        .unwrap()
        .with_file_name("checkout-server-bench");
    let server_bin = server_bin.to_str().unwrap().to_owned();
    if let Some(messages) = args.receipts {
        let broker = tokio::task::spawn_blocking(checkout_testkit::rabbitmq::Broker::start)
            .await
            .unwrap();
        let throughput = receipts::throughput(&broker, messages).await;
        let receipts_bin = std::env::current_exe().unwrap().with_file_name("receipts");
        let mut lags = Vec::new();
        for backend in [Backend::Sqlite, Backend::Postgres] {
            for poll_ms in [500, 50] {
                let lag = receipts::lag(
                    &broker,
                    &server_bin,
                    receipts_bin.to_str().unwrap(),
                    backend,
                    poll_ms,
                    32,
                    args.seconds,
                )
                .await;
                eprintln!(
                    "{} poll {poll_ms} ms: {} payments ({:.0}/s), lag p50 {:.3} s, p99 {:.3} s",
                    lag.database, lag.payments, lag.payments_per_second, lag.p50, lag.p99
                );
                lags.push(lag);
            }
        }
        std::fs::write(&args.receipts_out, receipts::markdown(&throughput, &lags)).unwrap();
        eprintln!("wrote {}", args.receipts_out);
        // BENCHMARKS.md keeps its other sections as the last full run wrote them.
        checkout_bench::kept::rewrite(&args.out);
        eprintln!("wrote {}", args.out);
        return;
    }
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
    let log = args.server_log.as_str();
    let mut pg_env = vec![("RUST_LOG", log)];
    if let Some(pool) = &args.pool {
        pg_env.push(("CHECKOUT_DB_POOL_SIZE", pool.as_str()));
    }
    let mut numbers = SessionNumbers(1);
    let pg = Target::start(
        &server_bin,
        TestDb::on(cluster).await,
        Backend::Postgres,
        &pg_env,
    )
    .await;
    let limit_url = setup::limit_database(cluster, ACCOUNTS).await;
    let limit_db = limit_url.rsplit('/').next().unwrap().to_owned();
    // Keys executed once, to be replayed.
    let executed = execute_keys(&pg, &mut numbers, 2_000).await;
    let sqlite = |env: Vec<(&'static str, &'static str)>| {
        let binary = server_bin.clone();
        async move {
            let mut env = env;
            env.push(("RUST_LOG", "info,sqlx=warn"));
            Target::start(
                &binary,
                TestDb::new(Backend::Sqlite).await,
                Backend::Sqlite,
                &env,
            )
            .await
        }
    };
    let group = sqlite(vec![]).await;
    if let Some(payments) = args.dashboard {
        let mut runs = Vec::new();
        for (name, target) in [("PostgreSQL", &pg), ("SQLite", &group)] {
            runs.push(dashboard::measure(name, target, &mut numbers, payments, d).await);
        }
        std::fs::write(&args.dashboard_out, dashboard::markdown(&runs)).unwrap();
        eprintln!("wrote {}", args.dashboard_out);
        // BENCHMARKS.md keeps its other sections as the last full run wrote them.
        checkout_bench::kept::rewrite(&args.out);
        eprintln!("wrote {}", args.out);
        return;
    }
    if let Some(payments) = args.verify_cost {
        let mut costs = Vec::new();
        for (name, target) in [("PostgreSQL", &pg), ("SQLite", &group)] {
            let cost =
                verify_cost::measure(name, target, &mut numbers, payments, args.seconds, d).await;
            eprintln!(
                "{name}: verify {:.2} s alone on {} payments; {:.0} → {:.0} payments/s with it running",
                cost.verify_alone.as_secs_f64(),
                cost.payments,
                cost.without,
                cost.with
            );
            costs.push(cost);
        }
        std::fs::write(
            &args.verify_out,
            verify_cost::markdown(&costs, args.seconds),
        )
        .unwrap();
        eprintln!("wrote {}", args.verify_out);
        return;
    }
    let single = sqlite(vec![("CHECKOUT_SQLITE_BATCH", "1")]).await;

    let mut series: Vec<Series> = [
        Workload::PgbenchKeyed,
        Workload::PgbenchEleven,
        Workload::PgbenchUnkeyed,
        Workload::Keyed,
        Workload::OneShop,
        Workload::Unkeyed,
        Workload::Replays,
        Workload::SqliteLoop,
        Workload::SqliteGroupCommit,
        Workload::SqliteOneShop,
        Workload::SqliteCommitPerRequest,
    ]
    .into_iter()
    .map(|workload| Series {
        workload,
        runs: Vec::new(),
    })
    .collect();
    let mut bench = Bench {
        pg: &pg,
        group: &group,
        single: &single,
        cluster,
        limit_url: &limit_url,
        limit_db: &limit_db,
        executed: &executed,
        pool,
        numbers,
        dir: d,
    };
    for &clients in &args.levels {
        for series in &mut series {
            let run = bench.run(series.workload, clients, args.seconds).await;
            series.runs.push((clients, run));
        }
    }
    let goals = bench.goal_pairs(args.pairs, args.seconds).await;
    let mut numbers = bench.numbers;

    let storms = vec![
        ("PostgreSQL", storm(&pg, &mut numbers).await),
        ("SQLite", storm(&group, &mut numbers).await),
    ];
    let peak_rss = [
        ("PostgreSQL", peak_rss_kib(pg.server.pid())),
        ("SQLite (group commit)", peak_rss_kib(group.server.pid())),
    ];
    report::write(
        &report::Context {
            out: &args.out,
            svg: &args.svg,
            levels: &args.levels,
            seconds: args.seconds,
        },
        &series,
        &goals,
        &storms,
        &peak_rss,
    );
    eprintln!("wrote {} and {}", args.out, args.svg);
    // Every payment of every run reached its shop: the ledger agrees with the balances.
    for target in [&pg, &group, &single] {
        target.db.assert_invariants().await;
    }
    eprintln!("invariants hold on the three databases");
}

/// Everything a measured run needs.
struct Bench<'a> {
    pg: &'a Target,
    group: &'a Target,
    single: &'a Target,
    cluster: &'static checkout_testkit::postgres::Cluster,
    limit_url: &'a str,
    limit_db: &'a str,
    executed: &'a [(String, String, String)],
    /// pgbench's connections at most (the server's pool).
    pool: usize,
    numbers: SessionNumbers,
    dir: &'a std::path::Path,
}

impl Bench<'_> {
    /// One run of `workload` at `clients` for `seconds`, printed as it ends.
    async fn run(&mut self, workload: Workload, clients: usize, seconds: u64) -> Run {
        let (s, d) = (seconds, self.dir);
        let numbers = &mut self.numbers;
        let run = match workload {
            Workload::PgbenchKeyed | Workload::PgbenchEleven | Workload::PgbenchUnkeyed => {
                let runners = clients.min(self.pool);
                let span = span(s, runners);
                let count = span * runners as u64;
                let first = numbers.take(count);
                setup::sessions(self.limit_url, Backend::Postgres, first, count, false).await;
                let transaction = match workload {
                    Workload::PgbenchKeyed => transactions::keyed_transaction(),
                    Workload::PgbenchEleven => {
                        transactions::ELEVEN_STATEMENT_TRANSACTION.to_owned()
                    }
                    _ => transactions::unkeyed_transaction(),
                };
                load::pgbench(
                    self.cluster.port,
                    self.limit_db,
                    &transaction,
                    ACCOUNTS,
                    runners,
                    (first, span),
                    s,
                    d,
                )
            }
            Workload::Keyed => self.pg.pay_fresh(numbers, KEYED, clients, s, d).await,
            Workload::OneShop => self.pg.pay_fresh(numbers, ONE_SHOP, clients, s, d).await,
            Workload::Unkeyed => self.pg.pay_fresh(numbers, UNKEYED, clients, s, d).await,
            Workload::Replays => load::wrk(
                &self.pg.server.base,
                &Requests::Replays {
                    tokens_keys_sessions: self.executed,
                },
                clients,
                s,
                d,
            ),
            Workload::SqliteLoop => {
                let d = d.to_owned();
                tokio::task::spawn_blocking(move || sqlite_loop::run(&d, ACCOUNTS, s))
                    .await
                    .unwrap()
            }
            Workload::SqliteGroupCommit => {
                self.group.pay_fresh(numbers, KEYED, clients, s, d).await
            }
            Workload::SqliteOneShop => self.group.pay_fresh(numbers, ONE_SHOP, clients, s, d).await,
            Workload::SqliteCommitPerRequest => {
                self.single.pay_fresh(numbers, KEYED, clients, s, d).await
            }
        };
        eprintln!(
            "{clients:>4} clients  {:<66} {:>8.0} req/s  p50 {:>7.2} ms  p99 {:>7.2} ms  errors {}",
            workload.name(),
            run.throughput(),
            run.p50_ms,
            run.p99_ms,
            run.errors
        );
        let server = match workload {
            Workload::Keyed | Workload::OneShop | Workload::Unkeyed | Workload::Replays => {
                Some(&self.pg.server)
            }
            Workload::SqliteGroupCommit | Workload::SqliteOneShop => Some(&self.group.server),
            Workload::SqliteCommitPerRequest => Some(&self.single.server),
            _ => None,
        };
        if let Some(server) = server.filter(|_| run.errors > 0) {
            eprintln!(
                "the server's last errors and warnings: {:#?}",
                last_errors(server)
            );
        }
        run
    }

    /// The goals' ratios at [`GOAL_CLIENTS`], each from `pairs` rounds of runs made one right
    /// after the other, in an order that turns round every round (the keyed service first, then
    /// last), so that neither side always runs on a warmer or a busier machine.
    async fn goal_pairs(&mut self, pairs: usize, seconds: u64) -> report::Goals {
        let mut rounds = Vec::new();
        for round in 0..pairs {
            let mut order = [Workload::Keyed, Workload::Unkeyed, Workload::PgbenchEleven];
            if round % 2 == 1 {
                order.reverse();
            }
            let mut runs = Vec::new();
            for workload in order {
                runs.push((workload, self.run(workload, GOAL_CLIENTS, seconds).await));
            }
            let of = |w: Workload| runs.iter().find(|(x, _)| *x == w).unwrap().1.clone();
            rounds.push(report::Round {
                keyed: of(Workload::Keyed),
                unkeyed: of(Workload::Unkeyed),
                eleven: of(Workload::PgbenchEleven),
            });
        }
        report::Goals {
            clients: GOAL_CLIENTS,
            rounds,
        }
    }
}

/// The concurrency the goals are stated at.
const GOAL_CLIENTS: usize = 32;

/// Pays `n` fresh sessions once each, to be replayed: (token, key, session id).
async fn execute_keys(
    target: &Target,
    numbers: &mut SessionNumbers,
    n: u64,
) -> Vec<(String, String, String)> {
    let first = numbers.take(n);
    setup::sessions(&target.db.url, target.backend, first, n, false).await;
    let triples: Vec<_> = (0..n)
        .map(|i| {
            (
                target.tokens[i as usize % target.tokens.len()].clone(),
                new_key(),
                load::session_id(first + i),
            )
        })
        .collect();
    let api = target.server.api();
    for chunk in triples.chunks(32) {
        join_all(chunk.iter().map(|(token, key, session)| {
            let api = Api {
                token: Some(token.clone()),
                ..api.clone()
            };
            async move {
                let answer = api.pay(key, &pay_session(session)).await;
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
async fn storm(target: &Target, numbers: &mut SessionNumbers) -> Storm {
    let (server, db) = (&target.server, &target.db);
    let session = numbers.take(1);
    setup::sessions(&db.url, target.backend, session, 1, false).await;
    let api = Api {
        token: Some(target.tokens[0].clone()),
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(1_000)
            .build()
            .unwrap(),
        ..server.api()
    };
    let key = new_key();
    let body = pay_session(&load::session_id(session));
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
            other => panic!(
                "storm: unexpected answer {other:?}; the server's last errors and warnings: {:#?}",
                last_errors(server)
            ),
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

/// The last ERROR and WARN lines of a server's log: what a run's errors or a storm's unexpected
/// answer are reported with.
fn last_errors(server: &Server) -> Vec<String> {
    let log = server.log();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("ERROR") || l.contains("WARN"))
        .collect();
    said[said.len().saturating_sub(8)..]
        .iter()
        .map(|l| l.to_string())
        .collect()
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
