//! What a run needs before it starts, made straight in the database so that making it is not
//! measured: rich shoppers, 64 shops, and open checkout sessions numbered so that wrk's Lua and
//! pgbench can name the next one without asking anybody.

use checkout_testkit::{Backend, Server, TestDb};

/// Shops the "many shops" workloads spread over (`shop-0` … `shop-63`).
pub const SHOPS: u64 = 64;

/// Sessions `first .. first + count`, open, 1 kopeck each: all to `shop-0`, or session `n` to
/// `shop-(n mod 64)`.
pub async fn sessions(url: &str, backend: Backend, first: u64, count: u64, one_shop: bool) {
    let last = first + count - 1;
    let shop = if one_shop {
        "'shop-0'".to_owned()
    } else {
        format!("'shop-' || (n % {SHOPS})")
    };
    let sql = match backend {
        Backend::Postgres | Backend::PgBouncer => format!(
            "INSERT INTO checkout_sessions (session_id, shop_account_id, order_id, amount, currency, \
                                            items, status, expires_at, created_at) \
             SELECT 'cs_' || lpad(to_hex(n), 32, '0'), {shop}, 'o-' || n, 1, 'RUB', '[]', 'open', \
                    9999999999999, 0 FROM generate_series({first}::bigint, {last}::bigint) n"
        ),
        Backend::Sqlite => format!(
            "WITH RECURSIVE seq(n) AS (SELECT {first} UNION ALL SELECT n + 1 FROM seq WHERE n < {last}) \
             INSERT INTO checkout_sessions (session_id, shop_account_id, order_id, amount, currency, \
                                            items, status, expires_at, created_at) \
             SELECT 'cs_' || printf('%032x', n), {shop}, 'o-' || n, 1, 'RUB', '[]', 'open', \
                    9999999999999, 0 FROM seq"
        ),
    };
    execute(url, &sql).await;
    // A table that grew by a hundred thousand rows a moment ago has statistics that say it is
    // small, and a plan may then pick the open sessions' index (`expires_at`) over the primary
    // key and scan every open session per payment. A live table grows slowly and autovacuum
    // keeps its statistics current; so does this, before measuring.
    if backend == Backend::Postgres {
        execute(url, "ANALYZE checkout_sessions").await;
    }
}

/// The 64 shops, with their accounts (no secret keys: nobody logs in as them here).
pub async fn shops(url: &str) {
    for i in 0..SHOPS {
        execute(
            url,
            &format!(
                "INSERT INTO accounts (account_id, token_hash, currency, balance, created_at, kind) \
                 VALUES ('shop-{i}', 'no token: bench shop {i}', 'RUB', 0, 0, 'shop')"
            ),
        )
        .await;
        execute(
            url,
            &format!(
                "INSERT INTO shops (shop_id, livemode, account_id, name, signing_secret, created_at) \
                 VALUES ('shop_bench_{i}', 0, 'shop-{i}', 'Bench shop {i}', 'whsec_bench', 0)"
            ),
        )
        .await;
    }
}

/// Demo shoppers, each given enough money for any run (with its opening entry in the ledger).
pub async fn shoppers(server: &Server, db: &TestDb, n: usize) -> Vec<String> {
    let mut tokens = Vec::new();
    for _ in 0..n {
        tokens.push(server.api().shopper().await.token.unwrap());
    }
    db.execute("UPDATE accounts SET balance = balance + 100000000000 WHERE kind = 'shopper'")
        .await;
    db.execute(
        "INSERT INTO ledger (account_id, amount, kind, created_at) \
         SELECT account_id, 100000000000, 'opening', 0 FROM accounts WHERE kind = 'shopper'",
    )
    .await;
    tokens
}

pub async fn execute(url: &str, sql: &str) {
    let mut conn: sqlx::AnyConnection = sqlx::Connection::connect(url).await.unwrap();
    sqlx::raw_sql(sql).execute(&mut conn).await.unwrap();
}

/// A database with the server's schema, rich shoppers `bench-1..` and the shops, for pgbench.
pub async fn limit_database(
    cluster: &checkout_testkit::postgres::Cluster,
    accounts: usize,
) -> String {
    let url = cluster.create_database().await;
    for migration in checkout_backend::store::postgres_migrations() {
        execute(&url, migration).await;
    }
    execute(
        &url,
        &format!(
            "INSERT INTO accounts (account_id, token_hash, currency, balance, created_at) \
             SELECT 'bench-' || i, md5(i::text), 'RUB', 1000000000000, 0 \
               FROM generate_series(1, {accounts}) i"
        ),
    )
    .await;
    shops(&url).await;
    url
}
