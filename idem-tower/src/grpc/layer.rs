//! [`IdempotencyLayer`], its builder and the methods it guards.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use http::HeaderName;
use tonic::Code;

use super::IDEMPOTENCY_KEY;
use crate::layer::sealed::Sealed;
use crate::layer::{Common, Protocol};
use idem_core::{Codec, Error, Idempotency, JsonCodec};

type StoreIfFn = dyn Fn(Code) -> bool + Send + Sync;
type KeyFn = dyn Fn(&[u8]) -> Result<Option<String>, String> + Send + Sync;

/// Whether the layer stores a call's answer by default, by its gRPC status: the final answers
/// `OK`, `INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`, `PERMISSION_DENIED`,
/// `FAILED_PRECONDITION` and `OUT_OF_RANGE` are stored and replayed; the others say "try
/// again" or "the server failed" (`CANCELLED`, `UNKNOWN`, `DEADLINE_EXCEEDED`,
/// `RESOURCE_EXHAUSTED`, `ABORTED`, `UNIMPLEMENTED`, `INTERNAL`, `UNAVAILABLE`, `DATA_LOSS`,
/// `UNAUTHENTICATED`), so they go to the client unstored and free the key for a retry.
///
/// Unlike the HTTP layer's `400`, `INVALID_ARGUMENT` is stored: a gRPC service answers it from
/// its own validation, after reading the message, and a retry of the same message would get the
/// same answer. Change it with [`store_if`](LayerBuilder::store_if).
///
/// ```
/// use idem::grpc::stores_by_default;
/// use tonic::Code;
/// assert!(stores_by_default(Code::Ok));
/// assert!(stores_by_default(Code::NotFound));
/// assert!(!stores_by_default(Code::Unavailable));
/// assert!(!stores_by_default(Code::Internal));
/// ```
pub fn stores_by_default(code: Code) -> bool {
    matches!(
        code,
        Code::Ok
            | Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::PermissionDenied
            | Code::FailedPrecondition
            | Code::OutOfRange
    )
}

/// A unary method the layer guards, by its path (`/package.Service/Method`), and where its
/// key comes from: the layer's key metadata entry (`idempotency-key` by default), a string
/// field of the request message ([`key_field`](Self::key_field), Google AIP-155's
/// `request_id`), or a function of the message bytes ([`key_from`](Self::key_from)).
///
/// ```
/// use idem::grpc::UnaryMethod;
/// // `string request_id = 3;` in `TransferRequest`.
/// let transfer = UnaryMethod::new("/bank.v1.Payments/Transfer").key_field(3);
/// // Keyed by the `idempotency-key` metadata entry.
/// let create: UnaryMethod = "/bank.v1.Payments/Create".into();
/// assert_eq!(create.path(), "/bank.v1.Payments/Create");
/// # let _ = transfer;
/// ```
#[derive(Clone)]
pub struct UnaryMethod {
    path: String,
    key: KeySource,
}

#[derive(Clone)]
pub(crate) enum KeySource {
    Metadata,
    Field(u32),
    Custom(Arc<KeyFn>),
}

impl UnaryMethod {
    /// The method at `path`, `/package.Service/Method` as gRPC sends it (tonic's generated
    /// server routes the same path), keyed by the layer's key metadata entry.
    ///
    /// ```
    /// # use idem::grpc::UnaryMethod;
    /// let m = UnaryMethod::new("/helloworld.Greeter/SayHello");
    /// # let _ = m;
    /// ```
    pub fn new(path: impl Into<String>) -> UnaryMethod {
        UnaryMethod {
            path: path.into(),
            key: KeySource::Metadata,
        }
    }

    /// The method named `method` of the tonic service `S` (its generated server type, whose
    /// [`NamedService::NAME`](tonic::server::NamedService::NAME) is `package.Service`).
    ///
    /// ```
    /// # use idem::grpc::UnaryMethod;
    /// struct Greeter;
    /// impl tonic::server::NamedService for Greeter {
    ///     const NAME: &'static str = "helloworld.Greeter";
    /// }
    /// assert_eq!(UnaryMethod::of::<Greeter>("SayHello").path(), "/helloworld.Greeter/SayHello");
    /// ```
    pub fn of<S: tonic::server::NamedService>(method: &str) -> UnaryMethod {
        UnaryMethod::new(format!("/{}/{method}", S::NAME))
    }

    /// Reads the key from the string field `number` at the top level of the request message
    /// (Google AIP-155's `string request_id`), instead of metadata. An absent or empty field is
    /// no key. The message must not be compressed: a compressed request with a key field gets
    /// `INVALID_ARGUMENT`.
    ///
    /// ```
    /// # use idem::grpc::UnaryMethod;
    /// // message CreateBookRequest { string parent = 1; Book book = 2; string request_id = 3; }
    /// let m = UnaryMethod::new("/library.v1.Library/CreateBook").key_field(3);
    /// # let _ = m;
    /// ```
    pub fn key_field(mut self, number: u32) -> UnaryMethod {
        self.key = KeySource::Field(number);
        self
    }

    /// Reads the key from the request message with `extract`, given the message's bytes
    /// (uncompressed protobuf): `Ok(None)` is no key, `Err(why)` answers `INVALID_ARGUMENT`
    /// with `why`. Decode the message with your own generated type, for a key inside a nested
    /// message, say.
    ///
    /// ```
    /// # use idem::grpc::UnaryMethod;
    /// let m = UnaryMethod::new("/bank.v1.Payments/Refund").key_from(|message| {
    ///     // In a real service: `RefundRequest::decode(message)` and its nested id.
    ///     Ok((!message.is_empty()).then(|| format!("refund-{}", message.len())))
    /// });
    /// # let _ = m;
    /// ```
    pub fn key_from(
        mut self,
        extract: impl Fn(&[u8]) -> Result<Option<String>, String> + Send + Sync + 'static,
    ) -> UnaryMethod {
        self.key = KeySource::Custom(Arc::new(extract));
        self
    }

    /// The method's path.
    ///
    /// ```
    /// # use idem::grpc::UnaryMethod;
    /// assert_eq!(UnaryMethod::new("/p.S/M").path(), "/p.S/M");
    /// ```
    pub fn path(&self) -> &str {
        &self.path
    }

    pub(crate) fn key(&self) -> &KeySource {
        &self.key
    }
}

impl From<&str> for UnaryMethod {
    fn from(path: &str) -> UnaryMethod {
        UnaryMethod::new(path)
    }
}

impl From<String> for UnaryMethod {
    fn from(path: String) -> UnaryMethod {
        UnaryMethod::new(path)
    }
}

impl fmt::Debug for UnaryMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = match &self.key {
            KeySource::Metadata => "metadata".to_owned(),
            KeySource::Field(n) => format!("field {n}"),
            KeySource::Custom(_) => "a function of the message".to_owned(),
        };
        f.debug_struct("UnaryMethod")
            .field("path", &self.path)
            .field("key", &key)
            .finish()
    }
}

/// The checked configuration every [`IdempotencyService`](super::IdempotencyService) of one
/// layer shares: what both protocols have, and gRPC's own settings, checked.
pub struct Config<C> {
    pub(crate) common: Common<C>,
    pub(crate) methods: HashMap<String, UnaryMethod>,
    pub(crate) key_metadata: HeaderName,
    pub(crate) store_if: Arc<StoreIfFn>,
}

impl<C> fmt::Debug for Config<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut methods: Vec<_> = self.methods.values().collect();
        methods.sort_by(|a, b| a.path.cmp(&b.path));
        self.common
            .fields(&mut f.debug_struct("grpc::IdempotencyLayer"))
            .field("methods", &methods)
            .field("key_metadata", &self.key_metadata)
            .field("max_request_message", &self.common.max_request)
            .finish_non_exhaustive()
    }
}

/// The gRPC layer's own settings, as its builder's setters leave them (checked by
/// [`LayerBuilder::build`]).
pub struct Settings {
    methods: Vec<UnaryMethod>,
    key_metadata: Option<String>,
    store_if: Arc<StoreIfFn>,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("methods", &self.methods)
            .field("key_metadata", &self.key_metadata)
            .finish_non_exhaustive()
    }
}

/// A tower [`Layer`](tower::Layer) for tonic servers that makes the unary calls it guards run once per key:
/// a retry gets the stored response (headers, message and trailers), marked
/// `idempotent-replayed: true`. See the [module documentation](super).
///
/// ```
/// use idem::grpc::IdempotencyLayer;
/// use idem::{Idempotency, MemoryStore};
///
/// let layer = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
///     .unary("/bank.v1.Payments/Create")
///     .caller(|parts| Some(parts.headers.get("x-api-key")?.to_str().ok()?.to_owned()))
///     .build()?;
/// // tonic::transport::Server::builder().layer(layer).add_service(…)
/// # let _ = layer;
/// # Ok::<(), idem::Error>(())
/// ```
///
/// This is the layer generic over the protocol, [`IdempotencyLayer<Grpc, C>`](crate::IdempotencyLayer),
/// for gRPC: its builder and setters are the gRPC layer's.
pub type IdempotencyLayer<C = JsonCodec> = crate::IdempotencyLayer<Grpc, C>;

/// The gRPC protocol of an [`IdempotencyLayer`]: its configuration and its service.
#[derive(Debug, Clone, Copy)]
pub enum Grpc {}

impl Sealed for Grpc {}

impl Protocol for Grpc {
    type Config<C> = Config<C>;
    type Settings = Settings;
    const SERVICE: &'static str = "grpc::IdempotencyService";
    const BUILDER: &'static str = "grpc::LayerBuilder";
    const WORDS: [&'static str; 3] = ["gRPC", "idempotency keys", "message"];
}

impl<C: Codec> IdempotencyLayer<C> {
    /// A [`LayerBuilder`] with the defaults. Before [`build`](LayerBuilder::build) it needs at
    /// least one [`unary`](LayerBuilder::unary) method, and
    /// [`caller`](LayerBuilder::caller) or [`shared_key_space`](LayerBuilder::shared_key_space).
    ///
    /// ```
    /// use idem::grpc::{IdempotencyLayer, UnaryMethod};
    /// use idem::{Idempotency, MemoryStore};
    /// let layer = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     .unary(UnaryMethod::new("/bank.v1.Payments/Transfer").key_field(3))
    ///     .shared_key_space()
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn builder(engine: Idempotency<C>) -> LayerBuilder<C> {
        LayerBuilder::with(
            engine,
            "grpc",
            4 << 20,
            Settings {
                methods: Vec::new(),
                key_metadata: None,
                store_if: Arc::new(stores_by_default),
            },
        )
    }
}

/// Configures a gRPC [`IdempotencyLayer`]. Defaults:
///
/// | setting | default |
/// |---|---|
/// | [`unary`](Self::unary) | none: [`build`](Self::build) needs at least one; every other path passes untouched |
/// | [`key_metadata`](Self::key_metadata) | `idempotency-key` |
/// | [`require_key`](Self::require_key) | `false`: a guarded call without a key runs unguarded |
/// | [`scope`](Self::scope) | `"grpc"` |
/// | [`caller`](Self::caller) or [`shared_key_space`](Self::shared_key_space) | none: [`build`](Self::build) refuses until one is chosen |
/// | [`lease`](Self::lease), [`retention`](Self::retention), [`on_locked`](Self::on_locked) | the engine's policy (30 s, 24 h, fail fast) |
/// | [`on_lapse`](Self::on_lapse) | the engine's policy (`OnLapse::Release`: a lapsed claim frees its key) |
/// | [`policy_version`](Self::policy_version) | `"grpc"`, the version of the message fingerprint's scheme |
/// | [`store_if`](Self::store_if) | [`stores_by_default`] |
/// | [`max_request_message`](Self::max_request_message) | 4 MiB (tonic's default) |
///
/// ```
/// use std::time::Duration;
/// use idem::grpc::{IdempotencyLayer, UnaryMethod};
/// use idem::{Idempotency, MemoryStore, OnLocked};
///
/// let layer = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
///     .unary("/bank.v1.Payments/Create")
///     .unary(UnaryMethod::new("/bank.v1.Payments/Transfer").key_field(3))
///     .key_metadata("x-request-id")
///     .require_key(true)
///     .scope("payments-grpc")
///     .caller(|parts| Some(parts.headers.get("x-api-key")?.to_str().ok()?.to_owned()))
///     .lease(Duration::from_secs(10))
///     .on_locked(OnLocked::Wait { timeout: Duration::from_secs(5) })
///     .store_if(|code| code == tonic::Code::Ok)
///     .max_request_message(64 * 1024)
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), idem::Error>(())
/// ```
///
/// This is the builder generic over the protocol,
/// [`LayerBuilder<Grpc, C>`](crate::LayerBuilder), for gRPC: the setters both protocols have
/// are written there, gRPC's own here.
pub type LayerBuilder<C = JsonCodec> = crate::LayerBuilder<Grpc, C>;

impl<C: Codec> LayerBuilder<C> {
    /// Guards the unary method `method`: a path such as `"/bank.v1.Payments/Create"` (keyed by
    /// metadata), or a [`UnaryMethod`] that says where its key comes from. Call it once per
    /// method. Every path not given here passes through the layer untouched, so streaming
    /// methods, which the layer cannot store, are never guarded: the layer cannot tell a
    /// unary call from a streaming one on the wire, so you say which methods are unary.
    ///
    /// ```
    /// # use idem::{grpc::{IdempotencyLayer, UnaryMethod}, Idempotency, MemoryStore};
    /// let b = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     .unary("/bank.v1.Payments/Create")
    ///     .unary(UnaryMethod::new("/bank.v1.Payments/Transfer").key_field(3));
    /// # let _ = b;
    /// ```
    pub fn unary(mut self, method: impl Into<UnaryMethod>) -> Self {
        self.settings.methods.push(method.into());
        self
    }

    /// The metadata entry that carries the key of methods keyed by metadata. Default
    /// `idempotency-key`. An ASCII entry (not `-bin`), lowercase as gRPC sends it.
    ///
    /// ```
    /// # use idem::{grpc::IdempotencyLayer, Idempotency, MemoryStore};
    /// let b = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     .key_metadata("x-idempotency-key");
    /// # let _ = b;
    /// ```
    pub fn key_metadata(mut self, name: impl Into<String>) -> Self {
        self.settings.key_metadata = Some(name.into());
        self
    }

    /// Which answers are stored and replayed, by gRPC status (from the trailers, or from the
    /// headers of a trailers-only response; a response without one, or whose HTTP status is not
    /// `200`, counts as `UNKNOWN`). An answer that is not stored goes to the client as it is
    /// and frees the key. Default [`stores_by_default`].
    ///
    /// ```
    /// # use idem::{grpc::{stores_by_default, IdempotencyLayer}, Idempotency, MemoryStore};
    /// use tonic::Code;
    /// let b = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     // Let a corrected request run under the same key.
    ///     .store_if(|code| stores_by_default(code) && code != Code::InvalidArgument);
    /// # let _ = b;
    /// ```
    pub fn store_if(mut self, predicate: impl Fn(Code) -> bool + Send + Sync + 'static) -> Self {
        self.settings.store_if = Arc::new(predicate);
        self
    }

    /// The largest request message the layer reads to fingerprint it, in bytes; a guarded call
    /// with a larger one gets `RESOURCE_EXHAUSTED` and nothing runs. Default 4 MiB, tonic's own
    /// default limit.
    ///
    /// ```
    /// # use idem::{grpc::IdempotencyLayer, Idempotency, MemoryStore};
    /// let b = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
    ///     .max_request_message(256 * 1024);
    /// # let _ = b;
    /// ```
    pub fn max_request_message(mut self, limit: usize) -> Self {
        self.common.max_request = limit;
        self
    }

    /// Checks the configuration and builds the layer. [`Error::InvalidConfig`] when: no unary
    /// method is given, a path is not `/package.Service/Method` or is given twice; neither
    /// [`caller`](Self::caller) nor [`shared_key_space`](Self::shared_key_space) was chosen,
    /// or both; the key metadata name is not a lowercase ASCII metadata name; the scope is not
    /// a valid key part; the lease or retention is out of range.
    ///
    /// ```
    /// # use idem::{grpc::IdempotencyLayer, Idempotency, MemoryStore, Error};
    /// let engine = Idempotency::new(MemoryStore::new());
    /// let nothing = IdempotencyLayer::builder(engine.clone()).shared_key_space().build();
    /// assert!(matches!(nothing, Err(Error::InvalidConfig(m)) if m.contains(".unary(")));
    /// let bad = IdempotencyLayer::builder(engine).shared_key_space().unary("Create").build();
    /// assert!(matches!(bad, Err(Error::InvalidConfig(_))));
    /// ```
    pub fn build(self) -> Result<IdempotencyLayer<C>, Error> {
        let bad = |m: String| Err(Error::InvalidConfig(m));
        let (mut common, settings) = self.checked()?;
        common
            .guard
            .policy
            .get_or_insert(super::wire::FINGERPRINT_VERSION);
        let mut config = Config {
            common,
            methods: HashMap::new(),
            key_metadata: IDEMPOTENCY_KEY,
            store_if: settings.store_if,
        };
        if settings.methods.is_empty() {
            return bad(
                "the gRPC layer guards no method: name each unary method with \
                 .unary(\"/package.Service/Method\"); every other path passes untouched"
                    .to_owned(),
            );
        }
        for method in settings.methods {
            let parts: Vec<&str> = method.path.split('/').collect();
            if !matches!(parts.as_slice(), ["", service, name] if !service.is_empty() && !name.is_empty())
            {
                return bad(format!(
                    "the gRPC layer's unary method {:?} is not a path of the form \
                     \"/package.Service/Method\"",
                    method.path
                ));
            }
            if let Some(old) = config.methods.insert(method.path.clone(), method) {
                return bad(format!(
                    "the gRPC layer's unary method {:?} is given twice; give each method once",
                    old.path
                ));
            }
        }
        if let Some(name) = settings.key_metadata {
            let valid = HeaderName::from_bytes(name.as_bytes())
                .ok()
                .filter(|h| h.as_str() == name && !name.ends_with("-bin"));
            match valid {
                Some(header) => config.key_metadata = header,
                None => {
                    return bad(format!(
                        "the gRPC layer's key_metadata {name:?} is not a lowercase ASCII \
                         metadata name (letters, digits, '-', '_' and '.', not ending in -bin)"
                    ))
                }
            }
        }
        Ok(IdempotencyLayer::from_config(config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use idem_core::MemoryStore;

    fn refused(b: LayerBuilder) -> String {
        match b.build() {
            Err(Error::InvalidConfig(m)) => m,
            other => panic!("built: {other:?}"),
        }
    }

    fn builder() -> LayerBuilder {
        IdempotencyLayer::builder(Idempotency::new(MemoryStore::new())).unary("/p.S/M")
    }

    #[test]
    fn build_refuses_what_cannot_work() {
        assert!(refused(builder()).contains(".shared_key_space()"));
        assert!(refused(builder().shared_key_space().caller(|_| None)).contains("both"));
        assert!(refused(builder().shared_key_space().unary("/p.S/M")).contains("twice"));
        for path in ["p.S/M", "/p.S", "/p.S/", "//M", "/p.S/M/x"] {
            let m = refused(builder().shared_key_space().unary(path));
            assert!(m.contains("/package.Service/Method"), "{path}: {m}");
        }
        for name in ["Idempotency-Key", "key-bin", "a key", ""] {
            let m = refused(builder().shared_key_space().key_metadata(name));
            assert!(m.contains("metadata name"), "{name}: {m}");
        }
        assert!(refused(builder().shared_key_space().scope("")).contains("scope"));
        assert!(matches!(
            builder().shared_key_space().lease(Duration::ZERO).build(),
            Err(Error::InvalidConfig(_))
        ));
    }

    #[test]
    fn builds_with_every_setting() {
        let layer = builder()
            .unary(UnaryMethod::new("/p.S/N").key_field(3))
            .unary(UnaryMethod::new("/p.S/O").key_from(|_| Ok(None)))
            .key_metadata("x-request-id")
            .caller(|_| Some("c".into()))
            .build()
            .unwrap();
        let debug = format!("{layer:?}");
        assert!(
            debug.contains("field 3") && debug.contains("x-request-id"),
            "{debug}"
        );
        assert_eq!(layer.config().methods.len(), 3);
        assert_eq!(layer.config().key_metadata, "x-request-id");
    }
}
