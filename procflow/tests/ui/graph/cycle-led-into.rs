use procflow::prelude::*;

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Job)]
enum JobState {
    #[initial]
    #[transition(to = [Lead, Done])]
    Start,
    #[transition(to = [Fetch])]
    Lead,
    #[transition(to = [Parse])]
    Fetch,
    #[transition(to = [Store])]
    Parse,
    #[transition(to = [Fetch])]
    Store,
    #[terminal]
    Done,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Job;

fn main() {}
