//! A restart reads a procedure suspended on an event in place, without loading it
//! (`builder::prepare_dormant`, issue 33): its state, steps and place in its tree from
//! the stored value, its timeout and deadline from the envelope. What the executor shows
//! of each such procedure after the restart, and what it does with it, is what it showed
//! and would have done before: for every shape the short way takes (a root, a child,
//! one with a nonce, a timeout, a deadline, one past a point of no return) and beside
//! one it does not (a parent waiting for its child).

mod common;

use common::Bounded;
use common::TestStore;
use procflow::ProcedureId;
use procflow::executor::{Executor, Outcome, Status, SubmitOptions};
use procflow::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The events let through: a procedure woken on one of them ends.
#[derive(Default)]
struct Env {
    open: Mutex<HashSet<String>>,
}

/// Steps to `Park` (through `Past`, a point of no return, when `late`) and waits there
/// for its event; a `parent` spawns a `Shape` child first and ends with it.
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Shape, env = Env)]
enum ShapeState {
    #[initial]
    #[transition(to = [Past, Park, Done])]
    Start,
    #[no_rollback]
    #[transition(to = [Park])]
    Past,
    #[transition(to = [Done])]
    Park,
    #[terminal]
    Done,
}

#[derive(Clone, Serialize, Deserialize)]
struct Shape {
    event: String,
    late: bool,
    /// Waits at most this long, then ends.
    timeout_ms: Option<u64>,
    /// Spawns a child waiting for this event, and ends once it has.
    child: Option<String>,
    /// Has waited once (for its timeout's end, or a wake).
    waited: bool,
}

impl Shape {
    fn on(event: &str) -> Self {
        Self {
            event: event.to_owned(),
            late: false,
            timeout_ms: None,
            child: None,
            waited: false,
        }
    }
}

impl ShapeStateHandlers for Shape {
    async fn start(&mut self, _: &Context<Env>) -> Step<shape_state::Start> {
        if let Some(event) = &self.child {
            let child = Child::new::<ShapeState>(&Shape::on(event))?;
            return Ok(Flow::spawn([child], shape_state::Start::Done));
        }
        if self.late {
            return Ok(shape_state::Start::Past.into());
        }
        Ok(shape_state::Start::Park.into())
    }

    async fn past(&mut self, _: &Context<Env>) -> Step<shape_state::Past> {
        Ok(shape_state::Past::Park.into())
    }

    async fn park(&mut self, ctx: &Context<Env>) -> Step<shape_state::Park> {
        let open = ctx.env().open.lock().unwrap().contains(&self.event);
        if open || (self.waited && self.timeout_ms.is_some()) {
            return Ok(shape_state::Park::Done.into());
        }
        self.waited = true;
        Ok(match self.timeout_ms {
            Some(ms) => Flow::suspend_for(self.event.clone(), Duration::from_millis(ms)),
            None => Flow::suspend(self.event.clone()),
        })
    }
}

async fn start(store: &TestStore, env: &Arc<Env>) -> Executor<Env> {
    Executor::builder_shared(Arc::clone(&store.store), Arc::clone(env))
        .register::<ShapeState>()
        .config(common::test_config())
        .start()
        .await
        .unwrap()
}

async fn submit(executor: &Executor<Env>, shape: Shape, options: SubmitOptions) -> ProcedureId {
    executor
        .submit_with::<_, ShapeState>(shape, options)
        .await
        .unwrap()
}

async fn status_is(executor: &Executor<Env>, id: ProcedureId, wanted: impl Fn(&Status) -> bool) {
    common::status_is(executor, id, Duration::from_secs(60), wanted).await;
}

fn suspended(status: &Status) -> bool {
    matches!(status, Status::Suspended { .. })
}

/// Lets `event` through and wakes the one procedure waiting for it.
async fn wake(executor: &Executor<Env>, event: &str) {
    executor.env().open.lock().unwrap().insert(event.to_owned());
    assert_eq!(executor.wake(event).await.unwrap(), 1, "{event}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn procedures_read_in_place_at_a_restart_show_and_do_what_they_did_before() {
    // Long enough for the restart to happen well before it; short for the test.
    const DUE: Duration = Duration::from_millis(2_500);
    let store = TestStore::wal();
    let env = Arc::new(Env::default());
    let executor = start(&store, &env).await;
    let none = SubmitOptions::default;
    let plain = submit(&executor, Shape::on("plain"), none().nonce("client-1")).await;
    let timed = Shape {
        timeout_ms: Some(DUE.as_millis() as u64),
        ..Shape::on("timed")
    };
    let timed = submit(&executor, timed, none()).await;
    let deadline = submit(&executor, Shape::on("deadline"), none().timeout(DUE)).await;
    let late = Shape {
        late: true,
        ..Shape::on("late")
    };
    let late = submit(&executor, late, none().timeout(DUE)).await;
    let parent = Shape {
        child: Some("child".to_owned()),
        ..Shape::on("parent")
    };
    let parent = submit(&executor, parent, none()).await;
    for id in [plain, timed, deadline, late] {
        status_is(&executor, id, suspended).await;
    }
    status_is(&executor, parent, |s| *s == Status::WaitingChildren).await;
    let child = executor
        .list()
        .into_iter()
        .find(|info| info.parent == Some(parent))
        .expect("the parent's child")
        .id;
    status_is(&executor, child, suspended).await;
    let mut before = executor.list();
    executor.shutdown().bounded().await.unwrap();
    drop(executor);

    let store = store.reopen();
    let executor = start(&store, &env).await;
    assert!(executor.unloadable().is_empty());
    let mut after = executor.list();
    before.sort_by_key(|info| info.id);
    after.sort_by_key(|info| info.id);
    assert_eq!(after, before, "what the restart shows");
    let again = submit(&executor, Shape::on("plain"), none().nonce("client-1")).await;
    assert_eq!(again, plain, "the nonce finds the procedure loaded dormant");

    // Their times come: the timeout ends its procedure, the deadline rolls its own back,
    // and the one past a point of no return keeps waiting.
    let wait = |id| executor.wait(id).bounded();
    assert_eq!(wait(timed).await.unwrap(), Outcome::Succeeded);
    assert!(matches!(
        wait(deadline).await.unwrap(),
        Outcome::RolledBack(_)
    ));
    assert!(suspended(&executor.state(late).unwrap().status));
    // Their events come.
    for (event, id) in [("plain", plain), ("late", late), ("child", child)] {
        wake(&executor, event).await;
        assert_eq!(wait(id).await.unwrap(), Outcome::Succeeded, "{event}");
    }
    assert_eq!(wait(parent).await.unwrap(), Outcome::Succeeded);
    executor.shutdown().bounded().await.unwrap();
}
