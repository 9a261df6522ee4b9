//! Addresses on the web the checkout is given: a shop's webhook URL, the origins of its pages,
//! a session's return URL. Each is `https://`, or plain `http://` only to this machine's loopback
//! (a demo shop, a test): nothing of a shop's or a shopper's crosses a network in clear text.

/// A URL the checkout will send to, or send a shopper to: `Err` says why not, in a few words.
pub fn secure_url(text: &str) -> Result<url::Url, String> {
    if text.len() > 2_000 {
        return Err("longer than 2 000 characters".into());
    }
    let parsed = url::Url::parse(text).map_err(|e| e.to_string())?;
    let loopback = match parsed.host() {
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => return Err("no host".into()),
    };
    match parsed.scheme() {
        "https" => Ok(parsed),
        "http" if loopback => Ok(parsed),
        "http" => Err("use https (plain http only to a loopback address)".into()),
        other => Err(format!("{other}: not a web address")),
    }
}

/// An origin as browsers spell it (`https://shop.example`, `http://127.0.0.1:3001`), from an
/// origin or any URL on it; `Err` for what is not one (a path, a query, no host).
pub fn origin(text: &str) -> Result<String, String> {
    let parsed = secure_url(text)?;
    if parsed.path() != "/" || parsed.query().is_some() || parsed.fragment().is_some() {
        return Err("an origin is scheme, host and port only".into());
    }
    Ok(parsed.origin().ascii_serialization())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_secure_addresses_and_plain_origins() {
        assert!(secure_url("https://shop.example/hooks").is_ok());
        assert!(secure_url("http://127.0.0.1:3001/webhooks").is_ok());
        assert!(secure_url("http://localhost/x").is_ok());
        for bad in [
            "http://shop.example/",
            "ftp://127.0.0.1/",
            "not a url",
            "javascript:alert(1)",
        ] {
            assert!(secure_url(bad).is_err(), "{bad}");
        }
        assert_eq!(
            origin("https://Shop.Example").unwrap(),
            "https://shop.example"
        );
        assert_eq!(
            origin("http://127.0.0.1:3001/").unwrap(),
            "http://127.0.0.1:3001"
        );
        assert_eq!(
            origin("https://shop.example:443").unwrap(),
            "https://shop.example"
        );
        assert!(origin("https://shop.example/pay").is_err());
        assert!(origin("https://shop.example/?a=1").is_err());
    }
}
