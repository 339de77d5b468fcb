//! A Mermaid picture of a machine, for docs and operators.

use crate::StateMachine;
use std::fmt::Write;

/// Renders machine `M` as a Mermaid `stateDiagram-v2`.
///
/// Every declared transition becomes an arrow, the initial state hangs off `[*]` and
/// every terminal state leads to `[*]`. States with a rollback handler get the class
/// `rollback` (drawn red), points of no return the class `no_rollback` (drawn grey).
/// Paste the text into any Markdown renderer that knows Mermaid (GitHub does).
#[must_use]
pub fn mermaid<M: StateMachine>() -> String {
    let mut out = String::from("stateDiagram-v2\n");
    // Writing to a String cannot fail.
    let _ = writeln!(out, "    [*] --> {}", M::INITIAL.name());
    for (from, to) in M::EDGES {
        let _ = writeln!(out, "    {} --> {}", from.name(), to.name());
    }
    for terminal in M::TERMINALS {
        let _ = writeln!(out, "    {} --> [*]", terminal.name());
    }
    push_class::<M>(&mut out, "rollback", "fill:#fde2e2,stroke:#c0392b", |s| {
        s.has_rollback()
    });
    push_class::<M>(&mut out, "no_rollback", "fill:#e0e0e0,stroke:#555", |s| {
        s.is_point_of_no_return()
    });
    out
}

fn push_class<M: StateMachine>(
    out: &mut String,
    class: &str,
    style: &str,
    member: impl Fn(M) -> bool,
) {
    let members: Vec<&str> = M::STATES
        .iter()
        .copied()
        .filter(|state| member(*state))
        .map(StateMachine::name)
        .collect();
    if !members.is_empty() {
        let _ = writeln!(out, "    classDef {class} {style}");
        let _ = writeln!(out, "    class {} {class}", members.join(","));
    }
}
