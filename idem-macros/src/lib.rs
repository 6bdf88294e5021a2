//! The `#[idempotent]` attribute of [idem](https://docs.rs/idem).
//!
//! Depend on `idem`, not on this crate: the attribute is re-exported there as
//! `idem::idempotent`, and the code it generates calls into `::idem::__private`.
//!
//! Parsing and checking the arguments lives in `attr.rs` (with duration literals in
//! `duration.rs`); checking the function and generating the new body lives in `expand.rs`, with
//! what its parameters mean (which make the default fingerprint, which a detached body borrows)
//! in `params.rs`. All runtime logic is in `idem-core`, where it is tested without macros.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]

mod attr;
mod duration;
mod expand;
mod params;

use proc_macro::TokenStream;

/// Runs an `async fn` once per key: the first call runs the body and stores its `Ok` value;
/// a later call with the same key and the same arguments gets that value back without running
/// the body, until the `retention` ends. The same key with other arguments is another request
/// reusing the key: it gets `idem::Error::KeyReused` (see [the default
/// fingerprint](#the-default-fingerprint)).
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use idem::{idempotent, Idempotency, MemoryStore};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Debug, thiserror::Error)]
/// enum BankError {
///     #[error(transparent)]
///     Idem(#[from] idem::Error),
/// }
///
/// #[derive(Serialize)]
/// struct Deposit { request_id: String, cents: u64 }
///
/// #[derive(Debug, PartialEq, Serialize, Deserialize)]
/// struct Receipt { deposit_no: u64, cents: u64 }
///
/// struct Bank { idem: Idempotency, tenant: String, deposits: AtomicU64 }
///
/// impl Bank {
///     #[idempotent(
///         key = req.request_id,
///         caller = self.tenant,
///         scope = "deposit",
///         engine = self.idem,
///         retention = "24h",
///     )]
///     async fn deposit(&self, req: Deposit) -> Result<Receipt, BankError> {
///         let deposit_no = self.deposits.fetch_add(1, Ordering::SeqCst) + 1;
///         Ok(Receipt { deposit_no, cents: req.cents })
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BankError> {
/// let bank = Bank {
///     idem: Idempotency::new(MemoryStore::new()),
///     tenant: "acme".into(),
///     deposits: AtomicU64::new(0),
/// };
/// let request = || Deposit { request_id: "req-1".into(), cents: 500 };
/// let first = bank.deposit(request()).await?;
/// let retry = bank.deposit(request()).await?; // replayed: the body does not run again
/// assert_eq!(first, retry);
/// assert_eq!(bank.deposits.load(Ordering::SeqCst), 1);
///
/// // The same key for a different request is refused: `req` is the fingerprint.
/// let other = bank.deposit(Deposit { cents: 900, ..request() }).await;
/// assert!(matches!(other, Err(BankError::Idem(idem::Error::KeyReused))));
/// # Ok(()) }
/// ```
///
/// # Where it applies
///
/// An `async fn` with a body: a free function, or a method in an `impl` block (inherent or
/// trait, including an `#[async_trait]` impl) with any receiver (`&self`, `&mut self`, `self`,
/// `self: Arc<Self>`). Generics, visibility, other attributes and doc comments are kept. The
/// function returns `Result<T, E>`, written so or through an alias of any name
/// (`type AppResult<T> = Result<T, AppError>`), where
///
/// - `T: Serialize + DeserializeOwned`: the `Ok` value is stored (as JSON by default) and
///   replayed;
/// - `E: From<idem::Error>`: idem's own errors (invalid key, key reused, locked, store down)
///   reach the caller through the function's error type.
///
/// The return type is checked by these bounds, not by its name; an unmet one is reported on
/// the return type.
///
/// **`#[async_trait]`.** Put `#[async_trait]` on the trait and on the impl, as usual, and
/// `#[idempotent(…)]` on the method in the impl, before or after its other attributes.
/// `#[async_trait]` on the impl runs first and turns the method into a plain `fn` returning
/// `Pin<Box<dyn Future<Output = R> + Send + 'async_trait>>`; the attribute recognises that form,
/// derives the key from the arguments, then runs the boxed body through idem. `transaction`
/// does not work in that form (the boxed body owns the connection): use a native `async fn` in
/// the trait instead.
///
/// ```
/// use async_trait::async_trait;
/// use idem::{idempotent, Idempotency, MemoryStore};
///
/// #[async_trait]
/// trait Handler {
///     async fn handle(&self, message_id: &str) -> Result<u32, idem::Error>;
/// }
///
/// struct Consumer { idem: Idempotency }
///
/// #[async_trait]
/// impl Handler for Consumer {
///     #[idempotent(key = message_id, scope = "consume", engine = self.idem)]
///     async fn handle(&self, message_id: &str) -> Result<u32, idem::Error> {
///         Ok(7)
///     }
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # let consumer = Consumer { idem: Idempotency::new(MemoryStore::new()) };
/// # assert_eq!(consumer.handle("m-1").await.unwrap(), 7);
/// # }
/// ```
///
/// **axum handlers.** axum's `Json<T>` is neither `Serialize` nor `Deserialize`, so it cannot
/// be the stored value. Let the idempotent function return the value (`Result<Order,
/// ApiError>`) and the handler wrap it, with the status it chooses:
///
/// ```
/// use axum::{extract::State, http::{HeaderMap, StatusCode}, Json};
/// use idem::{idempotent, Idempotency};
/// use serde::{Deserialize, Serialize};
/// # #[derive(Debug, thiserror::Error)]
/// # enum ApiError {
/// #     #[error(transparent)] Idem(#[from] idem::Error),
/// #     #[error("missing Idempotency-Key")] MissingKey,
/// # }
/// # impl axum::response::IntoResponse for ApiError {
/// #     fn into_response(self) -> axum::response::Response {
/// #         (StatusCode::BAD_REQUEST, self.to_string()).into_response()
/// #     }
/// # }
/// #[derive(Serialize, Deserialize)] // `Serialize`: the request is the fingerprint
/// struct NewOrder { cents: u64 }
///
/// #[derive(Serialize, Deserialize)]
/// struct Order { cents: u64 }
///
/// #[idempotent(key = request_id, scope = "create-order", engine = engine)]
/// async fn create_order(engine: &Idempotency, request_id: &str, new: NewOrder) -> Result<Order, ApiError> {
///     Ok(Order { cents: new.cents })
/// }
///
/// async fn post_order(
///     State(engine): State<Idempotency>,
///     headers: HeaderMap,
///     Json(new): Json<NewOrder>,
/// ) -> Result<(StatusCode, Json<Order>), ApiError> {
///     let request_id = headers
///         .get("idempotency-key")
///         .and_then(|v| v.to_str().ok())
///         .ok_or(ApiError::MissingKey)?;
///     let order = create_order(&engine, request_id, new).await?; // replayed on a retry
///     Ok((StatusCode::CREATED, Json(order)))
/// }
/// # let _app: axum::Router = axum::Router::new()
/// #     .route("/orders", axum::routing::post(post_order))
/// #     .with_state(Idempotency::new(idem::MemoryStore::new()));
/// ```
///
/// A `Json<T>` as the `Ok` type is refused on the return type with a note saying this. To store
/// and replay whole HTTP responses, status and headers included, use the HTTP layer of the
/// `http` feature instead of the attribute.
///
/// # Arguments
///
/// | argument | required | value | meaning |
/// |---|---|---|---|
/// | `key` | yes | expression of an `idem::KeyPart` type: `&str`, `String`, `Box<str>`, `Arc<str>`, `Rc<str>`, `Cow<str>`, an integer, a `uuid::Uuid`, a reference to one or an `Option` of one | The client key: what the caller sent (request id, `Idempotency-Key` header, message id). `None` runs the body without deduplication. A function generic over its key bounds it `K: idem::KeyPart` (`K: Into<String>` is not enough: the key is read from a borrow, before the body may move it). |
/// | `engine` | yes | expression: an `idem::Idempotency`, a reference to one, or an `Arc` of one | The engine: the store plus its policy (lease, retention, waiting, size limit, codec). |
/// | `scope` | no | string literal, 1 to 255 bytes of printable ASCII, checked at compile time | Names the operation. Default: the function's path (below). |
/// | `caller` | no | expression, as for `key` | Who asks (tenant, user, token id). Two callers sending the same key never share a record. Default: empty. |
/// | `fingerprint` | no | expression of a `Serialize` type, or `()` | What identifies the request, hashed as canonical JSON: a call reusing a key with another fingerprint gets `idem::Error::KeyReused`. Default: the function's arguments but the engine, the key, the caller and a transaction ([below](#the-default-fingerprint)). `fingerprint = ()`: none, so a reused key replays its result whatever the arguments. |
/// | `skip` | no | argument names in parentheses: `skip(client, deadline)` | Leaves those arguments out of the default fingerprint, so they need not be `Serialize` ([below](#skip)). Refused with `fingerprint = …`. |
/// | `lease` | no | duration literal | How long a claim blocks its key without a heartbeat; renewed every third of it while the body runs. Default: the engine's policy (30 s). |
/// | `retention` | no | duration literal | How long a completed result is replayed. Default: the engine's policy (24 h). |
/// | `on_locked` | no | expression of type `idem::OnLocked` | What a call does while another call runs the same key: `OnLocked::FailFast` (`idem::Error::Locked`) or `OnLocked::Wait { timeout }` (then replay). Default: the engine's policy (fail fast). |
/// | `on_lapse` | no | `uncertain` or `release` | What the key becomes if the call's claim lapses with no result (its process died, stalled past the lease, or the call was cancelled): `release` frees it, so a retry runs the body again; `uncertain` keeps it from running again (every retry gets `idem::Error::Uncertain`) until an operator or a reconciler resolves it. For a body whose effect outside the store must not repeat (a charge, an email). Default: the engine's policy (`release`). |
/// | `policy` | no | an integer literal, 0 to 4294967295 | The version of what the fingerprint hashes, kept with each record: a retry across a deploy that changed it, whose request now fingerprints differently, gets `idem::Error::PolicyChanged` rather than `KeyReused`. Default: derived from what is hashed (the hashed parameters' names and types, or the `fingerprint` expression as written), so changing those changes it. |
/// | `transaction` | no | the name of a parameter: `&mut sqlx::Transaction<'_, DB>` or `&mut` connection | Transactional mode (below): the claim, the body and the stored result share this transaction. `engine` is then an `idem::Transactional`; `lease`, `on_locked` and `on_lapse` are refused. |
/// | `detach` | no | `true` or `false` | `true`: once the call has claimed its key, the body runs to its end on a task of its own, and its result is stored, even if the caller is cancelled (a `timeout`, a client that disconnects); a retry replays it. The body must own what it uses (`'static + Send`): take arguments by value and `self: Arc<Self>` rather than `&self`; a borrowed argument (or `&self`) that the body uses is a compile error on it saying so. Refused with `transaction`. Default `false`: a cancelled call stops the body and releases the claim, so a retry runs it again. |
/// | `steps` | no | a name, such as `steps = steps` | Binds an `idem::Steps` handle to that name in the body, which runs through `Call::run_steps`: each `steps.run("name", …)` is stored as it finishes, and a call after a failure or a crash replays the finished steps and continues at the first unfinished one (docs/steps.md). Refused with `transaction`, with `detach = true` and on `#[async_trait]` methods. |
///
/// `store` and `ttl`, the old names of `engine` and `retention`, still work but are deprecated:
/// the compiler warns on them (a `deprecated` warning, so `#![deny(deprecated)]` makes it an
/// error). A misspelt argument gets "did you mean" with the closest name.
///
/// Arguments are `name = value`, separated by commas, in any order. Duration literals are a
/// number and a unit (`ms`, `s`, `m`, `h`, `d`), or several from the largest unit to the
/// smallest: `"250ms"`, `"30s"`, `"5m"`, `"24h"`, `"7d"`, `"1h30m"`. They must lie between 1 ms
/// and 10 years.
///
/// The key of a call is derived from `(scope, caller, key)` (SHA-256 over length-prefixed
/// parts); the key and caller must be 1 to 255 bytes of printable ASCII, otherwise the call
/// returns `idem::Error::InvalidKey` without running the body or touching the store.
///
/// # The default fingerprint
///
/// Without `fingerprint = …`, the fingerprint is the function's arguments, all but
///
/// - the receiver (`self`, `&self`, …);
/// - the engine, and the argument it is taken from (`state` in `engine = state.idem`);
/// - the arguments the key or the caller is built from whole: `order_id` in `key = order_id`,
///   `key = &order_id`, `key = order_id.as_ref()` (or `as_str`, `as_deref`, `borrow`, `clone`,
///   `to_owned`, `to_string`) and `key = format!("{tenant}-{}", order_id)`. A key that reads a
///   field, an index or another method (`key = req.id`, `key = req.id()`, `key = id.trim()`), or
///   passes the argument to a function, holds only part of it, so the argument stays in the
///   fingerprint: the rest of `req` is the request;
/// - the `transaction` argument, and arguments bound to `_`;
/// - the arguments named in `skip(…)` ([below](#skip)).
///
/// They are hashed as a struct with one field per argument, named as the argument: the call
/// `charge(&engine, "o-1", 100)` below has the fingerprint of `{"cents": 100}`, as
/// `idem::Fingerprint::of_json` computes it. A function with no argument left has no
/// fingerprint. So a key reused for another request is refused instead of replaying the first
/// request's result:
///
/// ```
/// use idem::{idempotent, Idempotency, MemoryStore};
///
/// #[idempotent(key = order_id, scope = "charge", engine = engine)]
/// async fn charge(engine: &Idempotency, order_id: &str, cents: u64) -> Result<u64, idem::Error> {
///     Ok(cents) // the card is charged here
/// }
///
/// // `fingerprint = ()`: no fingerprint, a reused key replays whatever the arguments.
/// #[idempotent(key = order_id, scope = "charge-any", engine = engine, fingerprint = ())]
/// async fn charge_any(engine: &Idempotency, order_id: &str, cents: u64) -> Result<u64, idem::Error> {
///     Ok(cents)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem::Error> {
/// let engine = Idempotency::new(MemoryStore::new());
/// assert_eq!(charge(&engine, "o-1", 100).await?, 100);
/// assert_eq!(charge(&engine, "o-1", 100).await?, 100); // a retry: replayed
/// assert!(matches!(charge(&engine, "o-1", 999).await, Err(idem::Error::KeyReused)));
///
/// assert_eq!(charge_any(&engine, "o-1", 100).await?, 100);
/// assert_eq!(charge_any(&engine, "o-1", 999).await?, 100); // the first result
/// # let key = idem::Key::derive("charge", "", "o-1")?;
/// # let record = engine.store().get(&key).await?.unwrap();
/// # #[derive(serde::Serialize)]
/// # struct Arguments { cents: u64 }
/// # let cents = idem::Fingerprint::of_json(&Arguments { cents: 100 })?;
/// # assert_eq!(record.fingerprint.map(|f| f.with_policy(0)), Some(cents));
/// # Ok(()) }
/// ```
///
/// Every hashed argument must be `Serialize`; one that is not is a compile error on that
/// argument, which names the ways out: derive `Serialize` on its type, leave it out with
/// `skip(name)` when it is not part of the request, name what identifies the request with
/// `fingerprint = <expr>` (such as `fingerprint = (cents, currency)`), or check nothing with
/// `fingerprint = ()`. Skip it also when an argument is not part of the request and changes
/// between retries (a counter, a deadline, a trace id): hashed, it would make every retry
/// `KeyReused`.
///
/// An argument the key holds whole is left out because the key already tells its values apart:
/// the same key means the same value of it. This reads the expression, not the types, so it
/// assumes the conversions keep the whole value (your own type whose `as_ref()` or `Display`
/// shows part of it would leave the rest unhashed) and that a `format!` key's pieces cannot run
/// into each other (pick a separator they never contain). docs/attribute.md gives the rule in
/// full and why it is not "used only in the key".
///
/// The arguments' names are part of the fingerprint: renaming, adding, removing or skipping a
/// hashed argument changes it, so a retry that spans the deploy gets `KeyReused` for a key
/// recorded before. Records made without a fingerprint (with `fingerprint = ()`, or by a function that
/// had none when they were stored) replay to any arguments until they expire.
///
/// # `skip`
///
/// `skip(a, b)` leaves the named arguments out of the default fingerprint, as tracing's
/// `#[instrument(skip(…))]` leaves them out of a span: a helper that is not part of the request
/// (a client, a counter, a deadline) needs neither `Serialize` nor a `fingerprint = …` for the
/// whole function. A reused key with a skipped argument changed replays; with a hashed one
/// changed it gets `KeyReused`. Here `id`, which the key holds whole, is not hashed either, so
/// its generic type need not be `Serialize`:
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use idem::{idempotent, Idempotency, MemoryStore};
///
/// /// A handle the function uses, not part of the request (nor `Serialize`).
/// struct Mailer { sent: AtomicU32 }
///
/// #[idempotent(key = id.as_ref(), scope = "confirm", engine = engine, skip(mailer, attempt))]
/// async fn confirm<K: AsRef<str>>(
///     engine: &Idempotency,
///     mailer: &Mailer,
///     id: K,
///     cents: u64,
///     attempt: u32,
/// ) -> Result<u64, idem::Error> {
///     mailer.sent.fetch_add(1, Ordering::SeqCst);
///     println!("order {}, attempt {attempt}", id.as_ref());
///     Ok(cents)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem::Error> {
/// let engine = Idempotency::new(MemoryStore::new());
/// let mailer = Mailer { sent: AtomicU32::new(0) };
/// assert_eq!(confirm(&engine, &mailer, "o-1", 100, 1).await?, 100);
/// assert_eq!(confirm(&engine, &mailer, String::from("o-1"), 100, 2).await?, 100); // replayed
/// assert!(matches!(
///     confirm(&engine, &mailer, "o-1", 999, 3).await,
///     Err(idem::Error::KeyReused)
/// ));
/// assert_eq!(mailer.sent.load(Ordering::SeqCst), 1);
/// # let key = idem::Key::derive("confirm", "", "o-1")?;
/// # let record = engine.store().get(&key).await?.unwrap();
/// # #[derive(serde::Serialize)]
/// # struct Arguments { cents: u64 }
/// # assert_eq!(record.fingerprint.map(|f| f.with_policy(0)), Some(idem::Fingerprint::of_json(&Arguments { cents: 100 })?));
/// # Ok(()) }
/// ```
///
/// `skip` takes argument names, each once, in one `skip(…)`, and trims the default fingerprint
/// only: with `fingerprint = …` (or `()`) it is a compile error. Naming what is left out already
/// (`self`, the argument the engine is taken from, one the key or the caller is built from whole,
/// the `transaction` argument) is an error that says why, so a `skip` lists only what it
/// changes.
///
/// # The default scope, and what a rename does
///
/// Without `scope`, the scope is the function's path as Rust names it, from the crate down:
/// `my_app::billing::charge` for a free function, `my_app::billing::Orders::create` for a
/// method or associated function of `Orders`, `<my_app::Orders as my_app::Handler>::handle` in
/// a trait impl, `my_app::Cache<_>::fill` in a generic impl (all instances share it). Two
/// different functions therefore never share keys, even with the same name: `Orders::create`
/// and `Refunds::create` keep apart. (A path longer than 255 bytes keeps its last 255.)
///
/// ```
/// use idem::{Idempotency, MemoryStore};
///
/// mod billing {
///     use idem::{idempotent, Idempotency};
///
///     pub struct Orders;
///     pub struct Refunds;
///
///     impl Orders {
///         #[idempotent(key = id, engine = engine)]
///         pub async fn create(engine: &Idempotency, id: &str) -> Result<String, idem::Error> {
///             Ok(format!("order {id}"))
///         }
///     }
///
///     impl Refunds {
///         #[idempotent(key = id, engine = engine)]
///         pub async fn create(engine: &Idempotency, id: &str) -> Result<String, idem::Error> {
///             Ok(format!("refund {id}"))
///         }
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let engine = Idempotency::new(MemoryStore::new());
/// assert_eq!(billing::Orders::create(&engine, "42").await?, "order 42");
/// assert_eq!(billing::Refunds::create(&engine, "42").await?, "refund 42"); // its own result
/// let scope = concat!(module_path!(), "::billing::Refunds::create");
/// let key = idem::Key::derive(scope, "", "42")?;
/// assert!(engine.store().get(&key).await?.is_some());
/// # Ok(()) }
/// ```
///
/// **Renaming forgets.** Stored results are found by scope. Renaming or moving the function,
/// its module, its crate or its type (or the trait it implements) changes the default scope,
/// and so does editing an explicit `scope`: every result stored under the old scope is then
/// forgotten, and a retry of an old request runs the body again. The default path is also the
/// compiler's wording (`std::any::type_name`), which Rust does not promise to keep across
/// releases. So give every function whose results must outlive a deploy an explicit
/// `scope = "…"`, and keep it when you rename the function.
///
/// Before this rule the default scope was the bare function name; a function without `scope`
/// keeps the results it stored then by naming it: `scope = "create"` for `fn create`.
///
/// # What a call returns
///
/// | situation | result |
/// |---|---|
/// | new key | the body runs; its `Ok` value is stored and returned |
/// | key completed before, within `retention` | the stored value, deserialized; the body does not run |
/// | the body returns `Err` | that error; nothing is stored and the claim is released, so a retry runs again |
/// | the call is cancelled (its future dropped) while the body runs | without `detach`: the body stops and the claim is released at once (by lease expiry when no tokio runtime is left), so a retry runs it again; with `detach = true`: the body runs on, its result is stored, and a retry replays it |
/// | the call is cancelled while its claim or its result is being written | that statement is finished on a task of its own; a claim it made is released (or, for the result, kept) |
/// | the body panics | the claim is released; the panic goes on to the caller |
/// | another call holds the key | `idem::Error::Locked { retry_after }`, or with `OnLocked::Wait` the other call's result |
/// | same key, another fingerprint (by default, other arguments) | `idem::Error::KeyReused` |
/// | malformed key or caller | `idem::Error::InvalidKey` |
/// | the `Ok` value exceeds the engine's size limit | the value; the key is kept as "completed, result not retained", so a retry gets `idem::Error::ResultNotRetained` and the body does not run again |
/// | the lease was lost before completion | `idem::Error::LeaseLost`: the work may have run twice |
///
/// A replayed value and a fresh one look the same to the caller; use
/// `Idempotency::run` directly when the difference matters (it returns an `Outcome`).
///
/// # Round trips to the store
///
/// A new key costs one statement to claim and one to complete (plus one renewal per third of
/// the lease the body runs); a replay costs one; a failed body costs a claim and a release; a
/// `None` key or an invalid one costs none.
///
/// # Expansion
///
/// The function keeps its signature; its body becomes, in outline (generated locals are
/// prefixed `__idem_` so they never clash with yours):
///
/// ```text
/// let __idem_engine = <clone of the engine named by `engine`>;        // one Arc clone
/// let __idem_prepared = Prepared {
///     key: key(<scope>, <Some(&caller) or None>, &<key>),         // Result<Option<Key>, Error>
///     fingerprint: versioned(fingerprint(&<fingerprint>), <policy>), // `fingerprint = <fingerprint>`
///     fingerprint: versioned(arguments(&[argument("cents", &cents), …]), <policy>), // by default
///     fingerprint: versioned(Ok(None), 0),          // or, with `()` or no argument hashed
///     options: options(<lease>, <retention>, <on_locked>, <on_lapse>), // None: engine's policy
/// };
/// call::<ReturnType, _, _>(&__idem_engine, __idem_prepared,
///     async move { <the original body> }).await
/// ```
///
/// where `Prepared`, `key`, `fingerprint`, `arguments`, `argument`, `versioned`, `options` and `call` (a thin layer over
/// `run`; with `detach = true`, `check_return::<ReturnType>()` then `run_detached(…,
/// body::<ReturnType, _>(…))`) are in `::idem::__private`; each `argument` is spanned on its
/// argument, so one that is not `Serialize` is reported there. Without `scope`, `<scope>` is
/// `default_scope(__idem_scope)` for an empty `fn __idem_scope() {}` declared in the body: that
/// item's path less its own name. The key, caller and fingerprint are computed from borrows
/// before the body starts, and the engine is cloned, so the body may still move the function's
/// arguments (including one that `engine` or `key` names).
/// `call::<ReturnType, _, _>` pins the body's output to the declared return type, so `?` and
/// `return` inside the body behave as in the original function, and carries the bounds on `T`
/// and `E`, so an unmet one is reported on the return type. The generated future is `Send`
/// whenever the original body's future is.
///
/// For an `#[async_trait]` method, the original body (which builds the boxed future) is
/// evaluated after the key is derived, as `__idem_body`, and the method returns
/// `Box::pin(async move { call::<R, _, _>(…, __idem_body).await })`.
///
/// An old argument name adds `{ #[deprecated] fn store() {} store(); }`, spanned
/// on the name, so the compiler's `deprecated` warning points at it.
///
/// # Transactional mode
///
/// When the body writes to the same SQL database as the idempotency records (SQLite or
/// PostgreSQL), `transaction = tx` names the parameter holding the caller's transaction (or
/// connection), and `engine` names an `idem::Transactional` engine over that database's store.
/// The claim, the body's writes and the stored result then commit together or not at all: a
/// crash or a dropped transaction before the commit leaves nothing, so the retry applies the
/// work exactly once. A concurrent duplicate waits on the database's lock until the first
/// transaction ends, then replays its result. The caller opens and commits the transaction
/// (on SQLite open it with `BEGIN IMMEDIATE`, so concurrent writers queue instead of failing).
///
/// ```
/// use idem::{idempotent, SqliteStore, Transactional};
/// use sqlx::{Sqlite, Transaction};
/// # #[derive(Debug, thiserror::Error)]
/// # enum BankError {
/// #     #[error(transparent)] Idem(#[from] idem::Error),
/// #     #[error(transparent)] Sql(#[from] sqlx::Error),
/// # }
///
/// #[idempotent(key = request_id, scope = "deposit", engine = idem, transaction = tx)]
/// async fn deposit(
///     idem: &Transactional<SqliteStore>,
///     tx: &mut Transaction<'_, Sqlite>,
///     request_id: &str,
///     cents: i64,
/// ) -> Result<i64, BankError> {
///     let balance = sqlx::query_scalar("UPDATE accounts SET balance = balance + ? RETURNING balance")
///         .bind(cents)
///         .fetch_one(&mut **tx)
///         .await?;
///     Ok(balance)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BankError> {
/// let store = SqliteStore::connect("sqlite::memory:").await?;
/// let idem = Transactional::new(store.clone());
/// # sqlx::query("CREATE TABLE accounts (balance INTEGER NOT NULL)").execute(store.pool()).await?;
/// # sqlx::query("INSERT INTO accounts VALUES (0)").execute(store.pool()).await?;
/// for _delivery in 0..2 {
///     let mut tx = store.pool().begin_with("BEGIN IMMEDIATE").await?;
///     assert_eq!(deposit(&idem, &mut tx, "req-1", 500).await?, 500); // the second one replays
///     tx.commit().await?;
/// }
/// # Ok(()) }
/// ```
///
/// The expansion derives the key and fingerprint first, then (in outline):
///
/// ```text
/// let __idem_claim = match tx_begin(&engine, &mut *tx, key, fingerprint, options).await {
///     Ok(TxClaimOutcome::Run(claim)) => claim,
///     Ok(TxClaimOutcome::Replayed(value)) => return Ok(value),
///     Err(e) => return Err(From::from(e)),
/// };
/// check_return::<ReturnType>();                      // the bounds on T and E, on the return type
/// let __idem_result = body::<ReturnType, _>(async { <the original body> }).await;
/// tx_end(&engine, &mut *tx, __idem_claim, __idem_result).await  // Ok: store it; Err: release
/// ```
///
/// The body is not a `move` block: it borrows the transaction while it runs, so `tx` is usable
/// in the body and after it (it must not be moved away, for instance committed, inside the
/// body). An `Err` releases the claim inside the transaction, so committing leaves the key free;
/// rolling back does too. `retention` sets how long the result is kept. `lease`, `on_locked` and
/// `on_lapse` do not apply: the claim is invisible to other calls until the commit, a duplicate
/// waits on the database's lock rather than on the lease, and a call that dies leaves nothing to
/// lapse. A plain connection outside a transaction also
/// works, but then every statement commits on its own and the one-transaction guarantee is
/// gone.
///
/// Round trips: one claim statement and one completion statement inside your transaction (a
/// replay is the claim statement, plus one read on SQLite).
///
/// # Compile errors
///
/// Each mistake is reported on the token that causes it, and the function is still emitted
/// unchanged next to the error, so only that one error shows: a function that is not `async`
/// (nor rewritten by `#[async_trait]`); a missing `key` or `engine`; an unknown argument (with
/// "did you mean" when a known name is close, otherwise the list of the known ones); an
/// argument given twice, also under its old name (on the second one); an argument without a
/// value; a malformed, zero or too long duration; a `scope` that is not a string literal, is
/// empty, longer than 255 bytes or not printable ASCII (and, without `scope`, a function name
/// that is not ASCII); a `transaction` that is not the name of a parameter, given with `lease`
/// or `on_locked`, or on an `#[async_trait]` method; with `detach = true`, an argument whose type
/// borrows (a reference, a lifetime other than `'static`) or `&self`, when the body uses it; in
/// `skip(…)`, a name that is not an argument (the error lists those that are), a name given twice,
/// `skip` given twice or empty, `skip` with `fingerprint = …`, and a name the default fingerprint
/// leaves out already (with the reason).
/// The type checker reports, on the argument, an argument of the default fingerprint that is
/// not `Serialize`; on the return type, a return type that is not a `Result`, an `Ok` type
/// that is not `Serialize + DeserializeOwned` (such as axum's `Json<T>`) and an `Err` type
/// without `From<idem::Error>`; and a `key`, `caller`, `engine`, `on_locked` or `transaction`
/// of the wrong type on that expression. The old names `store` and `ttl` get a `deprecated` warning on the name.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::idempotent(args.into(), item.into()).into()
}
