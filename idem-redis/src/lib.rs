//! [`RedisStore`]: idempotency records in Redis or Valkey, one server or a Redis Cluster,
//! through one type, for [idem](https://docs.rs/idem).
//!
//! Depend on `idem` with its feature `redis`, which re-exports this crate's types as
//! `idem::RedisStore` and `idem::RedisStoreBuilder`; this crate is the seam that shows the
//! [`redis`](https://docs.rs/redis) crate, so a bump of it changes this crate only.
//!
//! Each store backend has the same file set, named for its jobs (idem-dynamodb's is the same,
//! plus what only DynamoDB needs):
//!
//! | file | what it holds |
//! |---|---|
//! | `store.rs` | the store and its builder: connections, the [`Store`](idem_core::Store) impl, errors |
//! | `admin.rs` | [`StoreAdmin`](idem_core::StoreAdmin): listing and counting by a `SCAN` of every master |
//! | `completer.rs` | [`Store::find_abandoned`](idem_core::Store::find_abandoned): a `SCAN` of the steps hashes |
//! | `scripts.rs` | the Lua scripts every state change runs (DynamoDB's `item.rs` is its counterpart: the record's shape) |
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]

mod admin;
mod completer;
mod scripts;
mod store;

pub use store::{RedisStore, RedisStoreBuilder};
