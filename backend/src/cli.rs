//! The `checkout-server` command: settings, logging, runtime. A library function so that a test
//! or benchmark server (given [`Seams`]) is the very same program.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use crate::Seams;
use crate::config::{Cli, Command, Config, LogFormat, Mode, ShopCommand, ShopperCommand};
use crate::store::Store;

/// `checkout-server` as shipped.
pub fn main() -> ExitCode {
    main_with(Seams::default())
}

/// The same program with test or benchmark seams.
pub fn main_with(seams: Seams) -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) if !error.use_stderr() => error.exit(), // --help, --version
        Err(error) => {
            // One clear line, not clap's usage block.
            let text = error.to_string();
            let line = text.lines().next().unwrap_or("invalid setting");
            eprintln!("checkout-server: {}", line.trim_start_matches("error: "));
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Some(Command::Shop {
            action:
                ShopCommand::Add {
                    name,
                    webhook_url,
                    origins,
                },
        }) => return shop_add(&cli.config, &name, webhook_url.as_deref(), &origins),
        Some(Command::Shop {
            action: ShopCommand::SetOrigins { shop, origins, .. },
        }) => return shop_set_origins(&cli.config, &shop, &origins),
        Some(Command::Shop {
            action: ShopCommand::SetWebhook {
                shop, url, mode, ..
            },
        }) => return shop_set_webhook(&cli.config, &shop, mode, url.as_deref()),
        Some(Command::Shop {
            action:
                ShopCommand::RollKey {
                    shop,
                    mode,
                    overlap,
                },
        }) => return shop_roll_key(&cli.config, &shop, mode, overlap.unwrap_or_default()),
        Some(Command::Shop {
            action:
                ShopCommand::RollWebhookSecret {
                    shop,
                    mode,
                    overlap,
                },
        }) => {
            return shop_roll_webhook_secret(&cli.config, &shop, mode, overlap.unwrap_or_default());
        }
        Some(Command::Shop {
            action: ShopCommand::Invite { shop, email, role },
        }) => return shop_invite(&cli.config, &shop, &email, &role),
        Some(Command::Shopper {
            action:
                ShopperCommand::Deposit {
                    account,
                    email,
                    amount,
                    key,
                },
        }) => {
            use crate::operations::deposits::Recipient;
            let to = match (account, email) {
                (Some(account), _) => Recipient::Account(account),
                (None, email) => Recipient::Email(email.unwrap_or_default()),
            };
            return shopper_deposit(&cli.config, to, amount, &key);
        }
        Some(Command::Shopper {
            action: ShopperCommand::Show { email },
        }) => return shopper_show(&cli.config, &email),
        Some(Command::Verify { json }) => return verify(&cli.config, json),
        Some(Command::Migrate) => return migrate(&cli.config),
        None => {}
    }
    let config = cli.config;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    match config.log_format {
        LogFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(std::io::stdout().is_terminal())
            .init(),
        // One object per line; a request's line carries its span's fields (request id, route,
        // idempotency outcome) at the top level, beside status and latency.
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_env_filter(filter)
            .init(),
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("checkout-server: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(crate::run(config, seams)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("checkout-server: {error}");
            ExitCode::FAILURE
        }
    }
}

/// `checkout-server shop add`: prints the new shop's secrets as one JSON line on stdout (the
/// only time they are shown), or one line on stderr. Works beside a running server, on either
/// database.
fn shop_add(
    config: &Config,
    name: &str,
    webhook_url: Option<&str>,
    origins: &[String],
) -> ExitCode {
    operator_command(config, |store| async move {
        let shop = crate::operations::shops::add(&store, name, webhook_url, origins)
            .await
            .map_err(|e| e.to_string())?;
        Ok(serde_json::to_string(&shop).expect("a shop serializes"))
    })
}

/// `checkout-server shop set-webhook`: one JSON line saying what the shop's endpoint is now.
fn shop_set_webhook(
    config: &Config,
    shop_id: &str,
    mode: Option<Mode>,
    url: Option<&str>,
) -> ExitCode {
    operator_command(config, |store| async move {
        let livemode = mode.map(Mode::livemode);
        crate::operations::shops::set_webhook_url(&store, shop_id, livemode, url)
            .await
            .map_err(|e| e.to_string())?;
        let modes = match mode {
            Some(Mode::Test) => vec!["test"],
            Some(Mode::Live) => vec!["live"],
            None => vec!["test", "live"],
        };
        Ok(
            serde_json::json!({ "shop_id": shop_id, "webhook_url": url, "modes": modes })
                .to_string(),
        )
    })
}

/// `checkout-server shop invite`: mails the invitation (through `CHECKOUT_SMTP_URL`); one JSON
/// line saying to whom. The link is only in the mail.
fn shop_invite(config: &Config, shop_id: &str, email: &str, role: &str) -> ExitCode {
    operator_command(config, |store| async move {
        use crate::operations::staff::{self, Invitation, Inviter, Role};
        // Made inside the runtime: its connection pool belongs to it.
        let mailer = config
            .smtp_url
            .as_deref()
            .map(|url| crate::mail::Mailer::new(url, &config.mail_from))
            .transpose()?;
        let role = Role::parse(role).ok_or("role must be owner, staff or viewer")?;
        let shop = store
            .shop(shop_id, false)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no shop {shop_id}"))?;
        let invitation = Invitation {
            shop_id,
            shop_name: &shop.name,
            email,
            role,
        };
        staff::invite(
            &store,
            mailer.as_ref(),
            &config.public_origin,
            &invitation,
            Inviter::Operator,
        )
        .await
        .map_err(|e| e.to_string())?;
        Ok(
            serde_json::json!({ "shop_id": shop_id, "invited": email, "role": role.as_str() })
                .to_string(),
        )
    })
}

/// `checkout-server shop roll-key`: the new secret key, once, and when the old one stops
/// (`null`: it has stopped).
fn shop_roll_key(
    config: &Config,
    shop_id: &str,
    mode: Mode,
    overlap: std::time::Duration,
) -> ExitCode {
    operator_command(config, |store| async move {
        let (key, old_until) =
            crate::operations::shops::roll_key(&store, shop_id, mode.livemode(), overlap)
                .await
                .map_err(|e| e.to_string())?;
        Ok(serde_json::json!({
            "shop_id": shop_id,
            "secret_key": key,
            "old_key_expires_at": old_until.map(crate::clock::rfc3339),
        })
        .to_string())
    })
}

/// `checkout-server shop roll-webhook-secret`: the new signing secret, once, and when the old
/// one stops signing (`null`: it has stopped).
fn shop_roll_webhook_secret(
    config: &Config,
    shop_id: &str,
    mode: Mode,
    overlap: std::time::Duration,
) -> ExitCode {
    operator_command(config, |store| async move {
        let (secret, old_until) = crate::operations::endpoints::roll_signing_secret(
            &store,
            shop_id,
            mode.livemode(),
            overlap,
            crate::operations::endpoints::By::Operator,
        )
        .await
        .map_err(|e| e.to_string())?;
        Ok(serde_json::json!({
            "shop_id": shop_id,
            "mode": if mode.livemode() { "live" } else { "test" },
            "signing_secret": secret,
            "old_signing_secret_expires_at": old_until.map(crate::clock::rfc3339),
        })
        .to_string())
    })
}

/// `checkout-server shopper deposit`: the deposit (first made now, or the same one again).
fn shopper_deposit(
    config: &Config,
    to: crate::operations::deposits::Recipient,
    amount: i64,
    key: &str,
) -> ExitCode {
    let protocol = checkout_idempotency::Protocol::new(config.key_ttl());
    operator_command(config, |store| async move {
        let (done, replayed) =
            crate::operations::deposits::deposit(&store, &protocol, key, to, amount)
                .await
                .map_err(|e| e.problem().detail)?;
        let mut line = serde_json::to_value(&done).expect("a deposit serializes");
        line["replayed"] = serde_json::json!(replayed);
        Ok(line.to_string())
    })
}

/// `checkout-server shopper show`: the live shopper's account and balance.
fn shopper_show(config: &Config, email: &str) -> ExitCode {
    operator_command(config, |store| async move {
        let shopper = crate::operations::shoppers::show(&store, email)
            .await
            .map_err(|e| e.problem().detail)?;
        Ok(serde_json::to_string(&shopper).expect("a shopper serializes"))
    })
}

/// `checkout-server shop set-origins`: one JSON line with the origins the shop has now.
fn shop_set_origins(config: &Config, shop_id: &str, origins: &[String]) -> ExitCode {
    operator_command(config, |store| async move {
        let origins = crate::operations::shops::set_origins(&store, shop_id, origins)
            .await
            .map_err(|e| e.to_string())?;
        Ok(serde_json::json!({ "shop_id": shop_id, "origins": origins }).to_string())
    })
}

/// `checkout-server migrate`: one JSON line with the schema's version.
fn migrate(config: &Config) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("checkout-server: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(Store::migrate(&config.database_url)) {
        Ok(version) => {
            println!("{}", serde_json::json!({ "schema_version": version }));
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!(
                "checkout-server: cannot migrate {}: {error}",
                config.database_url_redacted()
            );
            ExitCode::FAILURE
        }
    }
}

/// At most this many ids of one broken invariant are printed (all are counted).
const IDS_SHOWN: usize = 20;

/// `checkout-server verify`: the books' invariants in one snapshot, as a report or JSON.
fn verify(config: &Config, json: bool) -> ExitCode {
    use crate::store::invariants::{Scope, verify_database};
    let database = config.database_url_redacted();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("checkout-server: cannot start the runtime: {error}");
            return ExitCode::from(2);
        }
    };
    let verified = match runtime.block_on(verify_database(&config.database_url, Scope::Service)) {
        Ok(verified) => verified,
        Err(error) => {
            eprintln!("checkout-server: cannot verify {database}: {error}");
            return ExitCode::from(2);
        }
    };
    if json {
        let invariants: Vec<_> = verified
            .checked
            .iter()
            .map(|c| {
                serde_json::json!({
                    "name": c.invariant.name,
                    "says": c.invariant.says,
                    "over": c.invariant.over,
                    "constraint": c.invariant.constraint,
                    "rows": c.rows,
                    "violation_count": c.violations.len(),
                    "took_ms": c.took.as_secs_f64() * 1000.0,
                    "violations": &c.violations[..c.violations.len().min(1_000)],
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({
                "database": database,
                "holds": verified.holds(),
                "took_ms": verified.took.as_millis() as u64,
                "invariants": invariants,
            })
        );
    } else {
        let verdict = if verified.holds() {
            "the books balance"
        } else {
            "INVARIANTS BROKEN"
        };
        println!(
            "{verdict}: {} invariants of {database} in one snapshot, {:.2} s",
            verified.checked.len(),
            verified.took.as_secs_f64()
        );
        let width = verified
            .checked
            .iter()
            .map(|c| c.invariant.name.len())
            .max()
            .unwrap_or(0);
        for c in &verified.checked {
            let (mark, found) = match c.violations.len() {
                0 => ("ok  ", String::new()),
                n => {
                    let shown = c.violations[..n.min(IDS_SHOWN)].join(", ");
                    let more = if n > IDS_SHOWN { ", …" } else { "" };
                    ("FAIL", format!("  {n} violating: {shown}{more}"))
                }
            };
            // A check the schema already enforces fails only if that constraint was dropped.
            let constraint = c
                .invariant
                .constraint
                .map(|k| format!("  (also the schema's {k}: fails only if it was dropped)"))
                .unwrap_or_default();
            println!(
                "{mark} {:width$}  {:>9} {:<17} {:>8.1} ms{found}{constraint}",
                c.invariant.name,
                c.rows,
                c.invariant.over,
                c.took.as_secs_f64() * 1000.0
            );
        }
    }
    if verified.holds() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// An operator's command over the server's database (beside a running server, which keeps its
/// SQLite file to itself only against other servers): one line on stdout when it worked, one
/// line on stderr and a failing exit when not.
fn operator_command<F, Fut>(config: &Config, command: F) -> ExitCode
where
    F: FnOnce(Store) -> Fut,
    Fut: std::future::Future<Output = Result<String, String>>,
{
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("checkout-server: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let done = runtime.block_on(async {
        let settings = crate::store::StoreSettings {
            exclusive: false,
            ..config.store_settings()
        };
        let store = Store::connect(&config.database_url, settings)
            .await
            .map_err(|e| {
                format!(
                    "cannot open the database {}: {e}",
                    config.database_url_redacted()
                )
            })?;
        command(store).await
    });
    match done {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("checkout-server: {error}");
            ExitCode::FAILURE
        }
    }
}
