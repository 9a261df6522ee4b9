//! Payments: a shopper pays a checkout session, whose amount its shop fixed. The money moves
//! from the shopper to the shop in one transaction: the session is taken (at most one payment
//! each), the shopper's balance is debited (guarded), and the transfer is written as two
//! ledger rows that sum to zero. The shop's credit waits beside its balance row instead of
//! updating it, so that no payment to a shop ever queues on that one row.

use checkout_idempotency::{AtOnce, Claim, Decision, Operation};
use checkout_shared::{CreatePayment, ErrorCode, Payment, PaymentStatus, Problem};

use crate::operations::answers;
use crate::operations::authentication::Principal;
use crate::operations::error::OperationError;
use crate::operations::events;
use crate::store::payments::BALANCE_SENTINEL;
use crate::store::{Payer, PaymentAtOnce, PaymentChange, PaymentRow, Store, TakenSession, Tx};
use crate::{clock, ids};

/// A validated payment request: this shopper pays this session.
#[derive(Debug)]
pub struct Charge {
    pub checkout_session_id: String,
    /// What the shopper's account pays in; the session must be in it.
    pub currency: String,
    /// The shopper's mode; the session must be of it.
    pub livemode: bool,
    /// Where the payment is settled at once, when it can be (see [`Charge::at_once`]).
    pub store: Store,
}

impl Charge {
    pub fn validate(
        principal: &Principal,
        request: CreatePayment,
        store: &Store,
    ) -> Result<Charge, OperationError> {
        let shopper = principal.as_shopper()?;
        if !ids::is_id("cs_", &request.checkout_session_id) {
            return Err(OperationError::InvalidRequest(
                "checkout_session_id must be a checkout session's id (cs_…)".into(),
            ));
        }
        Ok(Charge {
            checkout_session_id: request.checkout_session_id,
            currency: shopper.currency.clone(),
            livemode: shopper.livemode,
            store: store.clone(),
        })
    }

    /// The payment of `session` as its answer and its event tell it (the balance aside).
    fn payment(&self, payment_id: String, session: &TakenSession, now_ms: i64) -> Payment {
        Payment {
            payment_id,
            checkout_session_id: Some(self.checkout_session_id.clone()),
            order_id: session.order_id.clone(),
            amount: session.amount,
            currency: session.currency.clone(),
            status: PaymentStatus::Succeeded,
            balance: None,
            created_at: clock::rfc3339(now_ms),
            livemode: session.livemode,
        }
    }
}

/// The business step of a payment, inside the protocol's transaction.
impl Operation<Tx> for Charge {
    type Error = OperationError;

    async fn apply(&self, tx: &mut Tx, claim: &Claim) -> Result<Decision, OperationError> {
        let shopper = claim.scope.as_str();
        let session_id = self.checkout_session_id.as_str();
        let payment_id = ids::new_id("pay_");
        // The session taken (paid at most once, never after it expired), the guarded debit,
        // the payment and the transfer in double entry: one change, in one statement where
        // the database allows.
        let change = tx
            .pay(
                claim,
                &Payer {
                    payment_id: &payment_id,
                    checkout_session_id: session_id,
                    shopper_account_id: shopper,
                    livemode: self.livemode,
                    currency: &self.currency,
                },
            )
            .await?;
        let (session, balance) = match change {
            PaymentChange::Paid { session, balance } => (session, balance),
            PaymentChange::SessionNotOpen => return not_payable(tx, session_id).await,
            // Test money never pays a live session, nor live money a test one. An error, not
            // an outcome: the session is open again with the rollback, and nothing is stored.
            PaymentChange::Mismatch(session) if session.livemode != self.livemode => {
                return Err(mode_mismatch(session.livemode));
            }
            PaymentChange::Mismatch(session) => {
                return Err(OperationError::InvalidRequest(format!(
                    "the session is in {}; this account pays in {}",
                    session.currency, self.currency
                )));
            }
            // Short of money: the session is open again, and the decline is this key's outcome.
            PaymentChange::Short(session) => {
                tx.release_session(session_id, &payment_id).await?;
                let balance = tx.balance(shopper).await?;
                let mut problem = Problem::new(
                    402,
                    ErrorCode::InsufficientFunds,
                    format!(
                        "the balance {balance} is less than the amount {}",
                        session.amount
                    ),
                );
                problem.balance = Some(balance);
                return Ok(Decision::Respond(answers::declined(&problem)));
            }
            // Another payment of this session committed first: the next attempt says so.
            PaymentChange::Raced => return Ok(Decision::Restart),
        };
        let payment = self.payment(payment_id, &session, claim.now_ms);
        // The shop hears of it from the outbox, in this transaction: even if the shopper's tab
        // is gone before this answer arrives.
        let lines = events::Lines {
            items: &session.items,
            description: session.description.as_deref(),
        };
        events::payment_succeeded(tx, &session.shop_account_id, &payment, lines, claim.now_ms)
            .await?;
        // The shopper's balance is the shopper's: in this answer, never in the shop's event.
        Ok(Decision::Respond(answers::created(&Payment {
            balance: Some(balance),
            ..payment
        })))
    }

    /// On PostgreSQL, the common payment (an open session of the shopper's mode and currency,
    /// money enough, a new key) in one read and one statement, 2 round trips where the steps
    /// take 5; a completed key is answered from the read. Anything else (a decline, a key in
    /// flight or expired, a session raced meanwhile) is the steps' to settle: nothing is
    /// written here then.
    async fn at_once(&self, claim: &Claim) -> Result<AtOnce, OperationError> {
        if !self.store.pays_at_once() {
            return Ok(AtOnce::NotDone);
        }
        let shopper = claim.scope.as_str();
        let outlook = self
            .store
            .payment_outlook(&self.checkout_session_id, shopper, &claim.key)
            .await?;
        if let Some(key) = outlook.key {
            return Ok(AtOnce::Held(key));
        }
        let Some((status, expires_at, session)) = outlook.session else {
            return Ok(AtOnce::NotDone);
        };
        let payment_id = ids::new_id("pay_");
        let payer = Payer {
            payment_id: &payment_id,
            checkout_session_id: &self.checkout_session_id,
            shopper_account_id: shopper,
            livemode: self.livemode,
            currency: &self.currency,
        };
        // The statement's own guards, read first: what would fail it goes to the steps now.
        let payable = status == "open"
            && expires_at > claim.now_ms
            && payer.pays_in(&session)
            && outlook
                .balance
                .is_some_and(|balance| balance >= session.amount);
        if !payable {
            return Ok(AtOnce::NotDone);
        }
        let payment = self.payment(payment_id.clone(), &session, claim.now_ms);
        let lines = events::Lines {
            items: &session.items,
            description: session.description.as_deref(),
        };
        let event = events::PaymentSucceeded::of(&payment, lines, claim.now_ms);
        // The balance after the debit is the statement's to write into the answer.
        let answer = answers::created(&Payment {
            balance: Some(BALANCE_SENTINEL),
            ..payment.clone()
        });
        let paid = self
            .store
            .pay_at_once(&PaymentAtOnce {
                claim,
                payer: &payer,
                answer: &answer.body,
                event: &event.for_shop(&session.shop_account_id),
            })
            .await?;
        Ok(paid.map_or(AtOnce::NotDone, AtOnce::Done))
    }
}

/// Why a session could not be taken: unknown (`404`, nothing stored), paid already (`409` with
/// its payment), or expired (`410`). The last two are this key's outcome.
async fn not_payable(tx: &mut Tx, session_id: &str) -> Result<Decision, OperationError> {
    let Some(session) = tx.session(session_id).await? else {
        return Err(OperationError::NotFound(
            "there is no such checkout session".into(),
        ));
    };
    let problem = match (session.status.as_str(), session.payment_id) {
        ("paid", Some(payment_id)) => {
            let mut problem = Problem::new(
                409,
                ErrorCode::SessionAlreadyPaid,
                format!("checkout session {session_id} is already paid by payment {payment_id}"),
            );
            problem.payment_id = Some(payment_id);
            problem
        }
        _ => Problem::new(
            410,
            ErrorCode::SessionExpired,
            format!("checkout session {session_id} has expired; the shop can make a new one"),
        ),
    };
    Ok(Decision::Respond(answers::declined(&problem)))
}

/// A shopper of the other mode than the session's.
pub fn mode_mismatch(session_livemode: bool) -> OperationError {
    OperationError::ModeMismatch(if session_livemode {
        "this checkout session is paid with real money: sign in as a shopper (a test shopper pays only test sessions)".into()
    } else {
        "this checkout session is in test mode: only a test shopper pays it, never real money"
            .into()
    })
}

pub(crate) fn not_found(payment_id: &str) -> OperationError {
    OperationError::NotFound(format!("there is no payment {payment_id} of yours"))
}

pub fn payment_of(row: PaymentRow, with_shopper_balance: bool) -> Payment {
    Payment {
        payment_id: row.payment_id,
        checkout_session_id: row.checkout_session_id,
        order_id: row.order_id,
        amount: row.amount,
        currency: row.currency,
        status: PaymentStatus::Succeeded,
        balance: with_shopper_balance.then_some(row.balance_after),
        created_at: clock::rfc3339(row.created_at),
        livemode: row.livemode,
    }
}
