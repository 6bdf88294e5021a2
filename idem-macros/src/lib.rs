use proc_macro::TokenStream;
#[proc_macro_attribute]
pub fn idempotent(_a: TokenStream, item: TokenStream) -> TokenStream {
    item
}
