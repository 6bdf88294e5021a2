//! Compile-time behaviour of `#[idempotent]`: working uses under `ui/pass` (compiled and run),
//! mistakes under `ui/fail` with the compiler output they must produce.
//!
//! The `.stderr` files hold rustc's exact wording, which changes between compiler releases. So
//! the tests run only on the compiler the files were written with (rustc 1.95, any patch
//! release); on any other compiler the test passes after printing why it did not run, and a
//! new stable release cannot break CI. To move to a new compiler, regenerate the files with it,
//! read every changed `.stderr` (a message may have got worse, not only different), and change
//! the version below:
//!
//! ```text
//! TRYBUILD=overwrite cargo test -p idem-macros --test ui
//! ```

#[rustversion::stable(1.95)]
#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}

#[rustversion::not(stable(1.95))]
#[test]
fn ui() {
    eprintln!(
        "skipped: the ui tests' .stderr files were written with rustc 1.95, and compiler \
         messages change between releases; see tests/ui.rs to regenerate them for this compiler"
    );
}
