//! The idempotency protocol, top to bottom, knowing no web framework, no database and no
//! business operation: payments, refunds and a webhook inbox all run through [`Protocol::execute`].
//!
//! Exactly-once = at-least-once delivery (the client resends with the same key) + this
//! receiver. For one (scope, key), in ONE transaction of the database that holds the effect:
//!
//! 1. claim the key (`INSERT … ON CONFLICT`): the primary key, not an `if`, settles races;
//! 2. apply the operation: its guarded changes, whose affected rows it checks;
//! 3. its ledger rows (or whatever records the effect), written by the operation too;
//! 4. store the answer under the key and mark it done;
//! 5. `COMMIT`.
//!
//! A crash before 5 leaves no trace, so a resend runs afresh; after it, a resend replays the
//! stored answer byte for byte. An operation that can do 1–5 as ONE atomic write of its store
//! (a payment on PostgreSQL: one statement) says so in [`Operation::at_once`]: then a request
//! costs that write alone, and anything it could not settle (nothing of it written) takes the
//! steps above. A batch of requests ([`Protocol::execute_many`], a consumer's inbox) takes
//! the steps in one transaction for all of them; where nearly every key is new, its store may
//! claim them late ([`KeyStore::claims_late`]): every operation first, then every key inserted
//! once, with its answer, in one statement that fails unless every key is new (then nothing
//! commits, and the batch takes the steps). A key that is already taken is answered from
//! storage: the same request replays, another request under that key is
//! [`Outcome::KeyReused`], one still executing is [`Outcome::InUse`]. A copy that arrives while
//! this process is executing the key waits for it at most the lock timeout, in memory, rather
//! than queue for the database.
//!
//! The database is reached through [`KeyStore`] and [`KeyTx`]; how a store runs a transaction
//! (one connection each, or many requests in one group commit) is its own business, as long as
//! no answer leaves before the commit that holds it.
//!
//! `tests/model/` checks all of this against a model, without a database: the real
//! [`Protocol`] over [`memory::MemoryStore`] (PostgreSQL's or SQLite's concurrency, in memory),
//! under every schedule of a few clients, instances, crashes, lost answers, expiries and sweeps.

mod clock;
mod fingerprint;
pub mod memory;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

pub use clock::{Clock, SystemClock, now_ms};
pub use fingerprint::{Fingerprint, canonical_json, differing_fields};
use serde_json::Value;

/// A transaction that lost a race it can simply run again (a concurrent payment of the same
/// order, a serialization failure) is run this many times in all before [`Outcome::TryAgain`].
pub const MAX_ATTEMPTS: usize = 3;

/// An answer exactly as first sent, so that a replay is byte-identical.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub body: String,
}

impl StoredResponse {
    /// The answer a key's row holds: one only once its status is `done` (the stores write
    /// `in_progress` at the claim and `done` with the answer at the completion).
    pub fn from_columns(
        status: &str,
        response_status: Option<i64>,
        response_body: Option<String>,
    ) -> Option<StoredResponse> {
        match (status, response_status, response_body) {
            ("done", Some(status), Some(body)) => Some(StoredResponse {
                // The column only ever holds statuses its writer sent.
                status: u16::try_from(status).unwrap_or(500),
                body,
            }),
            _ => None,
        }
    }
}

/// A key as stored: what its first request was and, once done, the answer to replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRecord {
    pub request_hash: String,
    /// The first request's canonical JSON body (absent on keys stored before it was kept).
    pub request_body: Option<String>,
    /// `None` while the first request is still executing.
    pub response: Option<StoredResponse>,
    pub created_at_ms: i64,
}

/// One transaction's claim of a key. `claim_id` tells this claim from an earlier one of the same
/// key string that has expired.
#[derive(Clone, Debug)]
pub struct Claim {
    pub scope: String,
    pub key: String,
    pub claim_id: String,
    pub request_hash: String,
    /// Canonical JSON of the request's body, stored with the key.
    pub request_body: String,
    pub now_ms: i64,
}

/// What a keyed request is: who sent it (keys are scoped to their sender), its key, and what it
/// asks (method, route, JSON body): together, its fingerprint.
#[derive(Clone, Copy, Debug)]
pub struct KeyedRequest<'a> {
    pub scope: &'a str,
    pub key: &'a str,
    pub method: &'a str,
    pub route: &'a str,
    pub body: &'a Value,
}

/// How a request ended, for the caller to turn into its own kind of answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The operation ran now, and its answer committed with it.
    Executed {
        response: StoredResponse,
        expires_at_ms: i64,
    },
    /// The stored answer of an earlier execution of this very request.
    Replayed {
        response: StoredResponse,
        expires_at_ms: i64,
    },
    /// The key was first used for another request: these top-level fields of the body differ
    /// (none when it was another route or method).
    KeyReused {
        fields: Vec<String>,
        expires_at_ms: i64,
    },
    /// The key's first request is still executing; nothing ran.
    InUse,
    /// Nothing committed (every attempt lost a race, or a hook aborted); the request may be sent
    /// again as it is.
    TryAgain,
}

/// What the operation decided inside the transaction.
#[derive(Clone, Debug)]
pub enum Decision {
    /// Store this answer under the key and commit: a success, or a decline that is the outcome
    /// of this key (a retry gets the same decline).
    Respond(StoredResponse),
    /// Roll back and run the whole transaction again: a race was lost that the next attempt
    /// will see the outcome of (e.g. the order was paid by a concurrent request meanwhile).
    Restart,
}

/// How a store's failure bears on the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// A lock or a connection was not had within its bound. At the claim, this means the key's
    /// first request is still executing.
    Busy,
    /// The transaction lost a serialization race and may simply be run again.
    Retry,
    /// Anything else: the request fails, and nothing of it committed.
    Fatal,
}

/// Errors that can say which [`Failure`] they are.
pub trait Classify {
    fn failure(&self) -> Failure;
}

/// What an operation's try at the whole keyed step at once came to ([`Operation::at_once`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AtOnce {
    /// Claimed, changed, answered and committed, all in one atomic write: this answer.
    Done(StoredResponse),
    /// Nothing written: the key was found as committed (read, not locked). The protocol answers
    /// from it if it is completed and live; otherwise the steps run.
    Held(KeyRecord),
    /// Nothing written; the steps settle the request (a decline, a race, a key in flight or
    /// expired, a store that cannot).
    NotDone,
}

/// The keyed business step run inside the transaction (a payment, a refund, an inbox effect).
pub trait Operation<Tx>: Send + Sync + 'static {
    type Error: Classify + Send + 'static;

    /// Makes the change, guarded so that it can never break an invariant, and decides the answer.
    fn apply(
        &self,
        tx: &mut Tx,
        claim: &Claim,
    ) -> impl Future<Output = Result<Decision, Self::Error>> + Send;

    /// The claim, the change, the answer and the commit as ONE atomic write, where the operation
    /// can make it so (the common case, in a store where each statement is a round trip): either
    /// all of it commits, under `claim`, only if the key is new; or nothing does and the steps
    /// run. An error means the write's outcome is unknown (it may have committed). Most
    /// operations cannot: they answer [`AtOnce::NotDone`].
    fn at_once(&self, _claim: &Claim) -> impl Future<Output = Result<AtOnce, Self::Error>> + Send {
        std::future::ready(Ok(AtOnce::NotDone))
    }
}

/// Where keys live: beside the effect, in the same database.
pub trait KeyStore: Send + Sync {
    type Tx: KeyTx<Error = Self::Error>;
    type Error: Classify + Send + 'static;

    /// Whether to read the key before claiming it: worth it where a read does not compete with
    /// writes (SQLite's readers), so that a replay takes no write at all. Where every
    /// statement costs the database the same (PostgreSQL), the claim itself tells a replay.
    fn reads_before_claim(&self) -> bool {
        true
    }

    /// Whether a batch ([`Protocol::execute_many`]) may claim its keys late: run every
    /// operation first, then write each key once, with its answer, in one statement
    /// ([`KeyTx::insert_answered_many`]), the protocol's only write for the batch. Worth it
    /// where nearly every key is new (an inbox: a redelivery is rare) and a statement costs a
    /// round trip. A key that has a row makes that statement fail and everything roll back;
    /// the batch then runs again with its claims first.
    fn claims_late(&self) -> bool {
        false
    }

    /// The key as committed, read without taking any write lock.
    fn stored_key(
        &self,
        scope: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<KeyRecord>, Self::Error>> + Send;

    /// Runs `work` in one transaction: commits what it wrote when it ends in
    /// [`Finish::Commit`], rolls back otherwise. Returns only once the commit is durable.
    fn transaction<W>(&self, work: W) -> impl Future<Output = Result<W::Output, W::Error>> + Send
    where
        W: Work<Self::Tx>;
}

/// The protocol's own statements, inside a transaction.
pub trait KeyTx: Send {
    type Error: Classify + Send + 'static;

    /// Claims the key: [`Claimed::Ours`] if it is new, or expired before `expired_before_ms` and
    /// taken over; else the live key that holds it, as committed (read by the same statement
    /// where the database can, so that a replay costs one round trip). Waits for an in-flight
    /// holder at most the store's bound, then fails with [`Failure::Busy`].
    fn claim(
        &mut self,
        claim: &Claim,
        expired_before_ms: i64,
    ) -> impl Future<Output = Result<Claimed, Self::Error>> + Send;

    /// Stores the answer under the claimed key and marks it done; fails unless exactly the
    /// claimed row was updated.
    fn complete(
        &mut self,
        claim: &Claim,
        response: &StoredResponse,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// [`KeyTx::claim`] of every claim, what each found in their order: a key found
    /// [`Claimed::Ours`] is this transaction's until it ends. A store where a statement costs
    /// a round trip claims them all in one; a store whose transaction already keeps every
    /// other writer out (SQLite's `IMMEDIATE`) may claim by reading alone, and write each key
    /// once, with its answer, in [`KeyTx::complete_many`] (the two go together).
    fn claim_many(
        &mut self,
        claims: &[Claim],
        expired_before_ms: i64,
    ) -> impl Future<Output = Result<Vec<Claimed>, Self::Error>> + Send {
        async move {
            let mut claimed = Vec::with_capacity(claims.len());
            for claim in claims {
                claimed.push(self.claim(claim, expired_before_ms).await?);
            }
            Ok(claimed)
        }
    }

    /// [`KeyTx::complete`] of every claimed key with its answer; fails unless each key now
    /// holds its answer under its own claim. A store where a statement costs a round trip
    /// stores them all in one.
    fn complete_many(
        &mut self,
        answers: &[(&Claim, &StoredResponse)],
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        async move {
            for (claim, response) in answers {
                self.complete(claim, response).await?;
            }
            Ok(())
        }
    }

    /// The late claim of a batch whose operations have run ([`KeyStore::claims_late`]): every
    /// key inserted, done, with its answer, in one statement, if none has a row (waiting, as a
    /// claim does, for a transaction that is writing one). Otherwise [`LateClaim::KeyHeld`],
    /// and the transaction only rolls back. A store that cannot answers `KeyHeld` always.
    fn insert_answered_many(
        &mut self,
        _answers: &[(&Claim, &StoredResponse)],
    ) -> impl Future<Output = Result<LateClaim, Self::Error>> + Send {
        std::future::ready(Ok(LateClaim::KeyHeld))
    }
}

/// What a batch's late claim found ([`KeyTx::insert_answered_many`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LateClaim {
    /// Every key was new: each is this transaction's now, done, with its answer.
    Written,
    /// Some key has a row (live or expired, committed or not): nothing may commit; the batch
    /// runs again with its claims first, which settle each such key as a claim does.
    KeyHeld,
}

/// What a claim found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claimed {
    /// The key is this transaction's now.
    Ours,
    /// A live key holds it: its record, or `None` if the record could not be read as committed
    /// (its holder committed after this statement's snapshot, or it was swept meanwhile).
    Taken(Option<KeyRecord>),
}

/// How a unit of work ends: what the store must do with the transaction, and what to return.
pub enum Finish<T> {
    Commit(T),
    Rollback(T),
}

/// Something run inside one transaction by [`KeyStore::transaction`]. Owned and `'static`, so
/// that a store may run it wherever its connection lives (e.g. a SQLite writer's own thread).
pub trait Work<Tx: KeyTx>: Send + 'static {
    type Output: Send + 'static;
    /// Store failures (`BEGIN`, `COMMIT`) become this error too.
    type Error: From<Tx::Error> + Send + 'static;

    fn run(
        self,
        tx: &mut Tx,
    ) -> impl Future<Output = Result<Finish<Self::Output>, Self::Error>> + Send;
}

/// Test seams; the shipped server uses [`NoHooks`]. A hook can only delay or abort, never make
/// the protocol do something it would not do on its own.
pub trait Hooks: Send + Sync + 'static {
    /// Before a claim: `true` answers [`Outcome::InUse`] as if another request held the key.
    fn key_in_flight(&self, _scope: &str, _key: &str) -> bool {
        false
    }

    /// After the answer is stored, before `COMMIT`: may delay, or abort (everything rolls back).
    fn before_commit(&self, _scope: &str, _key: &str) -> HookFuture {
        Box::pin(std::future::ready(Ok(())))
    }

    /// Whether every request must take the steps, never [`Operation::at_once`] (which has no
    /// moment before its commit): true unless a hook says it acts nowhere near the commit.
    fn steps_only(&self) -> bool {
        true
    }
}

/// A hook's verdict: `Err` aborts the transaction.
pub type HookFuture = Pin<Box<dyn Future<Output = Result<(), Aborted>> + Send>>;

#[derive(Clone, Copy, Debug)]
pub struct Aborted;

#[derive(Clone, Copy, Debug, Default)]
pub struct NoHooks;

impl Hooks for NoHooks {
    fn steps_only(&self) -> bool {
        false
    }
}

/// How long a copy waits for its in-flight original unless told otherwise.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_millis(500);

/// The protocol with its settings: how long keys live, how long a copy waits for its
/// in-flight original, and the hooks. Clones share the registry of keys in flight.
#[derive(Clone)]
pub struct Protocol {
    key_ttl: Duration,
    lock_timeout: Duration,
    hooks: Arc<dyn Hooks>,
    clock: Arc<dyn Clock>,
    in_flight: Arc<InFlight>,
}

impl std::fmt::Debug for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Protocol")
            .field("key_ttl", &self.key_ttl)
            .field("lock_timeout", &self.lock_timeout)
            .finish_non_exhaustive()
    }
}

impl Protocol {
    pub fn new(key_ttl: Duration) -> Protocol {
        Protocol {
            key_ttl,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            hooks: Arc::new(NoHooks),
            clock: Arc::new(SystemClock),
            in_flight: Arc::default(),
        }
    }

    pub fn with_lock_timeout(self, lock_timeout: Duration) -> Protocol {
        Protocol {
            lock_timeout,
            ..self
        }
    }

    pub fn with_hooks(self, hooks: Arc<dyn Hooks>) -> Protocol {
        Protocol { hooks, ..self }
    }

    /// The clock keys' ages and waits are read from: the wall clock unless told otherwise (the
    /// model checker moves its own).
    pub fn with_clock(self, clock: Arc<dyn Clock>) -> Protocol {
        Protocol { clock, ..self }
    }

    pub fn key_ttl(&self) -> Duration {
        self.key_ttl
    }

    fn ttl_ms(&self) -> i64 {
        i64::try_from(self.key_ttl.as_millis()).unwrap_or(i64::MAX)
    }

    /// Runs `operation` at most once per (scope, key) and answers every copy of the request.
    pub async fn execute<S, O>(
        &self,
        store: &S,
        request: KeyedRequest<'_>,
        operation: O,
    ) -> Result<Outcome, O::Error>
    where
        S: KeyStore,
        O: Operation<S::Tx>,
        O::Error: From<S::Error>,
    {
        self.execute_shared(store, request, Arc::new(operation))
            .await
    }

    async fn execute_shared<S, O>(
        &self,
        store: &S,
        request: KeyedRequest<'_>,
        operation: Arc<O>,
    ) -> Result<Outcome, O::Error>
    where
        S: KeyStore,
        O: Operation<S::Tx>,
        O::Error: From<S::Error>,
    {
        let canonical_body = canonical_json(request.body);
        let fingerprint = Fingerprint::of_canonical(request.method, request.route, &canonical_body);
        let asked = Asked::of(&request, &fingerprint);
        // A completed key is answered from a plain read where that is cheap: such replays take
        // no write at all. (Elsewhere the claim below finds it.)
        let live_after = self.clock.now_ms().saturating_sub(self.ttl_ms());
        if store.reads_before_claim()
            && let Some(record) = store.stored_key(request.scope, request.key).await?
            && record.created_at_ms >= live_after
        {
            return Ok(self.answer_from_storage(record, &asked));
        }

        // A copy of a request this process is executing waits for it, bounded, in memory; then
        // the first copy's answer is in storage. The bound is one deadline for all of it: a
        // first copy that failed, and a third that took its place, do not start it again.
        let mut deadline = None;
        let mut in_flight = None;
        for _attempt in 0..MAX_ATTEMPTS {
            match self.in_flight.enter(request.scope, request.key) {
                Entry::First(guard) => {
                    in_flight = Some(guard);
                    break;
                }
                Entry::Behind(mut done) => {
                    let deadline =
                        deadline.get_or_insert_with(|| self.clock.sleep(self.lock_timeout));
                    tokio::select! {
                        biased;
                        _ = done.changed() => {}
                        () = deadline.as_mut() => return Ok(Outcome::InUse),
                    }
                    let live_after = self.clock.now_ms().saturating_sub(self.ttl_ms());
                    if let Some(record) = store.stored_key(request.scope, request.key).await?
                        && record.created_at_ms >= live_after
                    {
                        return Ok(self.answer_from_storage(record, &asked));
                    }
                    // The first copy ended without an answer (it failed): this one runs afresh.
                }
            }
        }
        let Some(_in_flight) = in_flight else {
            return Ok(Outcome::InUse);
        };

        for attempt in 0..MAX_ATTEMPTS {
            if self.hooks.key_in_flight(request.scope, request.key) {
                return Ok(Outcome::InUse);
            }
            let now_ms = self.clock.now_ms();
            let claim = Claim::of(&request, &fingerprint, canonical_body.clone(), now_ms);
            let expired_before_ms = now_ms.saturating_sub(self.ttl_ms());
            // 1–5 at once where the operation can; the steps below settle whatever it could not.
            if attempt == 0 && !self.hooks.steps_only() {
                match operation.at_once(&claim).await? {
                    AtOnce::Done(response) => {
                        return Ok(Outcome::Executed {
                            response,
                            expires_at_ms: now_ms.saturating_add(self.ttl_ms()),
                        });
                    }
                    AtOnce::Held(record)
                        if record.response.is_some()
                            && record.created_at_ms >= expired_before_ms =>
                    {
                        return Ok(self.answer_from_storage(record, &asked));
                    }
                    AtOnce::Held(_) | AtOnce::NotDone => {}
                }
            }
            let work = KeyedWork {
                claim,
                expired_before_ms,
                operation: operation.clone(),
                hooks: self.hooks.clone(),
            };
            let step = match store.transaction(work).await {
                Ok(step) => step,
                Err(error) if error.failure() == Failure::Retry => continue,
                Err(error) => return Err(error),
            };
            return Ok(match step {
                Step::Committed(response) => Outcome::Executed {
                    response,
                    expires_at_ms: now_ms.saturating_add(self.ttl_ms()),
                },
                Step::Taken(Some(record)) => self.answer_from_storage(record, &asked),
                // Its holder committed after the claim's snapshot, it was swept meanwhile, or a
                // race was lost: claim again.
                Step::Taken(None) | Step::Restart => continue,
                Step::KeyBusy => Outcome::InUse,
                Step::Aborted => Outcome::TryAgain,
            });
        }
        Ok(Outcome::TryAgain)
    }

    /// Runs many keyed requests in ONE transaction: one claim of all their keys, each
    /// operation, one storing of all their answers, one commit; or, where the store claims
    /// late, each operation and then one insert of every key with its answer (if a key turns
    /// out to have a row, that transaction rolls back and the claims go first). What a
    /// consumer taking messages in batches then pays per message is its operation, not a
    /// transaction and the protocol's own statements each time. Each request gets the outcome
    /// [`Protocol::execute`] would have given it, in the order given. The batch settles only
    /// what it can settle at once; any request it cannot (a copy already in flight, a key held
    /// by a request still executing or gone meanwhile, a race lost, a hook that aborts, a
    /// failed transaction — of which nothing committed) runs alone through
    /// [`Protocol::execute`] afterwards.
    pub async fn execute_many<S, O>(
        &self,
        store: &S,
        batch: Vec<(KeyedRequest<'_>, O)>,
    ) -> Vec<Result<Outcome, O::Error>>
    where
        S: KeyStore,
        O: Operation<S::Tx>,
        O::Error: From<S::Error>,
    {
        let (requests, operations): (Vec<KeyedRequest<'_>>, Vec<Arc<O>>) = batch
            .into_iter()
            .map(|(request, operation)| (request, Arc::new(operation)))
            .unzip();
        let mut outcomes: Vec<Option<Result<Outcome, O::Error>>> =
            requests.iter().map(|_| None).collect();
        let mut alone = Vec::new();
        let now_ms = self.clock.now_ms();
        let live_after = now_ms.saturating_sub(self.ttl_ms());
        let mut fingerprints = Vec::with_capacity(requests.len());
        let mut in_flight = Vec::with_capacity(requests.len());
        let mut units = Vec::with_capacity(requests.len());
        for (i, request) in requests.iter().enumerate() {
            let canonical_body = canonical_json(request.body);
            let fingerprint =
                Fingerprint::of_canonical(request.method, request.route, &canonical_body);
            fingerprints.push(fingerprint.clone());
            if store.reads_before_claim() {
                match store.stored_key(request.scope, request.key).await {
                    Ok(Some(record)) if record.created_at_ms >= live_after => {
                        let asked = Asked::of(request, &fingerprint);
                        outcomes[i] = Some(Ok(self.answer_from_storage(record, &asked)));
                        continue;
                    }
                    Ok(_) => {}
                    Err(error) => {
                        outcomes[i] = Some(Err(error.into()));
                        continue;
                    }
                }
            }
            // A copy in flight (in this batch or elsewhere in this process) is left to wait for
            // it alone, afterwards.
            match self.in_flight.enter(request.scope, request.key) {
                Entry::First(guard) => in_flight.push(guard),
                Entry::Behind(_) => {
                    alone.push(i);
                    continue;
                }
            }
            if self.hooks.key_in_flight(request.scope, request.key) {
                outcomes[i] = Some(Ok(Outcome::InUse));
                continue;
            }
            let claim = Claim::of(request, &fingerprint, canonical_body, now_ms);
            units.push((i, claim, operations[i].clone()));
        }

        if !units.is_empty() {
            // Claimed in the keys' order: two batches sharing keys lock them in one order.
            units.sort_by(|(_, a, _), (_, b, _)| (&a.scope, &a.key).cmp(&(&b.scope, &b.key)));
            let indexes: Vec<usize> = units.iter().map(|(i, _, _)| *i).collect();
            let (claims, operations): (Vec<Claim>, Vec<Arc<O>>) =
                units.into_iter().map(|(_, c, o)| (c, o)).unzip();
            let mut work = BatchWork {
                claims: claims.into(),
                operations: operations.into(),
                claims_late: store.claims_late(),
                expired_before_ms: live_after,
                hooks: self.hooks.clone(),
            };
            let mut ended = store.transaction(work.clone()).await;
            if work.claims_late && matches!(ended, Ok(BatchEnd::KeyHeld)) {
                work.claims_late = false;
                ended = store.transaction(work).await;
            }
            match ended {
                Ok(BatchEnd::Committed(steps)) => {
                    for (i, step) in indexes.into_iter().zip(steps) {
                        match step {
                            UnitStep::Committed(response) => {
                                outcomes[i] = Some(Ok(Outcome::Executed {
                                    response,
                                    expires_at_ms: now_ms.saturating_add(self.ttl_ms()),
                                }));
                            }
                            UnitStep::Taken(Some(record)) => {
                                let asked = Asked::of(&requests[i], &fingerprints[i]);
                                outcomes[i] = Some(Ok(self.answer_from_storage(record, &asked)));
                            }
                            UnitStep::Taken(None) => alone.push(i),
                        }
                    }
                }
                // Nothing of the batch committed: each runs alone.
                Ok(BatchEnd::Undone | BatchEnd::KeyHeld) | Err(_) => alone.extend(indexes),
            }
        }

        drop(in_flight);
        alone.sort_unstable();
        for i in alone {
            outcomes[i] = Some(
                self.execute_shared(store, requests[i], operations[i].clone())
                    .await,
            );
        }
        outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or(Ok(Outcome::TryAgain)))
            .collect()
    }

    fn answer_from_storage(&self, record: KeyRecord, asked: &Asked<'_>) -> Outcome {
        let expires_at_ms = record.created_at_ms.saturating_add(self.ttl_ms());
        if record.request_hash != asked.fingerprint.as_str() {
            // Fields are named only between requests of one route: the first body, taken as
            // this route's, gives the key's fingerprint exactly when the route is the same.
            let fields = record
                .request_body
                .as_deref()
                .filter(|first| {
                    Fingerprint::of_canonical(asked.method, asked.route, first).as_str()
                        == record.request_hash
                })
                .map(|first| differing_fields(first, asked.body))
                .unwrap_or_default();
            return Outcome::KeyReused {
                fields,
                expires_at_ms,
            };
        }
        match record.response {
            Some(response) => Outcome::Replayed {
                response,
                expires_at_ms,
            },
            None => Outcome::InUse,
        }
    }

    /// Where a key stands for its own sender, without sending anything: executing now (in this
    /// process), done with its stored answer, or unknown (never seen, or expired and forgotten).
    pub async fn key_status<S: KeyStore>(
        &self,
        store: &S,
        scope: &str,
        key: &str,
    ) -> Result<KeyStatus, S::Error> {
        let record = store.stored_key(scope, key).await?;
        let live_after = self.clock.now_ms().saturating_sub(self.ttl_ms());
        Ok(match record {
            Some(record) if record.created_at_ms >= live_after => {
                let expires_at_ms = record.created_at_ms.saturating_add(self.ttl_ms());
                match record.response {
                    Some(response) => KeyStatus::Done {
                        response,
                        expires_at_ms,
                    },
                    None => KeyStatus::InProgress {
                        expires_at_ms: Some(expires_at_ms),
                    },
                }
            }
            _ if self.in_flight.contains(scope, key) => KeyStatus::InProgress {
                expires_at_ms: None,
            },
            _ => KeyStatus::Unknown,
        })
    }
}

/// The keys this process is executing: each with a channel that closes when it is done.
#[derive(Default)]
struct InFlight {
    keys: Mutex<HashMap<(String, String), watch::Receiver<()>>>,
}

enum Entry {
    /// This copy executes; the key is in flight until the guard drops.
    First(InFlightGuard),
    /// Another copy is executing; the receiver learns when it is done.
    Behind(watch::Receiver<()>),
}

impl InFlight {
    fn contains(&self, scope: &str, key: &str) -> bool {
        let keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.contains_key(&(scope.to_owned(), key.to_owned()))
    }

    fn enter(self: &Arc<Self>, scope: &str, key: &str) -> Entry {
        let id = (scope.to_owned(), key.to_owned());
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(done) = keys.get(&id) {
            return Entry::Behind(done.clone());
        }
        let (sender, receiver) = watch::channel(());
        keys.insert(id.clone(), receiver);
        Entry::First(InFlightGuard {
            registry: self.clone(),
            id,
            _done: sender,
        })
    }
}

struct InFlightGuard {
    registry: Arc<InFlight>,
    id: (String, String),
    /// Dropped after the entry is removed: every waiter wakes.
    _done: watch::Sender<()>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let mut keys = self.registry.keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.remove(&self.id);
    }
}

/// What a request asked, for answering from storage.
struct Asked<'a> {
    fingerprint: &'a Fingerprint,
    method: &'a str,
    route: &'a str,
    body: &'a Value,
}

impl<'a> Asked<'a> {
    fn of(request: &KeyedRequest<'a>, fingerprint: &'a Fingerprint) -> Asked<'a> {
        Asked {
            fingerprint,
            method: request.method,
            route: request.route,
            body: request.body,
        }
    }
}

impl Claim {
    /// This transaction's claim of `request`'s key, made at `now_ms`.
    fn of(
        request: &KeyedRequest<'_>,
        fingerprint: &Fingerprint,
        canonical_body: String,
        now_ms: i64,
    ) -> Claim {
        Claim {
            scope: request.scope.to_owned(),
            key: request.key.to_owned(),
            // Time-ordered: claims made together share index pages.
            claim_id: uuid::Uuid::now_v7().simple().to_string(),
            request_hash: fingerprint.as_str().to_owned(),
            request_body: canonical_body,
            now_ms,
        }
    }
}

/// A key's state, as [`Protocol::key_status`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyStatus {
    /// Its first request is executing; its expiry is known once its claim is committed.
    InProgress {
        expires_at_ms: Option<i64>,
    },
    Done {
        response: StoredResponse,
        expires_at_ms: i64,
    },
    Unknown,
}

/// How one transaction of [`Protocol::execute`] ended.
enum Step {
    Committed(StoredResponse),
    /// A live key holds the claim: its record (or `None` if it vanished meanwhile).
    Taken(Option<KeyRecord>),
    /// The claim waited its bound for an in-flight holder of the key.
    KeyBusy,
    Restart,
    Aborted,
}

/// Steps 1–4 inside the transaction; the store commits (step 5) on [`Finish::Commit`].
struct KeyedWork<O> {
    claim: Claim,
    expired_before_ms: i64,
    operation: Arc<O>,
    hooks: Arc<dyn Hooks>,
}

impl<Tx, O> Work<Tx> for KeyedWork<O>
where
    Tx: KeyTx,
    O: Operation<Tx>,
    O::Error: From<Tx::Error>,
{
    type Output = Step;
    type Error = O::Error;

    async fn run(self, tx: &mut Tx) -> Result<Finish<Step>, O::Error> {
        let claim = &self.claim;
        // 1. Claim the key, or learn who has it.
        match tx.claim(claim, self.expired_before_ms).await {
            Ok(Claimed::Ours) => {}
            Ok(Claimed::Taken(record)) => return Ok(Finish::Rollback(Step::Taken(record))),
            Err(error) if error.failure() == Failure::Busy => {
                return Ok(Finish::Rollback(Step::KeyBusy));
            }
            Err(error) => return Err(error.into()),
        }

        // 2–3. The guarded business change and the rows that record it.
        let response = match self.operation.apply(tx, claim).await? {
            Decision::Respond(response) => response,
            Decision::Restart => return Ok(Finish::Rollback(Step::Restart)),
        };

        // 4. The answer is stored with the key…
        tx.complete(claim, &response).await?;
        if self
            .hooks
            .before_commit(&claim.scope, &claim.key)
            .await
            .is_err()
        {
            return Ok(Finish::Rollback(Step::Aborted));
        }
        // 5. …and all of it commits at once.
        Ok(Finish::Commit(Step::Committed(response)))
    }
}

/// How the transaction of [`Protocol::execute_many`] ended.
enum BatchEnd {
    /// Committed: each unit's step, in the order of the claims.
    Committed(Vec<UnitStep>),
    /// Rolled back (a race lost, a hook's abort, claims the store did not answer in full):
    /// every unit runs alone.
    Undone,
    /// Rolled back: a late claim found a key with a row (the batch runs with its claims first).
    KeyHeld,
}

enum UnitStep {
    Committed(StoredResponse),
    Taken(Option<KeyRecord>),
}

/// Steps 1–4 for every unit of a batch inside one transaction; the store commits (step 5) on
/// [`Finish::Commit`]. Claims whose keys are taken wrote nothing and stay out of the rest.
struct BatchWork<O> {
    claims: Arc<[Claim]>,
    operations: Arc<[Arc<O>]>,
    /// Every operation first, then the keys written once, with their answers (see
    /// [`KeyStore::claims_late`]); or the claims first, as a single request's.
    claims_late: bool,
    expired_before_ms: i64,
    hooks: Arc<dyn Hooks>,
}

impl<O> Clone for BatchWork<O> {
    fn clone(&self) -> Self {
        BatchWork {
            claims: self.claims.clone(),
            operations: self.operations.clone(),
            claims_late: self.claims_late,
            expired_before_ms: self.expired_before_ms,
            hooks: self.hooks.clone(),
        }
    }
}

impl<O> BatchWork<O> {
    /// After every answer is stored, before the commit: whether a hook aborts.
    async fn aborted_before_commit(&self, answered: impl Iterator<Item = &Claim>) -> bool {
        for claim in answered {
            if self
                .hooks
                .before_commit(&claim.scope, &claim.key)
                .await
                .is_err()
            {
                return true;
            }
        }
        false
    }

    /// The batch with its keys claimed late: each operation, then every key written with its
    /// answer in one statement. Right only if every key is new; otherwise nothing commits.
    async fn run_claiming_late<Tx>(self, tx: &mut Tx) -> Result<Finish<BatchEnd>, O::Error>
    where
        Tx: KeyTx,
        O: Operation<Tx>,
        O::Error: From<Tx::Error>,
    {
        let mut responses = Vec::with_capacity(self.claims.len());
        for (claim, operation) in self.claims.iter().zip(self.operations.iter()) {
            match operation.apply(tx, claim).await? {
                Decision::Respond(response) => responses.push(response),
                Decision::Restart => return Ok(Finish::Rollback(BatchEnd::Undone)),
            }
        }
        let answers: Vec<(&Claim, &StoredResponse)> = self.claims.iter().zip(&responses).collect();
        if tx.insert_answered_many(&answers).await? == LateClaim::KeyHeld {
            return Ok(Finish::Rollback(BatchEnd::KeyHeld));
        }
        if self.aborted_before_commit(self.claims.iter()).await {
            return Ok(Finish::Rollback(BatchEnd::Undone));
        }
        let steps = responses.into_iter().map(UnitStep::Committed).collect();
        Ok(Finish::Commit(BatchEnd::Committed(steps)))
    }
}

impl<Tx, O> Work<Tx> for BatchWork<O>
where
    Tx: KeyTx,
    O: Operation<Tx>,
    O::Error: From<Tx::Error>,
{
    type Output = BatchEnd;
    type Error = O::Error;

    async fn run(self, tx: &mut Tx) -> Result<Finish<BatchEnd>, O::Error> {
        if self.claims_late {
            return self.run_claiming_late(tx).await;
        }
        // 1. Claim every key at once (a key another request holds still executing fails the
        // claim after the store's bound: then each runs alone).
        let claimed = tx.claim_many(&self.claims, self.expired_before_ms).await?;
        if claimed.len() != self.claims.len() {
            return Ok(Finish::Rollback(BatchEnd::Undone));
        }
        // 2–3. Each claimed key's change.
        let mut steps = Vec::with_capacity(claimed.len());
        for ((claimed, claim), operation) in claimed
            .into_iter()
            .zip(self.claims.iter())
            .zip(self.operations.iter())
        {
            steps.push(match claimed {
                Claimed::Ours => match operation.apply(tx, claim).await? {
                    Decision::Respond(response) => UnitStep::Committed(response),
                    Decision::Restart => return Ok(Finish::Rollback(BatchEnd::Undone)),
                },
                Claimed::Taken(record) => UnitStep::Taken(record),
            });
        }
        // 4. Every answer stored with its key…
        let answers: Vec<(&Claim, &StoredResponse)> = self
            .claims
            .iter()
            .zip(&steps)
            .filter_map(|(claim, step)| match step {
                UnitStep::Committed(response) => Some((claim, response)),
                UnitStep::Taken(_) => None,
            })
            .collect();
        if !answers.is_empty() {
            tx.complete_many(&answers).await?;
        }
        if self
            .aborted_before_commit(answers.iter().map(|(claim, _)| *claim))
            .await
        {
            return Ok(Finish::Rollback(BatchEnd::Undone));
        }
        // 5. …and all of it commits at once.
        Ok(Finish::Commit(BatchEnd::Committed(steps)))
    }
}
