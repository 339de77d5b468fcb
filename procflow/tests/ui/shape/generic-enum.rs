use procflow::prelude::*;

#[derive(StateMachine)]
#[state_machine(procedure = Job)]
enum JobState<const N: usize> {
    #[initial]
    #[transition(to = [Done])]
    Start,
    #[terminal]
    Done,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Job;

fn main() {}
