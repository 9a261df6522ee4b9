//! Real-browser tests of the checkout widget live in `tests/`; `src/bin` holds the server they
//! run, which is `checkout-server` built with fault injection.
