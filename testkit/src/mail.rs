//! A real SMTP server for the tests: aiosmtpd (from PyPI, installed into `tools/venv` by the
//! test command) on a free port, each mail it takes written to a maildir. Started once per test
//! binary; every checkout server the test kit starts sends its mail here
//! (`CHECKOUT_SMTP_URL`), and a test reads what a shopper would find in the mailbox.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::postgres::{free_port, run_after_tests_exit};

pub struct MailReceiver {
    pub port: u16,
    maildir: PathBuf,
}

/// One mail as its reader sees it.
#[derive(Clone, Debug)]
pub struct Mail {
    pub from: String,
    pub to: String,
    pub subject: String,
    pub text: String,
}

impl Mail {
    /// The one-time code the mail carries (the first run of exactly six digits), if any.
    pub fn code(&self) -> Option<String> {
        let bytes = self.text.as_bytes();
        let mut start = 0;
        while start < bytes.len() {
            let run = bytes[start..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            if run == 6 {
                return Some(self.text[start..start + 6].to_owned());
            }
            start += run.max(1);
        }
        None
    }
}

static RECEIVER: OnceLock<MailReceiver> = OnceLock::new();

/// The receiver shared by every test (and every server) of this binary.
pub fn receiver() -> &'static MailReceiver {
    RECEIVER.get_or_init(MailReceiver::start)
}

fn program() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/venv/bin/aiosmtpd");
    assert!(
        path.exists(),
        "{} is missing: the README's test command installs aiosmtpd into tools/venv",
        path.display()
    );
    path
}

impl MailReceiver {
    fn start() -> MailReceiver {
        let port = free_port();
        let dir = tempfile::Builder::new()
            .prefix("checkout-mail-")
            .tempdir()
            .unwrap()
            .keep();
        // The handler makes the maildir (new/, cur/, tmp/) only where nothing is yet.
        let maildir = dir.join("maildir");
        let child = Command::new(program())
            .args(["-n", "-l", &format!("127.0.0.1:{port}")])
            .args(["-c", "aiosmtpd.handlers.Mailbox"])
            .arg(&maildir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("aiosmtpd starts");
        run_after_tests_exit(
            "the mail receiver's",
            &format!("kill {}; rm -rf {}", child.id(), dir.display()),
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "aiosmtpd listens on {port} within 20 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        #[allow(clippy::zombie_processes)] // the watcher above stops it
        std::mem::forget(child);
        MailReceiver { port, maildir }
    }

    /// What a server is given as `CHECKOUT_SMTP_URL`.
    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    /// Every mail to `address` so far (from `from`, when given: one server's), oldest first.
    pub fn mails(&self, address: &str, from: Option<&str>) -> Vec<Mail> {
        let Ok(entries) = std::fs::read_dir(self.maildir.join("new")) else {
            return Vec::new();
        };
        let mut files: Vec<(std::time::SystemTime, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        files.sort();
        files
            .into_iter()
            .filter_map(|(_, path)| read(&std::fs::read(path).ok()?))
            .filter(|mail| mail.to.eq_ignore_ascii_case(address))
            .filter(|mail| from.is_none_or(|from| mail.from.eq_ignore_ascii_case(from)))
            .collect()
    }

    /// The `n`th mail (from 1) to `address` (from `from`, when given), waiting up to 10 s for
    /// it to arrive.
    pub async fn nth_mail(&self, address: &str, from: Option<&str>, n: usize) -> Mail {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mails = self.mails(address, from);
            if let Some(mail) = mails.get(n - 1) {
                return mail.clone();
            }
            assert!(
                Instant::now() < deadline,
                "mail number {n} to {address} within 10 s; there are {}: {mails:?}",
                mails.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn read(raw: &[u8]) -> Option<Mail> {
    let message = mail_parser::MessageParser::default().parse(raw)?;
    let to = message.to()?.first()?.address()?.to_owned();
    let from = message.from()?.first()?.address()?.to_owned();
    Some(Mail {
        from,
        to,
        subject: message.subject().unwrap_or_default().to_owned(),
        text: message.body_text(0)?.into_owned(),
    })
}
