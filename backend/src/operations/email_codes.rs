//! One-time codes that prove a live shopper owns its e-mail: six digits, mailed, alive for ten
//! minutes, five tries, kept only as an Argon2id hash. A sign-up becomes an account only with
//! its code; a recovery sets a new password only with its code. What the mails say, in Russian.

use argon2::password_hash::rand_core::{OsRng, RngCore};

use crate::mail::Mailer;
use crate::operations::error::OperationError;
use crate::operations::passwords;
use crate::store::Store;
use crate::store::email_codes::{NewCode, Purpose, TriedCode};

/// How long a code can be entered.
pub const CODE_TTL_SECS: u64 = 10 * 60;
/// How many tries one code has (each counted before it is checked).
pub const MAX_TRIES: i64 = 5;

/// Six digits, each of the million codes equally likely (a draw past the last whole million of
/// `u32` is drawn again).
pub fn new_code() -> String {
    const CODES: u32 = 1_000_000;
    let limit = u32::MAX - u32::MAX % CODES;
    loop {
        let draw = OsRng.next_u32();
        if draw < limit {
            return format!("{:06}", draw % CODES);
        }
    }
}

/// Keeps a new code's hash for the address (replacing an earlier one of the same purpose, and
/// its tries), with a sign-up's password hash waiting beside it.
pub async fn keep(
    store: &Store,
    email: &str,
    purpose: Purpose,
    code_hash: &str,
    password_hash: Option<&str>,
    now_ms: i64,
) -> Result<(), OperationError> {
    let code = NewCode {
        email: email.to_owned(),
        purpose,
        code_hash: code_hash.to_owned(),
        password_hash: password_hash.map(str::to_owned),
        expires_at: now_ms + CODE_TTL_SECS as i64 * 1000,
        created_at: now_ms,
    };
    store.put_code(code).await?;
    Ok(())
}

/// One try of `code` for the address: the kept code when it is right; `InvalidCode` when it is
/// wrong, expired, used or out of tries (each costs the same work).
pub async fn check(
    store: &Store,
    email: &str,
    purpose: Purpose,
    code: &str,
    now_ms: i64,
) -> Result<TriedCode, OperationError> {
    let well_formed = code.len() == 6 && code.bytes().all(|b| b.is_ascii_digit());
    let tried = if well_formed {
        store
            .take_code_try(email, purpose, MAX_TRIES, now_ms)
            .await?
    } else {
        None
    };
    let hash = match &tried {
        Some(kept) => kept.code_hash.clone(),
        None => passwords::decoy().await?.to_owned(),
    };
    let right = passwords::verify(code.to_owned(), hash).await?;
    match tried {
        Some(kept) if right => Ok(kept),
        _ => Err(OperationError::InvalidCode),
    }
}

/// A mail: its subject and text.
pub struct Mail {
    pub subject: &'static str,
    pub text: String,
}

fn minutes() -> u64 {
    CODE_TTL_SECS / 60
}

/// To an address with no account yet: the code that makes it one.
pub fn sign_up_code(code: &str) -> Mail {
    Mail {
        subject: "Код подтверждения почты",
        text: format!(
            "Здравствуйте!\n\nКто-то (надеемся, вы) открывает счёт для оплаты заказов на эту почту.\n\n\
             Код подтверждения: {code}\n\nОн действует {} минут. Никому его не сообщайте: \
             магазины и наша поддержка его никогда не спрашивают.\n\n\
             Если счёт открываете не вы, ничего не делайте: без кода он не откроется.\n",
            minutes()
        ),
    }
}

/// To an address that has an account: no code, and what to do instead.
pub fn already_signed_up() -> Mail {
    Mail {
        subject: "У вас уже есть счёт",
        text: "Здравствуйте!\n\nКто-то (возможно, вы) пытался открыть счёт на эту почту, но \
               счёт на неё уже есть.\n\nЕсли это вы, войдите со своим паролем.\n\n\
               Если это не вы, ничего не делайте: ваш счёт никто не изменил.\n"
            .into(),
    }
}

/// To a confirmed account's address: the code that sets a new password.
pub fn recovery_code(code: &str) -> Mail {
    Mail {
        subject: "Код для восстановления доступа",
        text: format!(
            "Здравствуйте!\n\nКто-то (надеемся, вы) просит восстановить доступ к счёту.\n\n\
             Код восстановления: {code}\n\nОн действует {} минут. После восстановления все \
             прежние входы в счёт будут закрыты.\n\nЕсли это не вы, ничего не делайте: без \
             кода доступ никто не получит.\n",
            minutes()
        ),
    }
}

/// To an address with no confirmed account: nothing to recover.
pub fn nothing_to_recover() -> Mail {
    Mail {
        subject: "Восстановление доступа",
        text: "Здравствуйте!\n\nКто-то просил восстановить доступ к счёту на эту почту, но \
               подтверждённого счёта на неё нет. Открыть счёт можно при оплате заказа.\n\n\
               Если это были не вы, ничего не делайте.\n"
            .into(),
    }
}

/// Sends `mail` to `to`; without a mailer, or when the server refuses it, `MailUnavailable`.
pub async fn send(mailer: Option<&Mailer>, to: &str, mail: Mail) -> Result<(), OperationError> {
    let Some(mailer) = mailer else {
        tracing::warn!("a code was asked for, but CHECKOUT_SMTP_URL is not set");
        return Err(OperationError::MailUnavailable);
    };
    mailer
        .send(to, mail.subject, mail.text)
        .await
        .map_err(|error| {
            tracing::warn!(%error, "mail not sent");
            OperationError::MailUnavailable
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_six_digits_and_vary() {
        let codes: std::collections::BTreeSet<String> = (0..200).map(|_| new_code()).collect();
        assert!(
            codes
                .iter()
                .all(|c| c.len() == 6 && c.bytes().all(|b| b.is_ascii_digit()))
        );
        assert!(codes.len() > 190, "{}", codes.len());
    }

    /// Every mail reads as it is in a mailbox (8-bit UTF-8), not as base64.
    #[test]
    fn every_mail_goes_readable() {
        use lettre::message::header::ContentTransferEncoding;
        for mail in [
            sign_up_code("123456"),
            already_signed_up(),
            recovery_code("123456"),
            nothing_to_recover(),
        ] {
            let body = crate::mail::readable_body(&mail.text);
            assert_eq!(
                body.encoding(),
                ContentTransferEncoding::EightBit,
                "{}",
                mail.text
            );
        }
    }
}
