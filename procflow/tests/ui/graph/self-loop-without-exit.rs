use procflow::prelude::*;

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Job)]
enum JobState {
    #[initial]
    #[transition(to = [Poll, Done])]
    Start,
    #[transition(to = [Poll])]
    Poll,
    #[terminal]
    Done,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Job;

fn main() {}
