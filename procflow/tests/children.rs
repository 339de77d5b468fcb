//! Child procedures: persisted atomically with the parent's step, the parent resumes when
//! all have ended, a failed child fails the parent. Every scenario runs on a `MemStore`
//! and on a durable `WalStore`.

mod common;

use common::{Bounded, Ledger, TestStore};
use procflow::executor::{Executor, ExecutorError, Outcome, Status, StoreWrite, WritePoint};
use procflow::prelude::*;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

on_both_stores! {
    parent_resumes_after_all_children_succeed => parent_resumes_after_all_children_succeed;
    failed_child_rolls_back_the_parent_keeping_its_error => failed_child_rolls_back_the_parent_keeping_its_error;
    double_execution_with_a_child_runs_each_step_twice => double_execution_with_a_child_runs_each_step_twice;
    children_are_written_with_the_parent_step => children_are_written_with_the_parent_step;
    succeeded_children_are_rolled_back_newest_first => succeeded_children_are_rolled_back_newest_first;
    tree_rollback_survives_a_kill_before_every_write => tree_rollback_survives_a_kill_before_every_write;
}

/// HBase TestStateMachineProcedure's machine: STEP_1 → STEP_2, which spawns children.
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Parent, env = Ledger)]
enum ParentState {
    #[initial]
    #[transition(to = [Step2])]
    #[rollback]
    Step1,
    #[transition(to = [Done])]
    #[rollback]
    Step2,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
struct Parent {
    children: Vec<Kid>,
}

impl ParentStateHandlers for Parent {
    async fn step1(&mut self, ctx: &Context<Ledger>) -> Step<parent_state::Step1> {
        ctx.env().push("parent execute 1");
        Ok(parent_state::Step1::Step2.into())
    }
    async fn step2(&mut self, ctx: &Context<Ledger>) -> Step<parent_state::Step2> {
        ctx.env().push("parent execute 2");
        let children = self
            .children
            .iter()
            .map(Child::new::<KidState>)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Flow::spawn(children, parent_state::Step2::Done))
    }
    async fn rollback_step1(&mut self, ctx: &Context<Ledger>) -> Result<(), Error> {
        ctx.env().push("parent rollback 1");
        Ok(())
    }
    async fn rollback_step2(&mut self, ctx: &Context<Ledger>) -> Result<(), Error> {
        ctx.env().push("parent rollback 2");
        Ok(())
    }
}

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Kid, env = Ledger)]
enum KidState {
    #[initial]
    #[transition(to = [Done])]
    Work,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize, Clone)]
struct Kid {
    name: String,
    fail: bool,
    /// Suspend on event `name` first (to observe the parent waiting).
    wait: bool,
}

impl Kid {
    fn named(name: &str) -> Self {
        Self {
            name: name.into(),
            fail: false,
            wait: false,
        }
    }
}

impl KidStateHandlers for Kid {
    async fn work(&mut self, ctx: &Context<Ledger>) -> Step<kid_state::Work> {
        if self.wait && !ctx.env().events().contains(&format!("{} go", self.name)) {
            return Ok(Flow::suspend(self.name.clone()));
        }
        ctx.env().push(format!("{} execute", self.name));
        if self.fail {
            return Err(Error::fatal(format!("{} cannot work", self.name)));
        }
        Ok(kid_state::Work::Done.into())
    }
}

async fn start(store: &TestStore, ledger: &Ledger) -> Executor<Ledger> {
    store
        .builder(ledger)
        .register::<ParentState>()
        .register::<KidState>()
        .start()
        .await
        .unwrap()
}

async fn parent_resumes_after_all_children_succeed(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let kids = vec![
        Kid {
            wait: true,
            ..Kid::named("a")
        },
        Kid::named("b"),
    ];
    let id = executor.submit(Parent { children: kids }).await.unwrap();
    let mut parent = executor.subscribe(id).unwrap();
    parent
        .wait_for(|i| i.status == Status::WaitingChildren)
        .await
        .unwrap();
    let children: Vec<_> = executor
        .list()
        .into_iter()
        .filter(|i| i.parent == Some(id))
        .collect();
    assert_eq!(children.len(), 2);
    assert!(children.iter().all(|c| c.machine == "Kid"));
    // `a` suspends (it must, before it is allowed on: otherwise a late first run of it
    // would not suspend at all); `b` ends; the parent still waits for `a`.
    let mut a = executor.subscribe(children[0].id).unwrap();
    a.wait_for(|i| matches!(i.status, Status::Suspended { .. }))
        .await
        .unwrap();
    executor.wait(children[1].id).bounded().await.unwrap();
    assert_eq!(executor.state(id).unwrap().status, Status::WaitingChildren);
    ledger.push("a go");
    assert_eq!(executor.wake("a").await.unwrap(), 1);
    assert_eq!(
        executor.wait(id).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    assert_eq!(executor.state(id).unwrap().state, "Done");
    assert_eq!(ledger.count("parent execute 2"), 1);
    assert_eq!(ledger.count("a execute"), 1);
    assert_eq!(ledger.count("b execute"), 1);
}

/// HBase: "If the child fails, the parent rolls back, and the original error is kept."
async fn failed_child_rolls_back_the_parent_keeping_its_error(store: TestStore) {
    let ledger = Ledger::default();
    let executor = start(&store, &ledger).await;
    let kid = Kid {
        fail: true,
        ..Kid::named("k")
    };
    let id = executor
        .submit(Parent {
            children: vec![kid],
        })
        .await
        .unwrap();
    let outcome = executor.wait(id).bounded().await.unwrap();
    assert_eq!(outcome, Outcome::RolledBack(Error::fatal("k cannot work")));
    let rollbacks: Vec<_> = ledger
        .events()
        .into_iter()
        .filter(|e| e.contains("rollback"))
        .collect();
    assert_eq!(rollbacks, ["parent rollback 2", "parent rollback 1"]);
}

/// HBase TestStateMachineProcedure: 3 executions in a plain run, 6 with double execution
/// (the executor dies before every store write and restarts).
async fn double_execution_with_a_child_runs_each_step_twice(store: TestStore) {
    let plain = Ledger::default();
    let executor = start(&store, &plain).await;
    let parent = || Parent {
        children: vec![Kid::named("k")],
    };
    let id = executor.submit(parent()).await.unwrap();
    assert_eq!(
        executor.wait(id).bounded().await.unwrap(),
        Outcome::Succeeded
    );
    assert_eq!(plain.events().len(), 3, "{:?}", plain.events());

    let store = if store.dir_kind() {
        TestStore::wal()
    } else {
        TestStore::memory()
    };
    let ledger = Ledger::default();
    let kill_next = Arc::new(AtomicBool::new(true));
    let mut id = None;
    loop {
        let toggle = Arc::clone(&kill_next);
        let executor = store
            .builder(&ledger)
            .register::<ParentState>()
            .register::<KidState>()
            .kill_hook(move |w: &StoreWrite| {
                w.point == WritePoint::Before && toggle.fetch_xor(true, Ordering::SeqCst)
            })
            .start()
            .await
            .unwrap();
        let pid = match id {
            Some(pid) => pid,
            None => match executor.submit(parent()).await {
                Ok(pid) => pid,
                Err(_) => continue,
            },
        };
        id = Some(pid);
        match executor.wait(pid).bounded().await {
            Ok(outcome) => {
                assert_eq!(outcome, Outcome::Succeeded);
                break;
            }
            Err(ExecutorError::Killed) => {}
            Err(other) => panic!("{other}"),
        }
    }
    assert_eq!(ledger.count("parent execute 1"), 2);
    assert_eq!(ledger.count("parent execute 2"), 2);
    assert_eq!(ledger.count("k execute"), 2);
    assert_eq!(ledger.events().len(), 6);
}

/// Killed right after the spawn's write, the children are there at restart with the
/// parent waiting for them; killed right before, neither is.
async fn children_are_written_with_the_parent_step(store: TestStore) {
    for point in [WritePoint::Before, WritePoint::After] {
        let store = if store.dir_kind() {
            TestStore::wal()
        } else {
            TestStore::memory()
        };
        let ledger = Ledger::default();
        let executor = store
            .builder(&ledger)
            .register::<ParentState>()
            .register::<KidState>()
            .kill_hook(move |w: &StoreWrite| {
                w.kind == procflow::executor::WriteKind::Spawn && w.point == point
            })
            .start()
            .await
            .unwrap();
        let kids = vec![Kid::named("a"), Kid::named("b")];
        let id = executor.submit(Parent { children: kids }).await.unwrap();
        assert!(
            executor.wait(id).bounded().await.is_err(),
            "killed at the spawn"
        );
        let records = store.store.load().await.unwrap().records;
        let children = records
            .iter()
            .filter(|r| r.parent == Some(id.get()))
            .count();
        match point {
            WritePoint::Before => assert_eq!(children, 0),
            WritePoint::After => assert_eq!(children, 2),
        }
        let executor = start(&store, &ledger).await;
        assert_eq!(
            executor.wait(id).bounded().await.unwrap(),
            Outcome::Succeeded
        );
        // The children's work is done once per surviving spawn.
        assert_eq!(ledger.count("a execute"), 1);
    }
}

/// A tree: `Two` spawns children whose work can be undone; `Four` fails after them.
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Tree, env = Ledger)]
enum TreeState {
    #[initial]
    #[transition(to = [Two])]
    #[rollback]
    One,
    #[transition(to = [Three])]
    #[rollback]
    Two,
    #[transition(to = [Four])]
    #[rollback]
    Three,
    #[transition(to = [Done])]
    Four,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
struct Tree {
    leaves: Vec<String>,
}

impl TreeStateHandlers for Tree {
    async fn one(&mut self, ctx: &Context<Ledger>) -> Step<tree_state::One> {
        ctx.env().push("tree execute 1");
        Ok(tree_state::One::Two.into())
    }
    async fn two(&mut self, ctx: &Context<Ledger>) -> Step<tree_state::Two> {
        ctx.env().push("tree execute 2");
        let leaves = self
            .leaves
            .iter()
            .map(|name| Child::new::<LeafState>(&Leaf { name: name.clone() }))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Flow::spawn(leaves, tree_state::Two::Three))
    }
    async fn three(&mut self, ctx: &Context<Ledger>) -> Step<tree_state::Three> {
        ctx.env().push("tree execute 3");
        Ok(tree_state::Three::Four.into())
    }
    async fn four(&mut self, ctx: &Context<Ledger>) -> Step<tree_state::Four> {
        ctx.env().push("tree execute 4");
        Err(Error::fatal("step 4 failed"))
    }
    async fn rollback_one(&mut self, ctx: &Context<Ledger>) -> Result<(), Error> {
        ctx.env().push("tree rollback 1");
        Ok(())
    }
    async fn rollback_two(&mut self, ctx: &Context<Ledger>) -> Result<(), Error> {
        ctx.env().push("tree rollback 2");
        Ok(())
    }
    async fn rollback_three(&mut self, ctx: &Context<Ledger>) -> Result<(), Error> {
        ctx.env().push("tree rollback 3");
        Ok(())
    }
}

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Leaf, env = Ledger)]
enum LeafState {
    #[initial]
    #[transition(to = [Done])]
    #[rollback]
    Grow,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
struct Leaf {
    name: String,
}

impl LeafStateHandlers for Leaf {
    async fn grow(&mut self, ctx: &Context<Ledger>) -> Step<leaf_state::Grow> {
        ctx.env().push(format!("{} execute", self.name));
        Ok(leaf_state::Grow::Done.into())
    }
    async fn rollback_grow(&mut self, ctx: &Context<Ledger>) -> Result<(), Error> {
        ctx.env().push(format!("{} rollback", self.name));
        Ok(())
    }
}

fn tree_builder(store: &TestStore, ledger: &Ledger) -> procflow::executor::ExecutorBuilder<Ledger> {
    store
        .builder(ledger)
        .register::<TreeState>()
        .register::<LeafState>()
}

fn rollbacks(ledger: &Ledger) -> Vec<String> {
    ledger
        .events()
        .into_iter()
        .filter(|e| e.contains("rollback"))
        .collect()
}

/// Unlike HBase (which leaves succeeded children alone), the rollback stack spans the
/// tree: Three, then the children Two spawned, then Two and One.
async fn succeeded_children_are_rolled_back_newest_first(store: TestStore) {
    let ledger = Ledger::default();
    let executor = tree_builder(&store, &ledger).start().await.unwrap();
    let tree = Tree {
        leaves: vec!["a".into(), "b".into()],
    };
    let id = executor.submit(tree).await.unwrap();
    assert_eq!(
        executor.wait(id).bounded().await.unwrap(),
        Outcome::RolledBack(Error::fatal("step 4 failed"))
    );
    let order = rollbacks(&ledger);
    assert_eq!(order.len(), 5, "{order:?}");
    assert_eq!(order[0], "tree rollback 3");
    let mut leaves = order[1..3].to_vec();
    leaves.sort();
    assert_eq!(leaves, ["a rollback", "b rollback"]);
    assert_eq!(order[3..], ["tree rollback 2", "tree rollback 1"]);
    for leaf in executor.list().iter().filter(|p| p.parent == Some(id)) {
        assert_eq!(leaf.status, Status::RolledBack);
    }
}

async fn tree_rollback_survives_a_kill_before_every_write(store: TestStore) {
    let ledger = Ledger::default();
    let kill_next = Arc::new(AtomicBool::new(true));
    let mut id = None;
    let outcome = loop {
        let toggle = Arc::clone(&kill_next);
        let executor = tree_builder(&store, &ledger)
            .kill_hook(move |w: &StoreWrite| {
                w.point == WritePoint::Before && toggle.fetch_xor(true, Ordering::SeqCst)
            })
            .start()
            .await
            .unwrap();
        let tree = Tree {
            leaves: vec!["a".into()],
        };
        let pid = match id {
            Some(pid) => pid,
            None => match executor.submit(tree).await {
                Ok(pid) => pid,
                Err(_) => continue,
            },
        };
        id = Some(pid);
        match executor.wait(pid).bounded().await {
            Ok(outcome) => break outcome,
            Err(ExecutorError::Killed) => {}
            Err(other) => panic!("{other}"),
        }
    };
    assert_eq!(outcome, Outcome::RolledBack(Error::fatal("step 4 failed")));
    // Every step and every rollback step ran twice: once killed before its write, once
    // persisted; the order of first runs is the tree's rollback order.
    for event in [
        "tree execute 1",
        "tree execute 2",
        "a execute",
        "tree execute 3",
        "tree rollback 3",
        "a rollback",
        "tree rollback 2",
        "tree rollback 1",
    ] {
        assert_eq!(ledger.count(event), 2, "{event}: {:?}", ledger.events());
    }
    let mut firsts = rollbacks(&ledger);
    firsts.dedup();
    assert_eq!(
        firsts,
        [
            "tree rollback 3",
            "a rollback",
            "tree rollback 2",
            "tree rollback 1"
        ]
    );
}

/// etcd allows 128 operations per transaction: a step asking for more children than one
/// batch holds fails its procedure (rolled back) instead of stopping the executor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_children_for_one_batch_fail_the_procedure_only() {
    use procflow::store::{Limits, MemStore};
    let ledger = Ledger::default();
    let limits = Limits {
        max_ops_per_batch: Some(4),
        max_value_bytes: None,
        max_batch_bytes: None,
    };
    let executor = Executor::builder(Arc::new(MemStore::with_limits(limits)), ledger.clone())
        .config(common::test_config())
        .register::<ParentState>()
        .register::<KidState>()
        .start()
        .await
        .unwrap();
    let kids = (0..3).map(|i| Kid::named(&format!("k{i}"))).collect();
    let id = executor.submit(Parent { children: kids }).await.unwrap();
    let Outcome::RolledBack(error) = executor.wait(id).bounded().await.unwrap() else {
        panic!("expected a rollback");
    };
    assert!(error.to_string().contains("at most 2 children"), "{error}");
    // The executor still runs: two children fit.
    let kids = (0..2).map(|i| Kid::named(&format!("j{i}"))).collect();
    let id = executor.submit(Parent { children: kids }).await.unwrap();
    assert_eq!(
        executor.wait(id).bounded().await.unwrap(),
        Outcome::Succeeded
    );
}
