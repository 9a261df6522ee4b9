//! The demo shop's back office sign-in under guessing (no browser needed): wrong passwords are
//! limited per client address and in all, counted only when they fail, so the staff's right
//! password from another address still works while someone guesses, and signing in often is
//! never refused.

use std::net::{IpAddr, Ipv4Addr};

use checkout_testkit::{DemoShop, STAFF_PASSWORD};

const SHOP: &str = env!("CARGO_BIN_EXE_demo-shop-for-tests");

/// A client whose requests come from `address` (a loopback address of its own).
fn client_from(last: u8) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

async fn sign_in(client: &reqwest::Client, shop: &DemoShop, password: &str) -> reqwest::Response {
    client
        .post(format!("{}/admin/login", shop.base))
        .form(&[("password", password)])
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_staff_passwords_are_limited_per_address_and_the_right_one_still_works() {
    let dir = tempfile::tempdir().unwrap();
    let shop = DemoShop::start(
        SHOP,
        "http://127.0.0.1:9",
        &dir.path().join("none.json"),
        &[],
    )
    .await;
    let (guesser, staff) = (client_from(2), client_from(3));
    // Signing in often is not guessing: none of these counts.
    for _ in 0..8 {
        assert_eq!(sign_in(&staff, &shop, STAFF_PASSWORD).await.status(), 303);
    }
    // Five wrong guesses from one address, then that address waits, even with the right one.
    for _ in 0..5 {
        assert_eq!(sign_in(&guesser, &shop, "guess").await.status(), 401);
    }
    let refused = sign_in(&guesser, &shop, STAFF_PASSWORD).await;
    assert_eq!(refused.status(), 429);
    let wait: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "Retry-After: {wait}");
    assert!(
        refused
            .text()
            .await
            .unwrap()
            .contains("Слишком много неверных попыток")
    );
    // The staff, elsewhere, is not locked out by them.
    assert_eq!(sign_in(&staff, &shop, STAFF_PASSWORD).await.status(), 303);
}

/// Served over https (`SHOP_PUBLIC_URL`), the staff's sign-in cookie is `__Host-` prefixed and
/// `Secure`: the browser sends it only over https, to this very host, and no subdomain or
/// plain-http page can set one in its place. Over plain http it stays as it was (the demo).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_https_the_staff_cookie_is_host_only_and_secure() {
    let dir = tempfile::tempdir().unwrap();
    let plain = DemoShop::start(SHOP, "http://127.0.0.1:9", &dir.path().join("a.json"), &[]).await;
    let signed = sign_in(&client_from(4), &plain, STAFF_PASSWORD).await;
    let cookie = signed.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(cookie.starts_with("staff="), "{cookie}");
    assert!(!cookie.contains("Secure"), "{cookie}");

    let https = DemoShop::start(
        SHOP,
        "http://127.0.0.1:9",
        &dir.path().join("b.json"),
        &[("SHOP_PUBLIC_URL", "https://shop.example/")],
    )
    .await;
    let signed = sign_in(&client_from(5), &https, STAFF_PASSWORD).await;
    assert_eq!(signed.status(), 303);
    let cookie = signed.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(cookie.starts_with("__Host-staff="), "{cookie}");
    assert!(cookie.contains("; Secure"), "{cookie}");
    assert!(
        cookie.contains("; Path=/") && !cookie.contains("Domain"),
        "{cookie}"
    );
    // The back office reads it back under that name.
    let token = cookie.split(';').next().unwrap().to_owned();
    let office = client_from(5)
        .get(format!("{}/admin", https.base))
        .header("cookie", &token)
        .send()
        .await
        .unwrap();
    assert_eq!(office.status(), 200);
}
