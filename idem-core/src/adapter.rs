//! For adapters: what a crate that puts the engine behind a transport (idem-tower's HTTP and
//! gRPC layers, the queue consumers) uses of the engine beyond its public API: running a call
//! whose result is stored in the adapter's own format, one set of call options for all of an
//! adapter's calls, and the checks and buffers the engine uses itself.
//!
//! **For adapter authors, in-tree and out; not covered by semver**: anything here may change in
//! a minor release. Pin idem-core with `=` as the idem crates do (sqlx-core's "Semver Exempt
//! API" is the model).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::background::{Pruner, PrunerConfig};
use crate::codec::Codec;
use crate::engine::{Call, Idempotency, Outcome, Policy};
use crate::error::Error;
use crate::key::Key;
use crate::record::StoredResult;

pub use crate::background::{Lease as PruneLease, Target as PruneTarget};
pub use crate::canonical::text::JsonText;
pub use crate::engine::{Core, EngineStore, Resolved};
pub use crate::engine::{Encoded, Format, Overrides};
pub use crate::envelope::payload_buffer;
pub use crate::key::check_scope;

/// `call` with `overrides` as its options (lease, retention, what it does on a live claim),
/// replacing any set before: what an adapter's builder decided, once for all its calls.
pub fn with_overrides<En>(call: Call<'_, En>, overrides: Overrides) -> Call<'_, En> {
    call.overrides(overrides)
}

/// Runs `call` as [`Call::run_detached`] does (once its claim is won, the work runs to its end
/// and its result is stored even if the caller goes away), with the value stored and replayed
/// in `format` instead of the engine's codec: how the HTTP and gRPC layers keep a response.
// A plain function returning the engine's future, as `run_detached`: no future of its own.
#[inline(always)]
pub fn run_detached_as<'e, C, T, E, F, Fm>(
    call: Call<'e, Idempotency<C>>,
    work: F,
    format: Fm,
) -> impl Future<Output = Result<Outcome<T>, E>> + Send + 'e
where
    C: Codec,
    F: Future<Output = Result<T, E>> + Send + 'static,
    T: Send + 'static,
    E: From<Error> + Send + 'static,
    Fm: Format<T> + Send + Sync + 'static,
{
    call.run_detached_as(work, format)
}

// A store's atomic step (idem-dynamodb's `DynamoSteps::dynamo_tx`): the step's record written in
// one transaction with the step's effect.
pub use crate::engine::{atomic_step, AtomicStep};

/// The [`Steps`](crate::Steps) a store crate's extension of them extends (idem-sql's `SqlSteps`,
/// idem-dynamodb's `DynamoSteps`): the extension's method is then written once, as its trait's
/// provided method over `steps()`, not again in an impl for `Steps`.
///
/// ```
/// use idem::adapter::StepsOf;
/// use idem::Steps;
/// // What an extension's provided method starts from.
/// fn extended<S: StepsOf>(extension: &S) -> &Steps<S::Codec> {
///     extension.steps()
/// }
/// # let _ = extended::<Steps>;
/// ```
pub trait StepsOf {
    /// The codec of the steps' results.
    type Codec: Codec;
    /// The steps themselves.
    fn steps(&self) -> &crate::Steps<Self::Codec>;
}

impl<C: Codec> StepsOf for crate::Steps<C> {
    type Codec = C;

    fn steps(&self) -> &crate::Steps<C> {
        self
    }
}

/// A [`Pruner`] of `target` (what a kit's history prunes, say), once `config` is checked (see
/// [`PrunerConfig`]; otherwise [`Error::InvalidConfig`]).
pub fn pruner(target: Arc<dyn PruneTarget>, config: PrunerConfig) -> Result<Pruner, Error> {
    Pruner::new(target, config)
}

// The transactional engine (idem-sql's `Transactional`): what both engines are made of besides
// their store, read through these functions, as it cannot reach the engine's own fields.

/// The default policy, the codec `codec` and no observer: what an engine built without a
/// builder is made of.
pub fn core<C>(codec: C) -> Core<C> {
    Core::new(codec)
}

/// `core` over `store`: it learns the store's limit on a stored response
/// ([`Store::max_response_bytes`](crate::Store::max_response_bytes)), so it seals a result over
/// it as not retained itself. Every engine calls this once, when it is built.
pub fn fit<C>(core: Core<C>, store: &dyn crate::Store) -> Core<C> {
    core.fit(store)
}

/// An [`EngineBuilder`](crate::EngineBuilder) of an engine over `store` with the default policy
/// and `codec`: what the engine's `builder` returns.
pub fn builder<S, C: Codec>(store: S, codec: C) -> crate::EngineBuilder<S, C> {
    crate::EngineBuilder::with(store, codec)
}

/// The policy `core` holds.
pub fn policy<C>(core: &Core<C>) -> &Policy {
    &core.policy
}

/// A call's `overrides` resolved against the policy of `core`, and checked.
pub fn resolve<C: Codec>(core: &Core<C>, overrides: &Overrides) -> Result<Resolved, Error> {
    core.resolve(overrides)
}

/// `overrides` with the call's lease.
pub fn with_lease(mut overrides: Overrides, lease: Duration) -> Overrides {
    overrides.lease = Some(lease);
    overrides
}

/// `overrides` with the call's retention.
pub fn with_retention(mut overrides: Overrides, retention: Duration) -> Overrides {
    overrides.retention = Some(retention);
    overrides
}

/// `value` of the call under `key` in its stored form: encoded by the codec of `core` and
/// sealed, or the note that it was not retained (larger than the policy's limit, or refused by
/// the codec).
pub fn seal<C: Codec, T: Serialize + ?Sized>(core: &Core<C>, value: &T, key: &Key) -> Vec<u8> {
    core.seal(value, key).bytes
}

/// The value a completed record replays, decoded by the codec of `core`: a stored error is
/// [`Error::StoredError`], a result that was not retained [`Error::ResultNotRetained`].
pub fn replay<C: Codec, T: DeserializeOwned>(
    core: &Core<C>,
    stored: StoredResult,
) -> Result<T, Error> {
    let (_, replayed) =
        crate::engine::replay(stored, |bytes| core.decode(bytes), Error::StoredError);
    replayed.map(Outcome::into_inner)
}
