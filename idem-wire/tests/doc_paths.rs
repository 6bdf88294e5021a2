//! idem-server's users read this crate's docs (the protocol's types) with the service's, and
//! RemoteStore's users through the facade `idem`; neither writes `idem_core::` or `idem_wire::`
//! paths from them, so no doc comment shows one (an intra-doc link's target may name it).

#[test]
fn docs_name_paths_as_the_facade_does() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    idem_test_support::docs_name_facade_paths(&src, &["idem_core::"], 4);
}
