//! Identifiers the server makes: a prefix naming the kind (`pay_`, `ref_`, `acc_`) and a UUID
//! in lowercase hex. Anything else in a path is not an id, so it is simply not found (and never
//! reaches the database: PostgreSQL refuses a NUL byte in text).

/// A time-ordered id (UUID v7: milliseconds, then 74 random bits). Rows made one after another
/// land on the same index pages, so a batch of payments writes a few pages, not one per row.
/// Only for ids that grant nothing by themselves: every read of them checks who is asking.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::now_v7().simple())
}

/// An id that must not be guessable (a checkout session's: holding it is enough to see the
/// session): 122 random bits (UUID v4).
pub fn new_secret_id(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::new_v4().simple())
}

pub fn is_id(prefix: &str, text: &str) -> bool {
    text.strip_prefix(prefix).is_some_and(|hex| {
        hex.len() == 32
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_new_id_makes_is_an_id() {
        let id = new_id("pay_");
        assert!(is_id("pay_", &id));
        assert!(!is_id("ref_", &id));
        for bad in [
            "",
            "pay_",
            "pay_\0x",
            "pay_%00",
            &id.to_uppercase(),
            &format!("{id}0"),
            &id[..35],
        ] {
            assert!(!is_id("pay_", bad), "{bad:?}");
        }
    }
}
