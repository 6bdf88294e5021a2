//! `RemoteStore`: a `Store` kept by an idem-server, reached over HTTP/1.1
//! (hyper-util's pooled client, plain `http://`) with MessagePack bodies. Every `Store` call is
//! one request to the server's fenced routes; the bodies are the types of `idem-wire`, which
//! the server decodes and answers with too, so the protocol is written once.
//!
//! Depend on `idem` with the feature `remote` rather than on this crate: `idem::RemoteStore`
//! and `idem::RemoteStoreBuilder` are these types, and `idem::store::url` opens an
//! `idem+http://HOST:PORT?token=TOKEN` URL with them.
//!
//! ```no_run
//! use idem::{Idempotency, Key, RemoteStore};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem::Error> {
//! let store = RemoteStore::builder("http://idem-server:8624", "billing-token-0123456789").build()?;
//! let idem = Idempotency::new(store);
//! let receipt = idem.call(Key::derive("charge", "", "order-1")?).run(async { Ok::<_, idem::Error>(42) }).await?;
//! assert_eq!(receipt.into_inner(), 42);
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod store;

pub use store::{RemoteStore, RemoteStoreBuilder};
