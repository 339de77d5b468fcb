//! Upgrades (issue 30): procedures in flight survive a new version of the code, and an
//! old one.
//!
//! Three versions of one machine, `order`, as three releases of an application would
//! declare it:
//!
//! - `v1`: `Order { name, qty, priority: Low | High }`, states `Reserve → Ship → Done`.
//! - `v2` (data version 2): adds `note: Option<String>`, inserts `Priority::Medium`
//!   between the two, and renames `Reserve` to `Hold` (`#[alias = "Reserve"]`); it reads
//!   version 1 through `migrate(1 = OrderV1)`.
//! - `v3` (data version 3): removes `note` and adds `shelf: u32` *before* `qty` (two
//!   fields of one type trade places: positional postcard would swap them silently); it
//!   reads versions 1 and 2.

mod common;

use common::{Bounded, TestStore};
use procflow::codec::{self, CodecError};
use procflow::executor::{Executor, Outcome, Status};
use procflow::operator::Catalog;
use procflow::prelude::*;
use procflow::{Cursor, ProcedureId};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the handlers saw, by version: a `Ship` step records the data it ran with.
#[derive(Default)]
pub struct Shop {
    pub shipped: Mutex<Vec<String>>,
    /// `Ship` waits for this to hold the order's name.
    pub paid: Mutex<Vec<String>>,
}

impl Shop {
    fn paid(&self, name: &str) -> bool {
        self.paid.lock().unwrap().iter().any(|n| n == name)
    }
    fn pay(&self, name: &str) {
        self.paid.lock().unwrap().push(name.to_owned());
    }
    fn shipped(&self) -> Vec<String> {
        self.shipped.lock().unwrap().clone()
    }
}

mod v1 {
    use super::Shop;
    use procflow::locks::{Lock, LockKeyError, Locks};
    use procflow::prelude::*;
    use serde::{Deserialize, Serialize};

    #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
    #[state_machine(procedure = Order, name = "order", env = Shop)]
    pub enum OrderState {
        #[initial]
        #[transition(to = [Ship])]
        Reserve,
        #[transition(to = [Done])]
        Ship,
        #[terminal]
        Done,
    }

    #[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
    pub enum Priority {
        Low,
        High,
    }

    #[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
    pub struct Order {
        pub name: String,
        pub qty: u32,
        pub priority: Priority,
    }

    impl OrderStateHandlers for Order {
        async fn reserve(&mut self, _: &Context<Shop>) -> Step<order_state::Reserve> {
            Ok(order_state::Reserve::Ship.into())
        }
        async fn ship(&mut self, ctx: &Context<Shop>) -> Step<order_state::Ship> {
            if !ctx.env().paid(&self.name) {
                return Ok(Flow::suspend(self.name.clone()));
            }
            let line = format!("v1 {} qty={} {:?}", self.name, self.qty, self.priority);
            ctx.env().shipped.lock().unwrap().push(line);
            Ok(order_state::Ship::Done.into())
        }
        fn locks(&self) -> Result<Locks, LockKeyError> {
            Ok(Locks::new([Lock::exclusive(format!(
                "order/{}",
                self.name
            ))?]))
        }
    }
}

mod v2 {
    use super::Shop;
    use procflow::locks::{Lock, LockKeyError, Locks};
    use procflow::prelude::*;
    use serde::{Deserialize, Serialize};

    #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
    #[state_machine(procedure = Order, name = "order", env = Shop, version = 2, migrate(1 = OrderV1))]
    pub enum OrderState {
        #[initial]
        #[alias = "Reserve"]
        #[transition(to = [Ship])]
        Hold,
        #[transition(to = [Done])]
        Ship,
        #[terminal]
        Done,
    }

    #[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
    pub enum Priority {
        Low,
        Medium,
        High,
    }

    #[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
    pub struct Order {
        pub name: String,
        pub qty: u32,
        pub priority: Priority,
        pub note: Option<String>,
    }

    /// Version 1's data, as it was stored.
    #[derive(Deserialize)]
    pub struct OrderV1 {
        name: String,
        qty: u32,
        priority: PriorityV1,
    }

    #[derive(Deserialize)]
    enum PriorityV1 {
        Low,
        High,
    }

    impl From<OrderV1> for Order {
        fn from(v1: OrderV1) -> Self {
            let priority = match v1.priority {
                PriorityV1::Low => Priority::Low,
                PriorityV1::High => Priority::High,
            };
            Order {
                name: v1.name,
                qty: v1.qty,
                priority,
                note: None,
            }
        }
    }

    impl OrderStateHandlers for Order {
        async fn hold(&mut self, _: &Context<Shop>) -> Step<order_state::Hold> {
            Ok(order_state::Hold::Ship.into())
        }
        async fn ship(&mut self, ctx: &Context<Shop>) -> Step<order_state::Ship> {
            if !ctx.env().paid(&self.name) {
                return Ok(Flow::suspend(self.name.clone()));
            }
            let line = format!(
                "v2 {} qty={} {:?} note={:?}",
                self.name, self.qty, self.priority, self.note
            );
            ctx.env().shipped.lock().unwrap().push(line);
            Ok(order_state::Ship::Done.into())
        }
        fn locks(&self) -> Result<Locks, LockKeyError> {
            Ok(Locks::new([Lock::exclusive(format!(
                "order/{}",
                self.name
            ))?]))
        }
    }
}

mod v3 {
    use super::{Shop, v2};
    use procflow::locks::{Lock, LockKeyError, Locks};
    use procflow::prelude::*;
    use serde::{Deserialize, Serialize};

    #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
    #[state_machine(
        procedure = Order,
        name = "order",
        env = Shop,
        version = 3,
        oldest = 2,
        migrate(2 = v2::Order)
    )]
    pub enum OrderState {
        #[initial]
        #[alias = "Reserve"]
        #[transition(to = [Ship])]
        Hold,
        #[transition(to = [Done])]
        Ship,
        #[terminal]
        Done,
    }

    #[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
    pub struct Order {
        pub name: String,
        pub shelf: u32,
        pub qty: u32,
    }

    impl From<v2::Order> for Order {
        fn from(v2: v2::Order) -> Self {
            Order {
                name: v2.name,
                shelf: 0,
                qty: v2.qty,
            }
        }
    }

    impl OrderStateHandlers for Order {
        async fn hold(&mut self, _: &Context<Shop>) -> Step<order_state::Hold> {
            Ok(order_state::Hold::Ship.into())
        }
        async fn ship(&mut self, ctx: &Context<Shop>) -> Step<order_state::Ship> {
            if !ctx.env().paid(&self.name) {
                return Ok(Flow::suspend(self.name.clone()));
            }
            let line = format!("v3 {} shelf={} qty={}", self.name, self.shelf, self.qty);
            ctx.env().shipped.lock().unwrap().push(line);
            Ok(order_state::Ship::Done.into())
        }
        fn locks(&self) -> Result<Locks, LockKeyError> {
            Ok(Locks::new([Lock::exclusive(format!(
                "order/{}",
                self.name
            ))?]))
        }
    }
}

fn order_v1(name: &str) -> v1::Order {
    v1::Order {
        name: name.into(),
        qty: 7,
        priority: v1::Priority::High,
    }
}

/// A v1 procedure that has taken its first step: at `Ship`, `Reserve` completed.
fn v1_at_ship() -> Vec<u8> {
    let mut cursor = Cursor::<v1::OrderState>::new();
    cursor.advance(v1::OrderState::Ship).unwrap();
    codec::encode::<v1::OrderState>(&order_v1("a"), &cursor).unwrap()
}

#[test]
fn p1_a_record_of_an_older_data_version_is_migrated_when_read() {
    let bytes = v1_at_ship();
    let (order, cursor) = codec::decode::<v2::OrderState>(&bytes).unwrap();
    assert_eq!(
        order,
        v2::Order {
            name: "a".into(),
            qty: 7,
            // Without the migration, the inserted variant would read `High` (1) as
            // `Medium` (1).
            priority: v2::Priority::High,
            note: None,
        }
    );
    assert_eq!(cursor.state(), v2::OrderState::Ship);
}

/// A v3 build reads versions 2 and 3; a version 1 record has no migration there (its
/// `oldest` is 2), and two fields of one type that traded places do not swap silently:
/// version 2's `qty` stays `qty`.
#[test]
fn p1_removed_and_reordered_fields_migrate_and_too_old_a_version_is_refused() {
    let v2 = codec::encode::<v2::OrderState>(
        &v2::Order {
            name: "c".into(),
            qty: 9,
            priority: v2::Priority::Low,
            note: Some("gone in v3".into()),
        },
        &Cursor::new(),
    )
    .unwrap();
    let (order, _) = codec::decode::<v3::OrderState>(&v2).unwrap();
    assert_eq!(
        order,
        v3::Order {
            name: "c".into(),
            shelf: 0,
            qty: 9
        }
    );
    let err = codec::decode::<v3::OrderState>(&v1_at_ship())
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(
            err,
            CodecError::NoMigration {
                version: 1,
                oldest: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("migrate(1 = OldType)"), "{err}");
}

#[test]
fn p2_a_renamed_state_loads_through_its_alias() {
    // At `Ship`, with `Reserve` on the rollback stack and in the entry counts.
    let bytes = v1_at_ship();
    let (_, cursor) = codec::decode::<v2::OrderState>(&bytes).unwrap();
    assert_eq!(cursor.entries(v2::OrderState::Hold), 1);
    // At `Reserve` itself.
    let at_reserve = codec::encode::<v1::OrderState>(&order_v1("d"), &Cursor::new()).unwrap();
    let (_, cursor) = codec::decode::<v2::OrderState>(&at_reserve).unwrap();
    assert_eq!(cursor.state(), v2::OrderState::Hold);
    assert_eq!(
        v2::OrderState::from_name("Reserve"),
        Some(v2::OrderState::Hold)
    );
    assert_eq!(v2::OrderState::from_name("Packed"), None);
}

#[test]
fn p5_data_of_a_newer_version_is_reported_as_newer_than_this_build() {
    // Version 3's states are version 2's: only the data is newer.
    let v3 = codec::encode::<v3::OrderState>(
        &v3::Order {
            name: "e".into(),
            shelf: 4,
            qty: 1,
        },
        &Cursor::new(),
    )
    .unwrap();
    let err = codec::decode::<v2::OrderState>(&v3)
        .map(|_| ())
        .unwrap_err();
    assert!(
        matches!(
            err,
            CodecError::NewerDataVersion {
                found: 3,
                this_build: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("newer build"), "{err}");
    // A state only a newer build knows (v2 renamed `Reserve`): v1 cannot read the cursor.
    let v2 = codec::encode::<v2::OrderState>(
        &v2::Order {
            name: "e".into(),
            qty: 1,
            priority: v2::Priority::Medium,
            note: None,
        },
        &Cursor::new(),
    )
    .unwrap();
    let err = codec::decode::<v1::OrderState>(&v2)
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(err, CodecError::UnknownState { .. }), "{err}");
}

async fn start_v1(store: &TestStore, shop: &Arc<Shop>) -> Executor<Shop> {
    Executor::builder_shared(Arc::clone(&store.store), Arc::clone(shop))
        .config(common::test_config())
        .register::<v1::OrderState>()
        .start()
        .await
        .unwrap()
}

async fn start_v2(store: &TestStore, shop: &Arc<Shop>) -> Executor<Shop> {
    Executor::builder_shared(Arc::clone(&store.store), Arc::clone(shop))
        .config(common::test_config())
        .register::<v2::OrderState>()
        .start()
        .await
        .unwrap()
}

async fn start_v3(store: &TestStore, shop: &Arc<Shop>) -> Executor<Shop> {
    Executor::builder_shared(Arc::clone(&store.store), Arc::clone(shop))
        .config(common::test_config())
        .register::<v3::OrderState>()
        .start()
        .await
        .unwrap()
}

/// Stops `executor` as a deploy does, and reopens the store for the next build.
async fn stop(executor: Executor<Shop>, store: TestStore) -> TestStore {
    executor.shutdown().bounded().await.unwrap();
    drop(executor);
    store.reopen()
}

async fn status_is(executor: &Executor<Shop>, id: ProcedureId, wanted: impl Fn(&Status) -> bool) {
    common::status_is(executor, id, Duration::from_secs(30), wanted).await;
}

fn suspended(status: &Status) -> bool {
    matches!(status, Status::Suspended { .. })
}

async fn catalog(store: &TestStore) -> Catalog {
    Catalog::load(store.store.as_ref()).await.unwrap()
}

/// Lets order `name` ship: paid, then woken.
async fn pay(executor: &Executor<Shop>, shop: &Shop, name: &str) {
    shop.pay(name);
    executor.wake(name).bounded().await.unwrap();
}

on_both_stores! {
    p1_procedures_in_flight_survive_a_deploy_of_a_new_data_version =>
        procedures_in_flight_survive_a_deploy_of_a_new_data_version;
    p5_data_of_a_newer_version_is_stuck_in_an_older_build_keeping_its_lock =>
        data_of_a_newer_version_is_stuck_in_an_older_build_keeping_its_lock;
    p5_a_state_only_a_newer_build_knows_is_stuck_keeping_its_lock =>
        a_state_only_a_newer_build_knows_is_stuck_keeping_its_lock;
    p5_a_record_of_a_newer_format_is_stuck_never_rewritten_and_requests_refused =>
        a_record_of_a_newer_format_is_stuck_never_rewritten_and_requests_refused;
    p3_the_start_check_refuses_a_build_that_cannot_run_the_store_and_writes_nothing =>
        the_start_check_refuses_a_build_that_cannot_run_the_store_and_writes_nothing;
}

/// Point 3: with the start check on, a build that cannot run every live procedure does
/// not start, names them by machine and id, and leaves the store as it was; the build
/// that can starts and runs them.
async fn the_start_check_refuses_a_build_that_cannot_run_the_store_and_writes_nothing(
    store: TestStore,
) {
    use procflow::executor::ExecutorError;
    let shop = Arc::new(Shop::default());
    let first = start_v1(&store, &shop).await;
    let a = first.submit(order_v1("a")).await.unwrap();
    status_is(&first, a, suspended).await;
    let store = stop(first, store).await;
    let second = start_v2(&store, &shop).await;
    let b = second
        .submit(v2::Order {
            name: "b".into(),
            qty: 1,
            priority: v2::Priority::Low,
            note: None,
        })
        .await
        .unwrap();
    status_is(&second, b, suspended).await;
    let store = stop(second, store).await;
    let before = store.store.load().await.unwrap();

    let checked = |builder: procflow::executor::ExecutorBuilder<Shop>| async move {
        match builder.check_data(true).start().await {
            Err(ExecutorError::DataCheck { unreadable }) => unreadable,
            other => panic!("started: {:?}", other.map(|_| ())),
        }
    };
    let builder = || {
        Executor::builder_shared(Arc::clone(&store.store), Arc::clone(&shop))
            .config(common::test_config())
    };
    // v3 reads versions 2 and 3 only: `a` has no migration there.
    let unreadable = checked(builder().register::<v3::OrderState>()).await;
    assert_eq!(unreadable.len(), 1);
    assert_eq!(
        (unreadable[0].id, unreadable[0].machine.as_str()),
        (a, "order")
    );
    assert!(
        unreadable[0]
            .reason
            .contains("no migration for data version 1"),
        "{unreadable:?}"
    );
    // v1 does not know the state v2 renamed, which `b` went through.
    let unreadable = checked(builder().register::<v1::OrderState>()).await;
    assert_eq!(unreadable.iter().map(|u| u.id).collect::<Vec<_>>(), [b]);
    assert!(
        unreadable[0].reason.contains("`Hold` is not a state"),
        "{unreadable:?}"
    );
    // A build that does not run the machine at all.
    let unreadable = checked(builder()).await;
    assert_eq!(unreadable.iter().map(|u| u.id).collect::<Vec<_>>(), [a, b]);
    assert!(
        unreadable[0].reason.contains("not registered"),
        "{unreadable:?}"
    );
    let message = ExecutorError::DataCheck { unreadable }.to_string();
    println!("{message}");
    assert!(message.contains("2 live procedure(s)"), "{message}");
    assert!(
        message.contains(&format!("machine `order`: {a}, {b}: ")),
        "{message}"
    );
    assert_eq!(store.store.load().await.unwrap(), before, "nothing written");

    // v2 reads both.
    let executor = builder()
        .register::<v2::OrderState>()
        .check_data(true)
        .start()
        .await
        .unwrap();
    for (id, name) in [(a, "a"), (b, "b")] {
        pay(&executor, &shop, name).await;
        assert_eq!(
            executor.wait(id).bounded().await.unwrap(),
            Outcome::Succeeded
        );
    }
    executor.shutdown().bounded().await.unwrap();
}

/// v1 leaves two orders suspended at `Ship`, holding their locks; v2 is deployed. Their
/// records stay as v1 wrote them (data version 1, state names of v1) until they run;
/// then v2 migrates their data and finishes them, each shipping once, and what it writes
/// is data version 2 under the new state names.
async fn procedures_in_flight_survive_a_deploy_of_a_new_data_version(store: TestStore) {
    let shop = Arc::new(Shop::default());
    let old = start_v1(&store, &shop).await;
    let a = old.submit(order_v1("a")).await.unwrap();
    let b = old.submit(order_v1("b")).await.unwrap();
    status_is(&old, a, suspended).await;
    status_is(&old, b, suspended).await;
    let store = stop(old, store).await;

    let new = start_v2(&store, &shop).await;
    let at_rest = catalog(&store).await;
    for id in [a, b] {
        let record = at_rest.get(id).unwrap();
        assert_eq!(record.data_version, 1, "untouched");
        assert_eq!(record.completed, ["Reserve"]);
    }
    assert_eq!(
        new.held_locks().len(),
        2,
        "they kept their locks across the deploy"
    );
    for (id, name) in [(a, "a"), (b, "b")] {
        pay(&new, &shop, name).await;
        assert_eq!(new.wait(id).bounded().await.unwrap(), Outcome::Succeeded);
    }
    assert_eq!(
        shop.shipped(),
        ["v2 a qty=7 High note=None", "v2 b qty=7 High note=None"]
    );
    let done = catalog(&store).await;
    for id in [a, b] {
        let record = done.get(id).unwrap();
        assert_eq!(record.data_version, 2, "rewritten at the new version");
        assert_eq!(record.completed, ["Hold", "Ship"], "under the new names");
    }
    new.shutdown().bounded().await.unwrap();
}

/// A deploy rolled back: v3 left an order suspended; v2 meets its data version 3. It
/// does not run it with a field dropped: the order is stuck, keeps its lock and its
/// record, and a competitor waits; v3, deployed again, finishes it.
async fn data_of_a_newer_version_is_stuck_in_an_older_build_keeping_its_lock(store: TestStore) {
    let shop = Arc::new(Shop::default());
    let newer = start_v3(&store, &shop).await;
    let x = newer
        .submit(v3::Order {
            name: "x".into(),
            shelf: 5,
            qty: 2,
        })
        .await
        .unwrap();
    status_is(&newer, x, suspended).await;
    let store = stop(newer, store).await;

    let older = start_v2(&store, &shop).await;
    pay(&older, &shop, "x").await;
    status_is(&older, x, |status| {
        matches!(status, Status::Stuck { error, .. } if error.to_string().contains("newer build"))
    })
    .await;
    assert_eq!(older.held_locks().len(), 1, "it keeps its lock");
    let rival = older
        .submit(v2::Order {
            name: "x".into(),
            qty: 1,
            priority: v2::Priority::Low,
            note: None,
        })
        .await
        .unwrap();
    status_is(&older, rival, |s| *s == Status::WaitingForLock).await;
    let record = catalog(&store).await;
    assert_eq!(record.get(x).unwrap().data_version, 3, "nothing dropped");
    assert!(
        shop.shipped().is_empty(),
        "nothing ran with a field dropped"
    );
    let store = stop(older, store).await;

    let again = start_v3(&store, &shop).await;
    assert_eq!(again.wait(x).bounded().await.unwrap(), Outcome::Succeeded);
    assert_eq!(shop.shipped()[0], "v3 x shelf=5 qty=2");
    again.shutdown().bounded().await.unwrap();
}

/// v2 renamed a state; rolled back to v1, a procedure v2 took through it names a state v1
/// does not know. v1 keeps it where it is, stuck, with its lock, and never rewrites it;
/// v2, deployed again, finishes it.
async fn a_state_only_a_newer_build_knows_is_stuck_keeping_its_lock(store: TestStore) {
    let shop = Arc::new(Shop::default());
    let newer = start_v2(&store, &shop).await;
    let z = newer
        .submit(v2::Order {
            name: "z".into(),
            qty: 3,
            priority: v2::Priority::High,
            note: None,
        })
        .await
        .unwrap();
    status_is(&newer, z, suspended).await;
    let store = stop(newer, store).await;
    let before = store.store.get(z.get()).await.unwrap().unwrap().value;

    let older = start_v1(&store, &shop).await;
    status_is(&older, z, |status| {
        matches!(status, Status::Stuck { error, .. } if error.to_string().contains("`Hold` is not a state"))
    })
    .await;
    assert!(older.unloadable().is_empty(), "it keeps its place");
    assert_eq!(older.held_locks().len(), 1, "it keeps its lock");
    // It is paid meanwhile: this build does not wake it (it could not store the wake-up).
    shop.pay("z");
    assert_eq!(older.wake("z").bounded().await.unwrap(), 0);
    assert!(shop.shipped().is_empty());
    let store = stop(older, store).await;
    let after = store.store.get(z.get()).await.unwrap().unwrap().value;
    assert_eq!(before, after, "never rewritten");

    // The build that reads it waits on its event again; the payment's wake is repeated
    // as the application does after a restart.
    let again = start_v2(&store, &shop).await;
    assert_eq!(again.wake("z").bounded().await.unwrap(), 1);
    assert_eq!(again.wait(z).bounded().await.unwrap(), Outcome::Succeeded);
    again.shutdown().bounded().await.unwrap();
}

/// A record whose envelope a newer procflow wrote (format 5): this build reads what it
/// knows of it (its locks), reports it stuck before it runs anything, refuses operators'
/// requests on it (acting would rewrite it in this build's format), and never writes it.
async fn a_record_of_a_newer_format_is_stuck_never_rewritten_and_requests_refused(
    store: TestStore,
) {
    use procflow::executor::Handled;
    use procflow::operator::{Action, Request};
    use procflow_store::Batch;
    let shop = Arc::new(Shop::default());
    let first = start_v1(&store, &shop).await;
    let y = first.submit(order_v1("y")).await.unwrap();
    status_is(&first, y, suspended).await;
    let store = stop(first, store).await;
    // As a later procflow would write it: its envelope's format is 5.
    let mut value = store
        .store
        .get(y.get())
        .await
        .unwrap()
        .unwrap()
        .value
        .to_vec();
    assert_eq!(value[0], 4);
    value[0] = 5;
    store
        .store
        .commit(Batch::new().put(y.get(), None, value.clone()))
        .await
        .unwrap();

    let older = start_v1(&store, &shop).await;
    status_is(&older, y, |status| {
        matches!(status, Status::Stuck { error, .. } if error.to_string().contains("newer build"))
    })
    .await;
    assert_eq!(older.held_locks().len(), 1, "it keeps its lock");
    let abort = Request::new(Action::Abort(y.get()), "ops", "rolling back a deploy");
    match older.request(abort).await.unwrap() {
        Handled::Refused(why) => assert!(why.contains("newer build"), "{why}"),
        other => panic!("{other:?}"),
    }
    shop.pay("y");
    assert_eq!(
        older.wake("y").bounded().await.unwrap(),
        0,
        "not woken here"
    );
    assert!(shop.shipped().is_empty());
    let stored = store.store.get(y.get()).await.unwrap().unwrap().value;
    assert_eq!(stored.to_vec(), value, "never rewritten");
    older.shutdown().bounded().await.unwrap();
}

/// A machine of one state, `Start → Done`, over a procedure type, as a release declares it.
#[cfg(feature = "testing")]
macro_rules! release {
    ($module:ident, $($version:tt)*) => {
        pub mod $module {
            use super::*;
            #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
            #[state_machine(procedure = Order, name = "order" $($version)*)]
            pub enum OrderState {
                #[initial]
                #[transition(to = [Done])]
                Start,
                #[terminal]
                Done,
            }

            impl OrderStateHandlers for Order {
                async fn start(&mut self, _: &Context<()>) -> Step<order_state::Start> {
                    Ok(order_state::Start::Done.into())
                }
            }
        }
    };
}

/// Golden bytes (point 6): the only way to catch, before it ships, a change of the stored
/// form that still decodes, into the wrong values.
#[cfg(feature = "testing")]
mod golden {
    use super::*;
    use procflow::testing::{GoldenError, golden};
    use serde::{Deserialize, Serialize};

    mod first {
        use super::*;
        #[derive(Serialize, Deserialize)]
        pub struct Order {
            pub name: String,
            pub qty: u32,
            pub shelf: u32,
            pub priority: Priority,
        }
        #[derive(Serialize, Deserialize)]
        pub enum Priority {
            Low,
            High,
        }
        release!(machine,);
    }

    /// `Medium` inserted before `High`, without a version bump: version 1's `High` would
    /// decode as `Medium`.
    mod inserted_variant {
        use super::*;
        #[derive(Serialize, Deserialize)]
        pub struct Order {
            pub name: String,
            pub qty: u32,
            pub shelf: u32,
            pub priority: Priority,
        }
        #[derive(Serialize, Deserialize)]
        pub enum Priority {
            Low,
            Medium,
            High,
        }
        release!(machine,);
    }

    /// `qty` and `shelf`, both `u32`, trade places without a version bump: each would
    /// decode as the other.
    mod reordered {
        use super::*;
        #[derive(Serialize, Deserialize)]
        pub struct Order {
            pub name: String,
            pub shelf: u32,
            pub qty: u32,
            pub priority: super::first::Priority,
        }
        release!(machine,);
    }

    /// The same change done right: version 2, reading version 1.
    mod bumped {
        use super::*;
        #[derive(Serialize, Deserialize)]
        pub struct Order {
            pub name: String,
            pub shelf: u32,
            pub qty: u32,
            pub priority: super::inserted_variant::Priority,
        }
        impl From<super::first::Order> for Order {
            fn from(v1: super::first::Order) -> Self {
                use super::inserted_variant::Priority as P2;
                let priority = match v1.priority {
                    super::first::Priority::Low => P2::Low,
                    super::first::Priority::High => P2::High,
                };
                Order {
                    name: v1.name,
                    shelf: v1.shelf,
                    qty: v1.qty,
                    priority,
                }
            }
        }
        release!(machine, , version = 2, migrate(1 = super::first::Order));
    }

    #[test]
    fn p6_golden_bytes_catch_a_reorder_and_an_inserted_variant_without_a_bump() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("order.golden");
        let v1 = first::Order {
            name: "g".into(),
            qty: 7,
            shelf: 2,
            priority: first::Priority::High,
        };
        let written = golden::<first::machine::OrderState>(&v1, &file).unwrap();
        assert!(written.written);
        assert!(
            !golden::<first::machine::OrderState>(&v1, &file)
                .unwrap()
                .written
        );

        let inserted = inserted_variant::Order {
            name: "g".into(),
            qty: 7,
            shelf: 2,
            priority: inserted_variant::Priority::High,
        };
        let err = golden::<inserted_variant::machine::OrderState>(&inserted, &file).unwrap_err();
        assert!(
            matches!(err, GoldenError::Changed { version: 1, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("version = 2"), "{err}");

        let reordered = reordered::Order {
            name: "g".into(),
            shelf: 2,
            qty: 7,
            priority: first::Priority::High,
        };
        let err = golden::<reordered::machine::OrderState>(&reordered, &file).unwrap_err();
        assert!(
            matches!(err, GoldenError::Changed { version: 1, .. }),
            "{err}"
        );

        // Bumped, with a migration: version 2's line is written, and version 1's sample
        // (kept in the file) reads through the migration.
        let bumped = bumped::Order {
            name: "g".into(),
            shelf: 2,
            qty: 7,
            priority: inserted_variant::Priority::High,
        };
        let checked = golden::<bumped::machine::OrderState>(&bumped, &file).unwrap();
        assert!(checked.written);
        assert_eq!(checked.migrated, [1]);
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.contains("\nv1 ") && text.contains("\nv2 "), "{text}");
        // The older build meets a file a newer one wrote.
        let err = golden::<first::machine::OrderState>(&v1, &file).unwrap_err();
        assert!(
            matches!(err, GoldenError::NewerThanBuild { found: 2, .. }),
            "{err}"
        );
    }
}
