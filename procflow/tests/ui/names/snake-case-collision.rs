use procflow::prelude::*;

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Job)]
enum HttpState {
    #[initial]
    #[transition(to = [Done])]
    Start,
    #[terminal]
    Done,
}

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Other)]
enum HTTPState {
    #[initial]
    #[transition(to = [Done])]
    Start,
    #[terminal]
    Done,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Job;

#[derive(serde::Serialize, serde::Deserialize)]
struct Other;

impl HttpStateHandlers for Job {
    async fn start(&mut self, _: &Context<()>) -> Step<http_state::Start> {
        Ok(http_state::Start::Done.into())
    }
}

impl HTTPStateHandlers for Other {
    async fn start(&mut self, _: &Context<()>) -> Step<http_state::Start> {
        Ok(http_state::Start::Done.into())
    }
}

fn main() {}
