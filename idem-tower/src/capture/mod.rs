//! What the HTTP and gRPC layers share: reading a request body within a limit, and capturing a
//! response whole (status, end-to-end headers, body bytes and trailers) in a byte form the
//! engine stores and a replay rebuilds exactly.

pub mod body;
pub(crate) mod reply;
pub(crate) mod stored;

use http::request::Parts;

use idem_core::{Key, KeyError};

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
