//! What the HTTP and gRPC layers share: reading a request body within a limit, and capturing a
//! response whole (status, end-to-end headers, body bytes and trailers) in a byte form the
//! engine stores and a replay rebuilds exactly.

pub mod body;
pub(crate) mod reply;
pub(crate) mod stored;

use http::request::Parts;

use idem_core::adapter::{check_scope, Overrides};
use idem_core::{Error, Key, KeyError};

/// Reads who is asking from a request head: the caller extractor both layers take.
pub(crate) type CallerFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// Why a request's caller identity cannot scope its key.
pub(crate) enum CallerRefused {
    /// The extractor found none.
    Missing,
    /// It returned the empty identity, which only the shared key space uses.
    Empty,
    /// It cannot be a key part (too long, a byte outside printable ASCII).
    Invalid(KeyError),
}

/// The record key of a request: the scope, the caller and the client key (already checked).
/// `caller` is `None` for the shared key space, which only a layer built with
/// `shared_key_space()` uses; so an extractor's empty identity is refused here, though
/// `Key::derive` would take it. The identity comes from the request: it never moves the request
/// to a shared space, and its value is neither logged nor sent (it may be a credential).
pub(crate) fn record_key(
    scope: &str,
    caller: Option<&CallerFn>,
    parts: &Parts,
    client_key: &str,
) -> Result<Key, CallerRefused> {
    let caller = match caller {
        None => String::new(),
        Some(extract) => match extract(parts) {
            None => return Err(CallerRefused::Missing),
            Some(caller) if caller.is_empty() => return Err(CallerRefused::Empty),
            Some(caller) => caller,
        },
    };
    Key::derive(scope, &caller, client_key).map_err(|e| {
        tracing::warn!(error = %e, "idempotency caller identity refused");
        CallerRefused::Invalid(e)
    })
}

/// Checks what both layers' builders decide alike: whose keys are whose (a caller extractor or
/// the shared key space, exactly one), the scope, and the lease and retention overrides.
/// `layer` names the layer (`HTTP`, `gRPC`), `keys` what its clients send (`Idempotency-Keys`),
/// `request` what a client sends with a key (`body`).
pub(crate) fn check_builder(
    layer: &str,
    keys: &str,
    request: &str,
    has_caller: bool,
    shared_key_space: bool,
    scope: &str,
    options: &Overrides,
) -> Result<(), Error> {
    match (has_caller, shared_key_space) {
        (true, false) | (false, true) => {}
        (false, false) => {
            return Err(Error::InvalidConfig(format!(
                "the {layer} layer does not know whose {keys} are whose: call .caller(|parts| …) \
                 to scope keys by the identity of who asks (an API key id, a user id), or \
                 .shared_key_space() to let every client share one key space, where any client \
                 that sends another's key and {request} gets that client's response"
            )))
        }
        (true, true) => {
            return Err(Error::InvalidConfig(format!(
                "the {layer} layer has both .caller(…) and .shared_key_space(); keep .caller(…) \
                 to scope keys by caller, or remove it to share one key space"
            )))
        }
    }
    if let Err(e) = check_scope(scope) {
        return Err(Error::InvalidConfig(format!("{layer} layer scope: {e}")));
    }
    options.check()
}
