//! Mail to shoppers over SMTP (`CHECKOUT_SMTP_URL`): the one-time codes that prove a shopper
//! owns the address it signs up or recovers with. A leaf: it knows an address, a subject and a
//! text, nothing of ours.
//!
//! The URL is lettre's: `smtp://host:25` (plain, what a local relay or the tests' receiver
//! takes), `smtp://user:password@host:587?tls=required` (STARTTLS), `smtps://user:password@host`
//! (TLS from the start). It is never logged: it may carry a password.

use std::time::Duration;

use lettre::message::header::{ContentTransferEncoding, ContentType};
use lettre::message::{Body, Mailbox};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

/// How long one mail may take to hand over, connection included.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
}

/// Says who the mail is from, never the server's URL (it may hold a password).
impl std::fmt::Debug for Mailer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailer").field("from", &self.from).finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MailError {
    #[error("not an e-mail address: {0}")]
    Address(String),
    #[error("the mail could not be handed to the SMTP server: {0}")]
    Smtp(String),
}

impl Mailer {
    /// A mailer sending through the server at `url`, from `from` (`Name <address>`).
    pub fn new(url: &str, from: &str) -> Result<Mailer, String> {
        let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(url)
            .map_err(|e| format!("CHECKOUT_SMTP_URL is not an SMTP URL: {e}"))?
            .timeout(Some(SEND_TIMEOUT))
            .build();
        let from = from
            .parse()
            .map_err(|e| format!("CHECKOUT_MAIL_FROM is not a mailbox ({from}): {e}"))?;
        Ok(Mailer { transport, from })
    }

    /// Sends one plain-text mail.
    pub async fn send(&self, to: &str, subject: &str, text: String) -> Result<(), MailError> {
        let to: Mailbox = to.parse().map_err(|_| MailError::Address(to.to_owned()))?;
        let message = Message::builder()
            .from(self.from.clone())
            .to(to)
            .subject(subject)
            .header(ContentType::TEXT_PLAIN)
            .body(readable_body(&text))
            .map_err(|e| MailError::Smtp(e.to_string()))?;
        self.transport
            .send(message)
            .await
            .map(|_| ())
            .map_err(|e| MailError::Smtp(e.to_string()))
    }
}

/// The text as UTF-8 in 8 bits, its lines folded at spaces under 76 bytes with their CRLF (what
/// lettre lets go as 8-bit),
/// so that it reads as it is in a mailbox file; every SMTP server of this century takes
/// 8BITMIME. A text that cannot be folded so (a word longer than a line) goes as lettre chooses
/// (base64).
const MAX_LINE_BYTES: usize = 72;

pub(crate) fn readable_body(text: &str) -> Body {
    let mut folded = String::with_capacity(text.len() + text.len() / 32);
    for line in text.split('\n') {
        let mut width = 0;
        for (n, word) in line.split(' ').enumerate() {
            if n > 0 {
                if width + 1 + word.len() > MAX_LINE_BYTES {
                    folded.push_str("\r\n");
                    width = 0;
                } else {
                    folded.push(' ');
                    width += 1;
                }
            }
            folded.push_str(word);
            width += word.len();
        }
        folded.push_str("\r\n");
    }
    Body::new_with_encoding(folded, ContentTransferEncoding::EightBit)
        .unwrap_or_else(|_| Body::new(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_russian_text_goes_in_8_bits_folded_at_spaces() {
        let text = "Кто-то (надеемся, вы) открывает счёт для оплаты заказов на эту почту.\n\nКод: 123456\n";
        let body = readable_body(text);
        assert_eq!(body.encoding(), ContentTransferEncoding::EightBit);
        let sent = String::from_utf8(body.into_vec()).unwrap();
        assert!(sent.lines().all(|line| line.len() <= 76), "{sent}");
        assert_eq!(
            sent.replace("\r\n", " ")
                .split_whitespace()
                .collect::<Vec<_>>(),
            text.split_whitespace().collect::<Vec<_>>()
        );
    }
}
