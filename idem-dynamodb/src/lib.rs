//! [`DynamoStore`]: idempotency records in an Amazon DynamoDB table, for
//! [idem](https://docs.rs/idem); [`DynamoSteps`], the atomic step that commits a caller's
//! writes with the step's record in one `TransactWriteItems`; and [`DynamoOutbox`], the
//! transactional outbox whose messages a caller adds to its own `TransactWriteItems`.
//!
//! Depend on `idem` with its feature `dynamodb`, which re-exports this crate's items as
//! `idem::DynamoStore`, `idem::DynamoSteps`, `idem::MAX_DYNAMO_STEP_WRITES`,
//! `idem::DynamoOutbox`, `idem::MAX_DYNAMO_OUTBOX_SHARDS` and `idem::aws_sdk_dynamodb`; this
//! crate is the seam that shows [`aws-sdk-dynamodb`](https://docs.rs/aws-sdk-dynamodb), so a
//! bump of it changes this crate only.
//!
//! Each store backend has the same file set, named for its jobs (idem-redis's is the same, with
//! `scripts.rs` for `item.rs` and no `steps.rs`, `outbox.rs`, `table.rs`, `errors.rs` or
//! `endpoint.rs`):
//!
//! | file | what it holds |
//! |---|---|
//! | `store.rs` | the store and its builder: the client, the [`Store`](idem_core::Store) impl |
//! | `admin.rs` | [`StoreAdmin`](idem_core::StoreAdmin): listing and counting by a `Scan` of the table |
//! | `completer.rs` | [`Store::find_abandoned`](idem_core::Store::find_abandoned): a `Scan` of the steps items |
//! | `item.rs` | the record's item: its attributes and how it is read (Redis's `scripts.rs` is its counterpart) |
//! | `steps.rs` | the steps item, and [`DynamoSteps`] |
//! | `outbox.rs` | [`DynamoOutbox`]: its table, its item and its [`OutboxSource`](idem_core::OutboxSource) impl |
//! | `table.rs` | the table: its name, creating it, its TTL |
//! | `errors.rs` | a failed request's [`StoreErrorKind`](idem_core::StoreErrorKind) |
//! | `endpoint.rs` | a client from the environment or an endpoint URL |
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]

mod admin;
mod completer;
mod endpoint;
mod errors;
mod item;
mod outbox;
mod steps;
mod store;
mod table;

/// The aws-sdk-dynamodb (1.x) whose `Client` a [`DynamoStore`] is built on. Use this path to
/// name the very version idem uses.
pub use aws_sdk_dynamodb;
pub use outbox::{DynamoOutbox, DynamoOutboxBuilder, MAX_DYNAMO_OUTBOX_SHARDS};
pub use steps::{DynamoSteps, MAX_DYNAMO_STEP_WRITES};
pub use store::{DynamoStore, DynamoStoreBuilder};
