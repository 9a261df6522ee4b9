//! BENCHMARKS.md and its chart, from one run's figures.

use std::fmt::Write;

use plotters::prelude::*;

use crate::load::Run;
use crate::{Series, Storm, Workload};

/// Facts about the code's statements and what profiling it showed, kept with the figures.
const WHERE_THE_TIME_GOES: &str = "## Where a request's time goes

**Statements per payment** (a shopper pays a checkout session; the money goes to the session's shop in double entry). PostgreSQL, keyed first execution: 2 statements, each one round trip, outside any transaction: one read of the session, the shopper's balance and the key (`PAYMENT_OUTLOOK`; a replay ends here, answered from the stored answer); then the whole payment as one statement (`POSTGRES_PAY_AT_ONCE`): the chain of data-modifying `WITH`s (the session taken, the shopper's guarded debit, the payment row, the transfer's two ledger rows, the shop's waiting credit, each fed by the rows of the one before), the payment's event, and the key inserted already completed with its answer, the balance the debit left written into it. It commits whole or not at all: the key's `claim_id` (NOT NULL) is the claim only if every step wrote its rows, and its plain insert fails on any row of the key; then nothing is written and the protocol's steps settle the request (a decline, a race, a key in flight): `BEGIN`, the claim, the change, the answer with the event, `COMMIT`. Un-keyed: 4 (`BEGIN`, the change, the event, `COMMIT`). A replay: the read. Before this change the keyed payment took 11 (each step its own statement); pgbench runs that transaction too, unchanged, as a fixed anchor. pgbench's scripts are spelled from the server's own statement constants (`bench/src/transactions.rs`). SQLite: one read on a reader connection (a replay ends there), then the step-by-step statements on the writer thread inside a savepoint, sharing its batch's `BEGIN`/`COMMIT`: there a statement costs no round trip, and SQLite has no data-modifying `WITH`.

**No hot row.** A payment never updates its shop's balance row: the shop's side of the transfer is a ledger row plus a row in `unfolded_credits`, both inserts, so payments to one shop do not queue on one row lock. A refund (the only thing that spends a shop's money) folds the waiting credits into the balance row under that row's lock in one statement, then debits it, guarded. The shopper's row is still updated by each payment: it guards the shopper's balance, and one shopper does not pay hundreds of times a second. \"One shop\" below sends every payment to one shop (from 64 shoppers); \"many shops\" spreads them over 64.

**SQLite.** The writer thread owns its connection and runs a request's whole unit with no hop, so a commit is shared by whatever queued meanwhile (group commit). Statement journals stay in memory, the reader pool never reopens connections, and server-made ids are time-ordered (UUID v7) so that a batch of rows lands on a few index pages. What remains is SQLite's own work, B-tree inserts and the savepoint journal, on one thread.

**PostgreSQL.** On this machine the database's CPU is the limit, and every statement, however small, costs it a round trip: a wake-up of its backend and of the server's task, a parse-bind-execute, a context switch on cores the server, the database and the load share. Composing the change into one statement and deferring the event into the answer's statement cut a keyed payment from 11 round trips to 5; settling it in one statement outside any transaction, after one read, cut it to 2. The refund follows the same way (12 to 6: the claim, the guarded refunded total with the shop's credits folded in, the transfer, the answer with its event; the shop's row is updated twice, which one statement cannot do). Three more costs of the service that pgbench does not pay were cut: sqlx's pool pinged every connection before lending it (a round trip per request; now only a connection idle for a second is pinged) and again once it was given back (a round trip per connection lent, two per keyed payment: the server now pools its connections itself and sends nothing for one given back as it was lent, `backend/src/store/postgres/pool.rs`), and every payment woke the webhook sender, whose claim of due events is a write transaction of its own (wakes within 20 ms are now gathered into one). What the service still adds per request is HTTP, JSON and its own scheduling (a test shopper's token is read once and then known for a minute, so the bench's payments read no credential). The keyed path now sends fewer statements than the un-keyed one (2 against 4): what is left of the keyed service's cost is the service's own (HTTP, JSON, the fingerprint, the log line), which pgbench does not pay. Measured (not by this command: `pg_stat_statements` and `perf record -a` during a keyed run at 32 clients): the database runs exactly the read and the statement per payment for the service, each at the cost it has under pgbench (the statement 0.49 ms on average in both), and takes 63 % of the two cores; the server 18 % (about 180 µs a request, a quarter of it the kernel's scheduling), wrk 3 %, and 15 % stays idle. A pool of 16 connections instead of 8, or one tokio worker instead of two, made every workload slower.
";

/// Where the report goes and what the run was.
pub struct Context<'a> {
    pub out: &'a str,
    pub svg: &'a str,
    pub levels: &'a [usize],
    pub seconds: u64,
}

/// One round of the goals' runs, made one right after the other.
pub struct Round {
    pub keyed: Run,
    pub unkeyed: Run,
    pub eleven: Run,
}

/// The goals' rounds at one concurrency level.
pub struct Goals {
    pub clients: usize,
    pub rounds: Vec<Round>,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

impl Goals {
    fn median_of(&self, f: impl Fn(&Round) -> f64) -> f64 {
        median(self.rounds.iter().map(f).collect())
    }

    fn section(&self, md: &mut String) {
        let n = self.rounds.len();
        if n == 0 {
            return;
        }
        let c = self.clients;
        writeln!(
            md,
            "## The goals, PostgreSQL at {c} clients: medians of {n} rounds run side by side
"
        )
        .unwrap();
        writeln!(md, "Each round runs the keyed service, the un-keyed service and pgbench's 11 statements of before one right after the other, the order turned round every round; a ratio is the median of the rounds' own ratios, so a slow minute of this shared machine falls on both sides of it.
").unwrap();
        let keyed_unkeyed = self.median_of(|r| r.keyed.throughput() / r.unkeyed.throughput());
        let keyed_eleven = self.median_of(|r| r.keyed.throughput() / r.eleven.throughput());
        let met = |x: f64, goal: f64| if x >= goal { "met" } else { "**not met**" };
        writeln!(md, "| ratio | median | goal | |").unwrap();
        writeln!(md, "|---|---|---|---|").unwrap();
        writeln!(
            md,
            "| keyed ÷ un-keyed, service | {keyed_unkeyed:.2} | ≥ 0.95 | {} |",
            met(keyed_unkeyed, 0.95)
        )
        .unwrap();
        writeln!(
            md,
            "| service keyed ÷ pgbench, the 11 statements of before | {keyed_eleven:.2} | ≥ 1.3 | {} |",
            met(keyed_eleven, 1.3)
        )
        .unwrap();
        writeln!(md, "
| round | keyed req/s (p99 ms) | un-keyed req/s (p99 ms) | pgbench 11 statements req/s (p99 ms) | keyed ÷ un-keyed | keyed ÷ 11 statements |").unwrap();
        writeln!(md, "|---|---|---|---|---|---|").unwrap();
        let cell = |r: &Run| format!("{:.0} ({:.2})", r.throughput(), r.p99_ms);
        for (i, r) in self.rounds.iter().enumerate() {
            writeln!(
                md,
                "| {} | {} | {} | {} | {:.2} | {:.2} |",
                i + 1,
                cell(&r.keyed),
                cell(&r.unkeyed),
                cell(&r.eleven),
                r.keyed.throughput() / r.unkeyed.throughput(),
                r.keyed.throughput() / r.eleven.throughput(),
            )
            .unwrap();
        }
        writeln!(
            md,
            "| median | {:.0} ({:.2}) | {:.0} ({:.2}) | {:.0} ({:.2}) | {keyed_unkeyed:.2} | {keyed_eleven:.2} |",
            self.median_of(|r| r.keyed.throughput()),
            self.median_of(|r| r.keyed.p99_ms),
            self.median_of(|r| r.unkeyed.throughput()),
            self.median_of(|r| r.unkeyed.p99_ms),
            self.median_of(|r| r.eleven.throughput()),
            self.median_of(|r| r.eleven.p99_ms),
        )
        .unwrap();
        writeln!(
            md,
            "
Statements (round trips) per request: keyed {}, un-keyed {}, pgbench {}.
",
            Workload::Keyed.statements(),
            Workload::Unkeyed.statements(),
            Workload::PgbenchEleven.statements()
        )
        .unwrap();
    }
}

fn run_of(series: &[Series], workload: Workload, clients: usize) -> Option<&Run> {
    series
        .iter()
        .find(|s| s.workload == workload)?
        .runs
        .iter()
        .find(|(c, _)| *c == clients)
        .map(|(_, r)| r)
}

fn ratio(series: &[Series], a: Workload, b: Workload, clients: usize) -> String {
    match (run_of(series, a, clients), run_of(series, b, clients)) {
        (Some(x), Some(y)) if y.throughput() > 0.0 => {
            format!("{:.2}", x.throughput() / y.throughput())
        }
        _ => "–".into(),
    }
}

pub fn write(
    context: &Context<'_>,
    series: &[Series],
    goals: &Goals,
    storms: &[(&str, Storm)],
    rss: &[(&str, u64)],
) {
    let Context {
        out,
        svg,
        levels,
        seconds,
    } = *context;
    let mut md = String::new();
    let machine = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap().trim().to_owned())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    writeln!(md, "# Benchmarks\n").unwrap();
    writeln!(md, "Written by `scripts/bench` (the `checkout-bench` command) from one run: every figure below was measured side by side, on the same machine, the same throwaway PostgreSQL 15 cluster and the same concurrency levels. Only the ratios mean anything elsewhere: this machine is shared, and its absolute speed varies from hour to hour.\n").unwrap();
    writeln!(
        md,
        "- machine: {cores} cores ({machine}); server, database and load generator share them"
    )
    .unwrap();
    writeln!(md, "- runs: {seconds} s each; service load by `wrk` (Lua `request()`: a fresh `Idempotency-Key` and a fresh open checkout session per request, made in setup straight in the database, 1 kopeck each); PostgreSQL's limit by `pgbench -n -M prepared` running the server's own statements with as many connections as the server's pool at most (4 per core: the same concurrency in the database), SQLite's by the same statements in a loop on one connection (`bench/src/transactions.rs`, `bench/src/load.rs`, `bench/src/sqlite_loop.rs`)").unwrap();
    writeln!(md, "- 64 shoppers; \"many shops\" = 64 shops, \"one shop\" = every payment to one; the release build; request logs on (one INFO line per request); PostgreSQL with its durable defaults (fsync on), SQLite with `synchronous=FULL`").unwrap();
    writeln!(md).unwrap();

    goals.section(&mut md);
    writeln!(md, "## Ratios at every level, one run each\n").unwrap();
    writeln!(md, "| clients | one shop ÷ many shops, PostgreSQL (goal ≥ 0.8 at 32) | one shop ÷ many shops, SQLite (goal ≥ 0.8 at 32) | service ÷ pgbench, keyed | keyed ÷ un-keyed, service | keyed ÷ un-keyed, pgbench | SQLite service ÷ SQLite loop | group commit ÷ a commit per request |").unwrap();
    writeln!(md, "|---|---|---|---|---|---|---|---|").unwrap();
    for &c in levels {
        writeln!(
            md,
            "| {c} | {} | {} | {} | {} | {} | {} | {} |",
            ratio(series, Workload::OneShop, Workload::Keyed, c),
            ratio(
                series,
                Workload::SqliteOneShop,
                Workload::SqliteGroupCommit,
                c
            ),
            ratio(series, Workload::Keyed, Workload::PgbenchKeyed, c),
            ratio(series, Workload::Keyed, Workload::Unkeyed, c),
            ratio(series, Workload::PgbenchKeyed, Workload::PgbenchUnkeyed, c),
            ratio(series, Workload::SqliteGroupCommit, Workload::SqliteLoop, c),
            ratio(
                series,
                Workload::SqliteGroupCommit,
                Workload::SqliteCommitPerRequest,
                c
            ),
        )
        .unwrap();
    }
    writeln!(
        md,
        "\n### PostgreSQL: the keyed payment in fewer round trips\n"
    )
    .unwrap();
    writeln!(md, "| clients | service keyed ÷ pgbench, the server's statements now | service keyed ÷ pgbench, the 11 statements of before (goal ≥ 1.3 at 32, above) | keyed ÷ un-keyed, service (goal ≥ 0.95 at 32, above) | replays ÷ first executions, service |").unwrap();
    writeln!(md, "|---|---|---|---|---|").unwrap();
    for &c in levels {
        writeln!(
            md,
            "| {c} | {} | {} | {} | {} |",
            ratio(series, Workload::Keyed, Workload::PgbenchKeyed, c),
            ratio(series, Workload::Keyed, Workload::PgbenchEleven, c),
            ratio(series, Workload::Keyed, Workload::Unkeyed, c),
            ratio(series, Workload::Replays, Workload::Keyed, c),
        )
        .unwrap();
    }
    writeln!(md, "\nThe SQLite loop runs on one connection whatever the level (SQLite has one writer); it is measured again at each level so that every ratio compares runs made side by side.").unwrap();

    writeln!(md, "\n{WHERE_THE_TIME_GOES}").unwrap();
    writeln!(md, "## Throughput and latency\n").unwrap();
    writeln!(
        md,
        "| workload | statements (round trips) per request | clients | req/s | p50 ms | p99 ms | errors |"
    )
    .unwrap();
    writeln!(md, "|---|---|---|---|---|---|---|").unwrap();
    for s in series {
        for (c, r) in &s.runs {
            writeln!(
                md,
                "| {} | {} | {c} | {:.0} | {:.2} | {:.2} | {} |",
                s.workload.name(),
                s.workload.statements(),
                r.throughput(),
                r.p50_ms,
                r.p99_ms,
                r.errors
            )
            .unwrap();
        }
    }

    writeln!(
        md,
        "\n## Duplicate storm: 1 000 concurrent copies of one request\n"
    )
    .unwrap();
    writeln!(md, "| database | copies | executed | replayed | 409 in use | debits | p50 ms | p99 ms | max ms |").unwrap();
    writeln!(md, "|---|---|---|---|---|---|---|---|---|").unwrap();
    for (db, s) in storms {
        writeln!(
            md,
            "| {db} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} |",
            s.copies, s.firsts, s.replays, s.in_use, s.debits, s.p50_ms, s.p99_ms, s.max_ms
        )
        .unwrap();
    }
    writeln!(md, "\n## Server memory\n").unwrap();
    for (db, kib) in rss {
        writeln!(
            md,
            "- peak RSS of the server on {db} after all its runs: {:.1} MiB",
            *kib as f64 / 1024.0
        )
        .unwrap();
    }
    writeln!(
        md,
        "\n![throughput and p99 per concurrency level]({})\n",
        svg.trim_start_matches("./")
    )
    .unwrap();
    checkout_bench::kept::append(&mut md);
    std::fs::write(out, md).unwrap();
    chart(svg, levels, series);
}

/// Two rows, PostgreSQL then SQLite: throughput on the left, p99 on the right.
fn chart(svg: &str, levels: &[usize], series: &[Series]) {
    let root = SVGBackend::new(svg, (1200, 900)).into_drawing_area();
    root.fill(&WHITE).unwrap();
    let rows = root.split_evenly((2, 1));
    let is_sqlite = |s: &&Series| s.workload.name().starts_with("SQLite");
    for (row, sqlite) in rows.iter().zip([false, true]) {
        let picked: Vec<&Series> = series.iter().filter(|s| is_sqlite(s) == sqlite).collect();
        let (left, right) = row.split_horizontally(600);
        draw(
            &left,
            &right,
            levels,
            &picked,
            if sqlite { "SQLite" } else { "PostgreSQL" },
        );
    }
    root.present().unwrap();
}

fn draw<DB: DrawingBackend>(
    left: &DrawingArea<DB, plotters::coord::Shift>,
    right: &DrawingArea<DB, plotters::coord::Shift>,
    levels: &[usize],
    series: &[&Series],
    database: &str,
) {
    let xs = 0..levels.len().saturating_sub(1).max(1);
    let label = |i: &usize| levels.get(*i).map(|c| c.to_string()).unwrap_or_default();
    let colours = [
        BLACK,
        BLUE,
        RGBColor(120, 120, 120),
        GREEN,
        MAGENTA,
        RGBColor(255, 140, 0),
        RED,
    ];
    let max_rps = series
        .iter()
        .flat_map(|s| s.runs.iter().map(|(_, r)| r.throughput()))
        .fold(1.0, f64::max);
    let max_p99 = series
        .iter()
        .flat_map(|s| s.runs.iter().map(|(_, r)| r.p99_ms))
        .fold(1.0, f64::max);
    for (area, title, max, pick) in [
        (
            left,
            format!("{database}: throughput (req/s)"),
            max_rps * 1.6,
            0usize,
        ),
        (
            right,
            format!("{database}: p99 latency (ms)"),
            max_p99 * 1.1,
            1usize,
        ),
    ] {
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(32)
            .y_label_area_size(56)
            .build_cartesian_2d(xs.clone(), 0.0..max)
            .unwrap();
        chart
            .configure_mesh()
            .x_labels(levels.len())
            .x_label_formatter(&label)
            .x_desc("clients")
            .draw()
            .unwrap();
        for (s, colour) in series.iter().zip(colours) {
            let points: Vec<(usize, f64)> = s
                .runs
                .iter()
                .filter_map(|(c, r)| {
                    levels
                        .iter()
                        .position(|l| l == c)
                        .map(|i| (i, if pick == 0 { r.throughput() } else { r.p99_ms }))
                })
                .collect();
            let name = s
                .workload
                .name()
                .split_once(": ")
                .map_or(s.workload.name(), |(_, n)| n);
            chart
                .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))
                .unwrap()
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], colour.stroke_width(2))
                });
            chart
                .draw_series(
                    points
                        .into_iter()
                        .map(|p| Circle::new(p, 3, colour.filled())),
                )
                .unwrap();
        }
        if pick == 0 {
            // Above the lines: the throughput axis leaves the top third free for it.
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.9))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .unwrap();
        }
    }
}
