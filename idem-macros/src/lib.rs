//! The `#[idempotent]` attribute of [idem](https://docs.rs/idem). Depend on `idem`, which
//! re-exports it: the expansion calls into `::idem::__private`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod attr;
mod duration;
mod expand;

use proc_macro::TokenStream;

/// Makes an `async fn` idempotent (docs to come).
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::idempotent(args.into(), item.into()).into()
}
