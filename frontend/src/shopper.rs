//! The demo shopper of this tab, shared by every widget of the page: two widgets that load at
//! once (or renew a session the server forgot) wait for one new shopper, never make two.

use std::cell::RefCell;

use checkout_shared::DemoSession;
use futures::FutureExt;
use futures::future::{LocalBoxFuture, Shared};

use crate::{api, storage};

type Pending = Shared<LocalBoxFuture<'static, Result<DemoSession, api::Failure>>>;

thread_local! {
    static PENDING: RefCell<Option<Pending>> = const { RefCell::new(None) };
}

/// The tab's shopper: the saved one, unless it is `forgotten` (the server no longer knows that
/// token); else a new one, made once for all the widgets asking now.
pub async fn shopper(forgotten: Option<&str>) -> Result<DemoSession, api::Failure> {
    if let Some(saved) = storage::load::<DemoSession>(storage::SESSION)
        && forgotten != Some(saved.token.as_str())
    {
        return Ok(saved);
    }
    let pending = PENDING.with(|p| {
        p.borrow_mut()
            .get_or_insert_with(|| {
                async {
                    let made = api::demo_session().await;
                    if let Ok(session) = &made {
                        storage::save(storage::SESSION, session);
                    }
                    PENDING.with(|p| p.borrow_mut().take());
                    made
                }
                .boxed_local()
                .shared()
            })
            .clone()
    });
    pending.await
}
