use procflow::prelude::*;

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Job)]
enum JobState {
    #[initial]
    #[alias = "Begin"]
    #[alias = "Done"]
    #[transition(to = [Work])]
    Start,
    #[alias = "Begin"]
    #[alias = "Work"]
    #[alias = ""]
    #[transition(to = [Done])]
    Work,
    #[terminal]
    #[alias = Finished]
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
