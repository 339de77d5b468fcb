use procflow::prelude::*;

#[derive(StateMachine)]
#[state_machine(procedure = Job)]
enum JobState {}

#[derive(serde::Serialize, serde::Deserialize)]
struct Job;

fn main() {}
