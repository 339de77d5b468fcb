use procflow::prelude::*;

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Job, retries = 3, version = 3, migrate(2 = JobV2))]
enum JobState {
    #[initial]
    #[transition(to = [Wrok])]
    Start,
    #[initial]
    #[transition(to = [Done, Done])]
    #[rollback]
    #[no_rollback]
    Work,
    #[terminal]
    #[rollback]
    #[alias = "Start"]
    Done,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Job;

#[derive(serde::Deserialize)]
struct JobV2;

impl From<JobV2> for Job {
    fn from(_: JobV2) -> Self {
        Job
    }
}

fn main() {}
