//! A Mermaid picture of a machine, for docs and operators.

use crate::StateMachine;
use crate::operator::MachineGraph;

/// Renders machine `M` as a Mermaid `stateDiagram-v2` ([`MachineGraph::mermaid`]).
///
/// Every declared transition becomes an arrow, the initial state hangs off `[*]` and
/// every terminal state leads to `[*]`. States with a rollback handler get the class
/// `rollback` (drawn red), points of no return the class `no_rollback` (drawn grey).
/// Paste the text into any Markdown renderer that knows Mermaid (GitHub does).
#[must_use]
pub fn mermaid<M: StateMachine>() -> String {
    MachineGraph::of::<M>().mermaid()
}
