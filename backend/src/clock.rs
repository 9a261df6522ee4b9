//! Time as the database stores it (Unix milliseconds) and as the API shows it (RFC 3339).

use time::{OffsetDateTime, format_description::well_known::Rfc3339};

pub use checkout_idempotency::now_ms;

/// `1764683352345` → `2025-12-02T13:49:12.345Z`; the same instant always gives the same text.
pub fn rfc3339(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_default()
}

/// `2025-12-02T13:49:12.345Z` (any offset) → Unix milliseconds; `None` if it is not RFC 3339.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let at = OffsetDateTime::parse(text, &Rfc3339).ok()?;
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000).ok()
}
