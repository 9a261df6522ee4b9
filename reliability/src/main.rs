//! `checkout-campaign`: the crash-and-duplicate campaign against two servers sharing one
//! PostgreSQL, and again against one on SQLite. Prints its figures and writes RELIABILITY.md.

use std::fmt::Write;
use std::time::{Duration, Instant};

use checkout_reliability::failover::{self, FailoverPlan, FailoverReport, Fault};
use checkout_reliability::receipts::{self, ReceiptsPlan, ReceiptsReport};
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
    /// Losses of the PostgreSQL primary per failover campaign (one with a synchronous standby,
    /// one with an asynchronous one).
    #[arg(long, default_value_t = 3)]
    failovers: u32,
    /// Requests per failover campaign at least.
    #[arg(long, default_value_t = 3_000)]
    failover_requests: u64,
    /// Only the failover campaigns.
    #[arg(long)]
    only_failover: bool,
    /// Seconds of load per receipts campaign (consumers killed, the broker restarted).
    #[arg(long, default_value_t = 30)]
    receipts_seconds: u64,
    /// Only the receipts campaigns.
    #[arg(long)]
    only_receipts: bool,
    /// Rounds of the campaign on Patroni, etcd, HAProxy and a RabbitMQ cluster (each round:
    /// one fault of each kind, in turn).
    #[arg(long, default_value_t = 3)]
    ha_rounds: u32,
    /// Only the campaign on Patroni, etcd, HAProxy and a RabbitMQ cluster.
    #[arg(long)]
    only_ha: bool,
    /// The table of `checkout-bench --verify-cost`, included as it is.
    #[arg(long, default_value = "bench/verify-cost.md")]
    verify_cost: String,
    #[arg(long, default_value = "RELIABILITY.md")]
    out: String,
}

impl Args {
    /// Clients of the campaigns on the cluster (failovers and HA): at most 8.
    fn cluster_clients(&self) -> usize {
        self.clients.min(8)
    }
}

/// How long the outbox took to drain after the load, as a table cell.
fn drained(report: &FailoverReport) -> String {
    report.drained_after.map_or("not within 60 s".into(), |d| {
        format!("{:.1} s", d.as_secs_f64())
    })
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
    let receipts_bin = std::env::current_exe()
        .unwrap()
        .with_file_name("receipts-chaos");
    let only = args.only_failover || args.only_receipts || args.only_ha;
    let campaigns: &[(Backend, usize)] = if only {
        &[]
    } else {
        &[(Backend::Postgres, 2), (Backend::Sqlite, 1)]
    };
    for &(backend, servers) in campaigns {
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
        told(&report.summary(), &report.violations, started.elapsed());
        reports.push((report, started.elapsed()));
    }
    let mut failovers = Vec::new();
    let synchronous_or_not: &[bool] = if args.only_receipts || args.only_ha {
        &[]
    } else {
        &[true, false]
    };
    for &synchronous in synchronous_or_not {
        let plan = FailoverPlan {
            faults: vec![Fault::LeaderPostgres; args.failovers as usize],
            requests: args.failover_requests,
            clients: args.cluster_clients(),
            load_before: Duration::from_secs(3),
            synchronous,
            link_delay: Duration::from_millis(20),
            receipts: false,
        };
        let started = Instant::now();
        let report = failover::run(
            &plan,
            server_bin.to_str().unwrap(),
            receipts_bin.to_str().unwrap(),
        )
        .await;
        told(&report.summary(), &report.violations, started.elapsed());
        failovers.push((report, started.elapsed()));
    }
    let mut receipt_reports = Vec::new();
    let receipt_backends: &[Backend] = if args.only_failover || args.only_ha {
        &[]
    } else {
        &[Backend::Postgres, Backend::Sqlite]
    };
    for &backend in receipt_backends {
        let plan = ReceiptsPlan {
            backend,
            clients: 8,
            load: Duration::from_secs(args.receipts_seconds),
            chaos_every: Duration::from_millis(1_500),
            broker_every: 5,
            broker_nodes: 1,
        };
        let started = Instant::now();
        let report = receipts::run(
            &plan,
            server_bin.to_str().unwrap(),
            receipts_bin.to_str().unwrap(),
        )
        .await;
        told(&report.summary(), &report.violations, started.elapsed());
        receipt_reports.push((report, started.elapsed()));
    }
    let mut ha_reports = Vec::new();
    if !(args.only_failover || args.only_receipts) && args.ha_rounds > 0 {
        let plan = FailoverPlan {
            faults: (0..args.ha_rounds).flat_map(|_| Fault::ALL).collect(),
            requests: args.failover_requests,
            clients: args.cluster_clients(),
            load_before: Duration::from_secs(3),
            synchronous: true,
            link_delay: Duration::ZERO,
            receipts: true,
        };
        let started = Instant::now();
        let report = failover::run(
            &plan,
            server_bin.to_str().unwrap(),
            receipts_bin.to_str().unwrap(),
        )
        .await;
        told(&report.summary(), &report.violations, started.elapsed());
        ha_reports.push((report, started.elapsed()));
    }
    let verify_cost = std::fs::read_to_string(&args.verify_cost).ok();
    // A partial run replaces only its own sections: the rest of the file stays as the last
    // full run wrote it.
    let mut md = if only {
        std::fs::read_to_string(&args.out).unwrap_or_default()
    } else {
        markdown(&args, &reports, &failovers, verify_cost.as_deref())
    };
    if only && !failovers.is_empty() {
        md = replace_section(&md, FAILOVER_HEADING, &failover_markdown(&args, &failovers));
    }
    if !receipt_reports.is_empty() {
        md = replace_section(
            &md,
            RECEIPTS_HEADING,
            &receipts_markdown(&args, &receipt_reports),
        );
    }
    if !ha_reports.is_empty() {
        md = replace_section(&md, HA_HEADING, &ha_markdown(&ha_reports));
    }
    std::fs::write(&args.out, md).unwrap();
    println!("wrote {}", args.out);
    if reports.iter().all(|(r, _)| r.violations.is_empty())
        && failovers.iter().all(|(r, _)| r.violations.is_empty())
        && receipt_reports.iter().all(|(r, _)| r.violations.is_empty())
        && ha_reports.iter().all(|(r, _)| r.violations.is_empty())
    {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

/// A campaign's summary line and its violations, as it ends.
fn told(summary: &str, violations: &[String], took: Duration) {
    println!("{summary}  ({:.0} s)", took.as_secs_f64());
    for violation in violations {
        println!("  VIOLATION: {violation}");
    }
}

fn markdown(
    args: &Args,
    reports: &[(Report, Duration)],
    failovers: &[(FailoverReport, Duration)],
    verify_cost: Option<&str>,
) -> String {
    let mut md = String::new();
    writeln!(md, "# Reliability\n").unwrap();
    if !reports.is_empty() {
        campaign_markdown(&mut md, args, reports);
    }
    if !failovers.is_empty() {
        md.push('\n');
        md.push_str(&failover_markdown(args, failovers));
    }
    if let Some(table) = verify_cost {
        writeln!(md, "\n## `checkout-server verify` on a large database\n").unwrap();
        writeln!(md, "Written by `scripts/bench --verify-cost 100000` (`checkout-bench`): the service pays sessions until each database holds at least 100 000 payments; `verify` runs alone, then back to back while the keyed service pays.\n").unwrap();
        md.push_str(table);
    }
    md
}

const FAILOVER_HEADING: &str = "## Losing the PostgreSQL primary";

fn failover_markdown(args: &Args, failovers: &[(FailoverReport, Duration)]) -> String {
    let mut md = String::new();
    let md = &mut md;
    writeln!(md, "{FAILOVER_HEADING}\n").unwrap();
    writeln!(md, "Written by `scripts/campaign` (`--only-failover` for this section alone). Each run: the cluster of `scripts/cluster` without the broker (three etcd members, three PostgreSQL 15 nodes under Patroni, HAProxy in front of the database and of two checkout instances), the nodes streaming their WAL to each other over a link that delays every byte 20 ms each way (a standby in another zone: `testkit/src/slow_link.rs`, advertised as each node's `connect_address`, so replication and `pg_rewind` cross it while HAProxy reaches the nodes directly). Patroni runs with `synchronous_mode` in one run and with asynchronous replication in the other. {} clients order, pay (a fifth of the payments sent as two concurrent copies) and refund through HAProxy; every 3 s of load the Patroni leader's PostgreSQL is SIGKILLed ({} times), and its link is cut with whatever it still carried; Patroni promotes a replica (`master_start_timeout: 0`), HAProxy follows its `GET /primary`, and the next loss waits until the old leader is back as a replica (`pg_rewind`). Afterwards every request without a definite answer is resent with its key until it has one (a replay, or a first execution when the transaction never committed), every key that had one is resent once and must replay it, every event is left to be delivered, and `verify` runs.\n", args.cluster_clients(), args.failovers).unwrap();
    writeln!(md, "| replication | failovers survived | requests | acknowledged payments / refunds | acknowledged and lost | sessions / refusals lost | double charges | 5xx other than 503 | 503 (all with Retry-After) | in doubt: replayed / first execution | unavailable per failover (median, max) | events (undelivered, of lost changes) | outbox drained after the load | verify | violations | time |").unwrap();
    writeln!(
        md,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    .unwrap();
    for (r, took) in failovers {
        let (median, max) = r.outage_median_max();
        writeln!(
            md,
            "| {} | {} | {} | {} / {} | **{}** | {} / {} | **{}** | **{}** | {} ({}) | {} / {} | {median:.2} s, {max:.2} s | {} ({}, {}) | {} | {} ({:.2} s) | **{}** | {:.0} s |",
            r.replication,
            r.failovers,
            r.requests,
            r.payments_acknowledged,
            r.refunds_acknowledged,
            r.acknowledged_lost,
            r.sessions_lost,
            r.refusals_lost,
            r.double_charges,
            r.other_5xx,
            r.unavailable_503,
            if r.without_retry_after == 0 { "yes" } else { "NO" },
            r.resolved_by_replay,
            r.resolved_by_first_execution,
            r.events,
            r.events_undelivered,
            r.events_of_lost_changes,
            drained(r),
            if r.verify_holds { "holds" } else { "BROKEN" },
            r.verify_took.as_secs_f64(),
            r.violations.len(),
            took.as_secs_f64()
        )
        .unwrap();
    }
    writeln!(md, "\n\"acknowledged and lost\": payments and refunds a client received `2xx` for that the promoted standby did not have; their keys, resent, ran again (one debit in the end, with a new payment id: the shopper's first receipt names a payment that no longer exists). \"sessions / refusals lost\": the same for sessions a shop was given and for stored refusals (a `402`, a `409`) a client was given: resent, the request ran again and could be answered otherwise. \"requests\" counts every request sent during the load, copies included; the load lasts until the old leader is back, so the runs' lengths differ. With a synchronous standby a commit is answered only once the standby has its WAL, so \"acknowledged and lost\" must be 0, and is. With an asynchronous one, what the primary committed in the last ~20 ms before it died is gone. Why the checkout needs the synchronous standby is in the section below. \"outbox drained\": from the end of the load to the last event delivered; the campaign's one shop receives every event, and a shop has at most 8 deliveries in flight across instances (`CHECKOUT_WEBHOOK_PER_SHOP`), each costing two commits that, with a synchronous standby, wait the 40 ms round trip: the synchronous run's outbox can trail its load by tens of seconds (with the share at 32, in one trial run, it drained at once). \"unavailable\": from the leader's death to the first `2xx` for a request sent after it (Patroni's loop, 1 s here, notices it; a replica is promoted; HAProxy's check, every 300 ms, follows). A bounded version (one loss each way) runs in `scripts/test` (`reliability/tests/failover.rs`).\n").unwrap();
    writeln!(md, "### Why a synchronous standby\n").unwrap();
    writeln!(md, "The checkout's promise is that an acknowledged payment exists: the shopper was shown «Оплачено», the shop shipped the order. Asynchronous replication breaks that promise on every failover by whatever the last moments held, even though the books still balance and nobody is charged twice (each lost payment's key is gone with it, so its resend is a first execution: one debit). What a shop then sees is worse than a decline: a receipt for a payment id that the checkout no longer knows, and (had the webhook already gone out) an event for it. With Patroni's `synchronous_mode` (it names the synchronous standby in `synchronous_standby_names` itself, and promotes only that one), the price is one round trip to the standby per commit (40 ms here), and, with `synchronous_mode_strict` off as here, a leader that drops to asynchronous only while no replica is healthy.").unwrap();
    for (r, _) in failovers {
        for v in &r.violations {
            writeln!(md, "- VIOLATION ({}): {v}", r.replication).unwrap();
        }
    }
    std::mem::take(md)
}

fn campaign_markdown(md: &mut String, args: &Args, reports: &[(Report, Duration)]) {
    writeln!(md, "## Kills, database restarts, cut connections\n").unwrap();
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
}

const RECEIPTS_HEADING: &str =
    "## Fiscal receipts through RabbitMQ: consumers killed, the broker restarted";

/// `text` with the section under `heading` (up to the next `## ` heading) replaced by
/// `section`, or `section` appended if there was none.
fn replace_section(text: &str, heading: &str, section: &str) -> String {
    let Some(start) = text.find(heading) else {
        return text.trim_end().to_owned() + "\n\n" + section.trim_start();
    };
    let after = start + heading.len();
    let end = text[after..]
        .find("\n## ")
        .map_or(text.len(), |at| after + at + 1);
    text[..start].to_owned() + section.trim_start() + "\n" + &text[end..]
}

const HA_HEADING: &str = "## Beyond one machine: Patroni, etcd, HAProxy, a RabbitMQ cluster";

fn ha_markdown(reports: &[(FailoverReport, Duration)]) -> String {
    let mut md = String::new();
    writeln!(md, "{HA_HEADING}\n").unwrap();
    writeln!(md, "Written by `scripts/campaign` (`--only-ha` for this section alone). The deployment of `scripts/cluster`, from Debian's packages: three etcd members, three PostgreSQL 15 nodes under Patroni 3.0.2 (`synchronous_mode`, `master_start_timeout: 0`, `pg_rewind`), HAProxy 2.6 in front of the database (Patroni's `GET /primary`) and of two checkout instances, a three-node RabbitMQ 3.10.8 cluster with two `receipts` consumers. Clients order, pay (a fifth of the payments sent as two concurrent copies) and refund through HAProxy; every 3 s of load one fault strikes, in turn: the Patroni leader's PostgreSQL SIGKILLed (the synchronous standby is promoted; the next fault waits until the old leader is back as a replica), an etcd member SIGKILLed (restarted 3 s later), a RabbitMQ node SIGKILLed (and started again), a checkout instance SIGKILLed (restarted 3 s later on its port), HAProxy SIGKILLed and started again. Afterwards every request without a definite answer is resent with its key, every event is left to be delivered, `verify` runs, and the receipts are compared with the books. No forwarder of ours: every address is HAProxy's, and the nodes reach each other directly. A bounded version (one fault of each kind) runs in `scripts/test` (`reliability/tests/ha.rs`).\n").unwrap();
    writeln!(md, "| faults | requests | acknowledged payments / refunds | acknowledged and lost | double charges | 5xx other than 503 | 503 (all with Retry-After) | in doubt: replayed / first execution | events (undelivered) | outbox drained after the load | receipts match the books | verify | violations | time |").unwrap();
    writeln!(
        md,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    .unwrap();
    for (r, took) in reports {
        writeln!(
            md,
            "| {} | {} | {} / {} | **{}** | **{}** | **{}** | {} ({}) | {} / {} | {} ({}) | {} | {} | {} | **{}** | {:.0} s |",
            r.failovers,
            r.requests,
            r.payments_acknowledged,
            r.refunds_acknowledged,
            r.acknowledged_lost + r.sessions_lost + r.refusals_lost,
            r.double_charges,
            r.other_5xx,
            r.unavailable_503,
            if r.without_retry_after == 0 { "yes" } else { "NO" },
            r.resolved_by_replay,
            r.resolved_by_first_execution,
            r.events,
            r.events_undelivered,
            drained(r),
            match r.receipts {
                Some(n) if r.violations.is_empty() => format!("yes ({n})"),
                Some(n) => format!("see violations ({n})"),
                None => "—".into(),
            },
            if r.verify_holds { "holds" } else { "BROKEN" },
            r.violations.len(),
            took.as_secs_f64()
        )
        .unwrap();
    }
    writeln!(md, "\nUnavailability per fault: from the blow (the process surely dead) to the first `2xx` for a request sent after it.\n").unwrap();
    writeln!(md, "| fault | times | median | max |").unwrap();
    writeln!(md, "|---|---|---|---|").unwrap();
    for fault in Fault::ALL {
        let mut secs: Vec<f64> = reports
            .iter()
            .flat_map(|(r, _)| r.outages_by_fault.iter())
            .filter(|(name, _)| name == fault.name())
            .map(|(_, d)| d.as_secs_f64())
            .collect();
        secs.sort_by(f64::total_cmp);
        if let (Some(max), n) = (secs.last(), secs.len()) {
            writeln!(
                md,
                "| {} | {n} | {:.2} s | {max:.2} s |",
                fault.name(),
                secs[n / 2]
            )
            .unwrap();
        }
    }
    for (r, _) in reports {
        if let (Some(idle), Some(load)) = (r.idle, r.under_load) {
            writeln!(md, "\nWhat the deployment costs this 2-core, 24 GiB machine (every process the campaign started, read from `/proc`; memory as proportional set size, so PostgreSQL's shared buffers count once; the load generator itself not counted): idle, {} MiB over {} processes; under the load, at most {} MiB over {} processes, and {:.2} cores on average over the {:.0} s of load and faults.", idle.pss_bytes >> 20, idle.processes, load.peak.pss_bytes >> 20, load.peak.processes, load.cores, load.seconds).unwrap();
        }
        for v in &r.violations {
            writeln!(md, "- VIOLATION: {v}").unwrap();
        }
    }
    md
}

fn receipts_markdown(args: &Args, reports: &[(ReceiptsReport, Duration)]) -> String {
    let mut md = String::new();
    let md = &mut md;
    writeln!(md, "\n{RECEIPTS_HEADING}\n").unwrap();
    writeln!(md, "Each run: the checkout publishes its outbox to a real RabbitMQ node (Debian's 3.10.8); two `receipts` consumers share the quorum queue (prefetch 50), their receipts and inbox in one database of the checkout's kind. 8 clients pay sessions and refund a part of every fourth payment for {} s. Every 1.5 s one consumer is SIGKILLed (with the messages it holds: some committed and not yet acknowledged, since each ack follows its commit by 20 ms) and started again; every fifth time the broker is restarted instead (`rabbitmqctl stop`, then started on its data). Afterwards the campaign waits for the receipts and checks: exactly one «приход» per payment and one «возврат прихода» per refund, each of its amount, none without its payment or refund, their net sum equal to the payments minus the refunds; nothing dead-lettered; every event published and confirmed; the checkout's books (`verify`). \"redelivered\": deliveries the broker flagged so; \"duplicates absorbed\": messages whose receipt the inbox already held (a lost ack, a killed holder, a publisher's second copy): nothing changed. Counted from the consumers' logs, since a killed consumer's counters die with it. A bounded version (8 s, one broker restart) runs in `scripts/test` (`reliability/tests/receipts.rs`).\n", args.receipts_seconds).unwrap();
    writeln!(md, "| database | requests | payments | refunds | consumer kills | broker restarts | receipts | receipts == payments + refunds | redelivered | duplicates absorbed | dead-lettered | drained after the load | violations | time |").unwrap();
    writeln!(
        md,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    .unwrap();
    for (r, took) in reports {
        writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} s | **{}** | {:.0} s |",
            r.backend,
            r.requests,
            r.payments,
            r.refunds,
            r.consumer_kills,
            r.broker_restarts,
            r.receipts,
            if r.receipts as u64 == r.payments + r.refunds {
                "yes"
            } else {
                "NO"
            },
            r.redelivered,
            r.duplicates_absorbed,
            r.dead_lettered,
            r.drained_in.as_secs_f64(),
            r.violations.len(),
            took.as_secs_f64()
        )
        .unwrap();
    }
    writeln!(md, "\nThe broker is restarted, not SIGKILLed: RabbitMQ 3.10.8's single node, SIGKILLed a few seconds after the queue was declared, came back without the queue's Ra member registered (\"running pre init for 0 registered servers\") and never elected a leader for it again (\"leader not known\"), in 4 runs of 4; consumers time out on it (10 s) and retry forever. A RabbitMQ of a later line, a three-node cluster, and alerting on `receipts_consuming == 0` are what a deployment needs; see the README.").unwrap();
    for (r, _) in reports {
        for v in &r.violations {
            writeln!(md, "- VIOLATION ({}): {v}", r.backend).unwrap();
        }
    }
    std::mem::take(md)
}
