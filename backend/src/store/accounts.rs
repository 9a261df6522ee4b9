//! Accounts (a shopper's wallet, a shop's merchant account, the system's) and shops: who holds a
//! credential (stored only as its hash), a balance, and for a shop its name, webhook URL and
//! signing secret.

use super::row::{Arg, Row, RowError};
use super::{Store, StoreError, Tx};

pub const ACCOUNT_BY_TOKEN_HASH: &str =
    "SELECT account_id, currency, kind FROM accounts WHERE token_hash = $1";

/// An account's balance: its row plus the credits not folded into it yet.
pub const ACCOUNT: &str = "\
    SELECT a.account_id, a.currency, a.kind, \
           CAST(a.balance + COALESCE((SELECT SUM(u.amount) FROM unfolded_credits u \
                                       WHERE u.account_id = a.account_id), 0) AS BIGINT) AS balance \
      FROM accounts a WHERE a.account_id = $1";

pub const INSERT_ACCOUNT: &str = "\
    INSERT INTO accounts (account_id, token_hash, currency, balance, created_at, kind) \
    VALUES ($1, $2, $3, $4, $5, $6)";

/// A new secret key for an account (the demo shop gets one at every start).
pub const SET_TOKEN_HASH: &str = "UPDATE accounts SET token_hash = $2 WHERE account_id = $1";

pub const INSERT_SHOP: &str = "\
    INSERT INTO shops (shop_id, account_id, name, webhook_url, signing_secret, created_at, origins) \
    VALUES ($1, $2, $3, $4, $5, $6, $7)";

pub const SHOP: &str = "\
    SELECT shop_id, account_id, name, webhook_url, signing_secret, origins FROM shops \
     WHERE shop_id = $1";

pub const SHOP_OF_ACCOUNT: &str = "\
    SELECT shop_id, account_id, name, webhook_url, signing_secret, origins FROM shops \
     WHERE account_id = $1";

/// The origins whose pages may frame a shop's payment pages (a JSON array).
pub const SET_SHOP_ORIGINS: &str =
    "UPDATE shops SET origins = $2 WHERE shop_id = $1 RETURNING account_id";

/// A shop's webhook URL, set or cleared by its operator.
pub const SET_SHOP_WEBHOOK_URL: &str =
    "UPDATE shops SET webhook_url = $2 WHERE shop_id = $1 RETURNING account_id";

/// Who an account belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccountKind {
    Shopper,
    Shop,
    System,
}

impl AccountKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AccountKind::Shopper => "shopper",
            AccountKind::Shop => "shop",
            AccountKind::System => "system",
        }
    }

    fn parse(text: &str) -> Result<AccountKind, RowError> {
        match text {
            "shopper" => Ok(AccountKind::Shopper),
            "shop" => Ok(AccountKind::Shop),
            "system" => Ok(AccountKind::System),
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
}

impl AccountRow {
    fn read(row: &dyn Row) -> Result<Self, RowError> {
        Ok(AccountRow {
            account_id: row.text("account_id")?,
            kind: AccountKind::parse(&row.text("kind")?)?,
            balance: row.int("balance")?,
            currency: row.text("currency")?,
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
    /// The origins (`https://shop.example`) whose pages may frame its payment pages.
    pub origins: Vec<String>,
}

impl ShopRow {
    fn read(row: &dyn Row) -> Result<Self, RowError> {
        Ok(ShopRow {
            shop_id: row.text("shop_id")?,
            account_id: row.text("account_id")?,
            name: row.text("name")?,
            webhook_url: row.opt_text("webhook_url")?,
            signing_secret: row.text("signing_secret")?,
            origins: serde_json::from_str(&row.text("origins")?)?,
        })
    }
}

impl Store {
    /// `(account_id, currency)` of the account holding this token hash.
    /// `(account_id, currency, kind)` of the account holding this token or secret key hash.
    pub async fn account_by_token_hash(
        &self,
        token_hash: &str,
    ) -> Result<Option<(String, String, AccountKind)>, StoreError> {
        let rows = self
            .read(ACCOUNT_BY_TOKEN_HASH, &[Arg::Text(token_hash)], |row| {
                Ok((
                    row.text("account_id")?,
                    row.text("currency")?,
                    AccountKind::parse(&row.text("kind")?)?,
                ))
            })
            .await?;
        Ok(rows.into_iter().next())
    }

    pub async fn account(&self, account_id: &str) -> Result<Option<AccountRow>, StoreError> {
        let rows = self
            .read(ACCOUNT, &[Arg::Text(account_id)], AccountRow::read)
            .await?;
        Ok(rows.into_iter().next())
    }

    pub async fn shop(&self, shop_id: &str) -> Result<Option<ShopRow>, StoreError> {
        let rows = self
            .read(SHOP, &[Arg::Text(shop_id)], ShopRow::read)
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

    /// Sets (or clears) a shop's webhook URL, in a transaction of its own (see
    /// [`Tx::set_webhook_url`]).
    pub async fn set_shop_webhook_url(
        &self,
        shop_id: &str,
        webhook_url: Option<&str>,
    ) -> Result<bool, StoreError> {
        let (shop_id, webhook_url) = (shop_id.to_owned(), webhook_url.map(str::to_owned));
        self.write(move |tx| {
            Box::pin(async move { tx.set_webhook_url(&shop_id, webhook_url.as_deref()).await })
        })
        .await
    }
}

impl Tx {
    pub async fn insert_account(
        &mut self,
        account_id: &str,
        token_hash: &str,
        kind: AccountKind,
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
            ],
        )
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
            ],
        )
        .await
        .map(|_| ())
    }

    pub async fn shop(&mut self, shop_id: &str) -> Result<Option<ShopRow>, StoreError> {
        self.fetch_optional(SHOP, &[Arg::Text(shop_id)], ShopRow::read)
            .await
    }

    /// Sets (or clears) a shop's webhook URL; its undelivered events follow: to the new
    /// endpoint at once, on a fresh schedule, or kept as `no_endpoint`. `false` if there is no
    /// such shop.
    pub async fn set_webhook_url(
        &mut self,
        shop_id: &str,
        webhook_url: Option<&str>,
    ) -> Result<bool, StoreError> {
        let Some(account_id) = self
            .fetch_optional(
                SET_SHOP_WEBHOOK_URL,
                &[Arg::Text(shop_id), Arg::OptText(webhook_url)],
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
            .fetch_optional(
                SET_SHOP_ORIGINS,
                &[Arg::Text(shop_id), Arg::Text(&origins)],
                |row| row.text("account_id"),
            )
            .await?;
        Ok(set.is_some())
    }
}
