use procflow::prelude::*;

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Job)]
enum JobState {
    #[initial]
    #[transition(to = [Work])]
    Start,
    #[initial]
    #[transition(to = [Done])]
    Work,
    #[termnal]
    Done,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Job;

impl JobStateHandlers for Job {
    async fn start(&mut self, _: &Context<()>) -> Step<job_state::Start> {
        Ok(job_state::Start::Work.into())
    }
    async fn work(&mut self, _: &Context<()>) -> Step<job_state::Work> {
        Ok(job_state::Work::Done.into())
    }
}

fn main() {}
