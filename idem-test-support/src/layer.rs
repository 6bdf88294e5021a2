//! What the HTTP and gRPC layer tests share: a server started behind the suite's layer on a
//! store ([`LayerServer`]), and reading the headers of the responses it sends ([`Headers`]).

use std::future::Future;
use std::sync::Arc;

use idem_core::{Idempotency, Store};

/// A layer suite's test server, started behind the layer the suite's builder makes: on an engine
/// of the store ([`start`](Self::start)) or on one of the test's own
/// ([`start_with`](Self::start_with)), each configured by the test.
///
/// ```
/// use std::sync::Arc;
/// use idem_core::{Idempotency, MemoryStore, Store};
/// use idem_test_support::layer::LayerServer;
///
/// /// A "server" that keeps the settings of the builder it was started with.
/// struct Settings(Vec<&'static str>);
///
/// impl LayerServer for Settings {
///     type Builder = Vec<&'static str>;
///
///     fn builder(_: Idempotency) -> Vec<&'static str> {
///         vec!["by x-caller"]
///     }
///
///     async fn build_and_serve(_: Arc<dyn Store>, builder: Vec<&'static str>) -> Settings {
///         Settings(builder)
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
/// let started = Settings::start(store, |mut b| {
///     b.push("lease 5 s");
///     b
/// })
/// .await;
/// assert_eq!(started.0, ["by x-caller", "lease 5 s"]);
/// # });
/// ```
pub trait LayerServer: Sized {
    /// The layer's builder.
    type Builder;

    /// The suite's builder on `engine`, before a test configures it.
    fn builder(engine: Idempotency) -> Self::Builder;

    /// Serves the suite's service behind the layer `builder` builds, whose records are in
    /// `store`.
    fn build_and_serve(store: Arc<dyn Store>, builder: Self::Builder)
        -> impl Future<Output = Self>;

    /// Serves behind the suite's layer on an engine of `store`, configured by `configure`.
    fn start(
        store: Arc<dyn Store>,
        configure: impl FnOnce(Self::Builder) -> Self::Builder,
    ) -> impl Future<Output = Self> {
        Self::start_with(Idempotency::from_arc(store.clone()), store, configure)
    }

    /// [`start`](Self::start) with an engine of the test's own.
    fn start_with(
        engine: Idempotency,
        store: Arc<dyn Store>,
        configure: impl FnOnce(Self::Builder) -> Self::Builder,
    ) -> impl Future<Output = Self> {
        Self::build_and_serve(store, configure(Self::builder(engine)))
    }
}

/// A response as a layer test reads it: its headers, (name, value) in arrival order.
///
/// ```
/// use idem_test_support::layer::Headers;
///
/// struct Reply(Vec<(String, Vec<u8>)>);
///
/// impl Headers for Reply {
///     fn headers(&self) -> &[(String, Vec<u8>)] {
///         &self.0
///     }
/// }
///
/// let reply = Reply(vec![
///     ("content-type".into(), b"text/plain".to_vec()),
///     ("idempotent-replayed".into(), b"true".to_vec()),
/// ]);
/// assert_eq!(reply.header("content-type"), Some("text/plain"));
/// assert!(reply.replayed());
/// assert_eq!(reply.headers_unmarked().len(), 1);
/// ```
pub trait Headers {
    /// Every header, (name, value) in arrival order; names in lowercase.
    fn headers(&self) -> &[(String, Vec<u8>)];

    /// The first header `name`, as text.
    fn header(&self, name: &str) -> Option<&str> {
        let (_, value) = self.headers().iter().find(|(n, _)| n == name)?;
        Some(std::str::from_utf8(value).unwrap())
    }

    /// Whether the layer marked the response a replay (`idempotent-replayed: true`).
    fn replayed(&self) -> bool {
        self.header(REPLAYED) == Some("true")
    }

    /// The headers without the replay marker.
    fn headers_unmarked(&self) -> Vec<(String, Vec<u8>)> {
        self.headers()
            .iter()
            .filter(|(n, _)| n != REPLAYED)
            .cloned()
            .collect()
    }
}

/// `headers` as a layer test keeps them ([`Headers::headers`]): (name, value) in arrival order,
/// `date` left out (the server writes it per message, so two answers would never compare equal).
///
/// ```
/// use http::{HeaderMap, HeaderValue};
/// let mut headers = HeaderMap::new();
/// headers.insert("date", HeaderValue::from_static("Sat, 28 Nov 2026 01:00:00 GMT"));
/// headers.insert("content-type", HeaderValue::from_static("application/grpc"));
/// let kept = idem_test_support::layer::kept_headers(&headers);
/// assert_eq!(kept, [("content-type".to_owned(), b"application/grpc".to_vec())]);
/// ```
pub fn kept_headers(headers: &http::HeaderMap) -> Vec<(String, Vec<u8>)> {
    headers
        .iter()
        .filter(|(n, _)| n.as_str() != "date")
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect()
}

/// The header both layers mark a replay with (`Idempotent-Replayed`, as HTTP/2 and the tests'
/// clients spell it).
const REPLAYED: &str = "idempotent-replayed";
