//! Money and order identity: integer kopecks, never floats.

/// The largest amount one request may move: 10^12 kopecks (10 billion roubles).
pub const MAX_AMOUNT: i64 = 1_000_000_000_000;
pub const MAX_ORDER_ID_LEN: usize = 64;

/// An amount in minor units must be `1..=10^12`.
pub fn validate_amount(amount: i64) -> Result<(), String> {
    if (1..=MAX_AMOUNT).contains(&amount) {
        Ok(())
    } else {
        Err(format!(
            "amount must be an integer number of kopecks from 1 to {MAX_AMOUNT}, got {amount}"
        ))
    }
}

/// An order id is 1..=64 characters of `A-Z a-z 0-9 . _ -`.
pub fn validate_order_id(order_id: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if order_id.is_empty() || order_id.len() > MAX_ORDER_ID_LEN || !order_id.chars().all(allowed) {
        Err("order_id must be 1 to 64 characters of A-Z a-z 0-9 . _ -".to_owned())
    } else {
        Ok(())
    }
}

/// A currency is an ISO 4217 code: three capital letters.
pub fn validate_currency(currency: &str) -> Result<(), String> {
    if currency.len() == 3 && currency.chars().all(|c| c.is_ascii_uppercase()) {
        Ok(())
    } else {
        Err(format!(
            "currency must be a three-letter ISO 4217 code such as RUB, got {currency:?}"
        ))
    }
}

/// Kopecks as Russian money: `300000` → «3 000,00 ₽». The spaces are no-break spaces so the
/// amount never wraps across lines.
pub fn format_rub(kopecks: i64) -> String {
    const NBSP: char = '\u{a0}';
    let sign = if kopecks < 0 { "−" } else { "" };
    let abs = kopecks.unsigned_abs();
    let digits = (abs / 100).to_string();
    let mut grouped = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(NBSP);
        }
        grouped.push(d);
    }
    format!("{sign}{grouped},{:02}{NBSP}₽", abs % 100)
}

/// Roubles as a person types them («450», «450,5», «1 234,56», «12.30», with or without «₽»)
/// in kopecks; `None` for anything else, a negative amount or more than two decimals.
pub fn parse_rub(text: &str) -> Option<i64> {
    let cleaned: String = text
        .trim()
        .trim_end_matches('₽')
        .chars()
        .filter(|c| !matches!(c, ' ' | '\u{a0}' | '\u{202f}'))
        .collect();
    let (whole, fraction) = match cleaned.split_once([',', '.']) {
        Some((_, "")) => return None,
        Some((whole, fraction)) => (whole, fraction),
        None => (cleaned.as_str(), ""),
    };
    let digits = |s: &str| !s.is_empty() && s.len() <= 15 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || fraction.len() > 2 || !(fraction.is_empty() || digits(fraction)) {
        return None;
    }
    let kopecks = format!("{fraction:0<2}").parse::<i64>().ok()?;
    whole
        .parse::<i64>()
        .ok()?
        .checked_mul(100)?
        .checked_add(kopecks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_roubles_as_typed() {
        assert_eq!(parse_rub("450"), Some(45_000));
        assert_eq!(parse_rub("450,5"), Some(45_050));
        assert_eq!(parse_rub(" 1\u{a0}234,56 ₽"), Some(123_456));
        assert_eq!(parse_rub("12.30"), Some(1_230));
        assert_eq!(parse_rub(&format_rub(98_765)), Some(98_765));
        for bad in [
            "",
            "-5",
            "1,234",
            "abc",
            "1,",
            ",5",
            "1e3",
            "99999999999999999999",
        ] {
            assert_eq!(parse_rub(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn formats_roubles_the_russian_way() {
        assert_eq!(format_rub(300_000), "3\u{a0}000,00\u{a0}₽");
        assert_eq!(format_rub(10_000_000), "100\u{a0}000,00\u{a0}₽");
        assert_eq!(format_rub(5), "0,05\u{a0}₽");
        assert_eq!(format_rub(123_456_789), "1\u{a0}234\u{a0}567,89\u{a0}₽");
        assert_eq!(format_rub(-1_050), "−10,50\u{a0}₽");
    }

    #[test]
    fn validates_amounts_orders_and_currencies() {
        assert!(validate_amount(1).is_ok() && validate_amount(MAX_AMOUNT).is_ok());
        assert!(validate_amount(0).is_err() && validate_amount(-5).is_err());
        assert!(validate_amount(MAX_AMOUNT + 1).is_err());
        assert!(validate_order_id("ord-8831_a.b").is_ok());
        assert!(validate_order_id(&"x".repeat(64)).is_ok());
        assert!(validate_order_id("").is_err() && validate_order_id(&"x".repeat(65)).is_err());
        assert!(validate_order_id("заказ").is_err() && validate_order_id("a b").is_err());
        assert!(validate_currency("RUB").is_ok());
        assert!(validate_currency("rub").is_err() && validate_currency("RUBL").is_err());
    }
}
