//! The shop's dashboard as a member's browser uses it, over plain HTTP: its cookie kept, its
//! forms posted with their CSRF token, redirects not followed (a test reads where they lead).
//! And the invitation that starts it, mailed by `checkout-server shop invite`.

use reqwest::StatusCode;
use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};

use crate::{Server, mail};

/// A browser signed in to the dashboard (or not yet: no cookie).
#[derive(Clone)]
pub struct Dashboard {
    pub base: String,
    client: reqwest::Client,
    pub cookie: Option<String>,
}

/// An answer as a test reads it: status, where a redirect leads, the page.
#[derive(Debug)]
pub struct Page {
    pub status: StatusCode,
    pub location: Option<String>,
    pub html: String,
    set_cookie: Option<String>,
}

impl Page {
    /// The value of the first hidden field `name` in the page.
    pub fn field(&self, name: &str) -> Option<String> {
        let marker = format!("name=\"{name}\" value=\"");
        let at = self.html.find(&marker)? + marker.len();
        Some(self.html[at..].split('"').next()?.to_owned())
    }

    /// The page's text with its tags taken out and its spaces folded (what a person reads).
    pub fn text(&self) -> String {
        let mut text = String::new();
        let mut in_tag = false;
        for c in self.html.chars() {
            match c {
                '<' => {
                    in_tag = true;
                    text.push(' ');
                }
                '>' => in_tag = false,
                c if !in_tag => text.push(c),
                _ => {}
            }
        }
        text.replace("&nbsp;", " ")
            .replace('\u{a0}', " ")
            .replace("&quot;", "\"")
            .replace("&amp;", "&")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    }
}

impl Dashboard {
    /// A browser with no cookie yet.
    pub fn new(base: &str) -> Dashboard {
        Dashboard {
            base: base.trim_end_matches('/').to_owned(),
            client: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("a client"),
            cookie: None,
        }
    }

    async fn read(answer: reqwest::Response) -> Page {
        let status = answer.status();
        let location = answer
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let set_cookie = answer
            .headers()
            .get(SET_COOKIE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let html = answer.text().await.unwrap_or_default();
        Page {
            status,
            location,
            html,
            set_cookie,
        }
    }

    fn keep_cookie(&mut self, page: &Page) {
        if let Some(set) = &page.set_cookie {
            let pair = set.split(';').next().unwrap_or_default();
            self.cookie = match pair.split_once('=') {
                Some((_, "")) | None => None,
                Some(_) => Some(pair.to_owned()),
            };
        }
    }

    pub async fn get(&self, path: &str) -> Page {
        let mut request = self.client.get(format!("{}{path}", self.base));
        if let Some(cookie) = &self.cookie {
            request = request.header(COOKIE, cookie);
        }
        Dashboard::read(request.send().await.expect("the dashboard answers")).await
    }

    /// Posts a form as the browser sends it (with `Sec-Fetch-Site: same-origin`); keeps a cookie
    /// it is given.
    pub async fn post(&mut self, path: &str, fields: &[(&str, &str)]) -> Page {
        self.post_from(path, fields, "same-origin").await
    }

    /// The same, as sent from a page of `site` (`Sec-Fetch-Site`).
    pub async fn post_from(&mut self, path: &str, fields: &[(&str, &str)], site: &str) -> Page {
        let mut request = self
            .client
            .post(format!("{}{path}", self.base))
            .header("sec-fetch-site", site)
            .form(fields);
        if let Some(cookie) = &self.cookie {
            request = request.header(COOKIE, cookie);
        }
        let page = Dashboard::read(request.send().await.expect("the dashboard answers")).await;
        self.keep_cookie(&page);
        page
    }

    /// This sign-in's CSRF token, as its pages carry it.
    pub async fn csrf(&self) -> String {
        let page = self.get("/dashboard/staff").await;
        page.field("csrf")
            .unwrap_or_else(|| panic!("no CSRF token on the page: {page:?}"))
    }

    /// Signs in with e-mail and password; the page it led to.
    pub async fn sign_in(&mut self, email: &str, password: &str) -> Page {
        self.post(
            "/dashboard/sign-in",
            &[("email", email), ("password", password)],
        )
        .await
    }

    /// Follows an invitation's link (its path, on this server): sets the password, and is
    /// signed in.
    pub async fn accept(&mut self, link: &str, password: &str) -> Page {
        let at = link
            .find("/dashboard/invite/")
            .unwrap_or_else(|| panic!("{link} is not an invitation"));
        let path = link[at..].to_owned();
        let form = self.get(&path).await;
        assert_eq!(form.status, StatusCode::OK, "{form:?}");
        self.post(&path, &[("password", password), ("repeat", password)])
            .await
    }
}

impl Server {
    /// `checkout-server shop invite`, as the operator runs it beside the server, with this
    /// server's mail settings; the link the mail carries.
    pub async fn invite(&self, shop_id: &str, email: &str, role: &str) -> String {
        let before = mail::receiver().mails(email, Some(&self.mail_from)).len();
        let output = tokio::process::Command::new(&self.binary)
            .args([
                "shop", "invite", "--shop", shop_id, "--email", email, "--role", role,
            ])
            .env("DATABASE_URL", &self.database_url)
            .env("CHECKOUT_SMTP_URL", mail::receiver().url())
            .env("CHECKOUT_MAIL_FROM", format!("Касса <{}>", self.mail_from))
            .env("CHECKOUT_PUBLIC_ORIGIN", &self.base)
            .env("RUST_LOG", "warn")
            .output()
            .await
            .expect("checkout-server runs");
        assert!(
            output.status.success(),
            "shop invite: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        self.invite_link(email, before + 1).await
    }

    /// The link of the `n`th mail (from 1) this server sent to `email`.
    pub async fn invite_link(&self, email: &str, n: usize) -> String {
        let mail = mail::receiver()
            .nth_mail(email, Some(&self.mail_from), n)
            .await;
        mail.text
            .split_whitespace()
            .find(|word| word.contains("/dashboard/invite/"))
            .unwrap_or_else(|| panic!("no link in {mail:?}"))
            .to_owned()
    }

    pub fn dashboard(&self) -> Dashboard {
        Dashboard::new(&self.base)
    }
}
