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

// Neither `Send` nor serializable: still one error.
struct Job {
    shared: std::rc::Rc<u32>,
}

impl JobStateHandlers for Job {
    async fn start(&mut self, _: &Context<()>) -> Step<job_state::Start> {
        let _ = &self.shared;
        Ok(job_state::Start::Done.into())
    }
}

fn main() {}
