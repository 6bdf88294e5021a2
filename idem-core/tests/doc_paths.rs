//! Users depend on the facade, `idem`, which re-exports this crate: its documentation (rendered
//! as `idem`'s on docs.rs) names paths as `idem::…`, so every example compiles as a user pastes
//! it. An `idem_core::` path in idem-core's sources (doc comments, and the doc strings its
//! macros build) would not resolve in such an app; inside the crate code says `crate::`.

use std::path::Path;

#[test]
fn docs_name_paths_as_the_facade_does() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    idem_test_support::sources_name_facade_paths(&src, &["idem_core::"], 40);
}
