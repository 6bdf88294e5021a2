//! Compile-time behaviour of `#[idempotent]`: working uses under `ui/pass` (compiled and run),
//! mistakes under `ui/fail` with the compiler output they must produce.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
