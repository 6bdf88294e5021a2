//! For store authors, in-tree and out: what a store needs of idem-core beyond its public API.
//! The stores of the idem crates (`idem-sql`, `idem-redis`, `idem-dynamodb`, `idem-remote`) use
//! these, and a store of your own may.
//!
//! **Not covered by semver**: these items change with idem-core's internals, in any release.
//! Pin idem-core with `=` as the idem crates do (`idem-core = "=0.1.0"`), as sqlx's drivers pin
//! sqlx-core (its "Semver Exempt API").

pub use crate::store::check_duration;

/// The engine's envelope, which it opens as
/// [`Error::ResultNotRetained`](crate::Error::ResultNotRetained). `RemoteStore` writes it for a
/// result its server did not keep; a later release makes the engine seal it, and stores stop
/// writing the engine's envelope.
pub use crate::envelope::not_retained;
