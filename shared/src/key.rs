//! The `Idempotency-Key` header: what a valid key is, parsed the same way on both sides.

use std::fmt;

pub const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";
/// Set to `true` on a response that is a stored answer to an earlier request with the same key.
pub const IDEMPOTENT_REPLAYED_HEADER: &str = "Idempotent-Replayed";
/// When the server will forget the key (an IMF-fixdate): a resend after that is a new request.
pub const IDEMPOTENCY_KEY_EXPIRES_HEADER: &str = "Idempotency-Key-Expires";
pub const MAX_KEY_LEN: usize = 255;

/// A client-made key naming one intent: 1..=255 visible ASCII characters (0x21..=0x7E).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyError {
    Empty,
    TooLong,
    /// A character outside 0x21..=0x7E (space, control, non-ASCII).
    InvalidCharacter,
    /// A value starting with `"` that is not a well-formed Structured-Field string.
    BadQuoting,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyError::Empty => "the Idempotency-Key header is empty",
            KeyError::TooLong => "the Idempotency-Key is longer than 255 characters",
            KeyError::InvalidCharacter => {
                "the Idempotency-Key may hold only visible ASCII characters (0x21..=0x7E)"
            }
            KeyError::BadQuoting => "the Idempotency-Key is not a well-formed quoted string",
        })
    }
}

impl std::error::Error for KeyError {}

impl IdempotencyKey {
    /// Parses a header value. A Structured-Field string (`"abc"`, RFC 8941 §3.3.3, as the IETF
    /// draft defines the header) means its content, so `"abc"` and `abc` are the same key.
    pub fn parse(header_value: &str) -> Result<Self, KeyError> {
        let value = header_value.trim_matches([' ', '\t']);
        let key = match value.strip_prefix('"') {
            Some(quoted) => unquote(quoted)?,
            None => value.to_owned(),
        };
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if !key.bytes().all(|b| (0x21..=0x7E).contains(&b)) {
            return Err(KeyError::InvalidCharacter);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong);
        }
        Ok(IdempotencyKey(key))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The body of an sf-string after its opening quote: `\"` and `\\` are the only escapes.
fn unquote(rest: &str) -> Result<String, KeyError> {
    let mut out = String::with_capacity(rest.len());
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped @ ('"' | '\\')) => out.push(escaped),
                _ => return Err(KeyError::BadQuoting),
            },
            '"' if chars.as_str().is_empty() => return Ok(out),
            '"' => return Err(KeyError::BadQuoting),
            c if (' '..='~').contains(&c) => out.push(c),
            _ => return Err(KeyError::InvalidCharacter),
        }
    }
    Err(KeyError::BadQuoting)
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_plain_and_quoted_forms_as_the_same_key() {
        let plain = IdempotencyKey::parse("req-7f3a").unwrap();
        assert_eq!(IdempotencyKey::parse("\"req-7f3a\"").unwrap(), plain);
        assert_eq!(IdempotencyKey::parse("  req-7f3a\t").unwrap(), plain);
        assert_eq!(
            IdempotencyKey::parse(r#""a\"b\\c""#).unwrap().as_str(),
            r#"a"b\c"#
        );
    }

    #[test]
    fn refuses_what_is_not_a_key() {
        assert_eq!(IdempotencyKey::parse(""), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::parse("\"\""), Err(KeyError::Empty));
        assert_eq!(
            IdempotencyKey::parse("a b"),
            Err(KeyError::InvalidCharacter)
        );
        assert_eq!(
            IdempotencyKey::parse("ключ"),
            Err(KeyError::InvalidCharacter)
        );
        assert_eq!(
            IdempotencyKey::parse("\"a b\""),
            Err(KeyError::InvalidCharacter)
        );
        assert_eq!(IdempotencyKey::parse("\"abc"), Err(KeyError::BadQuoting));
        assert_eq!(IdempotencyKey::parse("\"a\"b\""), Err(KeyError::BadQuoting));
        assert_eq!(
            IdempotencyKey::parse(r#""a\nb""#),
            Err(KeyError::BadQuoting)
        );
        assert_eq!(
            IdempotencyKey::parse(&"k".repeat(256)),
            Err(KeyError::TooLong)
        );
        assert!(IdempotencyKey::parse(&"k".repeat(255)).is_ok());
    }

    proptest! {
        #[test]
        fn every_visible_ascii_string_up_to_255_is_a_key(s in "[!-~]{1,255}") {
            // A leading quote starts an sf-string, which is checked separately below.
            prop_assume!(!s.starts_with('"'));
            let key = IdempotencyKey::parse(&s).unwrap();
            prop_assert_eq!(key.as_str(), s.as_str());
        }

        #[test]
        fn quoting_any_key_round_trips(s in "[!-~]{1,255}") {
            let quoted = format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
            let key = IdempotencyKey::parse(&quoted).unwrap();
            prop_assert_eq!(key.as_str(), s.as_str());
        }

        #[test]
        fn a_key_never_holds_a_character_outside_visible_ascii(s in "\\PC{0,300}") {
            if let Ok(key) = IdempotencyKey::parse(&s) {
                prop_assert!(!key.as_str().is_empty() && key.as_str().len() <= MAX_KEY_LEN);
                prop_assert!(key.as_str().bytes().all(|b| (0x21..=0x7E).contains(&b)));
            }
        }
    }
}
