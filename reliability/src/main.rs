//! `checkout-campaign`: the crash-and-duplicate campaign against two servers sharing one
//! PostgreSQL, and again against one on SQLite. Prints its figures and writes RELIABILITY.md.

use std::fmt::Write;
use std::time::{Duration, Instant};

use checkout_reliability::{Plan, Report, run};
use checkout_testkit::Backend;
use clap::Parser;

#[derive(Parser)]
#[command(about = "Payments and refunds under kills, database restarts and cut connections")]
struct Args {
    /// Requests per campaign, duplicates included.
    #[arg(long, default_value_t = 4_000)]
    requests: u64,
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Milliseconds between two acts of chaos.
    #[arg(long, default_value_t = 700)]
    chaos_every_ms: u64,
    /// The attack goes on until at least this many servers or databases have died.
    #[arg(long, default_value_t = 24)]
    min_chaos_acts: u64,
    #[arg(long, default_value = "RELIABILITY.md")]
    out: String,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let server_bin = std::env::current_exe()
        .unwrap()
        .with_file_name("checkout-server-chaos");
    let shop_bin = std::env::current_exe()
        .unwrap()
        .with_file_name("demo-shop-chaos");
    let mut reports = Vec::new();
    for (backend, servers) in [(Backend::Postgres, 2), (Backend::Sqlite, 1)] {
        let plan = Plan {
            backend,
            servers,
            requests: args.requests,
            clients: args.clients,
            accounts: 50,
            shops: 5,
            cut_percent: 5,
            chaos_every: Duration::from_millis(args.chaos_every_ms),
            min_chaos_acts: args.min_chaos_acts,
            late_webhook_percent: 5,
        };
        let started = Instant::now();
        let report = run(
            &plan,
            server_bin.to_str().unwrap(),
            shop_bin.to_str().unwrap(),
        )
        .await;
        println!(
            "{}  ({:.0} s)",
            report.summary(),
            started.elapsed().as_secs_f64()
        );
        for violation in &report.violations {
            println!("  VIOLATION: {violation}");
        }
        reports.push((report, started.elapsed()));
    }
    std::fs::write(&args.out, markdown(&args, &reports)).unwrap();
    println!("wrote {}", args.out);
    if reports.iter().all(|(r, _)| r.violations.is_empty()) {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

fn markdown(args: &Args, reports: &[(Report, Duration)]) -> String {
    let mut md = String::new();
    writeln!(md, "# Reliability\n").unwrap();
    writeln!(md, "Written by `scripts/campaign` (the `checkout-campaign` command). A population of {} clients acts for 5 shops and 50 shoppers. Each shop is a real demo shop process (`demo-shop`, its own SQLite database, its webhook receiver with its inbox), added with `checkout-server shop add`: clients order in its storefront (the cart form's token is the key; the shop makes the order's session with its own key), shoppers pay sessions (now and then one already paid), shops refund payments; about 30 % of the requests are duplicates (two concurrent copies of a new request, or a retry of an earlier key). The servers cut 5 % of their answers right after the commit; the shops hold 5 % of their webhook answers past the sender's 1 s timeout, after their own commit. Every {} ms something dies: a server is SIGKILLed and restarted on its port, a shop is SIGKILLed and restarted on its database (every fourth time), or (every third time, on PostgreSQL) the database is stopped with `pg_ctl stop -m immediate` and started again. PostgreSQL runs with its durable defaults. Afterwards every key is retried until it has a definite answer, and the campaign checks: every acknowledged session, payment and refund exists exactly once; no key moved money twice; at most one payment per session; every transfer is two ledger rows summing to zero; balance (with a shop's waiting credits) == sum(ledger) for every account, never negative; the money held by all accounts equals the money issued (conservation); refunds never exceed their payment; the stored replay of every key equals what the client first saw; every payment, refund and lapsed session wrote exactly one event; every event was delivered; and each shop knows every payment and refund of its orders exactly once in effect (order paid by that payment, learned from the webhook; refunded total equal to the checkout's; bonus the state those imply; one inbox entry per event).\n", args.clients, args.chaos_every_ms).unwrap();
    writeln!(md, "| database | servers | requests | duplicates | keys | sessions | payments | refunds | declines | no answer | server kills | shop kills | database restarts | money held / issued (kopecks) | shops hold | events / delivery attempts | shop orders checked | violations | time |").unwrap();
    writeln!(
        md,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    .unwrap();
    for (r, took) in reports {
        writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} | {} / {} | {} | **{}** | {:.0} s |",
            r.backend,
            r.servers,
            r.requests,
            r.duplicates,
            r.keys,
            r.sessions,
            r.payments,
            r.refunds,
            r.declines,
            r.no_answer,
            r.server_kills,
            r.shop_kills,
            r.database_restarts,
            r.money_held,
            r.money_issued,
            r.shops_hold,
            r.events,
            r.webhook_attempts,
            r.shop_orders,
            r.violations.len(),
            took.as_secs_f64()
        )
        .unwrap();
    }
    writeln!(md, "\n\"no answer\": requests cut off by a kill, a database restart or an injected cut (each retried later with the same key). A bounded version (a few hundred requests, a few kills) runs in `scripts/test` on every CI run (`reliability/tests/campaign.rs`).").unwrap();
    for (r, _) in reports {
        for v in &r.violations {
            writeln!(md, "- VIOLATION ({}): {v}", r.backend).unwrap();
        }
    }
    md
}
