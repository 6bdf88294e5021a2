//! Support for the code `#[idempotent]` expands to. Not a public API: it may change in any
//! release.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use std::time::Duration;

use crate::codec::Codec;
use crate::engine::{CallOptions, Idempotency, OnLocked};
use crate::error::Error;
use crate::key::{Fingerprint, Key};

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

/// Fingerprints a request value by its canonical JSON.
pub fn fingerprint<T: Serialize + ?Sized>(value: &T) -> Result<Option<Fingerprint>, Error> {
    Fingerprint::of_json(value)
        .map(Some)
        .map_err(|e| Error::Codec(Box::new(e)))
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
    let key = key?;
    let fingerprint = fingerprint?;
    engine
        .as_engine()
        .run_with(&options, key, fingerprint, body)
        .await
        .map(|o| o.into_inner())
}
