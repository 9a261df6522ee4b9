//! Accounts (a shopper's wallet, a shop's merchant account in each mode, the funding account,
//! the system's) and shops: who holds a credential (stored only as its hash), a balance, a mode
//! (test or live money), for a shop its name, webhook URL and signing secret per mode, and for a
//! live shopper the e-mail, the password's Argon2id hash and the sign-ins.

use super::row::{Arg, Row, RowError};
use super::{Store, StoreError, Tx};

/// The account holding a token or secret key, or a live shopper's unrevoked sign-in (whose age
/// and idle time the caller judges against the settings).
/// A sign-in says whether its shopper has confirmed the e-mail (one from before confirmation
/// existed may not have).
pub const ACCOUNT_BY_TOKEN_HASH: &str = "\
    SELECT a.account_id, a.currency, a.kind, a.livemode, CAST(NULL AS BIGINT) AS signed_in_at, \
           CAST(NULL AS BIGINT) AS last_used_at, CAST(1 AS BIGINT) AS confirmed, sh.origins \
      FROM accounts a LEFT JOIN shops sh ON sh.account_id = a.account_id \
     WHERE a.token_hash = $1 \
    UNION ALL \
    SELECT a.account_id, a.currency, a.kind, a.livemode, CAST(NULL AS BIGINT) AS signed_in_at, \
           CAST(NULL AS BIGINT) AS last_used_at, CAST(1 AS BIGINT) AS confirmed, sh.origins \
      FROM retired_keys r JOIN accounts a ON a.account_id = r.account_id \
           LEFT JOIN shops sh ON sh.account_id = a.account_id \
     WHERE r.token_hash = $1 AND r.expires_at > $2 \
    UNION ALL \
    SELECT a.account_id, a.currency, a.kind, a.livemode, t.created_at AS signed_in_at, \
           t.last_used_at, \
           CAST(CASE WHEN s.confirmed_at IS NULL THEN 0 ELSE 1 END AS BIGINT) AS confirmed, \
           NULL AS origins \
      FROM sign_ins t JOIN accounts a ON a.account_id = t.account_id \
           LEFT JOIN shoppers s ON s.account_id = t.account_id \
     WHERE t.token_hash = $1 AND t.revoked_at IS NULL";

/// A live shopper by e-mail (lower-cased): the account, the password's hash, and whether the
/// address is confirmed.
pub const SHOPPER_BY_EMAIL: &str = "\
    SELECT s.account_id, s.password_hash, s.confirmed_at FROM shoppers s WHERE s.email = $1";

/// A live shopper, made when the code mailed to its address is entered: confirmed from birth.
pub const INSERT_SHOPPER: &str = "\
    INSERT INTO shoppers (account_id, email, password_hash, created_at, confirmed_at) \
    VALUES ($1, $2, $3, $4, $4) ON CONFLICT (email) DO NOTHING RETURNING account_id";

/// A shopper from before confirmation proves its address: the password chosen with the code.
pub const CONFIRM_SHOPPER: &str = "\
    UPDATE shoppers SET password_hash = $2, confirmed_at = $3 \
     WHERE account_id = $1 AND confirmed_at IS NULL";

/// A recovered account's new password.
pub const SET_PASSWORD: &str = "UPDATE shoppers SET password_hash = $2 WHERE account_id = $1";

/// Every sign-in of an account ends (a recovery: whoever held one no longer does).
pub const REVOKE_ALL_SIGN_INS: &str = "\
    UPDATE sign_ins SET revoked_at = $2 WHERE account_id = $1 AND revoked_at IS NULL";

pub const INSERT_SIGN_IN: &str = "\
    INSERT INTO sign_ins (token_hash, account_id, created_at, last_used_at) VALUES ($1, $2, $3, $3)";

/// A sign-in used again: its idle time starts over (written at most once a minute per token).
pub const TOUCH_SIGN_IN: &str = "\
    UPDATE sign_ins SET last_used_at = $2 WHERE token_hash = $1 AND revoked_at IS NULL";

/// «Выйти»: the token stops working at once, on every instance (they read it each time).
pub const REVOKE_SIGN_IN: &str = "\
    UPDATE sign_ins SET revoked_at = $2 WHERE token_hash = $1 AND revoked_at IS NULL";

/// One bounded batch of sign-ins that ended (revoked, older than the absolute limit $1, or
/// unused since $2) is deleted. The outer `WHERE` checks again what the subquery picked: a
/// sign-in used meanwhile (under READ COMMITTED, re-read after the wait) is kept.
pub const SWEEP_ENDED_SIGN_INS: &str = "\
    DELETE FROM sign_ins WHERE token_hash IN \
        (SELECT token_hash FROM sign_ins \
          WHERE revoked_at IS NOT NULL OR created_at < $1 OR last_used_at < $2 LIMIT $3) \
       AND (revoked_at IS NOT NULL OR created_at < $1 OR last_used_at < $2)";

/// The one funding account of live money (made by the migration's first deposit if missing).
pub const FUNDING_ACCOUNT: &str = "acc_live_funding";

/// An account's balance: its row plus the credits not folded into it yet.
pub const ACCOUNT: &str = "\
    SELECT a.account_id, a.currency, a.kind, a.livemode, \
           (SELECT s.email FROM shoppers s WHERE s.account_id = a.account_id) AS email, \
           CAST(a.balance + COALESCE((SELECT SUM(u.amount) FROM unfolded_credits u \
                                       WHERE u.account_id = a.account_id), 0) AS BIGINT) AS balance \
      FROM accounts a WHERE a.account_id = $1";

pub const INSERT_ACCOUNT: &str = "\
    INSERT INTO accounts (account_id, token_hash, currency, balance, created_at, kind, livemode) \
    VALUES ($1, $2, $3, $4, $5, $6, $7)";

/// A new secret key for an account (the demo shop gets one at every start).
pub const SET_TOKEN_HASH: &str = "UPDATE accounts SET token_hash = $2 WHERE account_id = $1";

/// The account's key as it is now keeps working until `$2` (a roll's overlap).
pub const RETIRE_KEY: &str = "\
    INSERT INTO retired_keys (token_hash, account_id, expires_at) \
    SELECT token_hash, account_id, $2 FROM accounts WHERE account_id = $1";

pub const SWEEP_RETIRED_KEYS: &str = "DELETE FROM retired_keys WHERE expires_at <= $1";

pub const INSERT_SHOP: &str = "\
    INSERT INTO shops (shop_id, account_id, name, webhook_url, signing_secret, created_at, origins, \
                       livemode) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";

/// A shop in one mode ($2: 0 test, 1 live).
pub const SHOP: &str = "\
    SELECT shop_id, account_id, name, webhook_url, signing_secret, origins, livemode, \
           old_signing_secret, old_signing_secret_until FROM shops \
     WHERE shop_id = $1 AND livemode = $2";

pub const SHOP_OF_ACCOUNT: &str = "\
    SELECT shop_id, account_id, name, webhook_url, signing_secret, origins, livemode, \
           old_signing_secret, old_signing_secret_until FROM shops \
     WHERE account_id = $1";

/// A new signing secret for a shop in one mode; the old one keeps signing beside it until
/// `$3` (an overlap).
pub const ROLL_SIGNING_SECRET_WITH_OVERLAP: &str = "\
    UPDATE shops SET old_signing_secret = signing_secret, old_signing_secret_until = $3, \
                     signing_secret = $2 \
     WHERE shop_id = $1 AND livemode = $4";

/// A new signing secret for a shop in one mode; the old one (and any before it) signs no more.
pub const ROLL_SIGNING_SECRET: &str = "\
    UPDATE shops SET old_signing_secret = NULL, old_signing_secret_until = NULL, \
                     signing_secret = $2 \
     WHERE shop_id = $1 AND livemode = $3";

/// Old signing secrets whose overlap ended are forgotten.
pub const SWEEP_OLD_SIGNING_SECRETS: &str = "\
    UPDATE shops SET old_signing_secret = NULL, old_signing_secret_until = NULL \
     WHERE old_signing_secret_until <= $1";

/// The origins whose pages may frame a shop's payment pages (a JSON array), both modes alike.
pub const SET_SHOP_ORIGINS: &str = "UPDATE shops SET origins = $2 WHERE shop_id = $1";

/// A shop's webhook URL in one mode, set or cleared by its operator.
pub const SET_SHOP_WEBHOOK_URL: &str = "\
    UPDATE shops SET webhook_url = $2 WHERE shop_id = $1 AND livemode = $3 RETURNING account_id";

/// Who an account belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccountKind {
    Shopper,
    Shop,
    System,
    /// Where live money comes from: minus what the operator deposited.
    Funding,
}

impl AccountKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AccountKind::Shopper => "shopper",
            AccountKind::Shop => "shop",
            AccountKind::System => "system",
            AccountKind::Funding => "funding",
        }
    }

    fn parse(text: &str) -> Result<AccountKind, RowError> {
        match text {
            "shopper" => Ok(AccountKind::Shopper),
            "shop" => Ok(AccountKind::Shop),
            "system" => Ok(AccountKind::System),
            "funding" => Ok(AccountKind::Funding),
            other => Err(format!("unknown account kind {other}").into()),
        }
    }
}

#[derive(Clone, Debug)]
pub struct AccountRow {
    pub account_id: String,
    pub kind: AccountKind,
    /// With the credits not folded into it yet.
    pub balance: i64,
    pub currency: String,
    pub livemode: bool,
    /// A live shopper's.
    pub email: Option<String>,
}

impl AccountRow {
    fn read(row: &dyn Row) -> Result<Self, RowError> {
        Ok(AccountRow {
            account_id: row.text("account_id")?,
            kind: AccountKind::parse(&row.text("kind")?)?,
            balance: row.int("balance")?,
            currency: row.text("currency")?,
            livemode: row.int("livemode")? == 1,
            email: row.opt_text("email")?,
        })
    }
}

/// Who holds a token: the account, and for a live shopper's sign-in when it was made and last
/// used (the caller applies the settings' limits).
#[derive(Clone, Debug)]
pub struct TokenHolder {
    pub account_id: String,
    pub currency: String,
    pub kind: AccountKind,
    pub livemode: bool,
    pub sign_in: Option<(i64, i64)>,
    /// `false` for a live shopper that never proved its e-mail (made before codes existed).
    pub confirmed: bool,
    /// A shop's registered origins.
    pub origins: Vec<String>,
}

/// A live shopper as its sign-in finds it.
#[derive(Clone, Debug)]
pub struct ShopperLogin {
    pub account_id: String,
    pub password_hash: String,
    pub confirmed: bool,
}

impl ShopperLogin {
    fn read(row: &dyn Row) -> Result<Self, RowError> {
        Ok(ShopperLogin {
            account_id: row.text("account_id")?,
            password_hash: row.text("password_hash")?,
            confirmed: row.opt_int("confirmed_at")?.is_some(),
        })
    }
}

#[derive(Clone, Debug)]
pub struct ShopRow {
    pub shop_id: String,
    pub account_id: String,
    pub name: String,
    pub webhook_url: Option<String>,
    pub signing_secret: String,
    /// The secret rolled with an overlap, and when its overlap ends (Unix ms): until then each
    /// event is signed with it too.
    pub old_signing_secret: Option<(String, i64)>,
    /// The origins (`https://shop.example`) whose pages may frame its payment pages.
    pub origins: Vec<String>,
    /// This row's mode: the shop's test or live account.
    pub livemode: bool,
}

impl ShopRow {
    fn read(row: &dyn Row) -> Result<Self, RowError> {
        Ok(ShopRow {
            shop_id: row.text("shop_id")?,
            account_id: row.text("account_id")?,
            name: row.text("name")?,
            webhook_url: row.opt_text("webhook_url")?,
            signing_secret: row.text("signing_secret")?,
            old_signing_secret: match (
                row.opt_text("old_signing_secret")?,
                row.opt_int("old_signing_secret_until")?,
            ) {
                (Some(secret), Some(until)) => Some((secret, until)),
                _ => None,
            },
            origins: serde_json::from_str(&row.text("origins")?)?,
            livemode: row.int("livemode")? == 1,
        })
    }
}

impl Store {
    /// Who holds this token or secret key (by its hash).
    pub async fn account_by_token_hash(
        &self,
        token_hash: &str,
        now_ms: i64,
    ) -> Result<Option<TokenHolder>, StoreError> {
        let args = [Arg::Text(token_hash), Arg::Int(now_ms)];
        let rows = self
            .read(ACCOUNT_BY_TOKEN_HASH, &args, |row| {
                let sign_in = match row.opt_int("signed_in_at")? {
                    Some(at) => Some((at, row.int("last_used_at")?)),
                    None => None,
                };
                Ok(TokenHolder {
                    account_id: row.text("account_id")?,
                    currency: row.text("currency")?,
                    kind: AccountKind::parse(&row.text("kind")?)?,
                    livemode: row.int("livemode")? == 1,
                    sign_in,
                    confirmed: row.int("confirmed")? == 1,
                    origins: match row.opt_text("origins")? {
                        Some(json) => serde_json::from_str(&json)?,
                        None => Vec::new(),
                    },
                })
            })
            .await?;
        Ok(rows.into_iter().next())
    }

    /// A live shopper by e-mail.
    pub async fn shopper_by_email(&self, email: &str) -> Result<Option<ShopperLogin>, StoreError> {
        let rows = self
            .read(SHOPPER_BY_EMAIL, &[Arg::Text(email)], ShopperLogin::read)
            .await?;
        Ok(rows.into_iter().next())
    }

    /// A new sign-in of a live shopper (the token's hash), in a transaction of its own.
    pub async fn insert_sign_in(
        &self,
        token_hash: &str,
        account_id: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let (hash, account) = (token_hash.to_owned(), account_id.to_owned());
        self.write(move |tx| {
            Box::pin(async move { tx.insert_sign_in(&hash, &account, now_ms).await })
        })
        .await
    }

    /// Marks a sign-in used now (`false`: it is revoked).
    pub async fn touch_sign_in(&self, token_hash: &str, now_ms: i64) -> Result<bool, StoreError> {
        let hash = token_hash.to_owned();
        self.write(move |tx| {
            Box::pin(async move {
                tx.execute(TOUCH_SIGN_IN, &[Arg::Text(&hash), Arg::Int(now_ms)])
                    .await
                    .map(|n| n == 1)
            })
        })
        .await
    }

    /// Forgets the retired keys and old signing secrets whose overlap ended before `now_ms`;
    /// how many.
    pub async fn sweep_ended_overlaps(&self, now_ms: i64) -> Result<u64, StoreError> {
        self.write(move |tx| {
            Box::pin(async move {
                let keys = tx.execute(SWEEP_RETIRED_KEYS, &[Arg::Int(now_ms)]).await?;
                let secrets = tx
                    .execute(SWEEP_OLD_SIGNING_SECRETS, &[Arg::Int(now_ms)])
                    .await?;
                Ok(keys + secrets)
            })
        })
        .await
    }

    /// Deletes up to `batch` sign-ins that ended (see [`SWEEP_ENDED_SIGN_INS`]); how many.
    pub async fn sweep_ended_sign_ins(
        &self,
        created_before_ms: i64,
        used_before_ms: i64,
        batch: i64,
    ) -> Result<u64, StoreError> {
        self.write(move |tx| {
            Box::pin(async move {
                tx.execute(
                    SWEEP_ENDED_SIGN_INS,
                    &[
                        Arg::Int(created_before_ms),
                        Arg::Int(used_before_ms),
                        Arg::Int(batch),
                    ],
                )
                .await
            })
        })
        .await
    }

    /// Revokes a sign-in (`false`: there was none, or it was revoked already).
    pub async fn revoke_sign_in(&self, token_hash: &str, now_ms: i64) -> Result<bool, StoreError> {
        let hash = token_hash.to_owned();
        self.write(move |tx| {
            Box::pin(async move {
                tx.execute(REVOKE_SIGN_IN, &[Arg::Text(&hash), Arg::Int(now_ms)])
                    .await
                    .map(|n| n == 1)
            })
        })
        .await
    }

    pub async fn account(&self, account_id: &str) -> Result<Option<AccountRow>, StoreError> {
        let rows = self
            .read(ACCOUNT, &[Arg::Text(account_id)], AccountRow::read)
            .await?;
        Ok(rows.into_iter().next())
    }

    pub async fn shop(&self, shop_id: &str, livemode: bool) -> Result<Option<ShopRow>, StoreError> {
        let rows = self
            .read(
                SHOP,
                &[Arg::Text(shop_id), Arg::Int(livemode.into())],
                ShopRow::read,
            )
            .await?;
        Ok(rows.into_iter().next())
    }

    pub async fn shop_of_account(&self, account_id: &str) -> Result<Option<ShopRow>, StoreError> {
        let rows = self
            .read(SHOP_OF_ACCOUNT, &[Arg::Text(account_id)], ShopRow::read)
            .await?;
        Ok(rows.into_iter().next())
    }

    /// Replaces the origins whose pages may frame the shop's payment pages, in a transaction of
    /// its own; `false` if there is no such shop.
    pub async fn set_shop_origins(
        &self,
        shop_id: &str,
        origins: &[String],
    ) -> Result<bool, StoreError> {
        let (shop_id, origins) = (shop_id.to_owned(), origins.to_vec());
        self.write(move |tx| Box::pin(async move { tx.set_origins(&shop_id, &origins).await }))
            .await
    }

    /// Sets (or clears) a shop's webhook URL in one mode, in a transaction of its own (see
    /// [`Tx::set_webhook_url`]).
    pub async fn set_shop_webhook_url(
        &self,
        shop_id: &str,
        livemode: bool,
        webhook_url: Option<&str>,
    ) -> Result<bool, StoreError> {
        let (shop_id, webhook_url) = (shop_id.to_owned(), webhook_url.map(str::to_owned));
        self.write(move |tx| {
            Box::pin(async move {
                tx.set_webhook_url(&shop_id, livemode, webhook_url.as_deref())
                    .await
            })
        })
        .await
    }
}

impl Tx {
    #[allow(clippy::too_many_arguments)] // one per column of the row
    pub async fn insert_account(
        &mut self,
        account_id: &str,
        token_hash: &str,
        kind: AccountKind,
        livemode: bool,
        currency: &str,
        balance: i64,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.execute(
            INSERT_ACCOUNT,
            &[
                Arg::Text(account_id),
                Arg::Text(token_hash),
                Arg::Text(currency),
                Arg::Int(balance),
                Arg::Int(now_ms),
                Arg::Text(kind.as_str()),
                Arg::Int(livemode.into()),
            ],
        )
        .await
        .map(|_| ())
    }

    /// A new signing secret for the shop in one mode; the old one signs beside it until
    /// `old_until_ms`, if given. `false`: no such shop.
    pub async fn roll_signing_secret(
        &mut self,
        shop_id: &str,
        livemode: bool,
        secret: &str,
        old_until_ms: Option<i64>,
    ) -> Result<bool, StoreError> {
        let mode = Arg::Int(livemode.into());
        let changed = match old_until_ms {
            Some(until) => {
                let args = [Arg::Text(shop_id), Arg::Text(secret), Arg::Int(until), mode];
                self.execute(ROLL_SIGNING_SECRET_WITH_OVERLAP, &args)
                    .await?
            }
            None => {
                let args = [Arg::Text(shop_id), Arg::Text(secret), mode];
                self.execute(ROLL_SIGNING_SECRET, &args).await?
            }
        };
        Ok(changed == 1)
    }

    /// The account's present key keeps working until `until_ms` (the overlap of a roll).
    pub async fn retire_key(&mut self, account_id: &str, until_ms: i64) -> Result<(), StoreError> {
        self.execute(RETIRE_KEY, &[Arg::Text(account_id), Arg::Int(until_ms)])
            .await
            .map(|_| ())
    }

    pub async fn set_token_hash(
        &mut self,
        account_id: &str,
        token_hash: &str,
    ) -> Result<(), StoreError> {
        self.execute(
            SET_TOKEN_HASH,
            &[Arg::Text(account_id), Arg::Text(token_hash)],
        )
        .await
        .map(|_| ())
    }

    pub async fn insert_shop(&mut self, shop: &ShopRow, now_ms: i64) -> Result<(), StoreError> {
        let origins = serde_json::to_string(&shop.origins).expect("origins serialize");
        self.execute(
            INSERT_SHOP,
            &[
                Arg::Text(&shop.shop_id),
                Arg::Text(&shop.account_id),
                Arg::Text(&shop.name),
                Arg::OptText(shop.webhook_url.as_deref()),
                Arg::Text(&shop.signing_secret),
                Arg::Int(now_ms),
                Arg::Text(&origins),
                Arg::Int(shop.livemode.into()),
            ],
        )
        .await
        .map(|_| ())
    }

    pub async fn shop(
        &mut self,
        shop_id: &str,
        livemode: bool,
    ) -> Result<Option<ShopRow>, StoreError> {
        self.fetch_optional(
            SHOP,
            &[Arg::Text(shop_id), Arg::Int(livemode.into())],
            ShopRow::read,
        )
        .await
    }

    /// A live shopper by e-mail, inside a transaction.
    pub async fn shopper_by_email(
        &mut self,
        email: &str,
    ) -> Result<Option<ShopperLogin>, StoreError> {
        self.fetch_optional(SHOPPER_BY_EMAIL, &[Arg::Text(email)], ShopperLogin::read)
            .await
    }

    pub async fn insert_sign_in(
        &mut self,
        token_hash: &str,
        account_id: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.execute(
            INSERT_SIGN_IN,
            &[
                Arg::Text(token_hash),
                Arg::Text(account_id),
                Arg::Int(now_ms),
            ],
        )
        .await
        .map(|_| ())
    }

    /// A shopper from before confirmation confirms its address with the password chosen with the
    /// code; `false` if it was confirmed meanwhile.
    pub async fn confirm_shopper(
        &mut self,
        account_id: &str,
        password_hash: &str,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let confirmed = self
            .execute(
                CONFIRM_SHOPPER,
                &[
                    Arg::Text(account_id),
                    Arg::Text(password_hash),
                    Arg::Int(now_ms),
                ],
            )
            .await?;
        Ok(confirmed == 1)
    }

    pub async fn set_password(
        &mut self,
        account_id: &str,
        password_hash: &str,
    ) -> Result<(), StoreError> {
        self.execute(
            SET_PASSWORD,
            &[Arg::Text(account_id), Arg::Text(password_hash)],
        )
        .await
        .map(|_| ())
    }

    /// Ends every sign-in of the account; how many there were.
    pub async fn revoke_all_sign_ins(
        &mut self,
        account_id: &str,
        now_ms: i64,
    ) -> Result<u64, StoreError> {
        self.execute(
            REVOKE_ALL_SIGN_INS,
            &[Arg::Text(account_id), Arg::Int(now_ms)],
        )
        .await
    }

    /// A new live shopper, confirmed (its account made already); `false` if the e-mail has one.
    pub async fn insert_shopper(
        &mut self,
        account_id: &str,
        email: &str,
        password_hash: &str,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let inserted = self
            .fetch_optional(
                INSERT_SHOPPER,
                &[
                    Arg::Text(account_id),
                    Arg::Text(email),
                    Arg::Text(password_hash),
                    Arg::Int(now_ms),
                ],
                |row| row.text("account_id"),
            )
            .await?;
        Ok(inserted.is_some())
    }

    /// Sets (or clears) a shop's webhook URL in one mode; that mode's undelivered events follow:
    /// to the new endpoint at once, on a fresh schedule, or kept as `no_endpoint`. `false` if
    /// there is no such shop.
    pub async fn set_webhook_url(
        &mut self,
        shop_id: &str,
        livemode: bool,
        webhook_url: Option<&str>,
    ) -> Result<bool, StoreError> {
        let Some(account_id) = self
            .fetch_optional(
                SET_SHOP_WEBHOOK_URL,
                &[
                    Arg::Text(shop_id),
                    Arg::OptText(webhook_url),
                    Arg::Int(livemode.into()),
                ],
                |row| row.text("account_id"),
            )
            .await?
        else {
            return Ok(false);
        };
        let statement = if webhook_url.is_some() {
            self.template(&super::events::EVENTS_TO_NEW_ENDPOINT)
        } else {
            self.template(&super::events::EVENTS_WITHOUT_ENDPOINT)
        };
        self.execute(statement, &[Arg::Text(&account_id)]).await?;
        Ok(true)
    }

    /// Replaces the origins whose pages may frame the shop's payment pages; `false` if there is
    /// no such shop.
    pub async fn set_origins(
        &mut self,
        shop_id: &str,
        origins: &[String],
    ) -> Result<bool, StoreError> {
        let origins = serde_json::to_string(origins).expect("origins serialize");
        let set = self
            .execute(SET_SHOP_ORIGINS, &[Arg::Text(shop_id), Arg::Text(&origins)])
            .await?;
        Ok(set > 0)
    }
}
