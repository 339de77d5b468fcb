use procflow::prelude::*;

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Job)]
enum JobState {
    #[initial]
    #[transition(to = [Done])]
    Start,
    #[terminal]
    Done,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Job;

async fn pause() {}

impl JobStateHandlers for Job {
    async fn start(&mut self, _: &Context<()>) -> Step<job_state::Start> {
        let counter = std::rc::Rc::new(1);
        pause().await;
        drop(counter);
        Ok(job_state::Start::Done.into())
    }
}

fn main() {}
