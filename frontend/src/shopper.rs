//! The shopper of this tab. For a test session: a test shopper, shared by every widget of the
//! tab (two widgets that load at once, or renew a token the server forgot, wait for one new
//! shopper, never make two). For a live session: the live shopper's sign-in, if there is one;
//! never made here (the shopper signs in).

use std::cell::RefCell;

use checkout_shared::ShopperToken;
use futures::FutureExt;
use futures::future::{LocalBoxFuture, Shared};

use crate::{api, storage};

type Pending = Shared<LocalBoxFuture<'static, Result<ShopperToken, api::Failure>>>;

thread_local! {
    static PENDING: RefCell<Option<Pending>> = const { RefCell::new(None) };
}

/// The tab's shopper: the saved one, unless it is `forgotten` (the server no longer knows that
/// token); else a new one, made once for all the widgets asking now.
pub async fn shopper(
    forgotten: Option<&str>,
    livemode: bool,
) -> Result<ShopperToken, api::Failure> {
    let name = if livemode {
        storage::LIVE
    } else {
        storage::SESSION
    };
    if let Some(saved) = storage::load::<ShopperToken>(name)
        && forgotten != Some(saved.token.as_str())
    {
        return Ok(saved);
    }
    if livemode {
        storage::remove(storage::LIVE);
        return Err(api::Failure::Unauthorized);
    }
    let pending = PENDING.with(|p| {
        p.borrow_mut()
            .get_or_insert_with(|| {
                async {
                    let made = api::test_shopper().await;
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
