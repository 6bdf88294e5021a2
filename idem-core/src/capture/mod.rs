//! What the HTTP and gRPC layers share: reading a request body within a limit, and capturing a
//! response whole (status, end-to-end headers, body bytes and trailers) in a byte form the
//! engine stores and a replay rebuilds exactly.

pub(crate) mod body;
pub(crate) mod stored;
