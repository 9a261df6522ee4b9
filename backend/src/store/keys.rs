//! Idempotency keys, as the protocol (`checkout-idempotency`) claims, completes and reads them:
//! the primary key (scope, key) settles concurrent claims; an expired key is taken over, and
//! swept in bounded batches.

use std::sync::LazyLock;

use checkout_idempotency::{Claim, Claimed, KeyRecord, KeyStore, KeyTx, StoredResponse, Work};

use super::row::{Arg, Row, RowError, Template};
use super::{Store, StoreError, Tx};

/// The fast path: a completed key is answered from here without taking any write lock.
pub const STORED_KEY: &str = "\
    SELECT request_hash, request_body, status, response_status, response_body, created_at \
      FROM idempotency_keys WHERE account_id = $1 AND idempotency_key = $2";

/// The claim. A live row blocks it (no row returned: replay, mismatch or in use); an expired
/// row is taken over, because an expired key is a new key. The primary key, not a check in
/// code, settles concurrent claims. Databases append their own RETURNING clause.
pub const CLAIM_KEY: &str = "\
    INSERT INTO idempotency_keys \
           (account_id, idempotency_key, claim_id, request_hash, request_body, status, created_at) \
    VALUES ($1, $2, $3, $4, $7, 'in_progress', $5) \
    ON CONFLICT (account_id, idempotency_key) DO UPDATE \
       SET claim_id = excluded.claim_id, request_hash = excluded.request_hash, \
           request_body = excluded.request_body, \
           status = 'in_progress', response_status = NULL, response_body = NULL, \
           created_at = excluded.created_at \
     WHERE idempotency_keys.created_at < $6";

/// The claim as SQLite spells it.
pub static SQLITE_CLAIM_KEY: LazyLock<String> =
    LazyLock::new(|| format!("{} RETURNING claim_id", CLAIM_KEY));

/// Once the key is ours, other locks (the account row under a burst of payments) may be waited
/// for longer than a duplicate waits for the key, but still not forever.
const WORK_LOCK_TIMEOUT: &str = "5s";

/// The claim as PostgreSQL runs it: one statement that either claims the key or reads the live
/// key that holds it, so that a replay is one round trip after `BEGIN`. `set_config` runs in
/// RETURNING, i.e. only once the key is claimed: it lifts the claim's short bound to the work
/// bound without a round trip of its own. The holder is read in the statement's snapshot: one
/// that committed while the claim waited for it is not seen, and the protocol claims again. Only
/// a live holder is read: an expired row that the claim did not take over was taken over by
/// another claim after this snapshot (it committed while this one waited), and the snapshot's
/// copy is the old request's; answering from it would replay an old answer or call the new
/// request a reuse. Then the protocol claims again, and reads the new holder afresh.
pub static POSTGRES_CLAIM_KEY: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH claimed AS ({CLAIM_KEY} \
              RETURNING claim_id, set_config('lock_timeout', '{WORK_LOCK_TIMEOUT}', true) AS lifted) \
         SELECT claim_id, lifted, NULL::text AS request_hash, NULL::text AS request_body, \
                NULL::text AS status, NULL::bigint AS response_status, \
                NULL::text AS response_body, NULL::bigint AS created_at \
           FROM claimed \
         UNION ALL \
         SELECT NULL, NULL, request_hash, request_body, status, response_status, response_body, \
                created_at \
           FROM idempotency_keys \
          WHERE account_id = $1 AND idempotency_key = $2 AND created_at >= $6 \
            AND NOT EXISTS (SELECT 1 FROM claimed)"
    )
});

pub const COMPLETE_KEY: &str = "\
    UPDATE idempotency_keys SET status = 'done', response_status = $4, response_body = $5 \
     WHERE account_id = $1 AND idempotency_key = $2 AND claim_id = $3";

/// One bounded batch of expired keys ($2 at most). Every condition is repeated outside the
/// subquery: under PostgreSQL's READ COMMITTED, a delete that waited for a row lock re-checks
/// only the outer `WHERE` against the row as committed, and a key re-claimed meanwhile (an
/// expired key is a new key) is live again. The subquery skips keys being claimed right now.
pub static SWEEP_EXPIRED_KEYS: Template = Template::new(
    "DELETE FROM idempotency_keys WHERE (account_id, idempotency_key) IN \
        (SELECT account_id, idempotency_key FROM idempotency_keys WHERE created_at < $1 \
          LIMIT $2{skip_locked}) \
       AND created_at < $1",
);

pub(super) fn read_key(row: &dyn Row) -> Result<KeyRecord, RowError> {
    let response = StoredResponse::from_columns(
        &row.text("status")?,
        row.opt_int("response_status")?,
        row.opt_text("response_body")?,
    );
    Ok(KeyRecord {
        request_hash: row.text("request_hash")?,
        request_body: row.opt_text("request_body")?,
        response,
        created_at_ms: row.int("created_at")?,
    })
}

impl Store {
    /// Deletes at most `batch` keys created before `created_before_ms`, in a transaction of its
    /// own (short, so that SQLite's one writer is never held for long); returns how many.
    pub async fn sweep_expired_keys(
        &self,
        created_before_ms: i64,
        batch: i64,
    ) -> Result<u64, StoreError> {
        self.write(move |tx| {
            Box::pin(async move {
                let statement = tx.template(&SWEEP_EXPIRED_KEYS);
                tx.execute(statement, &[Arg::Int(created_before_ms), Arg::Int(batch)])
                    .await
            })
        })
        .await
    }
}

impl KeyTx for Tx {
    type Error = StoreError;

    async fn claim(
        &mut self,
        claim: &Claim,
        expired_before_ms: i64,
    ) -> Result<Claimed, StoreError> {
        let statement = self.spelled(&SQLITE_CLAIM_KEY, &POSTGRES_CLAIM_KEY);
        let args = [
            Arg::Text(&claim.scope),
            Arg::Text(&claim.key),
            Arg::Text(&claim.claim_id),
            Arg::Text(&claim.request_hash),
            Arg::Int(claim.now_ms),
            Arg::Int(expired_before_ms),
            Arg::Text(&claim.request_body),
        ];
        let rows = self
            .fetch_all(statement, &args, |row| {
                Ok(match row.opt_text("claim_id")? {
                    Some(_) => None,
                    None => Some(read_key(row)?),
                })
            })
            .await?;
        match rows.into_iter().next() {
            Some(None) => Ok(Claimed::Ours),
            Some(Some(holder)) => Ok(Claimed::Taken(Some(holder))),
            None if matches!(self, Tx::Postgres(_)) => Ok(Claimed::Taken(None)),
            // SQLite: this transaction holds the only writer, so the holder is read as
            // committed, by a second statement that costs no round trip.
            None => Ok(Claimed::Taken(
                self.fetch_optional(
                    STORED_KEY,
                    &[Arg::Text(&claim.scope), Arg::Text(&claim.key)],
                    read_key,
                )
                .await?,
            )),
        }
    }

    /// On PostgreSQL the writes the change deferred (its event) travel in this statement.
    async fn complete(
        &mut self,
        claim: &Claim,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let args = [
            Arg::Text(&claim.scope),
            Arg::Text(&claim.key),
            Arg::Text(&claim.claim_id),
            Arg::Int(i64::from(response.status)),
            Arg::Text(&response.body),
        ];
        let done = match self {
            Tx::Postgres(tx) => tx.execute_with_deferred(COMPLETE_KEY, &args).await?,
            Tx::Sqlite(_) => self.execute(COMPLETE_KEY, &args).await?,
        };
        if done == 1 {
            Ok(())
        } else {
            Err(StoreError::LostClaim)
        }
    }
}

impl KeyStore for Store {
    type Tx = Tx;
    type Error = StoreError;

    fn reads_before_claim(&self) -> bool {
        matches!(self, Store::Sqlite(_))
    }

    async fn stored_key(&self, scope: &str, key: &str) -> Result<Option<KeyRecord>, StoreError> {
        let rows = self
            .read(STORED_KEY, &[Arg::Text(scope), Arg::Text(key)], read_key)
            .await?;
        Ok(rows.into_iter().next())
    }

    async fn transaction<W>(&self, work: W) -> Result<W::Output, W::Error>
    where
        W: Work<Tx>,
    {
        self.run(work).await
    }
}
