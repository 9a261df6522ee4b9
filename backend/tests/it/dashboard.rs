//! The shop's dashboard over HTTP, against a real server on every database (SQLite,
//! PostgreSQL, and PostgreSQL behind PgBouncer in transaction mode), a real SMTP server (the
//! invitations) and a real webhook endpoint: who gets in (only by the mailed link), what each
//! role may do, that one shop's staff never see another's, that a refund form refunds once
//! however often it is sent, and that every event's delivery attempts are shown as they were.

use std::time::Duration;

use checkout_testkit as support;

const SERVER: &str = env!("CARGO_BIN_EXE_checkout-server");

use reqwest::StatusCode;
use support::dashboard::Dashboard;
use support::receiver::{Answer, Receiver};
use support::{Api, Backend, Server, Shop, TestDb, new_key};

checkout_testkit::on_every_database!(
    a_member_joins_only_by_the_mailed_link_and_signs_in_and_out,
    one_shops_staff_never_see_anothers,
    a_viewer_cannot_refund_and_a_refund_form_refunds_once,
    forms_from_elsewhere_are_refused,
    payments_are_found_by_order_amount_date_and_state,
    each_delivery_attempt_is_shown_and_an_event_is_resent,
    an_owner_invites_changes_and_removes_members,
    the_overview_draws_the_days_payments_and_refunds,
    an_owner_controls_the_endpoint_and_staff_cannot,
    a_change_the_audit_log_cannot_record_is_not_made,
);

const PASSWORD: &str = "пароль-кабинета";
const WITHIN: Duration = Duration::from_secs(10);
const FAST: [(&str, &str); 3] = [
    ("CHECKOUT_WEBHOOK_POLL_MS", "10"),
    ("CHECKOUT_WEBHOOK_FIRST_RETRY_MS", "40"),
    ("CHECKOUT_WEBHOOK_TIMEOUT_MS", "300"),
];

fn address(who: &str) -> String {
    format!("{who}-{}@shop.example.ru", uuid::Uuid::new_v4().simple())
}

/// A member of `shop`, invited by the operator in `role`, signed in.
async fn member(server: &Server, shop: &Shop, role: &str) -> (Dashboard, String) {
    let email = address(role);
    let link = server.invite(&shop.shop_id, &email, role).await;
    let mut dashboard = server.dashboard();
    let joined = dashboard.accept(&link, PASSWORD).await;
    assert_eq!(joined.status, StatusCode::SEE_OTHER, "{joined:?}");
    (dashboard, email)
}

/// A paid payment of `shop`: its id.
async fn paid(shop: &Shop, shopper: &Api, order_id: &str, amount: i64) -> String {
    let body = shop.checkout(order_id, amount).await;
    let answer = shopper.pay(&new_key(), &body).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    answer.json()["payment_id"].as_str().unwrap().to_owned()
}

async fn a_member_joins_only_by_the_mailed_link_and_signs_in_and_out(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let shop = server.add_shop("Лавка «Кабинет»").await;
    let email = address("owner");

    // Without a sign-in every page leads to the sign-in form.
    let stranger = server.dashboard();
    for path in ["/dashboard", "/dashboard/payments", "/dashboard/staff"] {
        let page = stranger.get(path).await;
        assert_eq!(page.status, StatusCode::SEE_OTHER, "{path}");
        assert_eq!(page.location.as_deref(), Some("/dashboard/sign-in"));
    }
    let form = stranger.get("/dashboard/sign-in").await;
    assert_eq!(form.status, StatusCode::OK);
    assert!(form.text().contains("Вход в кабинет"));
    assert!(
        form.html.contains("lang=\"ru\""),
        "the page says its language"
    );

    let link = server.invite(&shop.shop_id, &email, "owner").await;
    let mail = support::mail::receiver()
        .nth_mail(&email, Some(&server.mail_from), 1)
        .await;
    assert_eq!(mail.subject, "Приглашение в кабинет магазина");
    assert!(mail.text.contains("Лавка «Кабинет»") && mail.text.contains("владелец"));
    // The token is in the mail only: the database keeps its hash.
    let token = &link[link.find("inv_").unwrap()..];
    assert_eq!(
        db.scalar(&format!(
            "SELECT COUNT(*) FROM staff_invites WHERE token_hash LIKE '%{}%'",
            &token[4..20]
        ))
        .await,
        0
    );

    let mut owner = server.dashboard();
    let short = owner
        .post(
            &link[link.find("/dashboard").unwrap()..],
            &[("password", "short"), ("repeat", "short")],
        )
        .await;
    assert_eq!(short.status, StatusCode::BAD_REQUEST);
    assert!(short.text().contains("Пароль короче 8 знаков"));
    let joined = owner.accept(&link, PASSWORD).await;
    assert_eq!(joined.location.as_deref(), Some("/dashboard"));
    let cookie = owner.cookie.clone().expect("signed in");
    assert!(cookie.starts_with("dashboard="), "{cookie}");
    let overview = owner.get("/dashboard").await;
    assert_eq!(overview.status, StatusCode::OK);
    assert!(overview.text().contains("Лавка «Кабинет»"));
    assert!(overview.text().contains(&email));
    let policy = server
        .api()
        .http
        .get(format!("{}/dashboard", server.base))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    let csp = policy.headers()["content-security-policy"]
        .to_str()
        .unwrap();
    assert!(
        csp.contains("frame-ancestors 'none'") && !csp.contains("script-src"),
        "{csp}"
    );
    assert_eq!(policy.headers()["x-frame-options"], "DENY");

    // The link works once.
    let again = server.dashboard();
    let used = again.get(&link[link.find("/dashboard").unwrap()..]).await;
    assert_eq!(used.status, StatusCode::NOT_FOUND);
    assert!(used.text().contains("уже использована"));

    // «Выйти» ends the sign-in on the server: the old cookie no longer opens a page.
    let csrf = owner.csrf().await;
    let out = owner.post("/dashboard/sign-out", &[("csrf", &csrf)]).await;
    assert_eq!(out.location.as_deref(), Some("/dashboard/sign-in"));
    assert_eq!(owner.cookie, None);
    owner.cookie = Some(cookie);
    assert_eq!(owner.get("/dashboard").await.status, StatusCode::SEE_OTHER);

    let mut back = server.dashboard();
    let wrong = back.sign_in(&email, "не тот пароль").await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(wrong.text().contains("Неверная почта или пароль"));
    let unknown = back.sign_in(&address("nobody"), PASSWORD).await;
    assert_eq!(unknown.status, StatusCode::UNAUTHORIZED);
    let right = back.sign_in(&email.to_uppercase(), PASSWORD).await;
    assert_eq!(right.location.as_deref(), Some("/dashboard"), "{right:?}");
    let audit = back.get("/dashboard/audit").await.text();
    for line in ["принял(а) приглашение", "вошёл(ла)", "пригласил(а)"]
    {
        assert!(audit.contains(line), "{line} in {audit}");
    }
}

async fn one_shops_staff_never_see_anothers(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let (mine, theirs) = (
        server.add_shop("Моя лавка").await,
        server.add_shop("Чужая лавка").await,
    );
    let shopper = server.api().shopper().await;
    let my_payment = paid(&mine, &shopper, "MY-1", 10_000).await;
    let their_payment = paid(&theirs, &shopper, "THEIR-1", 20_000).await;
    let (mut owner, _) = member(&server, &mine, "owner").await;

    let list = owner.get("/dashboard/payments").await.text();
    assert!(
        list.contains(&my_payment) && !list.contains(&their_payment),
        "{list}"
    );
    let found = owner.get("/dashboard/payments?q=THEIR-1").await.text();
    assert!(found.contains("Платежей не найдено"), "{found}");
    let page = owner
        .get(&format!("/dashboard/payments/{their_payment}"))
        .await;
    assert_eq!(page.status, StatusCode::NOT_FOUND);
    assert!(!page.text().contains("THEIR-1"));

    let their_event = db
        .scalar_text(&format!(
            "SELECT event_id FROM webhook_events WHERE subject_id = '{their_payment}'"
        ))
        .await;
    let event = owner.get(&format!("/dashboard/events/{their_event}")).await;
    assert_eq!(event.status, StatusCode::NOT_FOUND);
    let csrf = owner.csrf().await;
    let resent = owner
        .post(
            &format!("/dashboard/events/{their_event}/redelivery"),
            &[("csrf", &csrf), ("mode", "test")],
        )
        .await;
    assert_eq!(resent.status, StatusCode::NOT_FOUND);

    // A refund of another shop's payment moves nothing.
    let refund = owner
        .post(
            &format!("/dashboard/payments/{their_payment}/refunds"),
            &[
                ("csrf", &csrf),
                ("mode", "test"),
                ("key", &new_key()),
                ("amount", "100"),
            ],
        )
        .await;
    assert_eq!(refund.status, StatusCode::NOT_FOUND, "{refund:?}");
    let theirs_now = theirs
        .api
        .get(&format!("/api/payments/{their_payment}"))
        .await;
    assert_eq!(theirs_now.json()["refunded_total"], 0);
    // Their members are not mine either.
    member(&server, &theirs, "owner").await;
    let team = owner.get("/dashboard/staff").await.text();
    assert_eq!(team.matches("@shop.example.ru").count(), 2, "{team}");
    db.assert_invariants().await;
}

async fn a_viewer_cannot_refund_and_a_refund_form_refunds_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let shop = server.add_shop("Лавка возвратов").await;
    let shopper = server.api().shopper().await;
    let payment = paid(&shop, &shopper, "R-1", 30_000).await;
    let path = format!("/dashboard/payments/{payment}");

    let (mut viewer, _) = member(&server, &shop, "viewer").await;
    let seen = viewer.get(&path).await;
    assert_eq!(seen.status, StatusCode::OK);
    assert!(
        seen.text().contains("Можно вернуть 300,00 ₽"),
        "{}",
        seen.text()
    );
    assert!(seen.field("key").is_none(), "a viewer gets no refund form");
    let csrf = viewer.csrf().await;
    let refused = viewer
        .post(
            &format!("{path}/refunds"),
            &[
                ("csrf", &csrf),
                ("mode", "test"),
                ("key", &new_key()),
                ("amount", "100"),
            ],
        )
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(
        refused.text().contains("ваша роль — наблюдатель"),
        "{}",
        refused.text()
    );

    // A member of staff sends the same form three times, two of them at once (a double
    // click), then once more later (a resent form): one refund.
    let (clerk, clerk_email) = member(&server, &shop, "staff").await;
    let form = clerk.get(&path).await;
    let (key, csrf) = (form.field("key").unwrap(), form.field("csrf").unwrap());
    assert!(key.starts_with("dash_"));
    let fields = [
        ("csrf", csrf.as_str()),
        ("mode", "test"),
        ("key", key.as_str()),
        ("amount", "120,50"),
    ];
    let refunds_path = format!("{path}/refunds");
    let (mut a, mut b) = (clerk.clone(), clerk.clone());
    let (first, second) = tokio::join!(
        a.post(&refunds_path, &fields),
        b.post(&refunds_path, &fields)
    );
    let mut c = clerk.clone();
    let third = c.post(&refunds_path, &fields).await;
    let refunds: Vec<_> = [&first, &second, &third]
        .iter()
        .filter(|p| p.status == StatusCode::SEE_OTHER)
        .map(|p| p.location.clone().unwrap())
        .collect();
    assert!(refunds.len() >= 2, "{first:?} {second:?} {third:?}");
    for busy in [&first, &second]
        .iter()
        .filter(|p| p.status != StatusCode::SEE_OTHER)
    {
        assert_eq!(busy.status, StatusCode::CONFLICT, "{busy:?}");
    }
    assert!(
        third.location.as_deref().unwrap().contains("replayed=1"),
        "{third:?}"
    );
    let after = clerk.get(third.location.as_deref().unwrap()).await.text();
    assert!(after.contains("Этот возврат уже был проведён"), "{after}");
    assert!(after.contains("Можно вернуть 179,50 ₽"), "{after}");
    let now = shop
        .api
        .get(&format!("/api/payments/{payment}"))
        .await
        .json();
    assert_eq!(now["refunded_total"], 12_050);
    assert_eq!(
        db.scalar(&format!(
            "SELECT COUNT(*) FROM refunds WHERE payment_id = '{payment}'"
        ))
        .await,
        1
    );
    // Its ledger rows are on the payment's page: the payment's two and the refund's two.
    let ledger = clerk.get(&path).await.text();
    assert!(ledger.matches("возврат").count() >= 2, "{ledger}");
    assert!(
        ledger.contains("−120,50 ₽") && ledger.contains("−300,00 ₽"),
        "{ledger}"
    );

    // More than is left: told how much is left; nothing moves.
    let form = clerk.get(&path).await;
    let mut d = clerk.clone();
    let too_much = d
        .post(
            &format!("{path}/refunds"),
            &[
                ("csrf", &csrf),
                ("mode", "test"),
                ("key", &form.field("key").unwrap()),
                ("amount", "500"),
            ],
        )
        .await;
    assert_eq!(too_much.status, StatusCode::CONFLICT);
    assert!(
        too_much.text().contains("можно вернуть 179,50 ₽"),
        "{}",
        too_much.text()
    );
    let audit = db
        .texts(&format!(
            "SELECT email FROM audit_log WHERE action = 'refund.created' AND subject LIKE '%{payment}%'"
        ))
        .await;
    assert_eq!(audit, vec![clerk_email]);
    db.assert_invariants().await;
}

async fn forms_from_elsewhere_are_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let shop = server.add_shop("Лавка форм").await;
    let shopper = server.api().shopper().await;
    let payment = paid(&shop, &shopper, "F-1", 10_000).await;
    let (mut owner, _) = member(&server, &shop, "owner").await;
    let csrf = owner.csrf().await;
    let path = format!("/dashboard/payments/{payment}/refunds");
    let no_token = owner
        .post(
            &path,
            &[("mode", "test"), ("key", &new_key()), ("amount", "10")],
        )
        .await;
    assert_eq!(no_token.status, StatusCode::FORBIDDEN);
    assert!(no_token.text().contains("Форма устарела"));
    let wrong_token = owner
        .post(
            &path,
            &[
                ("csrf", &"0".repeat(64)),
                ("mode", "test"),
                ("key", &new_key()),
                ("amount", "10"),
            ],
        )
        .await;
    assert_eq!(wrong_token.status, StatusCode::FORBIDDEN);
    let cross_site = owner
        .post_from(
            &path,
            &[
                ("csrf", &csrf),
                ("mode", "test"),
                ("key", &new_key()),
                ("amount", "10"),
            ],
            "cross-site",
        )
        .await;
    assert_eq!(cross_site.status, StatusCode::FORBIDDEN);
    assert!(cross_site.text().contains("с чужого сайта"));
    let no_key = owner
        .post(
            &path,
            &[("csrf", &csrf), ("mode", "test"), ("amount", "10")],
        )
        .await;
    assert_eq!(no_key.status, StatusCode::BAD_REQUEST);
    let bad_amount = owner
        .post(
            &path,
            &[
                ("csrf", &csrf),
                ("mode", "test"),
                ("key", &new_key()),
                ("amount", "десять"),
            ],
        )
        .await;
    assert_eq!(bad_amount.status, StatusCode::BAD_REQUEST);
    assert!(
        bad_amount
            .text()
            .contains("Сумма возврата должна быть в рублях")
    );
    assert_eq!(
        shop.api
            .get(&format!("/api/payments/{payment}"))
            .await
            .json()["refunded_total"],
        0
    );
    // The cookie alone signs nothing in from another site's page: it is SameSite=Strict.
    let out = owner.post("/dashboard/sign-out", &[("csrf", &csrf)]).await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
}

async fn payments_are_found_by_order_amount_date_and_state(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let shop = server.add_shop("Лавка поиска").await;
    let shopper = server.api().shopper().await;
    let mut ids = Vec::new();
    for n in 0..55 {
        ids.push(paid(&shop, &shopper, &format!("S-{n}"), 1_000 + n).await);
    }
    assert_eq!(
        shop.refund(&ids[3], &new_key(), 1_003).await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        shop.refund(&ids[4], &new_key(), 4).await.status,
        StatusCode::CREATED
    );
    let (owner, _) = member(&server, &shop, "viewer").await;
    let rows =
        |page: &support::dashboard::Page| page.html.matches("/dashboard/payments/pay_").count();

    // Newest first, 50 a page, the next page after.
    let first = owner.get("/dashboard/payments").await;
    assert_eq!(rows(&first), 50);
    assert!(first.text().find("S-54").unwrap() < first.text().find("S-53").unwrap());
    let next = first
        .html
        .split("href=\"")
        .find(|h| h.contains("before="))
        .unwrap();
    let next = next.split('"').next().unwrap().replace("&amp;", "&");
    let second = owner.get(&next).await;
    assert_eq!(rows(&second), 5, "{next}");
    assert!(second.text().contains("S-0 "));

    let by_order = owner.get("/dashboard/payments?q=S-7").await;
    assert_eq!(rows(&by_order), 1);
    let by_id = owner
        .get(&format!("/dashboard/payments?q={}", ids[9]))
        .await;
    assert_eq!(rows(&by_id), 1);
    assert!(by_id.text().contains("S-9"));
    let by_amount = owner.get("/dashboard/payments?amount=10%2C12").await;
    assert_eq!(rows(&by_amount), 1);
    assert!(by_amount.text().contains("S-12"));
    let refunded = owner.get("/dashboard/payments?state=refunded").await;
    assert_eq!(rows(&refunded), 1);
    assert!(refunded.text().contains("S-3") && refunded.text().contains("Возвращён"));
    let partly = owner
        .get("/dashboard/payments?state=partially_refunded")
        .await;
    assert_eq!(rows(&partly), 1);
    assert!(partly.text().contains("S-4"));
    let today = time::OffsetDateTime::now_utc()
        .to_offset(time::UtcOffset::from_hms(3, 0, 0).unwrap())
        .date();
    let today = format!("{today}");
    let dated = owner
        .get(&format!(
            "/dashboard/payments?from={today}&to={today}&q=S-1"
        ))
        .await;
    assert_eq!(rows(&dated), 1);
    let past = owner
        .get("/dashboard/payments?from=2020-01-01&to=2020-01-31")
        .await;
    assert_eq!(rows(&past), 0);
    assert!(past.text().contains("Платежей не найдено"));
    // Live money is a page of its own: none here.
    let live = owner.get("/dashboard/payments?mode=live").await;
    assert_eq!(rows(&live), 0);
    for bad in ["amount=abc", "from=вчера", "state=lost"] {
        let page = owner.get(&format!("/dashboard/payments?{bad}")).await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{bad}");
    }
}

async fn each_delivery_attempt_is_shown_and_an_event_is_resent(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start_with(SERVER, &db, &FAST).await;
    let receiver = Receiver::start().await;
    receiver.answer(vec![Answer::Status(500)], Answer::Status(200));
    let shop = server
        .add_shop_with_webhook("Лавка вебхуков", &receiver.url)
        .await;
    let shopper = server.api().shopper().await;
    let payment = paid(&shop, &shopper, "W-1", 5_000).await;
    receiver.wait_for(2, WITHIN).await;
    let event = db
        .scalar_text(&format!(
            "SELECT event_id FROM webhook_events WHERE subject_id = '{payment}'"
        ))
        .await;
    support::wait_until("the event is delivered", WITHIN, || async {
        db.scalar(&format!(
            "SELECT COUNT(*) FROM webhook_events WHERE event_id = '{event}' AND status = 'delivered'"
        ))
        .await
            == 1
    })
    .await;
    let (mut clerk, clerk_email) = member(&server, &shop, "staff").await;
    let page = clerk.get(&format!("/dashboard/events/{event}")).await;
    let text = page.text();
    assert!(text.contains("доставлено"), "{text}");
    let rows = page.html.split("<tr>").skip(2).collect::<Vec<_>>();
    assert_eq!(rows.len(), 2, "two attempts: {text}");
    assert!(
        rows[0].contains(">500<") && rows[1].contains(">200<"),
        "{rows:?}"
    );
    assert!(text.contains("payment.succeeded"));
    // The payment's page lists its event too.
    let payment_page = clerk
        .get(&format!("/dashboard/payments/{payment}"))
        .await
        .text();
    assert!(payment_page.contains(&event));

    let csrf = clerk.csrf().await;
    let resent = clerk
        .post(
            &format!("/dashboard/events/{event}/redelivery"),
            &[("csrf", &csrf), ("mode", "test")],
        )
        .await;
    assert_eq!(resent.status, StatusCode::SEE_OTHER, "{resent:?}");
    let got = receiver.wait_for(3, WITHIN).await;
    assert_eq!(got[2].webhook_id, event, "the same webhook-id again");
    support::wait_until("the third attempt is recorded", WITHIN, || async {
        db.scalar(&format!(
            "SELECT COUNT(*) FROM delivery_attempts WHERE event_id = '{event}'"
        ))
        .await
            == 3
    })
    .await;
    let latency = db
        .scalar(&format!(
            "SELECT MAX(latency_ms) FROM delivery_attempts WHERE event_id = '{event}'"
        ))
        .await;
    assert!((0..300).contains(&latency), "{latency}");

    // Everything since a time: the delivered event too, when asked.
    let since = time::OffsetDateTime::now_utc()
        .to_offset(time::UtcOffset::from_hms(3, 0, 0).unwrap())
        - time::Duration::hours(1);
    let since = format!("{}T{:02}:{:02}", since.date(), since.hour(), since.minute());
    let recovered = clerk
        .post(
            "/dashboard/events/recovery",
            &[
                ("csrf", &csrf),
                ("mode", "test"),
                ("since", &since),
                ("include_delivered", "1"),
            ],
        )
        .await;
    assert_eq!(
        recovered.location.as_deref(),
        Some("/dashboard/events?recovered=1&mode=test"),
        "{recovered:?}"
    );
    receiver.wait_for(4, WITHIN).await;

    // A viewer sees the attempts and cannot resend.
    let (mut viewer, _) = member(&server, &shop, "viewer").await;
    let csrf = viewer.csrf().await;
    let refused = viewer
        .post(
            &format!("/dashboard/events/{event}/redelivery"),
            &[("csrf", &csrf), ("mode", "test")],
        )
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let lines = db
        .texts(
            "SELECT email FROM audit_log WHERE action IN ('event.redelivered', 'events.recovered')",
        )
        .await;
    assert_eq!(lines, vec![clerk_email.clone(), clerk_email]);
}

async fn an_owner_invites_changes_and_removes_members(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let shop = server.add_shop("Лавка команды").await;
    let (mut owner, owner_email) = member(&server, &shop, "owner").await;
    let csrf = owner.csrf().await;
    let email = address("clerk");
    let invited = owner
        .post(
            "/dashboard/staff/invitations",
            &[
                ("csrf", &csrf),
                ("mode", "test"),
                ("email", &email),
                ("role", "staff"),
            ],
        )
        .await;
    assert_eq!(invited.status, StatusCode::SEE_OTHER, "{invited:?}");
    let waiting = owner.get(invited.location.as_deref().unwrap()).await.text();
    assert!(
        waiting.contains(&format!("Приглашение отправлено на {email}")),
        "{waiting}"
    );
    assert!(waiting.contains("Ждут ответа"));
    let link = server.invite_link(&email, 1).await;
    let mut clerk = server.dashboard();
    clerk.accept(&link, PASSWORD).await;
    // A member of staff manages no one.
    let clerk_csrf = clerk.csrf().await;
    let staff_id = db
        .scalar_text(&format!(
            "SELECT staff_id FROM staff WHERE email = '{owner_email}'"
        ))
        .await;
    let refused = clerk
        .post(
            &format!("/dashboard/staff/{staff_id}"),
            &[("csrf", &clerk_csrf), ("mode", "test"), ("role", "viewer")],
        )
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let refused = clerk
        .post(
            "/dashboard/staff/invitations",
            &[
                ("csrf", &clerk_csrf),
                ("mode", "test"),
                ("email", &address("x")),
                ("role", "owner"),
            ],
        )
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);

    // The owner makes the clerk a viewer: signed out everywhere, a viewer from the next sign-in.
    let clerk_id = db
        .scalar_text(&format!(
            "SELECT staff_id FROM staff WHERE email = '{email}'"
        ))
        .await;
    let changed = owner
        .post(
            &format!("/dashboard/staff/{clerk_id}"),
            &[("csrf", &csrf), ("mode", "test"), ("role", "viewer")],
        )
        .await;
    assert_eq!(changed.status, StatusCode::SEE_OTHER);
    assert_eq!(clerk.get("/dashboard").await.status, StatusCode::SEE_OTHER);
    clerk.sign_in(&email, PASSWORD).await;
    assert!(
        clerk
            .get("/dashboard")
            .await
            .text()
            .contains("(наблюдатель)")
    );
    // The last owner stays.
    let last = owner
        .post(
            &format!("/dashboard/staff/{staff_id}"),
            &[("csrf", &csrf), ("mode", "test"), ("role", "remove")],
        )
        .await;
    assert_eq!(last.status, StatusCode::BAD_REQUEST);
    let removed = owner
        .post(
            &format!("/dashboard/staff/{clerk_id}"),
            &[("csrf", &csrf), ("mode", "test"), ("role", "remove")],
        )
        .await;
    assert_eq!(removed.status, StatusCode::SEE_OTHER);
    let gone = clerk.sign_in(&email, PASSWORD).await;
    assert_eq!(gone.status, StatusCode::UNAUTHORIZED);
    let audit = owner.get("/dashboard/audit").await.text();
    for line in ["сменил(а) роль", "убрал(а) из команды", "пригласил(а)"]
    {
        assert!(audit.contains(line), "{line}: {audit}");
    }
}

async fn the_overview_draws_the_days_payments_and_refunds(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(SERVER, &db).await;
    let shop = server.add_shop("Лавка графиков").await;
    let shopper = server.api().shopper().await;
    let a = paid(&shop, &shopper, "C-1", 10_000).await;
    paid(&shop, &shopper, "C-2", 5_000).await;
    shop.refund(&a, &new_key(), 2_500).await;
    let (owner, _) = member(&server, &shop, "viewer").await;
    let page = owner.get("/dashboard").await;
    let text = page.text();
    assert!(text.contains("Платежей 2 на 150,00 ₽"), "{text}");
    assert!(text.contains("Возвратов 1 на 25,00 ₽"), "{text}");
    assert_eq!(page.html.matches("<svg").count(), 3);
    assert!(
        page.html.contains("платежи 150,00\u{a0}₽ (2)"),
        "today's bar is titled"
    );
    assert!(
        page.html
            .contains("aria-label=\"Платежи и возвраты по дням за 30 дней.")
    );
    // The live side has none of it.
    let live = owner.get("/dashboard?mode=live").await.text();
    assert!(live.contains("Платежей 0 на 0,00 ₽"), "{live}");
}

async fn an_owner_controls_the_endpoint_and_staff_cannot(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start_with(SERVER, &db, &FAST).await;
    let receiver = Receiver::start().await;
    let shop = server
        .add_shop_with_webhook("Лавка конечной точки", &receiver.url)
        .await;
    let shopper = server.api().shopper().await;
    let (mut owner, _) = member(&server, &shop, "owner").await;
    let (mut clerk, _) = member(&server, &shop, "staff").await;
    let csrf = owner.csrf().await;
    let page = owner.get("/dashboard/webhooks").await.text();
    assert!(page.contains("Состояние включена"), "{page}");
    assert!(page.contains("События все типы"), "{page}");

    // Only refunds: a payment's event is kept, not sent.
    let saved = owner
        .post(
            "/dashboard/webhooks",
            &[
                ("csrf", &csrf),
                ("mode", "test"),
                ("url", &receiver.url),
                ("type:refund.succeeded", "1"),
            ],
        )
        .await;
    assert_eq!(saved.status, StatusCode::SEE_OTHER, "{saved:?}");
    let page = owner.get(saved.location.as_deref().unwrap()).await.text();
    assert!(
        page.contains("Настройки сохранены") && page.contains("События refund.succeeded"),
        "{page}"
    );
    let none = owner
        .post(
            "/dashboard/webhooks",
            &[("csrf", &csrf), ("mode", "test"), ("url", &receiver.url)],
        )
        .await;
    assert_eq!(none.status, StatusCode::BAD_REQUEST);
    let payment = paid(&shop, &shopper, "E-1", 1_000).await;
    let listed = owner.get("/dashboard/events").await.text();
    assert!(listed.contains("тип не выбран"), "{listed}");
    assert!(receiver.deliveries().is_empty());

    // The test event reaches it, and its page shows the attempt.
    let tested = owner
        .post(
            "/dashboard/webhooks/test-event",
            &[("csrf", &csrf), ("mode", "test")],
        )
        .await;
    let location = tested.location.clone().unwrap();
    let event_id = location
        .split("test_event=")
        .nth(1)
        .unwrap()
        .split('&')
        .next()
        .unwrap()
        .to_owned();
    let got = receiver.wait_for(1, WITHIN).await;
    assert_eq!(got[0].webhook_id, event_id);
    support::wait_until("the test's attempt is recorded", WITHIN, || async {
        owner
            .get(&format!("/dashboard/events/{event_id}"))
            .await
            .text()
            .contains("доставлено")
    })
    .await;

    // Disabled by hand: a refund's event waits; enabled: it arrives.
    let off = owner
        .post(
            "/dashboard/webhooks/state",
            &[("csrf", &csrf), ("mode", "test"), ("enabled", "0")],
        )
        .await;
    assert_eq!(off.status, StatusCode::SEE_OTHER);
    let page = owner.get("/dashboard/webhooks").await.text();
    assert!(
        page.contains("Конечная точка отключена") && page.contains("отключена магазином"),
        "{page}"
    );
    assert_eq!(
        shop.refund(&payment, &new_key(), 100).await.status,
        StatusCode::CREATED
    );
    assert_eq!(receiver.deliveries().len(), 1);
    let on = owner
        .post(
            "/dashboard/webhooks/state",
            &[("csrf", &csrf), ("mode", "test"), ("enabled", "1")],
        )
        .await;
    assert_eq!(on.status, StatusCode::SEE_OTHER);
    let got = receiver.wait_for(2, WITHIN).await;
    assert!(got[1].body.contains("refund.succeeded"), "{:?}", got[1]);

    // A member of staff changes none of it.
    let clerk_csrf = clerk.csrf().await;
    for (path, fields) in [
        ("/dashboard/webhooks/state", vec![("enabled", "0")]),
        ("/dashboard/webhooks/test-event", vec![]),
        ("/dashboard/webhooks/secret", vec![("overlap", "0")]),
        (
            "/dashboard/webhooks",
            vec![("url", ""), ("type:payment.succeeded", "1")],
        ),
    ] {
        let mut all = vec![("csrf", clerk_csrf.as_str()), ("mode", "test")];
        all.extend(fields);
        let refused = clerk.post(path, &all).await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{path}");
    }
    let audit = owner.get("/dashboard/audit").await.text();
    for line in [
        "отключил(а) конечную точку",
        "включил(а) конечную точку",
        "отправил(а) тестовое событие",
        "сменил(а) конечную точку",
    ] {
        assert!(audit.contains(line), "{line}: {audit}");
    }
}

/// What a change to the shop's endpoint or events could alter: each mode's endpoint (URL,
/// types, state, signing secrets), and every event's state and attempts.
async fn endpoint_and_events(db: &TestDb) -> Vec<String> {
    let mut state = db
        .texts(
            "SELECT COALESCE(webhook_url, '-') || ' ' || event_types || ' ' || signing_secret \
                    || ' ' || COALESCE(old_signing_secret, '-') || ' ' \
                    || COALESCE(CAST(webhook_disabled_at AS TEXT), '-') \
               FROM shops ORDER BY shop_id, livemode",
        )
        .await;
    state.extend(
        db.texts(
            "SELECT type || ' ' || status || ' ' || CAST(attempts AS TEXT) \
               FROM webhook_events ORDER BY seq",
        )
        .await,
    );
    state.push(format!(
        "{} attempts",
        db.scalar("SELECT COUNT(*) FROM delivery_attempts").await
    ));
    state
}

/// Every change to a shop's endpoint and events, by a member or by the shop's key, is written
/// with its audit line in one transaction: while the audit log refuses lines, none is made
/// (the request fails whole), and once it takes them again, each change has its line, the
/// key's named as the API key's.
async fn a_change_the_audit_log_cannot_record_is_not_made(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start_with(SERVER, &db, &FAST).await;
    let receiver = Receiver::start().await;
    let shop = server
        .add_shop_with_webhook("Лавка журнала", &receiver.url)
        .await;
    let shopper = server.api().shopper().await;
    let (mut owner, _) = member(&server, &shop, "owner").await;
    let csrf = owner.csrf().await;
    paid(&shop, &shopper, "AUDIT-1", 1_000).await;
    let delivered = receiver.wait_for(1, WITHIN).await;
    let event_id = delivered[0].webhook_id.clone();
    support::wait_until("the event's attempt is recorded", WITHIN, || async {
        db.scalar("SELECT COUNT(*) FROM delivery_attempts").await == 1
    })
    .await;

    db.execute(match backend {
        Backend::Sqlite => {
            "CREATE TRIGGER audit_refused BEFORE INSERT ON audit_log \
             BEGIN SELECT RAISE(ABORT, 'the audit log refuses'); END"
        }
        _ => {
            "CREATE FUNCTION refuse_audit() RETURNS trigger LANGUAGE plpgsql \
             AS $$ BEGIN RAISE EXCEPTION 'the audit log refuses'; END $$"
        }
    })
    .await;
    if backend != Backend::Sqlite {
        db.execute(
            "CREATE TRIGGER audit_refused BEFORE INSERT ON audit_log \
             FOR EACH ROW EXECUTE FUNCTION refuse_audit()",
        )
        .await;
    }
    let before = endpoint_and_events(&db).await;
    let other_url = format!("{}?other=1", receiver.url);
    let forms: [(&str, Vec<(&str, &str)>); 6] = [
        (
            "/dashboard/webhooks",
            vec![("url", &other_url), ("type:refund.succeeded", "1")],
        ),
        ("/dashboard/webhooks/state", vec![("enabled", "0")]),
        ("/dashboard/webhooks/test-event", vec![]),
        ("/dashboard/webhooks/secret", vec![("overlap", "3600")]),
        (&format!("/dashboard/events/{event_id}/redelivery"), vec![]),
        (
            "/dashboard/events/recovery",
            vec![("since", "2020-01-01T00:00"), ("include_delivered", "1")],
        ),
    ];
    for (path, fields) in &forms {
        let mut all = vec![("csrf", csrf.as_str()), ("mode", "test")];
        all.extend(fields.iter().copied());
        let refused = owner.post(path, &all).await;
        assert!(refused.status.is_server_error(), "{path}: {refused:?}");
        assert_eq!(endpoint_and_events(&db).await, before, "{path}");
    }
    let redelivery = format!("/api/events/{event_id}/redelivery");
    let calls = [
        (
            "/api/webhook-endpoint",
            serde_json::json!({"url": other_url, "event_types": ["refund.succeeded"],
                               "enabled": false}),
        ),
        ("/api/webhook-endpoint/test-event", serde_json::Value::Null),
        (
            "/api/webhook-endpoint/signing-secret",
            serde_json::json!({"overlap_secs": 3600}),
        ),
        (redelivery.as_str(), serde_json::Value::Null),
        (
            "/api/events/recovery",
            serde_json::json!({"since": "2020-01-01T00:00:00Z", "include_delivered": true}),
        ),
    ];
    for (path, body) in &calls {
        let refused = shop
            .api
            .send(shop.api.post(path, None, body))
            .await
            .unwrap();
        assert!(refused.status.is_server_error(), "{path}: {refused:?}");
        assert_eq!(endpoint_and_events(&db).await, before, "{path}");
    }

    db.execute(match backend {
        Backend::Sqlite => "DROP TRIGGER audit_refused",
        _ => "DROP TRIGGER audit_refused ON audit_log",
    })
    .await;
    for (path, body) in &calls {
        let made = shop
            .api
            .send(shop.api.post(path, None, body))
            .await
            .unwrap();
        assert!(made.status.is_success(), "{path}: {made:?}");
    }
    let by_key = db
        .texts(
            "SELECT action FROM audit_log WHERE staff_id IS NULL AND email = 'API-ключ' \
              ORDER BY entry_id",
        )
        .await;
    assert_eq!(
        by_key,
        [
            "endpoint.set",
            "endpoint.disabled",
            "endpoint.tested",
            "signing_secret.rolled",
            "event.redelivered",
            "events.recovered",
        ]
    );
}
