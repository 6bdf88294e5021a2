//! idem makes retried work safe.
#![forbid(unsafe_code)]

pub use idem_core::*;
pub use idem_macros::idempotent;

#[doc(hidden)]
pub use idem_core::__private;
