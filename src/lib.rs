//! placeholder
pub use idem_core::*;
