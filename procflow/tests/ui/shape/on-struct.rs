use procflow::prelude::*;

#[derive(StateMachine)]
#[state_machine(procedure = Job)]
struct JobState {
    step: u32,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Job;

fn main() {}
