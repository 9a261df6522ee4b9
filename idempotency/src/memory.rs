//! A [`KeyStore`] in memory: the keys and the effects they guard, with the concurrency of a real
//! database, so that the protocol can be checked against a model without one (the model checker
//! in `tests/model/` runs every interleaving of its statements).
//!
//! It behaves as one of the two engines the checkout runs on ([`Engine`]): PostgreSQL's row
//! locks and statement snapshots (the claim waits for a row another transaction holds, then reads
//! the holder as its snapshot saw it), or SQLite's one writer. Before each statement that reads
//! or writes what other transactions see, it waits for its [`Turns`], which is how a scheduler
//! interleaves transactions one such statement at a time; the default runs them as they come.
//! A statement that touches only its own transaction's writes (the effect, the stored answer,
//! SQLite's claim under its one writer) takes no turn: it commutes with every other step, so
//! giving it one would only multiply the schedules a checker runs.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::Duration;

use crate::{
    AtOnce, Claim, Claimed, Classify, Clock, Failure, Finish, KeyRecord, KeyStore, KeyTx,
    LateClaim, StoredResponse, SystemClock, Work,
};

/// Which database's concurrency the store has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// Row locks; a claim that waited for a row's holder reads it in the snapshot its statement
    /// began with (as `INSERT … ON CONFLICT DO UPDATE WHERE … UNION ALL SELECT` does).
    Postgres,
    /// One writer at a time (`BEGIN IMMEDIATE`); readers see what is committed.
    Sqlite,
}

/// How the PostgreSQL claim reads the holder of a key it did not take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HolderRead {
    /// Only a live holder (`created_at >= expired_before`): what the checkout's store does.
    Live,
    /// Whatever the statement's snapshot holds, expired or not: the checkout's store before
    /// commit add96a7 ("an expired key taken over elsewhere is read from its new holder"). Kept
    /// so that a test can show the model checker finds that defect.
    AsOfSnapshot,
}

/// How a batch's late claim ([`KeyTx::insert_answered_many`]) writes its keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LateInsert {
    /// The store does not claim late: batches claim first.
    Never,
    /// A plain insert: it waits for a transaction writing the key, and fails on any row there
    /// (what the receipts' inbox does).
    Plain,
    /// Over a committed row that is still live (an upsert with no guard): a defect, kept so
    /// that a test can show the model checker finds it.
    Overwrites,
}

/// How [`MemoryStore::at_once`] inserts the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtOnceInsert {
    /// A plain insert: it waits for a transaction claiming the key, and fails on any row there
    /// (what the checkout's statement does).
    Plain,
    /// Over whatever is there, without waiting (an upsert with no guard): a defect, kept so
    /// that a test can show the model checker finds it.
    Overwrites,
}

/// What a statement is, for whoever hands out turns (and for the traces it prints).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Statement {
    Read,
    Begin,
    Claim,
    /// A claim that waited for another transaction's lock, taken up again.
    ClaimAfterWait,
    Commit,
    /// The whole keyed step in one statement ([`MemoryStore::at_once`]).
    AtOnce,
    /// A batch's keys written with their answers, after its operations
    /// ([`KeyTx::insert_answered_many`]).
    LateClaim,
}

/// Hands out turns: each statement of the store waits for one before it runs.
pub trait Turns: Send + Sync + 'static {
    fn turn(&self, statement: Statement) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// Every statement runs as it comes.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoTurns;

impl Turns for NoTurns {
    fn turn(&self, _statement: Statement) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(std::future::ready(()))
    }
}

/// Why a statement failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryError {
    /// A lock was not had within the store's bound.
    Busy,
    /// The completion found the key no longer under this claim.
    LostClaim,
}

impl Classify for MemoryError {
    fn failure(&self) -> Failure {
        match self {
            MemoryError::Busy => Failure::Busy,
            MemoryError::LostClaim => Failure::Fatal,
        }
    }
}

impl std::fmt::Display for MemoryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MemoryError::Busy => "a lock was not had within the bound",
            MemoryError::LostClaim => "the key is no longer under this claim",
        })
    }
}

impl std::error::Error for MemoryError {}

/// A key's row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRow {
    pub claim_id: String,
    pub request_hash: String,
    pub request_body: String,
    pub response: Option<StoredResponse>,
    pub created_at_ms: i64,
}

impl KeyRow {
    fn record(&self) -> KeyRecord {
        KeyRecord {
            request_hash: self.request_hash.clone(),
            request_body: Some(self.request_body.clone()),
            response: self.response.clone(),
            created_at_ms: self.created_at_ms,
        }
    }
}

/// One committed business change, made under a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Effect {
    /// Numbered in the order they were made (committed or not).
    pub id: u64,
    pub scope: String,
    pub key: String,
    pub request_hash: String,
    /// The claim's time: when the key was taken for it.
    pub claimed_at_ms: i64,
    /// Whatever the operation says of itself (e.g. which execution made it).
    pub note: String,
}

type KeyId = (String, String);

#[derive(Default)]
struct Tables {
    keys: BTreeMap<KeyId, KeyRow>,
    effects: Vec<Effect>,
    /// PostgreSQL: which transaction holds each locked row.
    row_locks: BTreeMap<KeyId, u64>,
    /// SQLite: the transaction that holds the one write lock.
    writer: Option<u64>,
    next_tx: u64,
    next_effect: u64,
}

struct Shared {
    tables: Mutex<Tables>,
    engine: Engine,
    holder_read: HolderRead,
    at_once_insert: AtOnceInsert,
    late_insert: LateInsert,
    lock_bound: Duration,
    clock: Arc<dyn Clock>,
    turns: Arc<dyn Turns>,
}

/// The store. Clones share one database.
#[derive(Clone)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("engine", &self.shared.engine)
            .finish_non_exhaustive()
    }
}

/// How a [`MemoryStore`] is made.
pub struct MemoryStoreBuilder {
    engine: Engine,
    holder_read: HolderRead,
    at_once_insert: AtOnceInsert,
    late_insert: LateInsert,
    lock_bound: Duration,
    clock: Arc<dyn Clock>,
    turns: Arc<dyn Turns>,
}

impl MemoryStoreBuilder {
    pub fn holder_read(self, holder_read: HolderRead) -> Self {
        MemoryStoreBuilder {
            holder_read,
            ..self
        }
    }

    pub fn at_once_insert(self, at_once_insert: AtOnceInsert) -> Self {
        MemoryStoreBuilder {
            at_once_insert,
            ..self
        }
    }

    /// Whether batches claim their keys late, and how ([`KeyStore::claims_late`]).
    pub fn late_insert(self, late_insert: LateInsert) -> Self {
        MemoryStoreBuilder {
            late_insert,
            ..self
        }
    }

    /// How long a statement waits for a lock before [`MemoryError::Busy`].
    pub fn lock_bound(self, lock_bound: Duration) -> Self {
        MemoryStoreBuilder { lock_bound, ..self }
    }

    pub fn clock(self, clock: Arc<dyn Clock>) -> Self {
        MemoryStoreBuilder { clock, ..self }
    }

    pub fn turns(self, turns: Arc<dyn Turns>) -> Self {
        MemoryStoreBuilder { turns, ..self }
    }

    pub fn build(self) -> MemoryStore {
        MemoryStore {
            shared: Arc::new(Shared {
                tables: Mutex::default(),
                engine: self.engine,
                holder_read: self.holder_read,
                at_once_insert: self.at_once_insert,
                late_insert: self.late_insert,
                lock_bound: self.lock_bound,
                clock: self.clock,
                turns: self.turns,
            }),
        }
    }
}

impl MemoryStore {
    pub fn builder(engine: Engine) -> MemoryStoreBuilder {
        MemoryStoreBuilder {
            engine,
            holder_read: HolderRead::Live,
            at_once_insert: AtOnceInsert::Plain,
            late_insert: LateInsert::Never,
            lock_bound: crate::DEFAULT_LOCK_TIMEOUT,
            clock: Arc::new(SystemClock),
            turns: Arc::new(NoTurns),
        }
    }

    pub fn new(engine: Engine) -> MemoryStore {
        MemoryStore::builder(engine).build()
    }

    fn tables(&self) -> MutexGuard<'_, Tables> {
        self.shared.tables()
    }

    /// The key's row as committed.
    pub fn key(&self, scope: &str, key: &str) -> Option<KeyRow> {
        self.tables().keys.get(&key_id(scope, key)).cloned()
    }

    /// Writes a committed row directly, as an earlier run of the protocol would have left it.
    pub fn put_key(&self, scope: &str, key: &str, row: KeyRow) {
        self.tables().keys.insert(key_id(scope, key), row);
    }

    /// Every effect committed, in the order they were made.
    pub fn effects(&self) -> Vec<Effect> {
        self.tables().effects.clone()
    }

    /// The whole keyed step as PostgreSQL's one statement does it (the checkout's payment at
    /// once): a read of the key as committed (any row found is [`AtOnce::Held`]), then
    /// ONE statement that inserts the key completed with `respond(effect)` and the effect, and
    /// commits. Its plain insert waits for a transaction that holds the key's row, and fails on
    /// any row there (a unique violation), or past the bound: then nothing is written and the
    /// steps run. SQLite's engine has no such statement: always [`AtOnce::NotDone`].
    pub async fn at_once(
        &self,
        claim: &Claim,
        note: String,
        respond: impl FnOnce(u64) -> StoredResponse + Send,
    ) -> Result<AtOnce, MemoryError> {
        if self.shared.engine == Engine::Sqlite {
            return Ok(AtOnce::NotDone);
        }
        let id = key_id(&claim.scope, &claim.key);
        self.shared.turns.turn(Statement::Read).await;
        if let Some(row) = self.key(&claim.scope, &claim.key) {
            return Ok(AtOnce::Held(row.record()));
        }
        self.shared.turns.turn(Statement::AtOnce).await;
        // Its own transaction, for the row lock it may wait on; dropped at the end (committed
        // by then, or rolled back).
        let tx = MemoryTx::begin(self.shared.clone()).await?;
        let plain = self.shared.at_once_insert == AtOnceInsert::Plain;
        if plain && tx.wait_for_row(&id).await.is_err() {
            return Ok(AtOnce::NotDone);
        }
        let mut tables = self.shared.tables();
        if plain && tables.keys.contains_key(&id) {
            return Ok(AtOnce::NotDone);
        }
        tables.next_effect += 1;
        let effect = tables.next_effect;
        let response = respond(effect);
        tables.keys.insert(
            id,
            KeyRow {
                response: Some(response.clone()),
                ..new_row(claim)
            },
        );
        tables.effects.push(Effect {
            id: effect,
            scope: claim.scope.clone(),
            key: claim.key.clone(),
            request_hash: claim.request_hash.clone(),
            claimed_at_ms: claim.now_ms,
            note,
        });
        drop(tables);
        drop(tx);
        Ok(AtOnce::Done(response))
    }

    /// The sweeper: deletes the keys created before `created_before_ms` that no transaction
    /// holds (`SKIP LOCKED`; on SQLite it would wait for the writer, and skips instead);
    /// returns how many.
    pub fn sweep_expired_keys(&self, created_before_ms: i64) -> usize {
        let mut tables = self.tables();
        if tables.writer.is_some() {
            return 0;
        }
        let Tables {
            keys, row_locks, ..
        } = &mut *tables;
        let before = keys.len();
        keys.retain(|id, row| row.created_at_ms >= created_before_ms || row_locks.contains_key(id));
        before - keys.len()
    }
}

impl Shared {
    fn tables(&self) -> MutexGuard<'_, Tables> {
        // A panic while the lock was held leaves the tables as consistent as any statement.
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn key_id(scope: &str, key: &str) -> KeyId {
    (scope.to_owned(), key.to_owned())
}

/// One transaction: what it wrote, visible to it alone until it commits.
pub struct MemoryTx {
    shared: Arc<Shared>,
    id: u64,
    keys: BTreeMap<KeyId, KeyRow>,
    effects: Vec<Effect>,
}

impl MemoryTx {
    /// Waits until `free` says the lock is this transaction's to take, then takes it; gives
    /// [`MemoryError::Busy`] once the store's bound has passed.
    async fn wait_for(
        &self,
        mut free: impl FnMut(&mut Tables, u64) -> bool + Send,
    ) -> Result<(), MemoryError> {
        let since = self.shared.clock.now_ms();
        let bound = i64::try_from(self.shared.lock_bound.as_millis()).unwrap_or(i64::MAX);
        std::future::poll_fn(|_cx| {
            if free(&mut self.shared.tables(), self.id) {
                Poll::Ready(Ok(()))
            } else if self.shared.clock.now_ms().saturating_sub(since) >= bound {
                Poll::Ready(Err(MemoryError::Busy))
            } else {
                // Whoever holds the lock lets it go in a statement of its own; the scheduler
                // polls every waiter after each statement.
                Poll::Pending
            }
        })
        .await
    }

    /// PostgreSQL: waits until no other transaction holds the key's row (claimed or inserted,
    /// not yet committed), taking a turn again each time it is woken (another statement may
    /// run before this one goes on).
    async fn wait_for_row(&self, id: &KeyId) -> Result<(), MemoryError> {
        let row_free = |tables: &mut Tables, me: u64| {
            tables.row_locks.get(id).is_none_or(|&holder| holder == me)
        };
        while !row_free(&mut self.shared.tables(), self.id) {
            self.wait_for(row_free).await?;
            self.shared.turns.turn(Statement::ClaimAfterWait).await;
        }
        Ok(())
    }

    async fn begin(shared: Arc<Shared>) -> Result<MemoryTx, MemoryError> {
        let id = {
            let mut tables = shared.tables();
            tables.next_tx += 1;
            tables.next_tx
        };
        let tx = MemoryTx {
            shared,
            id,
            keys: BTreeMap::new(),
            effects: Vec::new(),
        };
        if tx.shared.engine == Engine::Sqlite {
            tx.shared.turns.turn(Statement::Begin).await;
            tx.wait_for(|tables, id| match tables.writer {
                None => {
                    tables.writer = Some(id);
                    true
                }
                Some(writer) => writer == id,
            })
            .await?;
        }
        Ok(tx)
    }

    /// The business change: recorded under `claim`, committed with the key or not at all.
    /// Returns the effect's number.
    pub async fn record_effect(&mut self, claim: &Claim, note: String) -> u64 {
        let id = {
            let mut tables = self.shared.tables();
            tables.next_effect += 1;
            tables.next_effect
        };
        self.effects.push(Effect {
            id,
            scope: claim.scope.clone(),
            key: claim.key.clone(),
            request_hash: claim.request_hash.clone(),
            claimed_at_ms: claim.now_ms,
            note,
        });
        id
    }

    async fn commit(mut self) {
        self.shared.turns.turn(Statement::Commit).await;
        let mut tables = self.shared.tables();
        let keys = std::mem::take(&mut self.keys);
        tables.keys.extend(keys);
        tables.effects.append(&mut self.effects);
        // The locks go when `self` drops, with the guard released first.
        drop(tables);
    }

    /// The PostgreSQL claim: `INSERT … ON CONFLICT DO UPDATE … WHERE created_at < $expired`,
    /// then the holder read in the statement's snapshot.
    async fn claim_postgres(
        &mut self,
        claim: &Claim,
        expired_before_ms: i64,
    ) -> Result<Claimed, MemoryError> {
        let id = key_id(&claim.scope, &claim.key);
        self.shared.turns.turn(Statement::Claim).await;
        let snapshot = self.shared.tables().keys.get(&id).cloned();
        self.wait_for_row(&id).await?;
        let mut tables = self.shared.tables();
        // The row lock is taken whether or not the row is updated (ON CONFLICT DO UPDATE).
        tables.row_locks.insert(id.clone(), self.id);
        let latest = tables.keys.get(&id);
        if latest.is_none_or(|row| row.created_at_ms < expired_before_ms) {
            drop(tables);
            self.keys.insert(id, new_row(claim));
            return Ok(Claimed::Ours);
        }
        let holder = match self.shared.holder_read {
            HolderRead::Live => snapshot.filter(|row| row.created_at_ms >= expired_before_ms),
            HolderRead::AsOfSnapshot => snapshot,
        };
        Ok(Claimed::Taken(holder.map(|row| row.record())))
    }

    /// The SQLite claim: this transaction is the one writer, so what is committed is current.
    async fn claim_sqlite(
        &mut self,
        claim: &Claim,
        expired_before_ms: i64,
    ) -> Result<Claimed, MemoryError> {
        let id = key_id(&claim.scope, &claim.key);
        let tables = self.shared.tables();
        match tables.keys.get(&id) {
            Some(row) if row.created_at_ms >= expired_before_ms => {
                Ok(Claimed::Taken(Some(row.record())))
            }
            _ => {
                drop(tables);
                self.keys.insert(id, new_row(claim));
                Ok(Claimed::Ours)
            }
        }
    }
}

fn new_row(claim: &Claim) -> KeyRow {
    KeyRow {
        claim_id: claim.claim_id.clone(),
        request_hash: claim.request_hash.clone(),
        request_body: claim.request_body.clone(),
        response: None,
        created_at_ms: claim.now_ms,
    }
}

impl Drop for MemoryTx {
    /// The end of the transaction, committed or not (a rollback, or the process gone): its
    /// locks go.
    fn drop(&mut self) {
        let mut tables = self.shared.tables();
        let id = self.id;
        tables.row_locks.retain(|_, holder| *holder != id);
        if tables.writer == Some(id) {
            tables.writer = None;
        }
    }
}

impl KeyTx for MemoryTx {
    type Error = MemoryError;

    async fn claim(
        &mut self,
        claim: &Claim,
        expired_before_ms: i64,
    ) -> Result<Claimed, MemoryError> {
        match self.shared.engine {
            Engine::Postgres => self.claim_postgres(claim, expired_before_ms).await,
            Engine::Sqlite => self.claim_sqlite(claim, expired_before_ms).await,
        }
    }

    async fn complete(
        &mut self,
        claim: &Claim,
        response: &StoredResponse,
    ) -> Result<(), MemoryError> {
        match self.keys.get_mut(&key_id(&claim.scope, &claim.key)) {
            Some(row) if row.claim_id == claim.claim_id => {
                row.response = Some(response.clone());
                Ok(())
            }
            _ => Err(MemoryError::LostClaim),
        }
    }

    /// A batch's late claim: one statement inserting every key, done, with its answer. On
    /// PostgreSQL each insert waits for a transaction holding the key's row (its claim or its
    /// own insert) and fails on a row there; on SQLite this transaction is the one writer, and
    /// what is committed is current.
    async fn insert_answered_many(
        &mut self,
        answers: &[(&Claim, &StoredResponse)],
    ) -> Result<LateClaim, MemoryError> {
        let overwrites = match self.shared.late_insert {
            LateInsert::Never => return Ok(LateClaim::KeyHeld),
            LateInsert::Plain => false,
            LateInsert::Overwrites => true,
        };
        if self.shared.engine == Engine::Postgres {
            self.shared.turns.turn(Statement::LateClaim).await;
        }
        for (claim, response) in answers {
            let id = key_id(&claim.scope, &claim.key);
            if self.shared.engine == Engine::Postgres {
                self.wait_for_row(&id).await?;
            }
            let mut tables = self.shared.tables();
            if !overwrites && (tables.keys.contains_key(&id) || self.keys.contains_key(&id)) {
                return Ok(LateClaim::KeyHeld);
            }
            if self.shared.engine == Engine::Postgres {
                tables.row_locks.insert(id.clone(), self.id);
            }
            drop(tables);
            let row = KeyRow {
                response: Some((*response).clone()),
                ..new_row(claim)
            };
            self.keys.insert(id, row);
        }
        Ok(LateClaim::Written)
    }
}

impl KeyStore for MemoryStore {
    type Tx = MemoryTx;
    type Error = MemoryError;

    fn reads_before_claim(&self) -> bool {
        self.shared.engine == Engine::Sqlite
    }

    fn claims_late(&self) -> bool {
        self.shared.late_insert != LateInsert::Never
    }

    async fn stored_key(&self, scope: &str, key: &str) -> Result<Option<KeyRecord>, MemoryError> {
        self.shared.turns.turn(Statement::Read).await;
        Ok(self.key(scope, key).map(|row| row.record()))
    }

    async fn transaction<W>(&self, work: W) -> Result<W::Output, W::Error>
    where
        W: Work<MemoryTx>,
    {
        let mut tx = MemoryTx::begin(self.shared.clone()).await?;
        match work.run(&mut tx).await? {
            Finish::Commit(output) => {
                tx.commit().await;
                Ok(output)
            }
            Finish::Rollback(output) => Ok(output),
        }
    }
}
