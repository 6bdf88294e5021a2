//! idem makes retried work safe.
//!
//! A client retries a request, a queue redelivers a message, a function is invoked again after
//! a timeout: with idem the work runs once per key and every caller gets the same answer. Each
//! call claims its key in a store with a short, renewed lease; the result is stored when the
//! work succeeds and replayed to duplicates until its retention ends. A failure, cancellation
//! or crash releases the key, so a retry runs again.
//!
//! This crate is the one to depend on. It re-exports everything of `idem-core` (keys, records,
//! the [`Store`] trait and its backends, the [`Idempotency`] engine) with the [`idempotent`]
//! attribute and, by cargo feature, the crates of the other stores and ways in (`redis`,
//! `dynamodb`, `remote`, `object-store`, `http`, `grpc`, `consumer`, …), so every path is
//! `idem::…` whichever crate holds the item. [`store::url`] opens any store of the build from a
//! URL.
//!
//! # The attribute
//!
//! ```
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::time::Duration;
//! use idem::{idempotent, Idempotency, MemoryStore, OnLocked};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Debug, thiserror::Error)]
//! enum PayError {
//!     #[error(transparent)]
//!     Idem(#[from] idem::Error),
//! }
//!
//! #[derive(Debug, PartialEq, Serialize, Deserialize)]
//! struct Charge { charge_no: u64, cents: u64 }
//!
//! static CHARGES: AtomicU64 = AtomicU64::new(0);
//!
//! /// Charges once per message id, even when the queue delivers the message twice at once.
//! #[idempotent(
//!     key = message_id,
//!     scope = "charge",
//!     engine = engine,
//!     on_locked = OnLocked::Wait { timeout: Duration::from_secs(10) },
//! )]
//! async fn charge(engine: &Idempotency, message_id: &str, cents: u64) -> Result<Charge, PayError> {
//!     let charge_no = CHARGES.fetch_add(1, Ordering::SeqCst) + 1;
//!     Ok(Charge { charge_no, cents })
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), PayError> {
//! let engine = Idempotency::new(MemoryStore::new());
//! let (a, b) = tokio::join!(charge(&engine, "msg-1", 500), charge(&engine, "msg-1", 500));
//! assert_eq!(a?, b?); // two deliveries, two identical answers...
//! assert_eq!(CHARGES.load(Ordering::SeqCst), 1); // ...and one charge
//!
//! // The same key with another amount is another request: refused, not replayed.
//! let reused = charge(&engine, "msg-1", 900).await;
//! assert!(matches!(reused, Err(PayError::Idem(idem::Error::KeyReused))));
//! # Ok(()) }
//! ```
//!
//! The fingerprint that tells requests apart is, by default, the function's arguments but the
//! engine, the key, the caller and a transaction (here `cents`); `fingerprint = <expr>` names
//! another, `fingerprint = ()` none. The arguments, the default fingerprint, what each call
//! returns, and the expansion are described on [`idempotent`].
//!
//! # The engine, without the attribute
//!
//! ```
//! use idem::{Error, Idempotency, Key, MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! let engine = Idempotency::new(MemoryStore::new());
//! let key = Key::derive("charge", "tenant-7", "msg-1")?;
//! let first = engine.call(key).run(async { Ok::<_, Error>(500u64) }).await?;
//! let again = engine.call(key).run(async { Ok::<_, Error>(999u64) }).await?;
//! assert!(!first.is_replayed());
//! assert!(again.is_replayed());
//! assert_eq!(again.into_inner(), 500); // the second future never ran
//! # Ok(()) }
//! ```
//!
//! # Metrics in Prometheus
//!
//! With the feature `metrics`, idem records its counters and histograms through the
//! [`metrics`](https://docs.rs/metrics) facade. `metrics-exporter-prometheus` renders a histogram
//! as a summary unless buckets are set for it: [`PROMETHEUS_BUCKETS`] holds the bounds idem
//! recommends for each of its histograms.
//!
//! ```
//! # #[cfg(feature = "metrics")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use idem::{Error, Idempotency, Key, MemoryStore, PROMETHEUS_BUCKETS};
//! use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
//!
//! let mut prometheus = PrometheusBuilder::new();
//! for (name, bounds) in PROMETHEUS_BUCKETS {
//!     prometheus = prometheus.set_buckets_for_metric(Matcher::Full(name.to_string()), bounds)?;
//! }
//! let metrics = prometheus.install_recorder()?; // before the engine is built
//!
//! let engine = Idempotency::builder(MemoryStore::new()).sample_latencies(1).build()?;
//! let key = Key::derive("charge", "", "order-1")?;
//! engine.call(key).scope("charge").run(async { Ok::<_, Error>(7) }).await?;
//!
//! let text = metrics.render();
//! assert!(text.contains(r#"idem_claim_seconds_bucket{scope="charge",le="0.001"}"#));
//! assert!(!text.contains("quantile")); // histograms, not summaries
//! # Ok(()) }
//! # #[cfg(not(feature = "metrics"))] fn main() {}
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]

pub use idem_core::*;

#[cfg(feature = "remote")]
#[cfg_attr(docsrs, doc(cfg(feature = "remote")))]
pub use idem_remote::{RemoteStore, RemoteStoreBuilder};

#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres"))))]
pub use idem_sql::{
    sql_error, sqlx, ClaimOrder, SqlOutbox, SqlSteps, SqlStore, SqlStoreBuilder, Transactional,
    TransactionalStore, TxCall, TxClaim, TxClaimOutcome, TxFuture, MAX_OUTBOX_MESSAGES_PER_ADD,
};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use idem_sql::{PostgresOutbox, PostgresStore, PostgresStoreBuilder};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use idem_sql::{SqliteOutbox, SqliteStore, SqliteStoreBuilder, SqliteSync};

/// The concurrency kit: optimistic concurrency and request deduplication for the data that
/// retried work changes.
///
/// Four strategies, each for a different store: [versioned updates](kit::VersionedTable), [event
/// streams](kit::EventStreams) and [request history](kit::RequestHistory) on SQLite and
/// PostgreSQL (features `sqlite`, `postgres`: the idem-sql crate's half, which compares them with
/// their round trips), and [recent ids](kit::RecentIds) for any store, with
/// [`retry_on_conflict`](kit::retry_on_conflict) (idem-core's half). docs/kit.md shows each at
/// work.
pub mod kit {
    pub use idem_core::kit::*;
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub use idem_sql::kit::*;
}

/// The [`Store`] trait and its backends, and [`url`](store::url): the store a URL names.
///
/// Everything of `idem_core::store`, and the URL parser and opener, which knows every store of
/// this build and so lives in the facade.
pub mod store {
    pub use idem_core::store::*;

    pub mod url;
}

#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
#[doc(inline)]
pub use idem_tower::http;

#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
#[doc(inline)]
pub use idem_tower::grpc;

#[cfg(any(feature = "http", feature = "grpc", feature = "remote"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "http", feature = "grpc", feature = "remote")))
)]
#[doc(inline)]
pub use idem_tower::StoredResponse;

#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
pub use idem_dynamodb::{
    aws_sdk_dynamodb, DynamoOutbox, DynamoOutboxBuilder, DynamoSteps, DynamoStore,
    DynamoStoreBuilder, MAX_DYNAMO_OUTBOX_SHARDS, MAX_DYNAMO_STEP_WRITES,
};
#[cfg(feature = "object-store")]
#[cfg_attr(docsrs, doc(cfg(feature = "object-store")))]
pub use idem_object_store::{object_store, OffloadStore, OffloadStoreBuilder};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use idem_redis::{RedisStore, RedisStoreBuilder};

#[doc(inline)]
pub use idem_macros::idempotent;

/// Queue consumers: batches of messages through the engine, one outcome per message (the
/// `idem-consumer` crate; features `consumer`, and `sqs`, `lambda`, `nats`, `kafka` for the
/// brokers).
#[cfg(feature = "consumer")]
#[cfg_attr(docsrs, doc(cfg(feature = "consumer")))]
pub use idem_consumer as consumer;

// The attribute's expansion calls `::idem::__private::…`: idem-core's, and with `transaction =
// …` idem-sql's (`tx_begin`, `tx_end`, `tx_connection`). The generated code depends on this path,
// so it is spelled out.
#[doc(hidden)]
pub mod __private {
    pub use idem_core::__private::*;
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub use idem_sql::__private::*;
}

// The README's examples are compiled as doc tests, so they never rot; so are those of the docs
// the README's sections moved to.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/attribute.md")]
struct AttributeDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/kit.md")]
struct KitDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/stores.md")]
struct StoresDoctests;

#[cfg(all(doctest, feature = "consumer", feature = "sqlite"))]
#[doc = include_str!("../docs/consumers.md")]
struct ConsumersDoctests;
#[cfg(all(doctest, feature = "sqlite"))]
#[doc = include_str!("../docs/steps.md")]
struct StepsDoctests;

#[cfg(all(doctest, feature = "dynamodb", feature = "sqlite"))]
#[doc = include_str!("../docs/outbox.md")]
struct OutboxDoctests;

#[cfg(all(doctest, feature = "remote"))]
#[doc = include_str!("../docs/server.md")]
struct ServerDoctests;

#[cfg(all(doctest, feature = "encryption", feature = "sqlite"))]
#[doc = include_str!("../docs/encryption.md")]
struct EncryptionDoctests;
