use procflow::prelude::*;

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Job, version = 0)]
enum JobState {
    #[initial]
    #[transition(to = [Done])]
    Start,
    #[terminal]
    Done,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Job {
    name: String,
}

impl JobStateHandlers for Job {
    async fn start(&mut self, _: &Context<()>) -> Step<job_state::Start> {
        Ok(job_state::Start::Done.into())
    }
}

fn main() {}
