//! Argon2id, for what a person chooses or is mailed: live shoppers' passwords, and the one-time
//! codes (six digits are a million guesses: a stolen copy of the table must cost more to search
//! than a code lives). OWASP's current minimum (19 MiB of memory, 2 passes, 1 lane: the crate's
//! defaults); each takes tens of milliseconds of one core.
//!
//! They run on threads of their own, one per core, never more (`Workers`), each in its own
//! 19 MiB allocated once (`MEMORY`): on Tokio's blocking pool sixty sign-ins at once took
//! threads that each kept their 19 MiB in malloc's arenas after it was freed (measured: the
//! server's peak grew 1.1 GiB and stayed). A check waits for a free worker at most
//! `WAIT_AT_MOST`, then is refused as busy (`503`, try again).

use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::Semaphore;

use argon2::password_hash::ParamsString;
use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{Output, PasswordHash, SaltString};
use argon2::{Algorithm, Argon2, Block, Params, Version};

use crate::operations::authentication::new_secret;
use crate::operations::error::OperationError;
use crate::store::StoreError;

fn failed(error: impl ToString) -> OperationError {
    OperationError::Store(StoreError::Other(error.to_string().into()))
}

/// How long a check waits for a free worker before the request is refused as busy.
const WAIT_AT_MOST: Duration = Duration::from_secs(10);

type Job = Box<dyn FnOnce() + Send>;

/// The Argon2id threads (one per core) and the turns to use them.
struct Workers {
    jobs: Mutex<mpsc::Sender<Job>>,
    turns: Semaphore,
}

fn workers() -> &'static Workers {
    static WORKERS: OnceLock<Workers> = OnceLock::new();
    WORKERS.get_or_init(|| {
        let count = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for n in 0..count {
            let queue = queue.clone();
            let _ = std::thread::Builder::new()
                .name(format!("argon2-{n}"))
                .spawn(move || {
                    loop {
                        let job = queue.lock().unwrap_or_else(|e| e.into_inner()).recv();
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    }
                });
        }
        Workers {
            jobs: Mutex::new(jobs),
            turns: Semaphore::new(count),
        }
    })
}

/// Runs `work` on a free Argon2id worker.
async fn on_worker<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, OperationError> {
    let workers = workers();
    let _turn = match tokio::time::timeout(WAIT_AT_MOST, workers.turns.acquire()).await {
        Ok(Ok(turn)) => turn,
        _ => return Err(OperationError::PasswordChecksBusy),
    };
    let (answer, answered) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = answer.send(work());
    });
    workers
        .jobs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send(job)
        .map_err(failed)?;
    answered.await.map_err(failed)
}

thread_local! {
    /// This worker's Argon2id memory, allocated once and reused by every check it runs.
    static MEMORY: std::cell::RefCell<Vec<Block>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Argon2id of `secret` with `params` and `salt` into `out`, in this worker's own memory.
fn argon2id(params: &Params, secret: &[u8], salt: &[u8], out: &mut [u8]) -> argon2::Result<()> {
    MEMORY.with_borrow_mut(|memory| {
        let blocks = params.block_count();
        if memory.len() < blocks {
            memory.resize(blocks, Block::default());
        }
        Argon2::new(Algorithm::Argon2id, Version::V0x13, params.clone())
            .hash_password_into_with_memory(secret, salt, out, &mut memory[..blocks])
    })
}

/// The PHC string of `secret`'s hash, with a fresh salt.
pub async fn hash(secret: String) -> Result<String, OperationError> {
    on_worker(move || {
        let salt = SaltString::generate(&mut OsRng);
        let params = Params::default();
        let mut salt_bytes = [0; 64];
        let salt_bytes = salt.decode_b64(&mut salt_bytes).map_err(failed)?;
        let mut out = [0; Params::DEFAULT_OUTPUT_LEN];
        argon2id(&params, secret.as_bytes(), salt_bytes, &mut out).map_err(failed)?;
        let hash = PasswordHash {
            algorithm: Algorithm::Argon2id.ident(),
            version: Some(Version::V0x13.into()),
            params: ParamsString::try_from(&params).map_err(failed)?,
            salt: Some(salt.as_salt()),
            hash: Some(Output::new(&out).map_err(failed)?),
        };
        Ok(hash.to_string())
    })
    .await?
}

/// Whether `secret` is the one `hash` was made from (compared in constant time).
pub async fn verify(secret: String, hash: String) -> Result<bool, OperationError> {
    on_worker(move || {
        let Ok(parsed) = PasswordHash::new(&hash) else {
            return false;
        };
        let (Ok(params), Some(salt), Some(expected)) =
            (Params::try_from(&parsed), parsed.salt, parsed.hash)
        else {
            return false;
        };
        let mut salt_bytes = [0; 64];
        let Ok(salt) = salt.decode_b64(&mut salt_bytes) else {
            return false;
        };
        let mut out = vec![0; expected.len()];
        argon2id(&params, secret.as_bytes(), salt, &mut out).is_ok()
            && Output::new(&out).is_ok_and(|found| found == expected)
    })
    .await
}

/// A hash of nothing anyone knows, made once: what is checked when there is nothing to check
/// against (an unknown e-mail, no live code), so that it costs what a wrong guess costs and the
/// two cannot be told apart by time.
pub async fn decoy() -> Result<&'static str, OperationError> {
    static DECOY: OnceLock<String> = OnceLock::new();
    if let Some(hash) = DECOY.get() {
        return Ok(hash);
    }
    let made = hash(new_secret("decoy_")).await?;
    Ok(DECOY.get_or_init(|| made))
}

#[cfg(test)]
mod tests {
    use argon2::password_hash::{PasswordHasher, PasswordVerifier};

    use super::*;

    /// The worker's own-memory Argon2id writes and reads the same PHC strings as the crate's
    /// own API: hashes kept before it still verify, and its hashes verify there.
    #[tokio::test]
    async fn hashes_are_the_crates_own_both_ways() {
        let ours = hash("пароль-надёжный".into()).await.unwrap();
        let parsed = PasswordHash::new(&ours).unwrap();
        assert!(
            Argon2::default()
                .verify_password("пароль-надёжный".as_bytes(), &parsed)
                .is_ok()
        );
        assert!(
            ours.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"),
            "{ours}"
        );
        let salt = SaltString::generate(&mut OsRng);
        let theirs = Argon2::default()
            .hash_password(b"old secret", &salt)
            .unwrap()
            .to_string();
        assert!(verify("old secret".into(), theirs.clone()).await.unwrap());
        assert!(!verify("another".into(), theirs).await.unwrap());
        assert!(
            !verify("пароль-надёжный".into(), "not a hash".into())
                .await
                .unwrap()
        );
        assert!(verify("пароль-надёжный".into(), ours).await.unwrap());
    }
}
