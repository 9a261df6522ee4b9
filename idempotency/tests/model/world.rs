//! The world the protocol runs in, as the model sees it: shoppers' clients that send a keyed
//! request and resend it when they get no answer, checkout instances (each a real
//! [`Protocol`] with its own memory of keys in flight) over one database (a [`MemoryStore`]),
//! and what can happen between any two statements: time passes, an instance crashes, an answer
//! is lost, the sweeper runs. After each step the answers given so far are checked against the
//! database: at most one effect per key while it lives, and every answer true.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use checkout_idempotency::memory::{
    AtOnceInsert, Engine, HolderRead, KeyRow, LateInsert, MemoryError, MemoryStore, MemoryTx,
    Statement, Turns,
};
use checkout_idempotency::{
    AtOnce, Claim, Clock, Decision, Fingerprint, KeyedRequest, Operation, Outcome, Protocol,
    StoredResponse, canonical_json,
};
use serde_json::Value;

use crate::explorer::{Explorer, Violation};

pub const TTL: Duration = Duration::from_secs(3600);
pub const LOCK_BOUND: Duration = Duration::from_millis(500);
const SCOPE: &str = "acc_shop";
const METHOD: &str = "POST";
const ROUTE: &str = "/api/payments";
/// The model's clock starts here (any time will do; this one reads well in traces).
const START_MS: i64 = 1_000_000_000;

/// One shopper's request: its key and body, and the instance each send goes to (the first is
/// the send, the rest resends after no answer).
#[derive(Clone, Debug)]
pub struct ClientPlan {
    pub key: &'static str,
    pub body: Value,
    pub sends: Vec<usize>,
}

/// How many of each event may happen in one schedule.
#[derive(Clone, Copy, Debug, Default)]
pub struct Budget {
    pub crashes: u32,
    pub lost_answers: u32,
    /// The lock bound passes: a copy stops waiting for its original, a claim for a row.
    pub lock_bounds: u32,
    /// A key's lifetime passes: every key stored so far expires.
    pub expiries: u32,
    pub sweeps: u32,
}

/// A key some earlier request left: its body, and its age at the start.
#[derive(Clone, Debug)]
pub struct EarlierKey {
    pub key: &'static str,
    pub body: Value,
    pub age: Duration,
}

#[derive(Clone, Debug)]
pub struct Scenario {
    pub engine: Engine,
    pub holder_read: HolderRead,
    pub at_once_insert: AtOnceInsert,
    pub instances: usize,
    pub clients: Vec<ClientPlan>,
    pub earlier: Vec<EarlierKey>,
    pub budget: Budget,
    /// The server cuts every request after a bound far below a key's lifetime (the checkout's
    /// `REQUEST_TIMEOUT`, 30 s, against 24 h): so when a lifetime passes, every request then in
    /// flight has been cut, its transaction rolled back, its client left without an answer.
    pub request_bound: bool,
    /// The payment settles at once where it can (PostgreSQL's one statement), the steps
    /// settling whatever it could not; or it always takes the steps.
    pub at_once: bool,
    /// Each send goes as a batch of its own through [`Protocol::execute_many`] (as the receipts'
    /// inbox takes messages), claiming its key late or first as `late_insert` says.
    pub batched: bool,
    pub late_insert: LateInsert,
}

impl Scenario {
    pub fn new(engine: Engine, instances: usize, clients: Vec<ClientPlan>) -> Scenario {
        Scenario {
            engine,
            holder_read: HolderRead::Live,
            at_once_insert: AtOnceInsert::Plain,
            instances,
            clients,
            earlier: Vec::new(),
            budget: Budget::default(),
            request_bound: true,
            at_once: false,
            batched: false,
            late_insert: LateInsert::Never,
        }
    }
}

/// Runs the scenario once, under the schedule `explorer` picks.
pub fn run(scenario: &Scenario, explorer: &mut Explorer) -> Result<(), Violation> {
    let mut world = World::new(scenario);
    loop {
        world.settle(explorer)?;
        let options = world.options();
        if options.is_empty() {
            return world.finished();
        }
        let step = options[explorer.pick(options.len())].clone();
        world.take(step)?;
    }
}

/// The time, moved only by the scheduler.
#[derive(Clone)]
struct ModelClock {
    now: Arc<AtomicI64>,
}

impl ModelClock {
    fn advance(&self, by: Duration) {
        self.now.fetch_add(ms(by), Ordering::SeqCst);
    }
}

impl Clock for ModelClock {
    fn now_ms(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }

    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let until = self.now_ms().saturating_add(ms(duration));
        let now = self.now.clone();
        Box::pin(std::future::poll_fn(move |_| {
            if now.load(Ordering::SeqCst) >= until {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }))
    }
}

fn ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Turns handed out one statement at a time: a statement waits until its task is granted.
#[derive(Clone, Default)]
struct ModelTurns {
    shared: Arc<TurnsShared>,
}

#[derive(Default)]
struct TurnsShared {
    state: Mutex<TurnState>,
    /// Bumped whenever a task reaches a statement: the world settles when it stops moving.
    arrivals: AtomicU64,
}

#[derive(Default)]
struct TurnState {
    /// The task being polled: whose statement a new turn is.
    polling: Option<u64>,
    waiting: BTreeMap<u64, Statement>,
    granted: Option<u64>,
}

impl Turns for ModelTurns {
    fn turn(&self, statement: Statement) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let turns = self.clone();
        let task = self.lock().polling.expect("a statement outside any task");
        let mut arrived = false;
        Box::pin(std::future::poll_fn(move |_| {
            let mut state = turns.lock();
            if state.granted == Some(task) {
                state.granted = None;
                state.waiting.remove(&task);
                return Poll::Ready(());
            }
            if !arrived {
                arrived = true;
                state.waiting.insert(task, statement);
                turns.shared.arrivals.fetch_add(1, Ordering::SeqCst);
            }
            Poll::Pending
        }))
    }
}

impl ModelTurns {
    fn lock(&self) -> std::sync::MutexGuard<'_, TurnState> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn arrivals(&self) -> u64 {
        self.shared.arrivals.load(Ordering::SeqCst)
    }
}

/// The business change: one effect, whose number is the answer. With a store, it tries the
/// whole keyed step at once first.
struct Pay {
    task: u64,
    at_once: Option<MemoryStore>,
}

impl Operation<MemoryTx> for Pay {
    type Error = MemoryError;

    async fn apply(&self, tx: &mut MemoryTx, claim: &Claim) -> Result<Decision, MemoryError> {
        let effect = tx.record_effect(claim, task_note(self.task)).await;
        Ok(Decision::Respond(answer(effect)))
    }

    async fn at_once(&self, claim: &Claim) -> Result<AtOnce, MemoryError> {
        match &self.at_once {
            Some(store) => store.at_once(claim, task_note(self.task), answer).await,
            None => Ok(AtOnce::NotDone),
        }
    }
}

fn answer(effect: u64) -> StoredResponse {
    StoredResponse {
        status: 201,
        body: format!("{{\"effect\":{effect}}}"),
    }
}

fn task_note(task: u64) -> String {
    format!("task {task}")
}

fn effect_of(response: &StoredResponse) -> Option<u64> {
    let body: Value = serde_json::from_str(&response.body).ok()?;
    body.get("effect")?.as_u64()
}

type Execution = Pin<Box<dyn Future<Output = Result<Outcome, MemoryError>>>>;

/// One send of a request, executing on an instance.
struct Task {
    client: usize,
    instance: usize,
    /// When it was sent: the answer speaks of the key as it stood then.
    sent_at_ms: i64,
    execution: Execution,
}

#[derive(Default)]
struct Client {
    sends_made: usize,
    /// The conclusive answer it got (then it sends no more).
    answer: Option<Outcome>,
    running: Option<u64>,
}

/// A step the scheduler can take.
#[derive(Clone, Debug)]
enum Step {
    Send(usize),
    Grant(u64),
    LockBoundPasses,
    KeysExpire,
    Sweep,
    Crash(usize),
}

struct World<'a> {
    scenario: &'a Scenario,
    clock: ModelClock,
    turns: ModelTurns,
    store: MemoryStore,
    instances: Vec<Protocol>,
    clients: Vec<Client>,
    tasks: BTreeMap<u64, Task>,
    next_task: u64,
    budget: Budget,
    trace: Vec<String>,
}

impl<'a> World<'a> {
    fn new(scenario: &'a Scenario) -> World<'a> {
        let clock = ModelClock {
            now: Arc::new(AtomicI64::new(START_MS)),
        };
        let turns = ModelTurns::default();
        let store = MemoryStore::builder(scenario.engine)
            .holder_read(scenario.holder_read)
            .at_once_insert(scenario.at_once_insert)
            .late_insert(scenario.late_insert)
            .lock_bound(LOCK_BOUND)
            .clock(Arc::new(clock.clone()))
            .turns(Arc::new(turns.clone()))
            .build();
        for earlier in &scenario.earlier {
            let request_body = canonical_json(&earlier.body);
            store.put_key(
                SCOPE,
                earlier.key,
                KeyRow {
                    claim_id: "earlier".into(),
                    request_hash: fingerprint(&earlier.body),
                    request_body,
                    response: Some(StoredResponse {
                        status: 201,
                        body: "{\"effect\":0}".into(),
                    }),
                    created_at_ms: START_MS - ms(earlier.age),
                },
            );
        }
        let mut world = World {
            scenario,
            clock,
            turns,
            store,
            instances: Vec::new(),
            clients: scenario.clients.iter().map(|_| Client::default()).collect(),
            tasks: BTreeMap::new(),
            next_task: 0,
            budget: scenario.budget,
            trace: Vec::new(),
        };
        world.instances = (0..scenario.instances).map(|_| world.protocol()).collect();
        world
    }

    /// An instance's protocol, as it starts (nothing in flight).
    fn protocol(&self) -> Protocol {
        Protocol::new(TTL)
            .with_lock_timeout(LOCK_BOUND)
            .with_clock(Arc::new(self.clock.clone()))
    }

    fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Polls every task until none moves: each runs up to its next statement, or ends.
    fn settle(&mut self, explorer: &mut Explorer) -> Result<(), Violation> {
        let mut context = Context::from_waker(Waker::noop());
        loop {
            let arrivals = self.turns.arrivals();
            let mut ended = Vec::new();
            for (&id, task) in &mut self.tasks {
                self.turns.lock().polling = Some(id);
                if let Poll::Ready(result) = task.execution.as_mut().poll(&mut context) {
                    ended.push((id, result));
                }
                self.turns.lock().polling = None;
            }
            if ended.is_empty() && self.turns.arrivals() == arrivals {
                return Ok(());
            }
            for (id, result) in ended {
                self.answered(id, result, explorer)?;
            }
        }
    }

    fn options(&self) -> Vec<Step> {
        let mut options = Vec::new();
        for (i, client) in self.clients.iter().enumerate() {
            let plan = &self.scenario.clients[i];
            if client.running.is_none()
                && client.answer.is_none()
                && client.sends_made < plan.sends.len()
            {
                options.push(Step::Send(i));
            }
        }
        let waiting = self.turns.lock().waiting.clone();
        options.extend(waiting.keys().map(|&task| Step::Grant(task)));
        // Tasks neither at a statement nor done wait: for their original, or for a lock.
        let blocked = self.tasks.keys().any(|task| !waiting.contains_key(task));
        if self.budget.lock_bounds > 0 && blocked {
            options.push(Step::LockBoundPasses);
        }
        if self.budget.expiries > 0 {
            options.push(Step::KeysExpire);
        }
        if self.budget.sweeps > 0 {
            options.push(Step::Sweep);
        }
        if self.budget.crashes > 0 {
            for instance in 0..self.instances.len() {
                if self.tasks.values().any(|task| task.instance == instance) {
                    options.push(Step::Crash(instance));
                }
            }
        }
        options
    }

    fn take(&mut self, step: Step) -> Result<(), Violation> {
        match step {
            Step::Send(client) => self.send(client),
            Step::Grant(task) => {
                let statement = self.turns.lock().waiting[&task];
                let who = self.who(task);
                self.trace.push(format!("{who}: {statement:?}"));
                self.turns.lock().granted = Some(task);
            }
            Step::LockBoundPasses => {
                self.budget.lock_bounds -= 1;
                self.clock.advance(LOCK_BOUND);
                self.trace.push("the lock bound passes".into());
            }
            Step::KeysExpire => {
                self.budget.expiries -= 1;
                self.clock.advance(TTL + Duration::from_millis(1));
                self.trace.push("a key's lifetime passes".into());
                if self.scenario.request_bound && !self.tasks.is_empty() {
                    self.trace
                        .push("every request in flight was cut at the request bound".into());
                    self.cut(|_| true);
                }
            }
            Step::Sweep => {
                self.budget.sweeps -= 1;
                let swept = self
                    .store
                    .sweep_expired_keys(self.now().saturating_sub(ms(TTL)));
                self.trace
                    .push(format!("the sweeper deletes {swept} expired keys"));
            }
            Step::Crash(instance) => {
                self.budget.crashes -= 1;
                self.trace
                    .push(format!("instance {} crashes", name(instance)));
                self.cut(|task| task.instance == instance);
                self.instances[instance] = self.protocol();
            }
        }
        Ok(())
    }

    /// Drops the requests `which` picks mid-flight: their transactions roll back (the store's
    /// `Drop`), their memory of keys in flight goes, their clients get no answer.
    fn cut(&mut self, which: impl Fn(&Task) -> bool) {
        let cut: Vec<u64> = self
            .tasks
            .iter()
            .filter(|(_, task)| which(task))
            .map(|(&id, _)| id)
            .collect();
        for id in cut {
            let task = self.tasks.remove(&id).expect("listed just now");
            self.turns.lock().waiting.remove(&id);
            self.clients[task.client].running = None;
        }
    }

    fn send(&mut self, client: usize) {
        let plan = &self.scenario.clients[client];
        let instance = plan.sends[self.clients[client].sends_made];
        self.clients[client].sends_made += 1;
        let id = self.next_task;
        self.next_task += 1;
        let (protocol, store) = (self.instances[instance].clone(), self.store.clone());
        let (key, body) = (plan.key, plan.body.clone());
        let at_once = self.scenario.at_once.then(|| store.clone());
        let batched = self.scenario.batched;
        let execution: Execution = Box::pin(async move {
            let request = KeyedRequest {
                scope: SCOPE,
                key,
                method: METHOD,
                route: ROUTE,
                body: &body,
            };
            let pay = Pay { task: id, at_once };
            if batched {
                let mut outcomes = protocol.execute_many(&store, vec![(request, pay)]).await;
                outcomes.pop().expect("one outcome per request")
            } else {
                protocol.execute(&store, request, pay).await
            }
        });
        self.tasks.insert(
            id,
            Task {
                client,
                instance,
                sent_at_ms: self.now(),
                execution,
            },
        );
        self.clients[client].running = Some(id);
        let who = self.who(id);
        self.trace
            .push(format!("{who}: sends {} with key {key}", plan.body));
    }

    fn who(&self, task: u64) -> String {
        let task_ = &self.tasks[&task];
        format!(
            "client {} (send #{task}) on {}",
            task_.client,
            name(task_.instance)
        )
    }

    fn answered(
        &mut self,
        id: u64,
        result: Result<Outcome, MemoryError>,
        explorer: &mut Explorer,
    ) -> Result<(), Violation> {
        let who = self.who(id);
        let task = self.tasks.remove(&id).expect("an answer of a running task");
        self.trace.push(format!("{who}: answers {result:?}"));
        let client = task.client;
        self.clients[client].running = None;
        self.check_answer(id, &task, &result)?;
        self.check_effects()?;
        let conclusive = matches!(
            result,
            Ok(Outcome::Executed { .. } | Outcome::Replayed { .. } | Outcome::KeyReused { .. })
        );
        if !conclusive {
            return Ok(());
        }
        if self.budget.lost_answers > 0 && explorer.pick(2) == 1 {
            self.budget.lost_answers -= 1;
            self.trace
                .push(format!("the answer to client {client} is lost"));
            return Ok(());
        }
        self.clients[client].answer = result.ok();
        Ok(())
    }

    fn violation(&self, what: String) -> Violation {
        Violation {
            what,
            trace: self.trace.clone(),
        }
    }

    /// Is the answer true, now, of the database?
    fn check_answer(
        &self,
        id: u64,
        task: &Task,
        result: &Result<Outcome, MemoryError>,
    ) -> Result<(), Violation> {
        let (client, sent_at) = (task.client, task.sent_at_ms);
        let plan = &self.scenario.clients[client];
        let hash = fingerprint(&plan.body);
        let effects = self.store.effects();
        let mine: Vec<_> = effects.iter().filter(|e| e.note == task_note(id)).collect();
        // The answer speaks of the key as it stood when the request was sent: it must have
        // lived then (time may pass while the request runs; it was judged on arrival).
        let expiry_ahead = |expires_at_ms: i64| -> Result<(), Violation> {
            if expires_at_ms > sent_at {
                Ok(())
            } else {
                Err(self.violation(format!(
                    "client {client} was told its key expires at {expires_at_ms}, \
                     {} ms before it sent the request",
                    sent_at - expires_at_ms
                )))
            }
        };
        match result {
            Ok(Outcome::Executed {
                response,
                expires_at_ms,
            }) => {
                if mine.len() != 1 || effect_of(response) != Some(mine[0].id) {
                    return Err(self.violation(format!(
                        "client {client} was told {response:?} was executed; its effects: \
                         {mine:?}"
                    )));
                }
                expiry_ahead(*expires_at_ms)
            }
            Ok(Outcome::Replayed {
                response,
                expires_at_ms,
            }) => {
                let replayed = effect_of(response).and_then(|id| {
                    effects
                        .iter()
                        .find(|e| e.id == id && e.key == plan.key && e.request_hash == hash)
                });
                if replayed.is_none() {
                    return Err(self.violation(format!(
                        "client {client} was replayed {response:?}, the answer to no effect of \
                         its own request"
                    )));
                }
                expiry_ahead(*expires_at_ms)
            }
            Ok(Outcome::KeyReused { expires_at_ms, .. }) => {
                let holder = self.store.key(SCOPE, plan.key);
                let live_other = holder.as_ref().is_some_and(|row| {
                    row.created_at_ms >= sent_at - ms(TTL) && row.request_hash != hash
                });
                if !live_other {
                    return Err(self.violation(format!(
                        "client {client} was told its key was used for another request; the \
                         key holds {holder:?}"
                    )));
                }
                expiry_ahead(*expires_at_ms)
            }
            Ok(Outcome::InUse) => {
                let another = self
                    .tasks
                    .values()
                    .any(|other| self.scenario.clients[other.client].key == plan.key);
                if another {
                    Ok(())
                } else {
                    Err(self.violation(format!(
                        "client {client} was told its key is in use; nothing else runs with it"
                    )))
                }
            }
            Ok(Outcome::TryAgain) | Err(_) => {
                if mine.is_empty() {
                    Ok(())
                } else {
                    Err(self.violation(format!(
                        "client {client} was told nothing happened ({result:?}); its effects: \
                         {mine:?}"
                    )))
                }
            }
        }
    }

    /// At most one effect per key while the key lives: a key's next effect was claimed only
    /// once the one before had expired.
    fn check_effects(&self) -> Result<(), Violation> {
        let mut last: BTreeMap<&str, i64> = BTreeMap::new();
        let effects = self.store.effects();
        for effect in &effects {
            if let Some(&before) = last.get(effect.key.as_str())
                && (effect.claimed_at_ms - before).abs() <= ms(TTL)
            {
                return Err(self.violation(format!(
                    "key {} took effect twice while it lived: {effects:?}",
                    effect.key
                )));
            }
            last.insert(&effect.key, effect.claimed_at_ms);
        }
        Ok(())
    }

    /// No step is left: nothing may still be running (it would wait forever).
    fn finished(&self) -> Result<(), Violation> {
        self.check_effects()?;
        match self.tasks.keys().next() {
            Some(&task) => Err(self.violation(format!("{} waits forever", self.who(task)))),
            None => Ok(()),
        }
    }
}

fn name(instance: usize) -> char {
    (b'A' + u8::try_from(instance).unwrap_or(25)) as char
}

fn fingerprint(body: &Value) -> String {
    Fingerprint::of_canonical(METHOD, ROUTE, &canonical_json(body))
        .as_str()
        .to_owned()
}
