use procflow::prelude::*;

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Job, version = 3, migrate(1 = JobV1))]
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

#[derive(serde::Deserialize)]
struct JobV1;

impl From<JobV1> for Job {
    fn from(_: JobV1) -> Self {
        Job { name: String::new() }
    }
}

impl JobStateHandlers for Job {
    async fn start(&mut self, _: &Context<()>) -> Step<job_state::Start> {
        Ok(job_state::Start::Done.into())
    }
}

fn main() {}
