//! Load from real generators: wrk (with a Lua `request()` that makes a fresh key and order per
//! request) against the service, pgbench against the database.

use std::path::Path;
use std::process::Command;

/// One measured run.
#[derive(Clone, Debug)]
pub struct Run {
    pub requests: u64,
    pub seconds: f64,
    pub errors: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

impl Run {
    pub fn throughput(&self) -> f64 {
        self.requests as f64 / self.seconds
    }
}

/// What each wrk request sends.
pub enum Requests<'a> {
    /// A fresh key and a fresh open session every time (sessions made in setup, numbered from
    /// `first` on, `span` per wrk thread: see [`session_id`]), spread over these shoppers.
    Fresh {
        path: &'a str,
        tokens: &'a [String],
        keyed: bool,
        first: u64,
        span: u64,
    },
    /// These already-executed (token, key, session) triples again, round robin.
    Replays {
        tokens_keys_sessions: &'a [(String, String, String)],
    },
}

/// The id of bench session `n`: a well-formed session id (`cs_` and 32 hex digits) that the
/// setup's SQL and wrk's Lua both compute.
pub fn session_id(n: u64) -> String {
    format!("cs_{n:032x}")
}

fn lua_list(items: impl Iterator<Item = String>) -> String {
    items
        .map(|s| format!("{s:?}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn lua_script(requests: &Requests) -> String {
    let request = match requests {
        Requests::Fresh {
            path,
            tokens,
            keyed,
            first,
            span,
        } => format!(
            r#"local tokens = {{{tokens}}}
local keyed = {keyed}
function request()
  counter = counter + 1
  local n = {first} + (tid - 1) * {span} + counter - 1
  local headers = {{["Content-Type"] = "application/json",
                   ["Authorization"] = "Bearer " .. tokens[(counter * 7 + tid) % #tokens + 1]}}
  if keyed then headers["Idempotency-Key"] = string.format("k-%d-%d", n, math.random(1, 2147483647)) end
  return wrk.format("POST", "{path}", headers, string.format('{{"checkout_session_id":"cs_%032x"}}', n))
end"#,
            tokens = lua_list(tokens.iter().cloned()),
        ),
        Requests::Replays {
            tokens_keys_sessions,
        } => format!(
            r#"local tokens = {{{tokens}}}
local keys = {{{keys}}}
local sessions = {{{sessions}}}
function request()
  counter = counter + 1
  local i = (counter * 2 + tid) % #keys + 1
  local headers = {{["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. tokens[i],
                   ["Idempotency-Key"] = keys[i]}}
  return wrk.format("POST", "/api/payments", headers, '{{"checkout_session_id":"' .. sessions[i] .. '"}}')
end"#,
            tokens = lua_list(tokens_keys_sessions.iter().map(|t| t.0.clone())),
            keys = lua_list(tokens_keys_sessions.iter().map(|t| t.1.clone())),
            sessions = lua_list(tokens_keys_sessions.iter().map(|t| t.2.clone())),
        ),
    };
    format!(
        r#"local next_tid = 1
function setup(thread) thread:set("tid", next_tid); next_tid = next_tid + 1 end
function init(args) counter = 0; math.randomseed(os.time() * 1000 + tid) end
{request}
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %d %d %d %f %f\n", summary.requests, summary.duration,
    e.connect + e.read + e.write + e.status + e.timeout, latency:percentile(50), latency:percentile(99)))
end
"#
    )
}

/// wrk's threads for this many clients (each thread takes its own span of sessions).
pub fn wrk_threads(clients: usize) -> usize {
    clients.min(2)
}

/// `wrk` with `clients` connections for `seconds`.
pub fn wrk(base: &str, requests: &Requests, clients: usize, seconds: u64, dir: &Path) -> Run {
    let script = dir.join("load.lua");
    std::fs::write(&script, lua_script(requests)).unwrap();
    let threads = wrk_threads(clients);
    let out = Command::new("wrk")
        .args([
            "-t",
            &threads.to_string(),
            "-c",
            &clients.to_string(),
            "-d",
            &format!("{seconds}s"),
        ])
        .args(["--timeout", "10s", "-s"])
        .arg(&script)
        .arg(base)
        .output()
        .expect("wrk runs (the bench command installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("RESULT "))
        .unwrap_or_else(|| panic!("wrk said: {text}"));
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap())
        .collect();
    Run {
        requests: f[0] as u64,
        seconds: f[1] / 1e6,
        errors: f[2] as u64,
        p50_ms: f[3] / 1e3,
        p99_ms: f[4] / 1e3,
    }
}

/// pgbench running `transaction` (the server's statements, see below) on sessions made in
/// setup (`span` per client from `first` on), with the server's session settings.
#[allow(clippy::too_many_arguments)]
pub fn pgbench(
    port: u16,
    database: &str,
    transaction: &str,
    accounts: usize,
    clients: usize,
    (first, span): (u64, u64),
    seconds: u64,
    dir: &Path,
) -> Run {
    let script = dir.join("transaction.sql");
    std::fs::write(&script, transaction).unwrap();
    let logs = dir.join(format!("pgbench-{clients}"));
    std::fs::create_dir_all(&logs).unwrap();
    let out = Command::new("/usr/lib/postgresql/15/bin/pgbench")
        .env("PGOPTIONS", "-c lock_timeout=500ms")
        .args(["-n", "-M", "prepared", "-f"])
        .arg(&script)
        .args([
            "-c",
            &clients.to_string(),
            "-j",
            &clients.min(2).to_string(),
            "-T",
            &seconds.to_string(),
        ])
        .args(["-D", &format!("accounts={accounts}")])
        .args([
            "-D",
            &format!("first={first}"),
            "-D",
            &format!("span={span}"),
            "-D",
            "i=0",
        ])
        .args(["-l", "--log-prefix"])
        .arg(logs.join("tx"))
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "postgres",
            database,
        ])
        .output()
        .expect("pgbench runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "pgbench failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let field = |prefix: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("pgbench said: {text}"));
        line.split(['=', ':'])
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let processed = field("number of transactions actually processed");
    let failed = text
        .lines()
        .find(|l| l.starts_with("number of failed transactions"))
        .map_or(0.0, |_| field("number of failed transactions"));
    // Per-transaction latencies (µs, third column) from pgbench's logs.
    let mut histogram = hdrhistogram::Histogram::<u64>::new(3).unwrap();
    for entry in std::fs::read_dir(&logs).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for line in text.lines() {
            if let Some(us) = line
                .split_whitespace()
                .nth(2)
                .and_then(|v| v.parse::<u64>().ok())
            {
                histogram.record(us).unwrap();
            }
        }
    }
    std::fs::remove_dir_all(&logs).unwrap();
    Run {
        requests: processed as u64,
        seconds: seconds as f64,
        errors: failed as u64,
        p50_ms: histogram.value_at_quantile(0.5) as f64 / 1e3,
        p99_ms: histogram.value_at_quantile(0.99) as f64 / 1e3,
    }
}

/// The server's keyed payment of a session on PostgreSQL, as its statements reach the database
/// (backend/src/store/sql.rs, postgres.rs): `BEGIN`, the claim (whose `RETURNING` lifts the lock
/// timeout), the session taken, the shopper's guarded debit, the payment row, the transfer's two
/// ledger rows, the shop's waiting credit, the payment's event in the outbox, the stored answer,
/// `COMMIT`: 11 statements. Session
/// `:n` is this client's next one; its shop is `shop-(n mod 64)`, as the setup made it.
pub const PAYMENT_TRANSACTION: &str = r#"\set i :i + 1
\set n :first + :client_id * :span + :i - 1
\set a random(1, :accounts)
\set shop :n % 64
BEGIN;
INSERT INTO idempotency_keys (account_id, idempotency_key, claim_id, request_hash, request_body, status, created_at) VALUES ('bench-' || :a, 'k-' || :n, 'c-' || :n, '5f2b9c0d6a7e4c3b8a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b', '{"checkout_session_id":"cs_' || lpad(to_hex(:n::bigint), 32, '0') || '"}', 'in_progress', 1764000000000) ON CONFLICT (account_id, idempotency_key) DO UPDATE SET claim_id = excluded.claim_id, request_hash = excluded.request_hash, request_body = excluded.request_body, status = 'in_progress', response_status = NULL, response_body = NULL, created_at = excluded.created_at WHERE idempotency_keys.created_at < 1763900000000 RETURNING claim_id, set_config('lock_timeout', '5s', true);
UPDATE checkout_sessions SET status = 'paid', payment_id = 'pay-' || :n WHERE session_id = 'cs_' || lpad(to_hex(:n::bigint), 32, '0') AND status = 'open' AND expires_at > 1764000000000 RETURNING shop_account_id, order_id, amount, currency;
UPDATE accounts SET balance = balance - 1 WHERE account_id = 'bench-' || :a AND balance >= 1 RETURNING balance;
INSERT INTO payments (payment_id, checkout_session_id, shopper_account_id, shop_account_id, order_id, amount, currency, balance_after, idempotency_key, created_at) VALUES ('pay-' || :n, 'cs_' || lpad(to_hex(:n::bigint), 32, '0'), 'bench-' || :a, 'shop-' || :shop, 'o-' || :n, 1, 'RUB', 0, 'k-' || :n, 1764000000000) ON CONFLICT (checkout_session_id) DO NOTHING;
INSERT INTO ledger (account_id, amount, kind, idempotency_key, claim_id, payment_id, refund_id, created_at) VALUES ('bench-' || :a, -1, 'payment', 'k-' || :n, 'c-' || :n, 'pay-' || :n, NULL, 1764000000000);
INSERT INTO ledger (account_id, amount, kind, idempotency_key, claim_id, payment_id, refund_id, created_at) VALUES ('shop-' || :shop, 1, 'payment', NULL, NULL, 'pay-' || :n, NULL, 1764000000000);
INSERT INTO unfolded_credits (payment_id, account_id, amount) VALUES ('pay-' || :n, 'shop-' || :shop, 1);
INSERT INTO webhook_events (event_id, shop_account_id, type, subject_id, body, created_at, next_attempt_at, status) VALUES ('evt-' || :n, 'shop-' || :shop, 'payment.succeeded', 'pay-' || :n, '{"type":"payment.succeeded","timestamp":"2026-12-02T14:01:20.331Z","data":{"payment_id":"pay_019ae2f1c3b87d2a9c4e5f60718293a4","checkout_session_id":"cs_4f0c2b9e8d7a6b5c4d3e2f1a0b9c8d7e","order_id":"ORD-1A2B3C4D","amount":1,"currency":"RUB","status":"succeeded","created_at":"2026-12-02T14:01:20.331Z"}}', 1764000000000, 1764000000000, CASE WHEN (SELECT webhook_url FROM shops WHERE account_id = 'shop-' || :shop) IS NULL THEN 'no_endpoint' ELSE 'pending' END);
UPDATE idempotency_keys SET status = 'done', response_status = 201, response_body = '{"payment_id":"pay_019ae2f1c3b87d2a9c4e5f60718293a4","checkout_session_id":"cs_4f0c2b9e8d7a6b5c4d3e2f1a0b9c8d7e","order_id":"ORD-1A2B3C4D","amount":1,"currency":"RUB","status":"succeeded","balance":99999,"created_at":"2026-12-02T14:01:20.331Z"}' WHERE account_id = 'bench-' || :a AND idempotency_key = 'k-' || :n AND claim_id = 'c-' || :n;
COMMIT;
"#;

/// The same payment without any key (`POST /api/bench/unkeyed-payments`): `BEGIN`, the six
/// statements of the change (the event among them), `COMMIT`: 9 statements.
pub const UNKEYED_TRANSACTION: &str = r#"\set i :i + 1
\set n :first + :client_id * :span + :i - 1
\set a random(1, :accounts)
\set shop :n % 64
BEGIN;
UPDATE checkout_sessions SET status = 'paid', payment_id = 'pay-' || :n WHERE session_id = 'cs_' || lpad(to_hex(:n::bigint), 32, '0') AND status = 'open' AND expires_at > 1764000000000 RETURNING shop_account_id, order_id, amount, currency;
UPDATE accounts SET balance = balance - 1 WHERE account_id = 'bench-' || :a AND balance >= 1 RETURNING balance;
INSERT INTO payments (payment_id, checkout_session_id, shopper_account_id, shop_account_id, order_id, amount, currency, balance_after, idempotency_key, created_at) VALUES ('pay-' || :n, 'cs_' || lpad(to_hex(:n::bigint), 32, '0'), 'bench-' || :a, 'shop-' || :shop, 'o-' || :n, 1, 'RUB', 0, 'unkeyed-' || :n, 1764000000000) ON CONFLICT (checkout_session_id) DO NOTHING;
INSERT INTO ledger (account_id, amount, kind, idempotency_key, claim_id, payment_id, refund_id, created_at) VALUES ('bench-' || :a, -1, 'payment', 'unkeyed-' || :n, 'c-' || :n, 'pay-' || :n, NULL, 1764000000000);
INSERT INTO ledger (account_id, amount, kind, idempotency_key, claim_id, payment_id, refund_id, created_at) VALUES ('shop-' || :shop, 1, 'payment', NULL, NULL, 'pay-' || :n, NULL, 1764000000000);
INSERT INTO unfolded_credits (payment_id, account_id, amount) VALUES ('pay-' || :n, 'shop-' || :shop, 1);
INSERT INTO webhook_events (event_id, shop_account_id, type, subject_id, body, created_at, next_attempt_at, status) VALUES ('evt-' || :n, 'shop-' || :shop, 'payment.succeeded', 'pay-' || :n, '{"type":"payment.succeeded","timestamp":"2026-12-02T14:01:20.331Z","data":{"payment_id":"pay_019ae2f1c3b87d2a9c4e5f60718293a4","checkout_session_id":"cs_4f0c2b9e8d7a6b5c4d3e2f1a0b9c8d7e","order_id":"ORD-1A2B3C4D","amount":1,"currency":"RUB","status":"succeeded","created_at":"2026-12-02T14:01:20.331Z"}}', 1764000000000, 1764000000000, CASE WHEN (SELECT webhook_url FROM shops WHERE account_id = 'shop-' || :shop) IS NULL THEN 'no_endpoint' ELSE 'pending' END);
COMMIT;
"#;
