use procflow::prelude::*;

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Job)]
enum JobState {
    #[initial]
    #[transition(to = [Ping, Tick, Done])]
    Start,
    #[transition(to = [Pong])]
    Ping,
    #[transition(to = [Ping])]
    Pong,
    #[transition(to = [Tock])]
    Tick,
    #[transition(to = [Tick])]
    Tock,
    #[terminal]
    Done,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Job;

fn main() {}
