//! A machine's graph as data: what the derive knows about its states and transitions,
//! stored by the executor so that tools without the machine's types (the `procflow` CLI,
//! the admin page) can draw it, and a procedure's path on it.

use crate::{StateInfo, StateMachine};
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// Metadata key prefix under which an executor stores the graph of each machine it runs.
pub(crate) const MACHINE_PREFIX: &str = "procflow/machine/";

/// One state of a [`MachineGraph`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateNode {
    /// The variant's name.
    pub name: String,
    /// `#[initial]`.
    pub initial: bool,
    /// `#[terminal]`.
    pub terminal: bool,
    /// `#[rollback]`: it has an undo handler.
    pub rollback: bool,
    /// `#[no_rollback]`: a point of no return.
    pub no_rollback: bool,
}

/// A machine's states and declared transitions.
///
/// # Examples
///
/// ```
/// # use procflow::prelude::*;
/// # #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
/// # #[state_machine(procedure = Job)]
/// # enum JobState {
/// #     #[initial] #[transition(to = [Work])] #[rollback] Start,
/// #     #[transition(to = [Done])] Work,
/// #     #[terminal] Done,
/// # }
/// # #[derive(serde::Serialize, serde::Deserialize)] struct Job;
/// # impl JobStateHandlers for Job {
/// #     async fn start(&mut self, _: &Context<()>) -> Step<job_state::Start> { Ok(job_state::Start::Work.into()) }
/// #     async fn work(&mut self, _: &Context<()>) -> Step<job_state::Work> { Ok(job_state::Work::Done.into()) }
/// #     async fn rollback_start(&mut self, _: &Context<()>) -> Result<(), Error> { Ok(()) }
/// # }
/// use procflow::operator::{MachineGraph, PathOnGraph};
///
/// let graph = MachineGraph::of::<JobState>();
/// assert_eq!(graph.edges, [("Start".to_owned(), "Work".to_owned()), ("Work".to_owned(), "Done".to_owned())]);
/// let path = PathOnGraph { current: "Work".into(), visited: vec!["Start".into()], ..PathOnGraph::default() };
/// assert!(graph.mermaid_with(&path).contains("class Work current"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineGraph {
    /// The machine's stable name.
    pub name: String,
    /// Its states, in declaration order.
    pub states: Vec<StateNode>,
    /// Its transitions `(from, to)`, as declared.
    pub edges: Vec<(String, String)>,
}

/// A procedure's way through its machine, to draw on the graph.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PathOnGraph {
    /// The state it is in (or ended in).
    pub current: String,
    /// States it went through before the current one.
    pub visited: Vec<String>,
    /// States already undone by a rollback.
    pub undone: Vec<String>,
    /// States still to undo, in the order they will be (drawn as numbered back arrows).
    pub to_undo: Vec<String>,
}

impl MachineGraph {
    /// The graph of machine `M`.
    #[must_use]
    pub fn of<M: StateMachine>() -> Self {
        let node = |info: &StateInfo| StateNode {
            name: info.name.to_owned(),
            initial: info.initial,
            terminal: info.terminal,
            rollback: info.rollback,
            no_rollback: info.no_rollback,
        };
        Self {
            name: M::NAME.to_owned(),
            states: M::STATES.iter().map(|s| node(s.info())).collect(),
            edges: M::EDGES
                .iter()
                .map(|(from, to)| (from.name().to_owned(), to.name().to_owned()))
                .collect(),
        }
    }

    /// The graph as a Mermaid `stateDiagram-v2`: every transition an arrow, the initial
    /// state hanging off `[*]`, every terminal state leading to `[*]`; states with a
    /// rollback handler get the class `rollback` (red), points of no return the class
    /// `no_rollback` (grey).
    #[must_use]
    pub fn mermaid(&self) -> String {
        let mut out = String::from("stateDiagram-v2\n");
        // Writing to a String cannot fail.
        for state in self.states.iter().filter(|s| s.initial) {
            let _ = writeln!(out, "    [*] --> {}", state.name);
        }
        for (from, to) in &self.edges {
            let _ = writeln!(out, "    {from} --> {to}");
        }
        for state in self.states.iter().filter(|s| s.terminal) {
            let _ = writeln!(out, "    {} --> [*]", state.name);
        }
        let named = |pick: fn(&StateNode) -> bool| -> Vec<&str> {
            let states = self.states.iter().filter(|s| pick(s));
            states.map(|s| s.name.as_str()).collect()
        };
        push_class(&mut out, "rollback", ROLLBACK_STYLE, &named(|s| s.rollback));
        push_class(
            &mut out,
            "no_rollback",
            NO_ROLLBACK_STYLE,
            &named(|s| s.no_rollback),
        );
        out
    }

    /// [`mermaid`](Self::mermaid) with a procedure's path drawn on it: visited states
    /// green (class `visited`), undone ones dashed red (`undone`), the current state
    /// yellow with a thick border (`current`), and while rolling back, numbered arrows
    /// `undo 1`, `undo 2`… through the states still to undo.
    #[must_use]
    pub fn mermaid_with(&self, path: &PathOnGraph) -> String {
        let mut out = self.mermaid();
        let mut from = path.current.as_str();
        for (n, state) in path.to_undo.iter().enumerate() {
            if state != from {
                let _ = writeln!(out, "    {from} --> {state} : undo {}", n + 1);
            }
            from = state;
        }
        let visited: Vec<&str> = path.visited.iter().map(String::as_str).collect();
        let undone: Vec<&str> = path.undone.iter().map(String::as_str).collect();
        // Later classes win: the current state is drawn as current whatever else it is.
        push_class(&mut out, "visited", VISITED_STYLE, &visited);
        push_class(&mut out, "undone", UNDONE_STYLE, &undone);
        push_class(&mut out, "current", CURRENT_STYLE, &[path.current.as_str()]);
        out
    }
}

const ROLLBACK_STYLE: &str = "fill:#fde2e2,stroke:#c0392b";
const NO_ROLLBACK_STYLE: &str = "fill:#e0e0e0,stroke:#555";
const VISITED_STYLE: &str = "fill:#d8f0d8,stroke:#2e7d32";
const UNDONE_STYLE: &str = "fill:#fbe9e7,stroke:#c0392b,stroke-dasharray:4 2";
const CURRENT_STYLE: &str = "fill:#fff3b0,stroke:#d4a000,stroke-width:3px";

fn push_class(out: &mut String, class: &str, style: &str, members: &[&str]) {
    if !members.is_empty() {
        let _ = writeln!(out, "    classDef {class} {style}");
        let _ = writeln!(out, "    class {} {class}", members.join(","));
    }
}
