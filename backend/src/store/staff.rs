//! A shop's staff in its dashboard: the members and their roles, the invitations mailed to
//! them, their sign-ins (each a cookie's token, kept as its hash) and the audit log of what they
//! did.

use super::row::{Arg, Row, RowError};
use super::{Store, StoreError};

pub const INSERT_INVITE: &str = "\
    INSERT INTO staff_invites (token_hash, shop_id, email, role, invited_by, created_at, \
                               expires_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7)";

/// An invitation is used once: only the request whose update finds it unused and unexpired
/// goes on (two at once: one).
pub const TAKE_INVITE: &str = "\
    UPDATE staff_invites SET accepted_at = $2 \
     WHERE token_hash = $1 AND accepted_at IS NULL AND expires_at > $2 \
    RETURNING shop_id, email, role";

pub const OPEN_INVITE: &str = "\
    SELECT shop_id, email, role FROM staff_invites \
     WHERE token_hash = $1 AND accepted_at IS NULL AND expires_at > $2";

/// An accepted invitation makes the member, or gives a member again invited a new role and
/// password.
pub const PUT_MEMBER: &str = "\
    INSERT INTO staff (staff_id, shop_id, email, role, password_hash, created_at) \
    VALUES ($1, $2, $3, $4, $5, $6) \
    ON CONFLICT (shop_id, email) DO UPDATE SET role = excluded.role, \
        password_hash = excluded.password_hash \
    RETURNING staff_id";

macro_rules! member_columns {
    () => {
        "st.staff_id, st.shop_id, st.email, st.role, st.created_at, \
         (SELECT name FROM shops s WHERE s.shop_id = st.shop_id AND s.livemode = 0) AS shop_name"
    };
}

/// The memberships of an address, oldest first, with their password hashes.
pub const MEMBERS_BY_EMAIL: &str = concat!(
    "SELECT ",
    member_columns!(),
    ", st.password_hash FROM staff st \
      WHERE st.email = $1 AND st.password_hash IS NOT NULL ORDER BY st.created_at, st.staff_id"
);

pub const INSERT_SIGN_IN: &str = "\
    INSERT INTO staff_sign_ins (token_hash, staff_id, created_at, last_used_at) \
    VALUES ($1, $2, $3, $3)";

/// The member a sign-in's token belongs to, with the sign-in's times.
pub const MEMBER_BY_SIGN_IN: &str = concat!(
    "SELECT ",
    member_columns!(),
    ", si.created_at AS signed_in_at, si.last_used_at FROM staff_sign_ins si \
       JOIN staff st ON st.staff_id = si.staff_id \
      WHERE si.token_hash = $1 AND si.revoked_at IS NULL"
);

pub const TOUCH_SIGN_IN: &str = "\
    UPDATE staff_sign_ins SET last_used_at = $2 WHERE token_hash = $1 AND revoked_at IS NULL";

pub const REVOKE_SIGN_IN: &str = "\
    UPDATE staff_sign_ins SET revoked_at = $2 WHERE token_hash = $1 AND revoked_at IS NULL";

/// A member removed, or given another role, is signed out everywhere.
pub const REVOKE_MEMBER_SIGN_INS: &str = "\
    UPDATE staff_sign_ins SET revoked_at = $2 WHERE staff_id = $1 AND revoked_at IS NULL";

pub const MEMBERS_OF_SHOP: &str = concat!(
    "SELECT ",
    member_columns!(),
    " FROM staff st WHERE st.shop_id = $1 ORDER BY st.created_at, st.staff_id"
);

pub const SET_ROLE: &str = "UPDATE staff SET role = $3 WHERE staff_id = $1 AND shop_id = $2";

pub const REMOVE_MEMBER: &str = "DELETE FROM staff WHERE staff_id = $1 AND shop_id = $2";

pub const OWNERS_OF_SHOP: &str =
    "SELECT email FROM staff WHERE shop_id = $1 AND role = 'owner' ORDER BY created_at";

pub const OPEN_INVITES_OF_SHOP: &str = "\
    SELECT email, role, expires_at FROM staff_invites \
     WHERE shop_id = $1 AND accepted_at IS NULL AND expires_at > $2 ORDER BY created_at";

pub const INSERT_AUDIT: &str = "\
    INSERT INTO audit_log (shop_id, staff_id, email, action, subject, at) \
    VALUES ($1, $2, $3, $4, $5, $6)";

/// A shop's audit log, newest first, at most $2 entries.
pub const AUDIT_OF_SHOP: &str = "\
    SELECT entry_id, email, action, subject, at FROM audit_log \
     WHERE shop_id = $1 ORDER BY entry_id DESC LIMIT $2";

/// A member of a shop's staff.
#[derive(Clone, Debug)]
pub struct MemberRow {
    pub staff_id: String,
    pub shop_id: String,
    pub shop_name: String,
    pub email: String,
    pub role: String,
    pub created_at: i64,
}

impl MemberRow {
    fn read(row: &dyn Row) -> Result<Self, RowError> {
        Ok(MemberRow {
            staff_id: row.text("staff_id")?,
            shop_id: row.text("shop_id")?,
            shop_name: row.opt_text("shop_name")?.unwrap_or_default(),
            email: row.text("email")?,
            role: row.text("role")?,
            created_at: row.int("created_at")?,
        })
    }
}

/// An invitation not yet used.
#[derive(Clone, Debug)]
pub struct InviteRow {
    pub shop_id: String,
    pub email: String,
    pub role: String,
}

impl InviteRow {
    fn read(row: &dyn Row) -> Result<Self, RowError> {
        Ok(InviteRow {
            shop_id: row.text("shop_id")?,
            email: row.text("email")?,
            role: row.text("role")?,
        })
    }
}

/// An invitation to keep.
pub struct NewInvite<'a> {
    pub token_hash: &'a str,
    pub shop_id: &'a str,
    pub email: &'a str,
    pub role: &'a str,
    pub invited_by: Option<&'a str>,
    pub created_at: i64,
    pub expires_at: i64,
}

/// One line of the audit log.
#[derive(Clone, Debug)]
pub struct AuditRow {
    pub entry_id: i64,
    pub email: String,
    pub action: String,
    pub subject: String,
    pub at: i64,
}

/// One line to add to the audit log: who (`None`: the operator) did what to what.
pub struct NewAudit<'a> {
    pub shop_id: &'a str,
    pub staff_id: Option<&'a str>,
    pub email: &'a str,
    pub action: &'a str,
    pub subject: &'a str,
    pub at: i64,
}

impl Store {
    /// Keeps an invitation, in a transaction of its own, with its line in the audit log.
    pub async fn insert_invite(
        &self,
        invite: &NewInvite<'_>,
        audit: &NewAudit<'_>,
    ) -> Result<(), StoreError> {
        let args: Vec<super::row::OwnedArg> = [
            Arg::Text(invite.token_hash),
            Arg::Text(invite.shop_id),
            Arg::Text(invite.email),
            Arg::Text(invite.role),
            Arg::OptText(invite.invited_by),
            Arg::Int(invite.created_at),
            Arg::Int(invite.expires_at),
        ]
        .into_iter()
        .map(Into::into)
        .collect();
        let audit = owned_audit(audit);
        self.write(move |tx| {
            Box::pin(async move {
                let args: Vec<Arg<'_>> = args.iter().map(|a| a.borrow()).collect();
                tx.execute(INSERT_INVITE, &args).await?;
                let audit: Vec<Arg<'_>> = audit.iter().map(|a| a.borrow()).collect();
                tx.execute(INSERT_AUDIT, &audit).await?;
                Ok(())
            })
        })
        .await
    }

    /// The invitation with this token's hash, if unused and unexpired.
    pub async fn open_invite(
        &self,
        token_hash: &str,
        now_ms: i64,
    ) -> Result<Option<InviteRow>, StoreError> {
        let rows = self
            .read(
                OPEN_INVITE,
                &[Arg::Text(token_hash), Arg::Int(now_ms)],
                InviteRow::read,
            )
            .await?;
        Ok(rows.into_iter().next())
    }

    /// Uses the invitation: the member made (or given the invited role and this password) and
    /// signed in (`sign_in_hash`), in one transaction. `None`: no such unused invitation.
    pub async fn accept_invite(
        &self,
        token_hash: &str,
        password_hash: &str,
        sign_in_hash: &str,
        now_ms: i64,
    ) -> Result<Option<MemberRow>, StoreError> {
        let (token_hash, password_hash, sign_in_hash) = (
            token_hash.to_owned(),
            password_hash.to_owned(),
            sign_in_hash.to_owned(),
        );
        self.write(move |tx| {
            Box::pin(async move {
                let Some(invite) = tx
                    .fetch_optional(
                        TAKE_INVITE,
                        &[Arg::Text(&token_hash), Arg::Int(now_ms)],
                        InviteRow::read,
                    )
                    .await?
                else {
                    return Ok(None);
                };
                let staff_id = crate::ids::new_id("stf_");
                let staff_id = tx
                    .fetch_optional(
                        PUT_MEMBER,
                        &[
                            Arg::Text(&staff_id),
                            Arg::Text(&invite.shop_id),
                            Arg::Text(&invite.email),
                            Arg::Text(&invite.role),
                            Arg::Text(&password_hash),
                            Arg::Int(now_ms),
                        ],
                        |row| row.text("staff_id"),
                    )
                    .await?
                    .ok_or_else(|| StoreError::Other("the member was not written".into()))?;
                tx.execute(
                    REVOKE_MEMBER_SIGN_INS,
                    &[Arg::Text(&staff_id), Arg::Int(now_ms)],
                )
                .await?;
                tx.execute(
                    INSERT_SIGN_IN,
                    &[
                        Arg::Text(&sign_in_hash),
                        Arg::Text(&staff_id),
                        Arg::Int(now_ms),
                    ],
                )
                .await?;
                tx.execute(
                    INSERT_AUDIT,
                    &[
                        Arg::Text(&invite.shop_id),
                        Arg::Text(&staff_id),
                        Arg::Text(&invite.email),
                        Arg::Text("invite.accepted"),
                        Arg::Text(&invite.role),
                        Arg::Int(now_ms),
                    ],
                )
                .await?;
                let member = tx
                    .fetch_optional(
                        MEMBER_BY_SIGN_IN,
                        &[Arg::Text(&sign_in_hash)],
                        MemberRow::read,
                    )
                    .await?;
                Ok(member)
            })
        })
        .await
    }

    /// The memberships of an address that can sign in, each with its password's hash.
    pub async fn members_by_email(
        &self,
        email: &str,
    ) -> Result<Vec<(MemberRow, String)>, StoreError> {
        self.read(MEMBERS_BY_EMAIL, &[Arg::Text(email)], |row| {
            Ok((MemberRow::read(row)?, row.text("password_hash")?))
        })
        .await
    }

    pub async fn insert_staff_sign_in(
        &self,
        token_hash: &str,
        staff_id: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let (token_hash, staff_id) = (token_hash.to_owned(), staff_id.to_owned());
        self.write(move |tx| {
            Box::pin(async move {
                tx.execute(
                    INSERT_SIGN_IN,
                    &[
                        Arg::Text(&token_hash),
                        Arg::Text(&staff_id),
                        Arg::Int(now_ms),
                    ],
                )
                .await
                .map(|_| ())
            })
        })
        .await
    }

    /// The member signed in with this token's hash, and when it signed in and was last seen.
    pub async fn member_by_sign_in(
        &self,
        token_hash: &str,
    ) -> Result<Option<(MemberRow, i64, i64)>, StoreError> {
        let rows = self
            .read(MEMBER_BY_SIGN_IN, &[Arg::Text(token_hash)], |row| {
                Ok((
                    MemberRow::read(row)?,
                    row.int("signed_in_at")?,
                    row.int("last_used_at")?,
                ))
            })
            .await?;
        Ok(rows.into_iter().next())
    }

    /// Writes a sign-in's last use, or ends it (`revoke`); `false` if it had ended already.
    pub async fn staff_sign_in_used(
        &self,
        token_hash: &str,
        now_ms: i64,
        revoke: bool,
    ) -> Result<bool, StoreError> {
        let hash = token_hash.to_owned();
        self.write(move |tx| {
            Box::pin(async move {
                let sql = if revoke {
                    REVOKE_SIGN_IN
                } else {
                    TOUCH_SIGN_IN
                };
                Ok(tx
                    .execute(sql, &[Arg::Text(&hash), Arg::Int(now_ms)])
                    .await?
                    == 1)
            })
        })
        .await
    }

    pub async fn members_of_shop(&self, shop_id: &str) -> Result<Vec<MemberRow>, StoreError> {
        self.read(MEMBERS_OF_SHOP, &[Arg::Text(shop_id)], MemberRow::read)
            .await
    }

    pub async fn owners_of_shop(&self, shop_id: &str) -> Result<Vec<String>, StoreError> {
        self.read(OWNERS_OF_SHOP, &[Arg::Text(shop_id)], |row| {
            row.text("email")
        })
        .await
    }

    /// Invitations of the shop not yet used: address, role, until when.
    pub async fn open_invites_of_shop(
        &self,
        shop_id: &str,
        now_ms: i64,
    ) -> Result<Vec<(String, String, i64)>, StoreError> {
        self.read(
            OPEN_INVITES_OF_SHOP,
            &[Arg::Text(shop_id), Arg::Int(now_ms)],
            |row| {
                Ok((
                    row.text("email")?,
                    row.text("role")?,
                    row.int("expires_at")?,
                ))
            },
        )
        .await
    }

    /// Gives a member of the shop another role (`Some`) or removes it (`None`), signing it out
    /// everywhere, with the audit line, in one transaction; `false`: no such member of the shop.
    pub async fn change_member(
        &self,
        shop_id: &str,
        staff_id: &str,
        role: Option<&str>,
        audit: &NewAudit<'_>,
    ) -> Result<bool, StoreError> {
        let (shop_id, staff_id, role) = (
            shop_id.to_owned(),
            staff_id.to_owned(),
            role.map(str::to_owned),
        );
        let now = audit.at;
        let audit = owned_audit(audit);
        self.write(move |tx| {
            Box::pin(async move {
                tx.execute(
                    REVOKE_MEMBER_SIGN_INS,
                    &[Arg::Text(&staff_id), Arg::Int(now)],
                )
                .await?;
                let changed = match &role {
                    Some(role) => {
                        tx.execute(
                            SET_ROLE,
                            &[Arg::Text(&staff_id), Arg::Text(&shop_id), Arg::Text(role)],
                        )
                        .await?
                    }
                    None => {
                        tx.execute(
                            "DELETE FROM staff_sign_ins WHERE staff_id = $1",
                            &[Arg::Text(&staff_id)],
                        )
                        .await?;
                        tx.execute(REMOVE_MEMBER, &[Arg::Text(&staff_id), Arg::Text(&shop_id)])
                            .await?
                    }
                };
                if changed == 1 {
                    let audit: Vec<Arg<'_>> = audit.iter().map(|a| a.borrow()).collect();
                    tx.execute(INSERT_AUDIT, &audit).await?;
                }
                Ok(changed == 1)
            })
        })
        .await
    }

    /// Adds a line to the audit log, in a transaction of its own.
    pub async fn audit(&self, entry: &NewAudit<'_>) -> Result<(), StoreError> {
        let args = owned_audit(entry);
        self.write(move |tx| {
            Box::pin(async move {
                let args: Vec<Arg<'_>> = args.iter().map(|a| a.borrow()).collect();
                tx.execute(INSERT_AUDIT, &args).await.map(|_| ())
            })
        })
        .await
    }

    /// The shop's audit log, newest first.
    pub async fn audit_of_shop(
        &self,
        shop_id: &str,
        limit: i64,
    ) -> Result<Vec<AuditRow>, StoreError> {
        self.read(
            AUDIT_OF_SHOP,
            &[Arg::Text(shop_id), Arg::Int(limit)],
            |row| {
                Ok(AuditRow {
                    entry_id: row.int("entry_id")?,
                    email: row.text("email")?,
                    action: row.text("action")?,
                    subject: row.text("subject")?,
                    at: row.int("at")?,
                })
            },
        )
        .await
    }
}

impl super::Tx {
    /// Adds a line to the audit log in this transaction (beside the change it tells of).
    pub async fn audit(&mut self, entry: &NewAudit<'_>) -> Result<(), StoreError> {
        let args = owned_audit(entry);
        let args: Vec<Arg<'_>> = args.iter().map(|a| a.borrow()).collect();
        self.execute(INSERT_AUDIT, &args).await.map(|_| ())
    }
}

fn owned_audit(entry: &NewAudit<'_>) -> Vec<super::row::OwnedArg> {
    [
        Arg::Text(entry.shop_id),
        Arg::OptText(entry.staff_id),
        Arg::Text(entry.email),
        Arg::Text(entry.action),
        Arg::Text(entry.subject),
        Arg::Int(entry.at),
    ]
    .into_iter()
    .map(Into::into)
    .collect()
}
