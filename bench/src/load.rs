//! Load from real generators: wrk (with a Lua `request()` that makes a fresh key and order per
//! request) against the service, pgbench against the database.

use std::path::Path;
use std::process::Command;

/// One measured run.
#[derive(Clone, Debug)]
pub struct Run {
    /// Requests answered without an error (`2xx`).
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
local threads = {{}}
function setup(thread) thread:set("tid", next_tid); next_tid = next_tid + 1; table.insert(threads, thread) end
function init(args) counter = 0; statuses = {{}}; math.randomseed(os.time() * 1000 + tid) end
{request}
function response(status, headers, body)
  if status >= 300 then
    local s = tostring(status)
    if statuses[s] == nil then statuses[s] = body end
  end
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %d %d %d %f %f %d\n", summary.requests, summary.duration,
    e.connect + e.read + e.write + e.status + e.timeout, latency:percentile(50), latency:percentile(99),
    e.status))
  for _, thread in ipairs(threads) do
    for status, body in pairs(thread:get("statuses")) do
      io.write(string.format("STATUS %s %s\n", status, body))
    end
  end
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
    // The first answer of each unexpected status, as the service wrote it.
    for said in text.lines().filter(|l| l.starts_with("STATUS ")) {
        eprintln!("wrk saw {said}");
    }
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap())
        .collect();
    Run {
        // Answered, and not with an error: a fast 500 is not throughput.
        requests: (f[0] - f[5]) as u64,
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
