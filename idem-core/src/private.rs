//! Support for the code `#[idempotent]` expands to. Not a public API: it may change in any
//! release.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use std::time::Duration;

use crate::codec::Codec;
pub use crate::engine::Overrides as CallOptions;
use crate::engine::{Idempotency, OnLocked};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::engine::{Transactional, TxClaim, TxStart};
use crate::error::Error;
use crate::key::{Fingerprint, Key};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::store::TransactionalStore;

/// What `store = …` may name: an engine, or a reference or `Arc` to one.
#[diagnostic::on_unimplemented(
    message = "`store = …` must be an idem engine, not `{Self}`",
    label = "not an `Idempotency` engine",
    note = "`store` takes an `idem::Idempotency`, a reference to one, or an `Arc` of one"
)]
pub trait AsEngine {
    /// The engine's codec.
    type Codec: Codec;
    /// The engine.
    fn as_engine(&self) -> &Idempotency<Self::Codec>;
}

impl<C: Codec> AsEngine for Idempotency<C> {
    type Codec = C;
    fn as_engine(&self) -> &Idempotency<C> {
        self
    }
}

impl<T: AsEngine + ?Sized> AsEngine for &T {
    type Codec = T::Codec;
    fn as_engine(&self) -> &Idempotency<T::Codec> {
        (**self).as_engine()
    }
}

impl<T: AsEngine + ?Sized> AsEngine for Arc<T> {
    type Codec = T::Codec;
    fn as_engine(&self) -> &Idempotency<T::Codec> {
        (**self).as_engine()
    }
}

/// What `key = …` and `caller = …` may be: text, a number, a UUID, or an `Option` of one
/// (`None`: no key, so the call runs without deduplication; no caller, so the caller is empty).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be part of an idempotency key",
    label = "not text, an integer or a UUID",
    note = "`key` and `caller` take `&str`, `String`, an integer, a `uuid::Uuid`, or an `Option` of one; format other values into a `String` first"
)]
pub trait KeyPart {
    /// The text of the part, if any.
    fn key_part(&self) -> Option<Cow<'_, str>>;
}

impl KeyPart for str {
    fn key_part(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(self))
    }
}

impl KeyPart for String {
    fn key_part(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(self))
    }
}

/// Strings users already hold in a shared or boxed form lend their text, as `String` does.
macro_rules! key_part_str {
    ($($t:ty),*) => {$(
        impl KeyPart for $t {
            fn key_part(&self) -> Option<Cow<'_, str>> {
                Some(Cow::Borrowed(self))
            }
        }
    )*};
}
key_part_str!(Box<str>, Arc<str>, std::rc::Rc<str>, Cow<'_, str>);

impl KeyPart for uuid::Uuid {
    fn key_part(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Owned(self.hyphenated().to_string()))
    }
}

macro_rules! key_part_display {
    ($($t:ty),*) => {$(
        impl KeyPart for $t {
            fn key_part(&self) -> Option<Cow<'_, str>> {
                Some(Cow::Owned(self.to_string()))
            }
        }
    )*};
}
key_part_display!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize);

impl<T: KeyPart + ?Sized> KeyPart for &T {
    fn key_part(&self) -> Option<Cow<'_, str>> {
        (**self).key_part()
    }
}

impl<T: KeyPart> KeyPart for Option<T> {
    fn key_part(&self) -> Option<Cow<'_, str>> {
        self.as_ref().and_then(KeyPart::key_part)
    }
}

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

/// Pins the body's output type to the function's return type, so `?` in the body converts
/// errors as it would in the original function.
pub fn body<R, F: Future<Output = R>>(f: F) -> F {
    f
}

/// The per-call options the attribute's `lease`, `ttl` and `on_locked` set.
pub fn options(
    lease: Option<Duration>,
    retention: Option<Duration>,
    on_locked: Option<OnLocked>,
) -> CallOptions {
    CallOptions {
        lease,
        retention,
        on_locked,
    }
}

/// Runs the body through the engine, dropping the fresh/replayed flag.
pub async fn run<En, T, E, F>(
    engine: &En,
    key: Result<Option<Key>, Error>,
    fingerprint: Result<Option<Fingerprint>, Error>,
    options: CallOptions,
    body: F,
) -> Result<T, E>
where
    En: AsEngine + ?Sized,
    F: Future<Output = Result<T, E>>,
    T: Serialize + DeserializeOwned,
    E: From<Error>,
{
    let (key, fingerprint) = (key?, fingerprint?);
    let call = engine.as_engine().call(key).fingerprint(fingerprint);
    let outcome = call.overrides(options).run(body).await?;
    Ok(outcome.into_inner())
}

/// [`run`] with `detach = true`: the body runs on a task of its own, so a cancelled caller
/// cannot stop it once it has claimed the key.
pub async fn run_detached<En, T, E, F>(
    engine: &En,
    key: Result<Option<Key>, Error>,
    fingerprint: Result<Option<Fingerprint>, Error>,
    options: CallOptions,
    body: F,
) -> Result<T, E>
where
    En: AsEngine + ?Sized,
    F: Future<Output = Result<T, E>> + Send + 'static,
    T: Serialize + DeserializeOwned + Send + 'static,
    E: From<Error> + Send + 'static,
{
    let (key, fingerprint) = (key?, fingerprint?);
    let call = engine.as_engine().call(key).fingerprint(fingerprint);
    let outcome = call.overrides(options).run_detached(body).await?;
    Ok(outcome.into_inner())
}

/// What `store = …` may name together with `transaction = …`: a transactional engine, or a
/// reference or `Arc` to one.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[diagnostic::on_unimplemented(
    message = "with `transaction = …`, `store = …` must be an idem `Transactional` engine, not `{Self}`",
    label = "not a `Transactional` engine",
    note = "`store` then takes an `idem::Transactional` (such as `Transactional::new(sqlite_store)`), a reference to one, or an `Arc` of one"
)]
pub trait AsTransactional {
    /// The engine's store.
    type Store: TransactionalStore;
    /// The engine's codec.
    type Codec: Codec;
    /// The engine.
    fn as_transactional(&self) -> &Transactional<Self::Store, Self::Codec>;
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl<S: TransactionalStore, C: Codec> AsTransactional for Transactional<S, C> {
    type Store = S;
    type Codec = C;
    fn as_transactional(&self) -> &Transactional<S, C> {
        self
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl<T: AsTransactional + ?Sized> AsTransactional for &T {
    type Store = T::Store;
    type Codec = T::Codec;
    fn as_transactional(&self) -> &Transactional<T::Store, T::Codec> {
        (**self).as_transactional()
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl<T: AsTransactional + ?Sized> AsTransactional for Arc<T> {
    type Store = T::Store;
    type Codec = T::Codec;
    fn as_transactional(&self) -> &Transactional<T::Store, T::Codec> {
        (**self).as_transactional()
    }
}

/// The connection type of the transactional engine `En`.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub type TxConnection<En> = <<En as AsTransactional>::Store as TransactionalStore>::Connection;

/// The caller's connection, as the engine's store needs it: `&mut *tx` coerces to it from a
/// `&mut` connection, a `&mut Transaction` or a `&mut PoolConnection`. (One function for both
/// uses, so a wrong type is reported once.)
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub fn tx_connection<'c, En: AsTransactional + ?Sized>(
    _engine: &En,
    conn: &'c mut TxConnection<En>,
) -> &'c mut TxConnection<En> {
    conn
}

/// What [`tx_begin`] found: run the body (with the claim to finish, or none without a key), or
/// return the stored value.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[derive(Debug)]
pub enum TxBegun<T> {
    /// Run the body, then pass this to [`tx_end`].
    Run(Option<TxClaim>),
    /// The key completed earlier: return this value without running the body.
    Replayed(T),
}

/// Claims the call's key on the caller's connection (when the call has a key), or fetches its
/// stored value. An invalid key or fingerprint is returned before the database is touched.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub async fn tx_begin<En, T>(
    engine: &En,
    conn: &mut TxConnection<En>,
    key: Result<Option<Key>, Error>,
    fingerprint: Result<Option<Fingerprint>, Error>,
    options: CallOptions,
) -> Result<TxBegun<T>, Error>
where
    En: AsTransactional + ?Sized,
    T: DeserializeOwned,
{
    let (key, fingerprint) = (key?, fingerprint?);
    let call = engine.as_transactional().call(key).fingerprint(fingerprint);
    let begun = call.overrides(options).begin(conn).await?;
    Ok(match begun {
        TxStart::Run(claim) => TxBegun::Run(Some(claim)),
        TxStart::Replayed(value) => TxBegun::Replayed(value),
    })
}

/// After the body: stores an `Ok` value under the claim, or releases the claim on `Err`, on the
/// caller's connection.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub async fn tx_end<En, T, E>(
    engine: &En,
    conn: &mut TxConnection<En>,
    claim: Option<TxClaim>,
    result: Result<T, E>,
) -> Result<T, E>
where
    En: AsTransactional + ?Sized,
    T: Serialize,
    E: From<Error>,
{
    let Some(claim) = claim else {
        return result;
    };
    let engine = engine.as_transactional();
    match result {
        Ok(value) => {
            engine.finish(conn, claim, &value).await?;
            Ok(value)
        }
        Err(e) => {
            engine.release(conn, claim).await;
            Err(e)
        }
    }
}
