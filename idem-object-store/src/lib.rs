//! [`OffloadStore`]: results of any size for [idem](https://docs.rs/idem), kept in object
//! storage (S3, GCS, Azure Blob Storage, a local directory) through the
//! [`object_store`](https://docs.rs/object_store) crate, with a small pointer in the record.
//!
//! Depend on `idem` with its feature `object-store`, which re-exports this crate's types as
//! `idem::OffloadStore` and `idem::OffloadStoreBuilder`, and object_store itself as
//! `idem::object_store`; this crate is the seam that shows object_store (0.14) in its API, so a
//! new version of it changes this crate only. object_store's backends are its cargo features,
//! passed through here under the same names: `aws` (S3 and S3-compatible stores), `gcp`,
//! `azure` and `fs` (a local directory); with none, its `InMemory` store is there for tests.
//!
//! ```
//! use std::sync::Arc;
//! use idem::object_store::memory::InMemory;
//! use idem::{Idempotency, MemoryStore, OffloadStore};
//! // In production: `AmazonS3Builder::from_env().with_bucket_name("results").build()?` (feature
//! // `aws`), or `LocalFileSystem::new_with_prefix(dir)?` (feature `fs`), and your store.
//! let bucket = Arc::new(InMemory::new());
//! let store = OffloadStore::builder(MemoryStore::new(), bucket).prefix("idem").build()?;
//! let engine = Idempotency::new(store);
//! assert_eq!(engine.policy().max_response_bytes(), 1 << 30); // the store's limit, not 1 MiB
//! # Ok::<(), idem::Error>(())
//! ```
//!
//! docs/offload.md has the round trips, the order of writes and what a crash leaves at each
//! point, the pruner and the bucket lifecycle rule that can stand in for it, peak memory and
//! the limits.
//!
//! | file | what it holds |
//! |---|---|
//! | `store.rs` | the wrapper and its builder: what it does differently from the store it wraps |
//! | `objects.rs` | uploads, checked downloads, the pruning of ended hours, object_store's errors as idem's |
//! | `pointer.rs` | the bytes a record keeps in place of an offloaded result |
//! | `hours.rs` | the hour (UTC) in an object's name |
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]

mod hours;
mod objects;
mod pointer;
mod store;

pub use object_store;
pub use store::{OffloadStore, OffloadStoreBuilder};

// docs/offload.md's examples are compiled as doc tests, so they never rot; here rather than in
// the facade, so that its S3 and local-directory example sees this crate's features.
#[cfg(doctest)]
#[doc = include_str!("../../docs/offload.md")]
struct OffloadDoctests;
