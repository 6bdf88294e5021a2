//! What a guarded handler answered, as the engine stores and replays it, and why a call ended
//! without an answer to store: shared by the HTTP and gRPC layers.

use axum_core::body::Body;
use http::Response;

use super::stored::{self, Captured};
use crate::engine::{Encoded, Format};
use crate::error::{BoxError, Error};

/// What the guarded handler answered, as the engine stores it.
pub(crate) enum Reply {
    /// Read whole: stored, and replayed to retries.
    Stored(Captured),
    /// It cannot be kept (too large, a body that failed): the client gets it as it is, and the
    /// key is recorded as completed without it, so a retry is told, not run.
    Unstorable {
        response: Response<Body>,
        why: &'static str,
    },
}

impl Reply {
    pub(crate) fn into_response(self) -> Response<Body> {
        match self {
            Reply::Stored(captured) => captured.into_response(),
            Reply::Unstorable { response, .. } => response,
        }
    }
}

/// How the engine stores and replays a [`Reply`]: the layers' own byte format
/// (`capture/stored.rs`).
pub(crate) struct ReplyFormat;

impl Format<Reply> for ReplyFormat {
    fn encode(&self, reply: &Reply) -> Encoded {
        match reply {
            Reply::Stored(captured) => Encoded::from(stored::encode(captured)),
            Reply::Unstorable { why, .. } => Encoded::NotRetained(format!("the response {why}")),
        }
    }

    fn decode(&self, bytes: &[u8]) -> Result<Reply, BoxError> {
        stored::decode(bytes).map(Reply::Stored)
    }
}

/// Why the work inside the engine ended without a response to store.
pub(crate) enum Failure<E> {
    /// The engine refused or failed (locked, key reused, store down, lease lost).
    Idem(Error),
    /// The handler's response goes to the client unstored and the claim is released, because
    /// the layer's policy says it is not an answer (a 5xx, a gRPC `UNAVAILABLE`): a retry runs
    /// the handler again.
    Pass(Response<Body>),
    /// The inner service failed.
    Service(E),
}

impl<E> From<Error> for Failure<E> {
    fn from(e: Error) -> Self {
        Failure::Idem(e)
    }
}
