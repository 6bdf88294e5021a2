//! idem's tower layers: `http` (feature `http`), the tower/axum layer that makes requests
//! carrying an `Idempotency-Key` header run once and replays their stored response, and `grpc`
//! (feature `grpc`), the tower layer for tonic servers that does the same for unary calls. Both
//! are one capture core: a response read whole (status, headers, body, trailers), stored by the
//! engine in one byte format, [`StoredResponse`], and rebuilt exactly on a replay.
//!
//! Depend on the `idem` crate with its feature `http` or `grpc`, which re-exports these as
//! `idem::http` and `idem::grpc`. This crate shows the APIs of http 1, tower 0.5, axum-core 0.5
//! and tonic 0.14; idem-core shows none of them.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(any(feature = "http", feature = "grpc"))]
mod capture;
#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
pub mod grpc;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
#[cfg(any(feature = "http", feature = "grpc"))]
mod layer;
#[cfg(any(feature = "http", feature = "grpc"))]
mod problem;
mod stored_response;

#[cfg(any(feature = "http", feature = "grpc"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "http", feature = "grpc"))))]
pub use layer::{IdempotencyLayer, IdempotencyService, LayerBuilder, Protocol, Serve};
pub use stored_response::StoredResponse;
