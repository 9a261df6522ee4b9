//! The protocol against a model: the real [`checkout_idempotency::Protocol`] over an in-memory
//! store with a real database's concurrency, under every schedule of a few clients, instances
//! and mishaps (see `model/world.rs` for the world and its invariants, `model/explorer.rs` for
//! how every schedule is run). No database, no threads, no timers: each test is exhaustive
//! within its bounds and prints how many schedules it ran.

mod explorer;
mod world;

use std::time::Duration;

use checkout_idempotency::memory::{AtOnceInsert, Engine, HolderRead, LateInsert};
use serde_json::json;

use explorer::{Report, explore};
use world::{Budget, ClientPlan, EarlierKey, Scenario, TTL};

const A: usize = 0;
const B: usize = 1;

/// Runs every schedule of `scenario`; says how many.
fn check(name: &str, scenario: &Scenario) -> Report {
    let report = explore(|explorer| world::run(scenario, explorer));
    println!(
        "{name} on {:?}{}{}: {} schedules, the longest {} choices deep",
        scenario.engine,
        if scenario.at_once { " at once" } else { "" },
        match (scenario.batched, scenario.late_insert) {
            (false, _) => "",
            (true, LateInsert::Never) => " in batches",
            (true, _) => " in batches claimed late",
        },
        report.schedules,
        report.deepest
    );
    report
}

fn holds(name: &str, scenario: &Scenario) {
    let report = check(name, scenario);
    if let Some(violation) = report.violation {
        panic!(
            "{name} on {:?}, schedule {}: {violation}",
            scenario.engine, report.schedules
        );
    }
}

fn pay(key: &'static str, n: u64, sends: &[usize]) -> ClientPlan {
    ClientPlan {
        key,
        body: json!({ "amount": 100, "n": n }),
        sends: sends.to_vec(),
    }
}

/// The stores a scenario runs on: PostgreSQL with the payment at once (as the checkout pays)
/// and by the steps alone (as a refund, and a payment the at-once could not settle, go), and
/// SQLite (the steps).
const STORES: [(Engine, bool); 3] = [
    (Engine::Postgres, true),
    (Engine::Postgres, false),
    (Engine::Sqlite, false),
];

fn scenario(store: (Engine, bool), instances: usize, clients: Vec<ClientPlan>) -> Scenario {
    let (engine, at_once) = store;
    Scenario {
        at_once,
        ..Scenario::new(engine, instances, clients)
    }
}

/// A shopper's click, resent after no answer (to another instance, then back), while an
/// instance may crash, an answer be lost and a wait run out.
#[test]
fn a_request_resent_anywhere_takes_effect_once() {
    for store in STORES {
        holds("a request resent anywhere", &resent_anywhere(store));
    }
}

/// A click resent after no answer (to another instance, then back), while an instance may
/// crash, an answer be lost and a wait run out.
fn resent_anywhere(store: (Engine, bool)) -> Scenario {
    let mut scenario = scenario(store, 2, vec![pay("k1", 1, &[A, B, A])]);
    scenario.budget = Budget {
        crashes: 1,
        lost_answers: 1,
        lock_bounds: 1,
        ..Budget::default()
    };
    scenario
}

/// A double click: two copies at once on one instance (one waits for the other in memory) and a
/// third on another instance.
#[test]
fn copies_sent_at_once_take_effect_once() {
    for store in STORES {
        let mut scenario = scenario(
            store,
            2,
            vec![pay("k1", 1, &[A]), pay("k1", 1, &[A]), pay("k1", 1, &[B])],
        );
        scenario.budget = Budget {
            lock_bounds: 1,
            crashes: 1,
            ..Budget::default()
        };
        holds("copies sent at once", &scenario);
    }
}

/// One key sent with two different bodies: one of them takes effect, the other is refused as
/// a reuse, and no answer says otherwise.
#[test]
fn a_key_reused_for_another_request_is_refused() {
    for store in STORES {
        let mut scenario = scenario(store, 2, vec![pay("k1", 1, &[A, B]), pay("k1", 2, &[B, A])]);
        scenario.budget = Budget {
            lock_bounds: 1,
            ..Budget::default()
        };
        holds("a key reused for another request", &scenario);
    }
}

/// A key whose lifetime has passed is a new key: a request under it takes effect (once, however
/// its copies race), whether the sweeper has deleted it or not.
fn expired_key_taken_over(store: (Engine, bool), holder_read: HolderRead) -> Scenario {
    let mut scenario = scenario(store, 2, vec![pay("k1", 2, &[A, A]), pay("k1", 2, &[B, B])]);
    scenario.holder_read = holder_read;
    scenario.earlier = vec![EarlierKey {
        key: "k1",
        body: json!({ "amount": 100, "n": 1 }),
        age: TTL + Duration::from_secs(3600),
    }];
    scenario.budget = Budget {
        sweeps: 1,
        lock_bounds: 1,
        ..Budget::default()
    };
    scenario
}

#[test]
fn an_expired_key_is_taken_over_once() {
    for store in STORES {
        holds(
            "an expired key taken over",
            &expired_key_taken_over(store, HolderRead::Live),
        );
    }
}

/// Keys expire and are swept while requests under them run, answers are lost and resent.
fn expiring_while_running(store: (Engine, bool)) -> Scenario {
    let mut scenario = scenario(store, 2, vec![pay("k1", 1, &[A, B]), pay("k1", 1, &[B])]);
    scenario.budget = Budget {
        expiries: 1,
        sweeps: 1,
        lost_answers: 1,
        ..Budget::default()
    };
    scenario
}

#[test]
fn keys_expire_and_are_swept_while_their_requests_run() {
    for store in STORES {
        holds(
            "keys expire while their requests run",
            &expiring_while_running(store),
        );
    }
}

/// What the request bound is for, found by the model: a copy that read the clock when it
/// arrived and reached its claim only after the key's lifetime, the key swept meanwhile, runs
/// again (its claim judges the key by its arrival, the sweeper by the present). The server's
/// request timeout (30 s against a 24 h lifetime) is what rules that out.
#[test]
fn without_the_request_bound_a_copy_stalled_past_the_keys_lifetime_runs_again() {
    let mut scenario = expiring_while_running((Engine::Postgres, false));
    scenario.request_bound = false;
    let report = check("a copy stalled past the key's lifetime", &scenario);
    let violation = report.violation.expect("the model missed the stalled copy");
    println!("found, schedule {}: {violation}", report.schedules);
    assert!(violation.what.contains("took effect twice"), "{violation}");
}

/// The checker is not vacuous: with the PostgreSQL claim as it was before commit add96a7 (the
/// holder read in the claim's snapshot, expired or not), it finds the defect that commit fixed,
/// and prints the schedule.
#[test]
fn finds_the_expired_key_takeover_defect_when_its_fix_is_reverted() {
    let scenario = expired_key_taken_over((Engine::Postgres, false), HolderRead::AsOfSnapshot);
    let report = check("the takeover defect", &scenario);
    let violation = report
        .violation
        .expect("the model missed the expired-key takeover defect");
    println!("found, schedule {}: {violation}", report.schedules);
    assert!(
        violation.what.contains("another request") || violation.what.contains("before it sent"),
        "another violation than the defect's: {violation}"
    );
}

/// The checker reaches the payment at once too: with its key inserted over whatever is there
/// (no wait for a claim in flight, no failure on a row), it finds the copy that runs twice.
#[test]
fn finds_an_at_once_insert_that_overwrites_the_key() {
    let mut scenario = scenario(
        (Engine::Postgres, true),
        2,
        vec![pay("k1", 1, &[A]), pay("k1", 1, &[B])],
    );
    scenario.at_once_insert = AtOnceInsert::Overwrites;
    let report = check("an at-once insert that overwrites", &scenario);
    let violation = report
        .violation
        .expect("the model missed the overwriting insert");
    println!("found, schedule {}: {violation}", report.schedules);
    assert!(violation.what.contains("took effect twice"), "{violation}");
}

/// How an inbox takes messages: each send a batch of its own ([`Protocol::execute_many`]), its
/// key claimed first or, where the store claims late, written with its answer after the
/// operation (a key found with a row then rolls everything back and claims first).
const BATCH_STORES: [(Engine, LateInsert); 4] = [
    (Engine::Postgres, LateInsert::Plain),
    (Engine::Postgres, LateInsert::Never),
    (Engine::Sqlite, LateInsert::Plain),
    (Engine::Sqlite, LateInsert::Never),
];

fn batched(mut scenario: Scenario, late_insert: LateInsert) -> Scenario {
    scenario.batched = true;
    scenario.late_insert = late_insert;
    scenario
}

/// The scenarios above, with every send taken as a batch: redelivered anywhere, copies at once
/// (on two instances, and on one), a message id reused with another body, an expired key
/// taken over, keys expiring and swept while their messages run.
#[test]
fn messages_taken_in_batches_take_effect_once() {
    for (engine, late_insert) in BATCH_STORES {
        let store = (engine, false);
        let resent = resent_anywhere(store);
        let budget = Budget {
            lock_bounds: 1,
            crashes: 1,
            ..Budget::default()
        };
        let mut copies = scenario(store, 2, vec![pay("k1", 1, &[A]), pay("k1", 1, &[B])]);
        copies.budget = budget;
        // Two on one instance: the second waits for the first in memory, then runs alone.
        let mut copies_on_one = scenario(store, 1, vec![pay("k1", 1, &[A]), pay("k1", 1, &[A])]);
        copies_on_one.budget = budget;
        let mut reused = scenario(store, 2, vec![pay("k1", 1, &[A, B]), pay("k1", 2, &[B, A])]);
        reused.budget = Budget {
            lock_bounds: 1,
            ..Budget::default()
        };
        for (name, scenario) in [
            ("a message resent anywhere", resent),
            ("copies at once", copies),
            ("copies at once on one instance", copies_on_one),
            ("a message id reused", reused),
            (
                "an expired key taken over",
                expired_key_taken_over(store, HolderRead::Live),
            ),
            (
                "keys expire while their messages run",
                expiring_while_running(store),
            ),
        ] {
            holds(name, &batched(scenario, late_insert));
        }
    }
}

/// The checker reaches the late claim too: with a batch's keys written over whatever committed
/// row is there, it finds the redelivered message that takes effect twice.
#[test]
fn finds_a_late_claim_that_overwrites_the_key() {
    for engine in [Engine::Postgres, Engine::Sqlite] {
        let scenario = batched(
            scenario(
                (engine, false),
                2,
                vec![pay("k1", 1, &[A]), pay("k1", 1, &[B])],
            ),
            LateInsert::Overwrites,
        );
        let report = check("a late claim that overwrites", &scenario);
        let violation = report
            .violation
            .expect("the model missed the overwriting late claim");
        println!("found, schedule {}: {violation}", report.schedules);
        assert!(violation.what.contains("took effect twice"), "{violation}");
    }
}
