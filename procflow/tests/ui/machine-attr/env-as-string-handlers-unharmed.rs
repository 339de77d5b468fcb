use procflow::prelude::*;

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Job, env = "Catalog")]
enum JobState {
    #[initial]
    #[transition(to = [Done])]
    Start,
    #[terminal]
    Done,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Job;

struct Catalog;

impl JobStateHandlers for Job {
    async fn start(&mut self, _: &Context<Catalog>) -> Step<job_state::Start> {
        Ok(job_state::Start::Done.into())
    }
}

fn main() {}
