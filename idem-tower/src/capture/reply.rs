//! What a guarded handler answered, as the engine stores and replays it, and why a call ended
//! without an answer to store: shared by the HTTP and gRPC layers.

use std::future::Future;
use std::sync::Arc;

use axum_core::body::Body;
use http::{HeaderName, HeaderValue, Response};

use super::stored::{self, Captured, HeaderRule};
use idem_core::adapter::{self, Encoded, Format, Overrides};
use idem_core::{BoxError, Codec, Error, Fingerprint, Idempotency, Key, Outcome};

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
/// (`capture/stored.rs`), with the headers the layer's rule keeps, both when it stores a
/// response and when it replays one.
pub(crate) struct ReplyFormat {
    pub(crate) headers: Arc<HeaderRule>,
}

impl Format<Reply> for ReplyFormat {
    fn encode(&self, reply: &Reply) -> Encoded {
        match reply {
            Reply::Stored(captured) => Encoded::from(stored::encode(captured, &self.headers)),
            Reply::Unstorable { why, .. } => Encoded::NotRetained(format!("the response {why}")),
        }
    }

    fn decode(&self, bytes: &[u8]) -> Result<Reply, BoxError> {
        stored::decode(bytes, &self.headers).map(Reply::Stored)
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

/// The header both layers mark a replayed response with.
pub(crate) const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// What [`run_once`] takes from a layer's config: the engine, the call options the layer's
/// builder set (lease, retention, waiting), the scope that names its calls and the headers it
/// stores. Each layer's `Config<C>` holds one.
pub(crate) struct Guard<C> {
    /// The engine the layer claims with.
    pub(crate) engine: Idempotency<C>,
    /// The call options of the layer's builder.
    pub(crate) options: Overrides,
    /// The layer's scope: the label of its calls in metrics and traces.
    pub(crate) scope: Arc<str>,
    /// The version of what the layer fingerprints, stamped on every request's fingerprint
    /// (`Fingerprint::with_policy`): the builder's `policy_version`, or the protocol's own,
    /// derived from its fingerprint settings when the layer is built.
    pub(crate) policy: Option<u32>,
    /// Which response headers are stored and replayed: every end-to-end one unless the
    /// protocol's builder says otherwise (HTTP's `replay_headers`).
    pub(crate) headers: Arc<HeaderRule>,
}

/// A guarded call of either layer once its key, fingerprint and work are known: runs `work`
/// through the engine detached from the caller (`run_detached_as`: once claimed, the handler
/// runs to its end and its response is stored even if the client goes away, so its retry
/// replays it), and answers what the engine decided. The fresh response, or one the layer's
/// policy does not store, goes as it is; a replay is marked `idempotent-replayed: true`; an
/// engine refusal or failure is answered by `refusal` (each layer's problem); an error of the
/// inner service is returned.
pub(crate) async fn run_once<C, E, F>(
    guard: &Guard<C>,
    key: Key,
    fingerprint: Fingerprint,
    work: F,
    refusal: impl FnOnce(Error) -> Response<Body>,
) -> Result<Response<Body>, E>
where
    C: Codec,
    E: Send + 'static,
    F: Future<Output = Result<Reply, Failure<E>>> + Send + 'static,
{
    let fingerprint = fingerprint.with_policy(guard.policy.unwrap_or(0));
    let call = guard.engine.call(key).fingerprint(fingerprint);
    let call = adapter::with_overrides(call, guard.options).scope_named(guard.scope.clone());
    let format = ReplyFormat {
        headers: guard.headers.clone(),
    };
    let outcome = adapter::run_detached_as(call, work, format).await;
    match outcome {
        Ok(Outcome::Fresh(reply)) => Ok(reply.into_response()),
        Ok(Outcome::Replayed(reply)) => {
            let mut response = reply.into_response();
            response
                .headers_mut()
                .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            Ok(response)
        }
        Err(Failure::Pass(response)) => Ok(response),
        Err(Failure::Service(e)) => Err(e),
        Err(Failure::Idem(e)) => Ok(refusal(e)),
    }
}
