//! idem-server: idempotency as a service. It speaks Diom's idempotency protocol (routes, JSON
//! and MessagePack, result shapes, error bodies, status codes), so Diom's published clients work
//! unchanged, on idem's engine and stores, and adds a fenced extension (a claim token from
//! `start`, fenced `complete`/`abort`/`renew`, a fingerprint, a switch that requires tokens).
//! See docs/server.md.
//!
//! ```
//! use std::sync::Arc;
//! use idem_core::MemoryStore;
//! use idem_server::{auth::Tokens, router, App, Config};
//! let app = App::new(
//!     Arc::new(MemoryStore::new()),
//!     Tokens::new("admin-token-0123456789", &["billing=billing-token-0123456789".into()])?,
//!     Config::default(),
//!     None,
//! )?;
//! let routes: axum::Router = router(app);
//! # let _ = routes; Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod auth;
mod issued;
pub mod keys;
pub mod namespaces;
mod service;
pub mod uncertain;
pub mod wire;

pub use service::{router, App, Config, OPENAPI, OPENAPI_PATH};
