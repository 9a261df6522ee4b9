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
    /// A fresh key and order every time, spread over these accounts' tokens.
    Fresh {
        path: &'a str,
        tokens: &'a [String],
        keyed: bool,
    },
    /// These already-executed (token, key, order) triples again, round robin.
    Replays {
        tokens_keys_orders: &'a [(String, String, String)],
    },
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
        } => format!(
            r#"local tokens = {{{tokens}}}
local keyed = {keyed}
function request()
  counter = counter + 1
  local id = string.format("%d-%d-%d", tid, counter, math.random(1, 2147483647))
  local headers = {{["Content-Type"] = "application/json",
                   ["Authorization"] = "Bearer " .. tokens[(counter * 7 + tid) % #tokens + 1]}}
  if keyed then headers["Idempotency-Key"] = "k-" .. id end
  return wrk.format("POST", "{path}", headers, '{{"order_id":"o-' .. id .. '","amount":1}}')
end"#,
            tokens = lua_list(tokens.iter().cloned()),
        ),
        Requests::Replays { tokens_keys_orders } => format!(
            r#"local tokens = {{{tokens}}}
local keys = {{{keys}}}
local orders = {{{orders}}}
function request()
  counter = counter + 1
  local i = (counter * 2 + tid) % #keys + 1
  local headers = {{["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. tokens[i],
                   ["Idempotency-Key"] = keys[i]}}
  return wrk.format("POST", "/api/payments", headers, '{{"order_id":"' .. orders[i] .. '","amount":1}}')
end"#,
            tokens = lua_list(tokens_keys_orders.iter().map(|t| t.0.clone())),
            keys = lua_list(tokens_keys_orders.iter().map(|t| t.1.clone())),
            orders = lua_list(tokens_keys_orders.iter().map(|t| t.2.clone())),
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

/// `wrk` with `clients` connections for `seconds`.
pub fn wrk(base: &str, requests: &Requests, clients: usize, seconds: u64, dir: &Path) -> Run {
    let script = dir.join("load.lua");
    std::fs::write(&script, lua_script(requests)).unwrap();
    let threads = clients.min(2);
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

/// pgbench running `transaction` (the server's statements, see below) with fresh keys, with the
/// server's session settings.
pub fn pgbench(
    port: u16,
    database: &str,
    transaction: &str,
    accounts: usize,
    clients: usize,
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
        .args(["-D", &format!("accounts={accounts}"), "-l", "--log-prefix"])
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

/// The server's keyed payment on PostgreSQL, as its statements reach the database (see
/// backend/src/store/): `BEGIN`, the claim, the guarded debit with its payment row and ledger row
/// (one statement), the stored answer, `COMMIT`: 5 statements. The claim's lock timeout is the
/// session's (`PGOPTIONS`), as the server sets it once per connection.
pub const PAYMENT_TRANSACTION: &str = r#"\set n random(1, 1000000000000)
\set a random(1, :accounts)
BEGIN;
INSERT INTO idempotency_keys (account_id, idempotency_key, claim_id, request_hash, request_body, status, created_at) VALUES ('bench-' || :a, 'k-' || :client_id || '-' || :n, 'c-' || :client_id || '-' || :n, '5f2b9c0d6a7e4c3b8a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b', '{"amount":1,"order_id":"o-' || :client_id || '-' || :n || '"}', 'in_progress', 1764000000000) ON CONFLICT (account_id, idempotency_key) DO UPDATE SET claim_id = excluded.claim_id, request_hash = excluded.request_hash, request_body = excluded.request_body, status = 'in_progress', response_status = NULL, response_body = NULL, created_at = excluded.created_at WHERE idempotency_keys.created_at < 1763900000000 RETURNING claim_id, set_config('lock_timeout', '5s', true);
WITH debit AS (UPDATE accounts SET balance = balance - 1 WHERE account_id = 'bench-' || :a AND balance >= 1 AND NOT EXISTS (SELECT 1 FROM payments WHERE account_id = 'bench-' || :a AND order_id = 'o-' || :client_id || '-' || :n) RETURNING balance), payment AS (INSERT INTO payments (payment_id, account_id, order_id, amount, currency, balance_after, idempotency_key, created_at) SELECT 'pay-' || :client_id || '-' || :n, 'bench-' || :a, 'o-' || :client_id || '-' || :n, 1, 'RUB', balance, 'k-' || :client_id || '-' || :n, 1764000000000 FROM debit ON CONFLICT (account_id, order_id) DO NOTHING RETURNING payment_id), entry AS (INSERT INTO ledger (account_id, amount, kind, idempotency_key, claim_id, payment_id, refund_id, created_at) SELECT 'bench-' || :a, -1, 'payment', 'k-' || :client_id || '-' || :n, 'c-' || :client_id || '-' || :n, payment_id, NULL, 1764000000000 FROM payment) SELECT (SELECT balance FROM debit), (SELECT COUNT(*) FROM payment);
UPDATE idempotency_keys SET status = 'done', response_status = 201, response_body = '{"payment_id":"pay_9205d15e13e544e480ae12c72f73a5b5","order_id":"o-1-123456789","amount":1,"currency":"RUB","status":"succeeded","balance":99999,"created_at":"2026-12-02T14:01:20.331Z"}' WHERE account_id = 'bench-' || :a AND idempotency_key = 'k-' || :client_id || '-' || :n AND claim_id = 'c-' || :client_id || '-' || :n;
COMMIT;
"#;

/// The same payment without any key: `BEGIN`, the one-statement charge, `COMMIT`: 3 statements,
/// as `POST /api/bench/unkeyed-payments` sends them.
pub const UNKEYED_TRANSACTION: &str = r#"\set n random(1, 1000000000000)
\set a random(1, :accounts)
BEGIN;
WITH debit AS (UPDATE accounts SET balance = balance - 1 WHERE account_id = 'bench-' || :a AND balance >= 1 AND NOT EXISTS (SELECT 1 FROM payments WHERE account_id = 'bench-' || :a AND order_id = 'o-' || :client_id || '-' || :n) RETURNING balance), payment AS (INSERT INTO payments (payment_id, account_id, order_id, amount, currency, balance_after, idempotency_key, created_at) SELECT 'pay-' || :client_id || '-' || :n, 'bench-' || :a, 'o-' || :client_id || '-' || :n, 1, 'RUB', balance, 'unkeyed', 1764000000000 FROM debit ON CONFLICT (account_id, order_id) DO NOTHING RETURNING payment_id), entry AS (INSERT INTO ledger (account_id, amount, kind, idempotency_key, claim_id, payment_id, refund_id, created_at) SELECT 'bench-' || :a, -1, 'payment', 'unkeyed', 'c-' || :client_id || '-' || :n, payment_id, NULL, 1764000000000 FROM payment) SELECT (SELECT balance FROM debit), (SELECT COUNT(*) FROM payment);
COMMIT;
"#;

/// A composed variant, measured at the database only: the claim and the charge as one statement
/// (the charge guarded on the claim having taken), 4 statements in all. Not what the server
/// sends; see BENCHMARKS.md for why.
pub const COMPOSED_TRANSACTION: &str = r#"\set n random(1, 1000000000000)
\set a random(1, :accounts)
BEGIN;
WITH claim AS (INSERT INTO idempotency_keys (account_id, idempotency_key, claim_id, request_hash, request_body, status, created_at) VALUES ('bench-' || :a, 'k-' || :client_id || '-' || :n, 'c-' || :client_id || '-' || :n, '5f2b9c0d6a7e4c3b8a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b', '{"amount":1,"order_id":"o-' || :client_id || '-' || :n || '"}', 'in_progress', 1764000000000) ON CONFLICT (account_id, idempotency_key) DO UPDATE SET claim_id = excluded.claim_id, request_hash = excluded.request_hash, request_body = excluded.request_body, status = 'in_progress', response_status = NULL, response_body = NULL, created_at = excluded.created_at WHERE idempotency_keys.created_at < 1763900000000 RETURNING claim_id, set_config('lock_timeout', '5s', true) AS lifted), debit AS (UPDATE accounts SET balance = balance - 1 WHERE EXISTS (SELECT 1 FROM claim) AND account_id = 'bench-' || :a AND balance >= 1 AND NOT EXISTS (SELECT 1 FROM payments WHERE account_id = 'bench-' || :a AND order_id = 'o-' || :client_id || '-' || :n) RETURNING balance), payment AS (INSERT INTO payments (payment_id, account_id, order_id, amount, currency, balance_after, idempotency_key, created_at) SELECT 'pay-' || :client_id || '-' || :n, 'bench-' || :a, 'o-' || :client_id || '-' || :n, 1, 'RUB', balance, 'k-' || :client_id || '-' || :n, 1764000000000 FROM debit ON CONFLICT (account_id, order_id) DO NOTHING RETURNING payment_id), entry AS (INSERT INTO ledger (account_id, amount, kind, idempotency_key, claim_id, payment_id, refund_id, created_at) SELECT 'bench-' || :a, -1, 'payment', 'k-' || :client_id || '-' || :n, 'c-' || :client_id || '-' || :n, payment_id, NULL, 1764000000000 FROM payment) SELECT (SELECT balance FROM debit), (SELECT COUNT(*) FROM payment);
UPDATE idempotency_keys SET status = 'done', response_status = 201, response_body = '{"payment_id":"pay_9205d15e13e544e480ae12c72f73a5b5","order_id":"o-1-123456789","amount":1,"currency":"RUB","status":"succeeded","balance":99999,"created_at":"2026-12-02T14:01:20.331Z"}' WHERE account_id = 'bench-' || :a AND idempotency_key = 'k-' || :client_id || '-' || :n AND claim_id = 'c-' || :client_id || '-' || :n;
COMMIT;
"#;
