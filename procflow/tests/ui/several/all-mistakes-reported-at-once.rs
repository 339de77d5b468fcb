use procflow::prelude::*;

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Job, retries = 3)]
enum JobState {
    #[initial]
    #[transition(to = [Wrok])]
    Start,
    #[initial]
    #[transition(to = [Done, Done])]
    #[rollback]
    #[no_rollback]
    Work,
    #[terminal]
    #[rollback]
    Done,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Job;

fn main() {}
