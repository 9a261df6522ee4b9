//! A shop's staff and what each may do in its dashboard. A member joins only by an invitation
//! mailed to its address (by the operator, `checkout-server shop invite`, or by an owner), and
//! sets its password by the link in it: so a dashboard reaches only whom the mail reached. Its
//! sign-ins are tokens (stored as hashes) that end when idle or old, or by «Выйти». Every change
//! a member makes is written in the shop's audit log, beside the change.

use crate::mail::Mailer;
use crate::operations::authentication::{SignInLimits, new_secret, token_hash};
use crate::operations::email_codes::{self, Mail};
use crate::operations::error::OperationError;
use crate::operations::passwords;
use crate::operations::shoppers::{check_password, normalize_email};
use crate::store::Store;
use crate::store::staff::{MemberRow, NewAudit, NewInvite};
use crate::{clock, store::StoreError};

/// How long an invitation's link works.
pub const INVITE_TTL_MS: i64 = 7 * 24 * 3600 * 1000;
/// A sign-in's last use is written again only after this long.
const TOUCH_EVERY_MS: i64 = 60_000;

/// What a member may do. Each role may do what the ones after it may.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Manages the keys' settings, the webhook endpoints and the staff.
    Owner,
    /// Refunds, resends events.
    Staff,
    /// Looks.
    Viewer,
}

impl Role {
    pub fn parse(text: &str) -> Option<Role> {
        match text {
            "owner" => Some(Role::Owner),
            "staff" => Some(Role::Staff),
            "viewer" => Some(Role::Viewer),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Owner => "owner",
            Role::Staff => "staff",
            Role::Viewer => "viewer",
        }
    }

    /// As the dashboard names it.
    pub fn title(self) -> &'static str {
        match self {
            Role::Owner => "владелец",
            Role::Staff => "сотрудник",
            Role::Viewer => "наблюдатель",
        }
    }
}

/// A signed-in member, as a request acts for it.
#[derive(Clone, Debug)]
pub struct Member {
    pub staff_id: String,
    pub shop_id: String,
    pub shop_name: String,
    pub email: String,
    pub role: Role,
}

impl Member {
    fn from_row(row: MemberRow) -> Result<Member, OperationError> {
        let role = Role::parse(&row.role).ok_or_else(|| {
            OperationError::Store(StoreError::Other(
                format!("unknown role {}", row.role).into(),
            ))
        })?;
        Ok(Member {
            staff_id: row.staff_id,
            shop_id: row.shop_id,
            shop_name: row.shop_name,
            email: row.email,
            role,
        })
    }

    /// Only a role at least `role` may go on.
    pub fn may(&self, role: Role) -> Result<&Member, OperationError> {
        if self.role <= role {
            Ok(self)
        } else {
            Err(OperationError::Forbidden(format!(
                "Это может только {}; ваша роль — {}",
                match role {
                    Role::Owner => "владелец",
                    Role::Staff => "сотрудник или владелец",
                    Role::Viewer => "участник",
                },
                self.role.title()
            )))
        }
    }

    /// An audit line of this member's.
    pub fn audit<'a>(&'a self, action: &'a str, subject: &'a str) -> NewAudit<'a> {
        NewAudit {
            shop_id: &self.shop_id,
            staff_id: Some(&self.staff_id),
            email: &self.email,
            action,
            subject,
            at: clock::now_ms(),
        }
    }
}

/// Who sends an invitation: a member (an owner), or the operator.
pub enum Inviter<'a> {
    Member(&'a Member),
    Operator,
}

/// Whom to invite to which shop's dashboard, in which role.
pub struct Invitation<'a> {
    pub shop_id: &'a str,
    pub shop_name: &'a str,
    pub email: &'a str,
    pub role: Role,
}

/// Mails an invitation to the shop's dashboard; the link leads to
/// `{public_origin}/dashboard/invite/{token}`. The token is kept only as its hash.
pub async fn invite(
    store: &Store,
    mailer: Option<&Mailer>,
    public_origin: &url::Url,
    invitation: &Invitation<'_>,
    by: Inviter<'_>,
) -> Result<(), OperationError> {
    let Invitation {
        shop_id,
        shop_name,
        email,
        role,
    } = *invitation;
    let email = normalize_email(email)?;
    let token = new_secret("inv_");
    let now = clock::now_ms();
    let (invited_by, by_email) = match &by {
        Inviter::Member(member) => (Some(member.staff_id.as_str()), member.email.as_str()),
        Inviter::Operator => (None, "оператор"),
    };
    let subject = format!("{email} ({})", role.as_str());
    store
        .insert_invite(
            &NewInvite {
                token_hash: &token_hash(&token),
                shop_id,
                email: &email,
                role: role.as_str(),
                invited_by,
                created_at: now,
                expires_at: now + INVITE_TTL_MS,
            },
            &NewAudit {
                shop_id,
                staff_id: invited_by,
                email: by_email,
                action: "staff.invited",
                subject: &subject,
                at: now,
            },
        )
        .await?;
    let link = public_origin
        .join(&format!("/dashboard/invite/{token}"))
        .map_err(|e| OperationError::Store(StoreError::Other(e.to_string().into())))?;
    email_codes::send(
        mailer,
        &email,
        invitation_mail(shop_name, role, link.as_str()),
    )
    .await
}

fn invitation_mail(shop_name: &str, role: Role, link: &str) -> Mail {
    Mail {
        subject: "Приглашение в кабинет магазина",
        text: format!(
            "Здравствуйте!\n\nВас пригласили в кабинет магазина «{shop_name}» на кассе; ваша \
             роль — {}.\n\nЧтобы принять приглашение и задать пароль, откройте ссылку:\n\n{link}\n\n\
             Она действует 7 дней и только один раз. Если вы не ждали приглашения, ничего не \
             делайте.\n",
            role.title()
        ),
    }
}

/// The invitation behind a link, if it still works: its shop, address and role.
pub async fn open_invite(
    store: &Store,
    token: &str,
) -> Result<Option<(String, Role)>, OperationError> {
    let invite = store
        .open_invite(&token_hash(token), clock::now_ms())
        .await?;
    Ok(invite.and_then(|i| Role::parse(&i.role).map(|role| (i.email, role))))
}

/// Accepts an invitation with a chosen password: the member made and signed in (the cookie's
/// token). `None`: the link was used, or has expired.
pub async fn accept(
    store: &Store,
    token: &str,
    password: &str,
) -> Result<Option<(Member, String)>, OperationError> {
    check_password(password)?;
    let password_hash = passwords::hash(password.to_owned()).await?;
    let sign_in = new_secret("dash_");
    let accepted = store
        .accept_invite(
            &token_hash(token),
            &password_hash,
            &token_hash(&sign_in),
            clock::now_ms(),
        )
        .await?;
    accepted
        .map(|row| Ok((Member::from_row(row)?, sign_in)))
        .transpose()
}

/// A sign-in by e-mail and password: the member (its first membership the password opens) and
/// the cookie's token. A wrong password and an unknown address are one answer after the same work.
pub async fn sign_in(
    store: &Store,
    email: &str,
    password: &str,
) -> Result<(Member, String), OperationError> {
    let email = normalize_email(email).map_err(|_| OperationError::InvalidCredentials)?;
    let memberships = store.members_by_email(&email).await?;
    if memberships.is_empty() {
        passwords::verify(password.to_owned(), passwords::decoy().await?.to_owned()).await?;
        return Err(OperationError::InvalidCredentials);
    }
    for (row, hash) in memberships {
        if passwords::verify(password.to_owned(), hash).await? {
            let member = Member::from_row(row)?;
            let token = new_secret("dash_");
            store
                .insert_staff_sign_in(&token_hash(&token), &member.staff_id, clock::now_ms())
                .await?;
            store.audit(&member.audit("signed_in", "")).await?;
            return Ok((member, token));
        }
    }
    Err(OperationError::InvalidCredentials)
}

/// The member a cookie's token signs in, if the sign-in still holds.
pub async fn authenticate(
    store: &Store,
    limits: SignInLimits,
    token: &str,
) -> Result<Option<Member>, OperationError> {
    let hash = token_hash(token);
    let Some((row, signed_in_at, last_used_at)) = store.member_by_sign_in(&hash).await? else {
        return Ok(None);
    };
    let now = clock::now_ms();
    let within = |since: i64, limit: std::time::Duration| now - since < limit.as_millis() as i64;
    if !within(signed_in_at, limits.absolute) || !within(last_used_at, limits.idle) {
        return Ok(None);
    }
    if now - last_used_at >= TOUCH_EVERY_MS && !store.staff_sign_in_used(&hash, now, false).await? {
        return Ok(None);
    }
    Member::from_row(row).map(Some)
}

/// «Выйти»: the sign-in ends.
pub async fn sign_out(store: &Store, token: &str) -> Result<(), StoreError> {
    store
        .staff_sign_in_used(&token_hash(token), clock::now_ms(), true)
        .await
        .map(|_| ())
}

/// An owner gives a member another role, or removes it (`None`); the member is signed out
/// everywhere. The shop keeps at least one owner.
pub async fn change_member(
    store: &Store,
    by: &Member,
    staff_id: &str,
    role: Option<Role>,
) -> Result<(), OperationError> {
    by.may(Role::Owner)?;
    let members = store.members_of_shop(&by.shop_id).await?;
    let target = members
        .iter()
        .find(|m| m.staff_id == staff_id)
        .ok_or_else(|| OperationError::NotFound("Нет такого участника".into()))?;
    let owners = members.iter().filter(|m| m.role == "owner").count();
    if target.role == "owner" && role != Some(Role::Owner) && owners <= 1 {
        return Err(OperationError::InvalidRequest(
            "У магазина должен остаться хотя бы один владелец".into(),
        ));
    }
    let subject = match role {
        Some(role) => format!("{} → {}", target.email, role.as_str()),
        None => target.email.clone(),
    };
    let action = if role.is_some() {
        "staff.role_changed"
    } else {
        "staff.removed"
    };
    store
        .change_member(
            &by.shop_id,
            staff_id,
            role.map(Role::as_str),
            &by.audit(action, &subject),
        )
        .await?;
    Ok(())
}
