//! Abuse limits, in memory per server instance (`governor`'s keyed GCRA limiters): sign-in and
//! sign-up attempts per client address, mails asked for per account (e-mail), wrong guesses
//! at an account's password or code per (account, address) and per account in all, test-shopper creation per
//! address, and how many keyed requests one principal may have executing at once. Refused with
//! `429` + `Retry-After`. Behind N instances a client gets up to N times each allowance (each
//! instance counts alone); the README says what to put in front for one shared count.

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::operations::error::OperationError;

/// How many attempts each limit allows per window (also its burst: they come back evenly over
/// the window), and the in-progress bound.
#[derive(Clone, Copy, Debug)]
pub struct LimitSettings {
    pub window: std::time::Duration,
    pub sign_in_per_account: u32,
    pub sign_in_per_address: u32,
    pub test_shoppers_per_address: u32,
    pub keys_in_progress: u32,
}

impl Default for LimitSettings {
    fn default() -> Self {
        LimitSettings {
            window: std::time::Duration::from_secs(60),
            sign_in_per_account: 5,
            sign_in_per_address: 30,
            test_shoppers_per_address: 20,
            keys_in_progress: 16,
        }
    }
}

#[derive(Debug)]
pub struct Limits {
    /// Keyed by a digest of the normalized e-mail: 16 bytes whatever was sent (an e-mail of a
    /// megabyte, kept as the key, was a megabyte held per attempt).
    sign_in_per_account: DefaultKeyedRateLimiter<[u8; 16]>,
    sign_in_per_address: DefaultKeyedRateLimiter<IpAddr>,
    test_shoppers_per_address: DefaultKeyedRateLimiter<IpAddr>,
    keys_in_progress: u32,
    in_progress: Arc<Mutex<HashMap<String, u32>>>,
    /// Wrong guesses (a password, a code) at each account, with the address each came from.
    wrong: Mutex<HashMap<[u8; 16], WrongGuesses>>,
    wrong_per_address: usize,
    window: Duration,
}

/// An account's wrong guesses in the window: where each came from, and when.
type WrongGuesses = Vec<(IpAddr, Instant)>;

/// A guess at an account, counted as wrong until [`Limits::right`] says it was not.
#[must_use]
pub struct Guess {
    account: [u8; 16],
    address: IpAddr,
    at: Instant,
}

/// Wrong guesses at one account from all addresses together, as a multiple of those allowed
/// from one address: guessing from many addresses is held back too (and then everyone waits).
const WRONG_IN_ALL_PER_ADDRESS_ALLOWANCE: usize = 10;

/// Keyed limiters keep a state per key seen; past this many they forget the idle ones.
const FORGET_ABOVE: usize = 100_000;

/// The per-account limiter's key: the e-mail as sign-in normalizes it (trimmed, lower case),
/// digested to a fixed size.
fn account_key(email: &str) -> [u8; 16] {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(email.trim().to_lowercase().as_bytes());
    let mut key = [0; 16];
    key.copy_from_slice(&digest[..16]);
    key
}

/// `n` per `window`: a burst of `n`, one more every `window / n`.
fn per_window(n: u32, window: std::time::Duration) -> Quota {
    let n = NonZeroU32::new(n.max(1)).expect("at least 1");
    Quota::with_period(window / n.get())
        .unwrap_or_else(|| Quota::per_second(n))
        .allow_burst(n)
}

fn check<K>(limiter: &DefaultKeyedRateLimiter<K>, key: &K) -> Result<(), OperationError>
where
    K: std::hash::Hash + Eq + Clone,
{
    if limiter.len() > FORGET_ABOVE {
        limiter.retain_recent();
    }
    limiter.check_key(key).map_err(|not_until| {
        let wait = not_until.wait_time_from(DefaultClock::default().now());
        OperationError::TooManyRequests(wait.as_secs_f64().ceil() as u64)
    })
}

impl Limits {
    pub fn new(settings: LimitSettings) -> Limits {
        Limits {
            sign_in_per_account: RateLimiter::keyed(per_window(
                settings.sign_in_per_account,
                settings.window,
            )),
            sign_in_per_address: RateLimiter::keyed(per_window(
                settings.sign_in_per_address,
                settings.window,
            )),
            test_shoppers_per_address: RateLimiter::keyed(per_window(
                settings.test_shoppers_per_address,
                settings.window,
            )),
            keys_in_progress: settings.keys_in_progress.max(1),
            in_progress: Arc::default(),
            wrong: Mutex::default(),
            wrong_per_address: settings.sign_in_per_account.max(1) as usize,
            window: settings.window,
        }
    }

    /// A request that mails `email` a code (a sign-up, a recovery) from `address`: the address's
    /// attempts and the account's mails must have room (every one counts: each is a mail).
    pub fn mail(&self, address: IpAddr, email: &str) -> Result<(), OperationError> {
        check(&self.sign_in_per_address, &address)?;
        check(&self.sign_in_per_account, &account_key(email))
    }

    /// A guess at `email`'s secret (a password, a mailed code) from `address`: the address's
    /// attempts must have room, and the account's wrong guesses from this address (and from
    /// all together) too. Only wrong guesses count against the account: each is counted before
    /// it is checked (guesses sent at once are each counted) and uncounted if it was right, so
    /// the owner signing in often, or from another address than a guesser's, is not refused.
    pub fn guess(&self, address: IpAddr, email: &str) -> Result<Guess, OperationError> {
        check(&self.sign_in_per_address, &address)?;
        let account = account_key(email);
        let now = Instant::now();
        let mut wrong = self.wrong.lock().unwrap_or_else(|e| e.into_inner());
        let times = wrong.entry(account).or_default();
        times.retain(|(_, at)| now.duration_since(*at) < self.window);
        let here: Vec<Instant> = times
            .iter()
            .filter(|(from, _)| *from == address)
            .map(|(_, at)| *at)
            .collect();
        let wait = |oldest: Option<Instant>| {
            let left = oldest.map_or(self.window, |t| {
                self.window.saturating_sub(now.duration_since(t))
            });
            OperationError::TooManyRequests(left.as_secs_f64().ceil().max(1.0) as u64)
        };
        if here.len() >= self.wrong_per_address {
            return Err(wait(here.iter().min().copied()));
        }
        if times.len() >= self.wrong_per_address * WRONG_IN_ALL_PER_ADDRESS_ALLOWANCE {
            return Err(wait(times.iter().map(|(_, at)| *at).min()));
        }
        times.push((address, now));
        Ok(Guess {
            account,
            address,
            at: now,
        })
    }

    /// The guess was right: it does not count.
    pub fn right(&self, guess: Guess) {
        let mut wrong = self.wrong.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(times) = wrong.get_mut(&guess.account)
            && let Some(i) = times
                .iter()
                .position(|(from, at)| *from == guess.address && *at == guess.at)
        {
            times.swap_remove(i);
        }
    }

    /// Forgets the keys whose allowance is whole again (idle for a window): called on a timer,
    /// so that memory a burst of keys took comes back, however few keys there are.
    pub fn forget_idle(&self) {
        self.sign_in_per_account.retain_recent();
        self.sign_in_per_account.shrink_to_fit();
        self.sign_in_per_address.retain_recent();
        self.sign_in_per_address.shrink_to_fit();
        self.test_shoppers_per_address.retain_recent();
        self.test_shoppers_per_address.shrink_to_fit();
        let now = Instant::now();
        let mut wrong = self.wrong.lock().unwrap_or_else(|e| e.into_inner());
        wrong.retain(|_, times| {
            times.retain(|(_, at)| now.duration_since(*at) < self.window);
            !times.is_empty()
        });
        wrong.shrink_to_fit();
    }

    /// A passkey ceremony (no e-mail is typed: only the address is counted).
    pub fn passkey(&self, address: IpAddr) -> Result<(), OperationError> {
        check(&self.sign_in_per_address, &address)
    }

    pub fn test_shopper(&self, address: IpAddr) -> Result<(), OperationError> {
        check(&self.test_shoppers_per_address, &address)
    }

    /// A keyed request of `principal` starts; it counts until the guard is dropped.
    pub fn key_in_progress(&self, principal: &str) -> Result<InProgress, OperationError> {
        let mut counts = self.in_progress.lock().unwrap_or_else(|e| e.into_inner());
        let count = counts.entry(principal.to_owned()).or_insert(0);
        if *count >= self.keys_in_progress {
            return Err(OperationError::TooManyRequests(1));
        }
        *count += 1;
        Ok(InProgress {
            counts: self.in_progress.clone(),
            principal: principal.to_owned(),
        })
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits::new(LimitSettings::default())
    }
}

/// One keyed request executing; dropping it (answered, failed or cancelled) frees its place.
pub struct InProgress {
    counts: Arc<Mutex<HashMap<String, u32>>>,
    principal: String,
}

impl Drop for InProgress {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = counts.get_mut(&self.principal) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.principal);
            }
        }
    }
}
