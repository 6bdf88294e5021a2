//! Users depend on the facade, `idem`, which re-exports this crate's items: their documentation
//! (rendered as `idem`'s on docs.rs) names paths as `idem::…`, so every example compiles as a
//! user pastes it. The code of this crate says `idem_core::` and `crate::`; its docs may link
//! to such a path (`[x](idem_core::X)`, resolved by rustdoc), but a path they show (an example,
//! prose in backticks) is `idem::…`. idem-core's `tests/doc_paths.rs` checks the same of its own.

#[test]
fn docs_name_paths_as_the_facade_does() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    idem_test_support::docs_name_facade_paths(&src, &["idem_core::", "idem_object_store::"], 4);
}
