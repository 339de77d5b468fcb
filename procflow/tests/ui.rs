//! Every compile error of `#[derive(StateMachine)]`, locked with its exact message and
//! position (`tests/ui/<topic>/<mistake>.rs` beside its `.stderr`).
//!
//! After an intended change to a message: `TRYBUILD=overwrite cargo test -p procflow --test ui`,
//! then read every changed `.stderr` before committing it.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*/*.rs");
}
