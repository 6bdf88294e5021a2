//! Support for the code `#[idempotent]` expands to. Not a public API: it may change in any
//! release.

use std::future::Future;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use std::time::Duration;

use crate::canonical::{struct_to_canonical, DynSerialize};
use crate::codec::Codec;
pub use crate::engine::Overrides as CallOptions;
use crate::engine::{Idempotency, OnLocked, Steps};
use crate::error::Error;
use crate::key::{Fingerprint, Key};

/// What `engine = …` may name: the engine the attribute's form needs (`Engine` is an
/// [`Idempotency`], or with `transaction = …` idem-sql's `Transactional`), a
/// reference to one, or an `Arc` of one. One trait for both forms, so the error for a wrong
/// `engine` reads the same and names the engine that was needed.
#[diagnostic::on_unimplemented(
    message = "`engine = …` must be an idem `{Engine}`, not `{Self}`",
    label = "not an idem `{Engine}`",
    note = "`engine` takes an `idem::Idempotency`, or, when the attribute has `transaction = …`, an `idem::Transactional` (such as `Transactional::new(sqlite_store)`); a reference to one or an `Arc` of one works too"
)]
pub trait EngineArg<Engine> {
    /// The engine.
    fn engine(&self) -> &Engine;
}

impl<C: Codec> EngineArg<Idempotency<C>> for Idempotency<C> {
    fn engine(&self) -> &Idempotency<C> {
        self
    }
}

// `&T` and `Arc<T>` name the engine `T` names. Written out, not by a macro: rustc lists these
// impls in the attribute's diagnostics, and a macro's body would show there instead.
impl<E, T: EngineArg<E> + ?Sized> EngineArg<E> for &T {
    fn engine(&self) -> &E {
        (**self).engine()
    }
}

impl<E, T: EngineArg<E> + ?Sized> EngineArg<E> for Arc<T> {
    fn engine(&self) -> &E {
        (**self).engine()
    }
}

pub use crate::key::KeyPart;

/// Derives the call's key; `Ok(None)` when the client sent no key.
pub fn key(
    scope: &str,
    caller: Option<&dyn KeyPart>,
    client_key: &dyn KeyPart,
) -> Result<Option<Key>, Error> {
    let Some(client_key) = client_key.key_part() else {
        return Ok(None);
    };
    let caller = caller.and_then(KeyPart::key_part);
    Ok(Some(Key::derive(
        scope,
        caller.as_deref().unwrap_or(""),
        &client_key,
    )?))
}

/// Fingerprints a request value by its canonical form.
pub fn fingerprint<T: Serialize + ?Sized>(value: &T) -> Result<Option<Fingerprint>, Error> {
    Ok(Some(Fingerprint::of_json(value)?))
}

/// What the default fingerprint (no `fingerprint = …`) needs of each argument it hashes.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be hashed into the default fingerprint of `#[idempotent]`",
    label = "this argument is not `Serialize`",
    note = "without `fingerprint = …`, the arguments (all but the engine, those the key and the caller are built from, a transaction and those named in `skip(…)`) are hashed, so a key reused for another request gets `KeyReused`: derive `serde::Serialize` on this type; or, if this argument is not part of the request (a client, a counter, a deadline), leave it out with `skip(<its name>)`; or write `fingerprint = <expr>` naming what identifies the request, or `fingerprint = ()` to check nothing"
)]
pub trait FingerprintArgument: Serialize {}

impl<T: Serialize + ?Sized> FingerprintArgument for T {}

/// One argument of the default fingerprint: its name and its value, its type erased so that
/// the bound on it is checked (and reported) once, on the argument.
pub struct Argument<'a> {
    name: &'static str,
    value: &'a dyn DynSerialize,
}

/// `value`, the argument `name`, for [`arguments`].
pub fn argument<'a, T: FingerprintArgument>(name: &'static str, value: &'a T) -> Argument<'a> {
    Argument { name, value }
}

/// The default fingerprint: the canonical form of a struct with one field per argument, as
/// `{"cents":100}` for `cents: u64`.
pub fn arguments(arguments: &[Argument<'_>]) -> Result<Option<Fingerprint>, Error> {
    let fields = arguments.iter().map(|a| (a.name, a.value));
    Ok(Some(Fingerprint::of_bytes(&struct_to_canonical(fields)?)))
}

/// Pins the body's output type to the function's return type, so `?` in the body converts
/// errors as it would in the original function.
pub fn body<R, F: Future<Output = R>>(f: F) -> F {
    f
}

/// The per-call options the attribute's `lease`, `retention`, `on_locked` and `on_lapse` set.
pub fn options(
    lease: Option<Duration>,
    retention: Option<Duration>,
    on_locked: Option<OnLocked>,
    on_lapse: Option<crate::OnLapse>,
) -> CallOptions {
    CallOptions {
        lease,
        retention,
        on_locked,
        on_lapse,
        scope: None,
    }
}

/// The attribute's fingerprint stamped with its policy version (`policy = …`, or the one the
/// attribute derived from what it hashes).
pub fn versioned(
    fingerprint: Result<Option<Fingerprint>, Error>,
    policy: u32,
) -> Result<Option<Fingerprint>, Error> {
    fingerprint.map(|f| f.map(|f| f.with_policy(policy)))
}

/// What the attribute computes before the body starts, from borrows of the arguments (so the
/// body may still move them): the call's key, its fingerprint and its options.
pub struct Prepared {
    /// The key, `Ok(None)` when the client sent none.
    pub key: Result<Option<Key>, Error>,
    /// The fingerprint, `Ok(None)` when the call checks none.
    pub fingerprint: Result<Option<Fingerprint>, Error>,
    /// The attribute's `lease`, `retention`, `on_locked` and scope.
    pub options: CallOptions,
}

impl Prepared {
    /// The key, fingerprint and options, or the error that refuses the call before the store is
    /// touched.
    pub fn parts(self) -> Result<(Option<Key>, Option<Fingerprint>, CallOptions), Error> {
        Ok((self.key?, self.fingerprint?, self.options))
    }
}

/// The call with `detach = true` (see [`Call::run_detached`](crate::Call::run_detached)): once
/// it has claimed the key, a cancelled caller cannot stop the body.
pub async fn run_detached<C, T, E, F>(
    engine: &Idempotency<C>,
    prepared: Prepared,
    body: F,
) -> Result<T, E>
where
    C: Codec,
    F: Future<Output = Result<T, E>> + Send + 'static,
    T: Serialize + DeserializeOwned + Send + 'static,
    E: From<Error> + Send + 'static,
{
    let (key, fingerprint, options) = prepared.parts()?;
    let call = engine.call(key).fingerprint(fingerprint);
    let outcome = call.overrides(options).run_detached(body).await?;
    Ok(outcome.into_inner())
}

/// What `#[idempotent]` needs of a function's return type: a `Result<T, E>`, written as such or
/// through an alias. The expansion names the return type `R` only as the first type argument
/// of [`call`] (or [`check_return`]), spanned on the return type, so every unmet bound on `R`,
/// `T` or `E` is reported there, once.
#[diagnostic::on_unimplemented(
    message = "`#[idempotent]` needs a function returning `Result<T, E>`, not `{Self}`",
    label = "not a `Result`",
    note = "an alias of `Result` (`type AppResult<T> = Result<T, AppError>`) works too; idem's own errors reach the caller through `E`, and only `Ok` values are stored"
)]
pub trait IdempotentResult: Sized {
    /// `T`: what is stored and replayed.
    type Value;
    /// `E`: what carries idem's own errors.
    type Error;
    /// `self` as a `Result`.
    fn into_result(self) -> Result<Self::Value, Self::Error>;
    /// A `Result` as `Self`.
    fn from_result(result: Result<Self::Value, Self::Error>) -> Self;
}

impl<T, E> IdempotentResult for Result<T, E> {
    type Value = T;
    type Error = E;
    fn into_result(self) -> Result<T, E> {
        self
    }
    fn from_result(result: Result<T, E>) -> Self {
        result
    }
}

/// What the `Ok` type of an idempotent function must be: stored (as JSON by default) and
/// replayed.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be stored and replayed by `#[idempotent]`",
    label = "the `Ok` type must be `Serialize + DeserializeOwned`",
    note = "derive `serde::Serialize` and `serde::Deserialize` on it; an axum `Json<T>` is neither: return `Result<T, E>` from the idempotent function and wrap the value in `Json` in the handler (see the `#[idempotent]` docs)"
)]
pub trait Storable: Serialize + DeserializeOwned {}

impl<T: Serialize + DeserializeOwned> Storable for T {}

/// What the `Err` type of an idempotent function must be: able to carry idem's own errors.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot carry idem's errors",
    label = "the `Err` type must implement `From<idem::Error>`",
    note = "add a variant such as `#[error(transparent)] Idem(#[from] idem::Error)` (with thiserror), or implement `From<idem::Error>` for it"
)]
pub trait CarriesIdemError: From<Error> {}

impl<E: From<Error>> CarriesIdemError for E {}

/// Checks the return type `R` of an idempotent function, as [`call`] does, where the expansion
/// calls [`run_detached`] (`detach = true`) or idem-sql's `tx_begin` and `tx_end` (`transaction = …`).
pub fn check_return<R>()
where
    R: IdempotentResult,
    R::Value: Storable,
    R::Error: CarriesIdemError,
{
}

/// The engine's `run` for a body resolving to the function's return type `R` (given explicitly, so `?` in
/// the body converts errors as in the original function, and unmet bounds are reported on `R`).
///
/// Not an `async fn`: it prepares the call and returns the engine's own future for it, so the
/// attribute's function awaits the engine with no layer between them. Every async layer moves
/// the engine's future (about 2 KB) once more when it starts, and those moves cost more than the
/// rest of the attribute.
#[inline(always)]
pub fn call<'a, R, C, F>(
    engine: &'a Idempotency<C>,
    prepared: Prepared,
    body: F,
) -> impl Future<Output = R> + 'a
where
    R: IdempotentResult + 'a,
    R::Value: Storable,
    R::Error: CarriesIdemError,
    C: Codec,
    F: Future<Output = R> + 'a,
{
    let (key, fingerprint, options, refused) = match prepared.parts() {
        Ok((key, fingerprint, options)) => (key, fingerprint, options, None),
        Err(e) => (None, None, CallOptions::default(), Some(e)),
    };
    engine
        .call(key)
        .fingerprint(fingerprint)
        .overrides(options)
        .run_into(refused, body)
}

/// [`call`] for a function with `steps = name`: the body is a closure of the [`Steps`] handle
/// its `name` binds, run through [`Call::run_steps`](crate::Call::run_steps).
pub async fn call_steps<R, C, W, F>(engine: &Idempotency<C>, prepared: Prepared, body: W) -> R
where
    R: IdempotentResult,
    R::Value: Storable,
    R::Error: CarriesIdemError,
    C: Codec,
    W: FnOnce(Steps<C>) -> F,
    F: Future<Output = R>,
{
    let (key, fingerprint, options) = match prepared.parts() {
        Ok(parts) => parts,
        Err(e) => return R::from_result(Err(e.into())),
    };
    let out = engine
        .call(key)
        .fingerprint(fingerprint)
        .overrides(options)
        .run_steps(|steps| async move { body(steps).await.into_result() })
        .await;
    R::from_result(out.map(crate::Outcome::into_inner))
}

/// The default scope of an idempotent function: its path, read from the type name of an item
/// `item` declared in its body (`my_app::orders::Orders::create::__idem_scope`, with any
/// `{{closure}}` segments of an async body) with the item's own segment dropped. A path longer
/// than a key part may be keeps its last 255 bytes, the most specific ones.
pub fn default_scope<F>(_item: F) -> &'static str {
    let mut path = std::any::type_name::<F>();
    if let Some((parent, _item)) = path.rsplit_once("::") {
        path = parent;
    }
    while let Some(parent) = path.strip_suffix("::{{closure}}") {
        path = parent;
    }
    let mut start = path.len().saturating_sub(crate::key::MAX_KEY_LEN);
    while !path.is_char_boundary(start) {
        start += 1;
    }
    &path[start..]
}
