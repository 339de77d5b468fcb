//! The persisted form of a procedure: independent of variant order, tagged with the
//! machine's stable name, readable after the enum grows.

use procflow::codec::{self, CodecError};
use procflow::prelude::*;
use procflow::{Cursor, Phase, Stepper};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, PartialEq)]
pub struct Order {
    pub id: u64,
    pub items: Vec<String>,
}

/// Version 1 of the machine, as an older release of an application declared it.
mod v1 {
    use super::Order;
    use procflow::prelude::*;

    #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
    #[state_machine(procedure = Order, name = "order")]
    pub enum OrderState {
        #[initial]
        #[transition(to = [Reserve])]
        Validate,
        #[transition(to = [Charge])]
        #[rollback]
        Reserve,
        #[transition(to = [Shipped])]
        Charge,
        #[terminal]
        Shipped,
    }

    impl OrderStateHandlers for Order {
        async fn validate(&mut self, _: &Context<()>) -> Step<order_state::Validate> {
            Ok(order_state::Validate::Reserve.into())
        }
        async fn reserve(&mut self, _: &Context<()>) -> Step<order_state::Reserve> {
            Ok(order_state::Reserve::Charge.into())
        }
        async fn rollback_reserve(&mut self, _: &Context<()>) -> Result<(), Error> {
            Ok(())
        }
        async fn charge(&mut self, _: &Context<()>) -> Step<order_state::Charge> {
            Err(Error::fatal("card declined"))
        }
    }
}

/// Version 2: variants reordered, two new states added.
mod v2 {
    use procflow::prelude::*;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    pub struct Order {
        pub id: u64,
        pub items: Vec<String>,
    }

    #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
    #[state_machine(procedure = Order, name = "order")]
    pub enum OrderState {
        #[terminal]
        Shipped,
        #[transition(to = [FraudCheck])]
        Charge,
        #[transition(to = [Shipped])]
        FraudCheck,
        #[transition(to = [Charge])]
        #[rollback]
        Reserve,
        #[initial]
        #[transition(to = [Reserve, Cancelled])]
        Validate,
        #[terminal]
        Cancelled,
    }

    impl OrderStateHandlers for Order {
        async fn validate(&mut self, _: &Context<()>) -> Step<order_state::Validate> {
            Ok(order_state::Validate::Reserve.into())
        }
        async fn reserve(&mut self, _: &Context<()>) -> Step<order_state::Reserve> {
            Ok(order_state::Reserve::Charge.into())
        }
        async fn rollback_reserve(&mut self, _: &Context<()>) -> Result<(), Error> {
            Ok(())
        }
        async fn charge(&mut self, _: &Context<()>) -> Step<order_state::Charge> {
            Ok(order_state::Charge::FraudCheck.into())
        }
        async fn fraud_check(&mut self, _: &Context<()>) -> Step<order_state::FraudCheck> {
            Ok(order_state::FraudCheck::Shipped.into())
        }
    }
}

fn order() -> Order {
    Order {
        id: 42,
        items: vec!["book".into(), "lamp".into()],
    }
}

#[tokio::test]
async fn reordered_and_extended_enum_reads_states_written_before() {
    // v1 runs two steps and is persisted while at `Charge`.
    let mut run = Stepper::<v1::OrderState>::new(order(), ());
    run.step().await;
    run.step().await;
    let (data, cursor) = run.into_parts();
    assert_eq!(cursor.state(), v1::OrderState::Charge);
    let bytes = codec::encode::<v1::OrderState>(&data, &cursor).unwrap();

    // v2 reads it: same state names, whatever their new positions.
    let (data, cursor) = codec::decode::<v2::OrderState>(&bytes).unwrap();
    assert_eq!(
        data,
        v2::Order {
            id: 42,
            items: vec!["book".into(), "lamp".into()]
        }
    );
    assert_eq!(cursor.state(), v2::OrderState::Charge);
    assert_eq!(
        cursor.completed(),
        [v2::OrderState::Validate, v2::OrderState::Reserve]
    );
    assert_eq!(cursor.steps(), 2);

    // ... and finishes it through the new states.
    let mut run = Stepper::<v2::OrderState>::resume(data, cursor, ().into());
    assert_eq!(run.run().await, &Phase::Succeeded);
    assert_eq!(run.cursor().state(), v2::OrderState::Shipped);
}

#[tokio::test]
async fn a_rolled_back_procedure_round_trips_with_its_cause() {
    let mut run = Stepper::<v1::OrderState>::new(order(), ());
    run.run().await;
    let (data, cursor) = run.into_parts();
    let bytes = codec::encode::<v1::OrderState>(&data, &cursor).unwrap();
    let (back_data, back_cursor) = codec::decode::<v1::OrderState>(&bytes).unwrap();
    assert_eq!(back_data, data);
    assert_eq!(back_cursor, cursor);
    assert_eq!(
        back_cursor.phase(),
        &Phase::RolledBack {
            cause: Error::fatal("card declined")
        }
    );
}

#[test]
fn snapshots_are_tagged_with_the_stable_name() {
    let bytes = codec::encode::<v1::OrderState>(&order(), &Cursor::new()).unwrap();
    assert_eq!(codec::machine_name(&bytes).unwrap(), "order");
    match codec::decode::<RenamedState>(&bytes) {
        Err(CodecError::WrongMachine { expected, found }) => {
            assert_eq!((expected, found.as_str()), ("Renamed", "order"));
        }
        other => panic!("expected WrongMachine, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn a_state_removed_from_the_enum_is_a_clear_error() {
    // v2 at `FraudCheck` cannot be read by v1, which has no such state.
    let mut cursor = Cursor::<v2::OrderState>::new();
    cursor.advance(v2::OrderState::Reserve).unwrap();
    cursor.advance(v2::OrderState::Charge).unwrap();
    cursor.advance(v2::OrderState::FraudCheck).unwrap();
    let data = v2::Order {
        id: 1,
        items: vec![],
    };
    let bytes = codec::encode::<v2::OrderState>(&data, &cursor).unwrap();
    let err = codec::decode::<v1::OrderState>(&bytes)
        .map(|_| ())
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("`FraudCheck` is not a state of machine `order`"),
        "{message}"
    );
}

#[test]
fn damaged_bytes_are_errors_not_panics() {
    let bytes = codec::encode::<v1::OrderState>(&order(), &Cursor::new()).unwrap();
    for len in 0..bytes.len() {
        assert!(
            codec::decode::<v1::OrderState>(&bytes[..len]).is_err(),
            "cut at {len}"
        );
    }
    // A later format is read as far as this build knows it, and reported as newer, never
    // decoded as data this build would misread.
    let mut future = bytes.clone();
    future[0] = 9;
    assert!(matches!(
        codec::decode::<v1::OrderState>(&future),
        Err(CodecError::NewerFormat { found: 9 })
    ));
    let mut garbage = bytes.clone();
    garbage[0] = 0;
    assert!(matches!(
        codec::decode::<v1::OrderState>(&garbage),
        Err(CodecError::UnsupportedVersion { found: 0 })
    ));
}

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Renamed)]
enum RenamedState {
    #[initial]
    #[transition(to = [End])]
    Begin,
    #[terminal]
    End,
}

#[derive(Serialize, Deserialize)]
struct Renamed;

impl RenamedStateHandlers for Renamed {
    async fn begin(&mut self, _: &Context<()>) -> Step<renamed_state::Begin> {
        Ok(renamed_state::Begin::End.into())
    }
}

#[test]
fn metadata_and_mermaid_diagram() {
    use v1::OrderState as S;
    assert_eq!(S::NAME, "order");
    assert_eq!(S::STATES, [S::Validate, S::Reserve, S::Charge, S::Shipped]);
    assert_eq!(S::TERMINALS, [S::Shipped]);
    assert_eq!(
        S::EDGES,
        [
            (S::Validate, S::Reserve),
            (S::Reserve, S::Charge),
            (S::Charge, S::Shipped)
        ]
    );
    assert_eq!(S::Reserve.info().targets, ["Charge"]);
    assert!(S::Reserve.has_rollback() && !S::Charge.has_rollback());
    assert_eq!(
        S::mermaid(),
        "stateDiagram-v2\n\
         \x20   [*] --> Validate\n\
         \x20   Validate --> Reserve\n\
         \x20   Reserve --> Charge\n\
         \x20   Charge --> Shipped\n\
         \x20   Shipped --> [*]\n\
         \x20   classDef rollback fill:#fde2e2,stroke:#c0392b\n\
         \x20   class Reserve rollback\n"
    );
    // Default stable name: the procedure type's name.
    assert_eq!(RenamedState::NAME, "Renamed");
}

/// The cursor's stored layout, as docs/FORMAT.md gives it: states by name.
#[derive(Serialize, Deserialize, Debug)]
struct CursorLayout {
    state: String,
    steps: u64,
    completed: Vec<String>,
    entries: Vec<(String, u32)>,
    phase: Phase,
}

#[tokio::test]
async fn the_cursor_is_written_in_its_documented_layout() {
    let mut run = Stepper::<v1::OrderState>::new(order(), ());
    run.step().await;
    run.step().await;
    let midway = run.cursor().clone();
    run.run().await;
    let rolled_back = run.cursor().clone();
    for cursor in [Cursor::<v1::OrderState>::new(), midway, rolled_back] {
        let bytes = postcard::to_stdvec(&cursor).unwrap();
        let layout: CursorLayout = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(layout.state, cursor.state().name());
        assert_eq!(layout.steps, cursor.steps());
        let names: Vec<&str> = cursor.completed().iter().map(|s| s.name()).collect();
        assert_eq!(layout.completed, names);
        assert_eq!(&layout.phase, cursor.phase());
        // Nothing more, nothing less: the layout writes back the very same bytes.
        assert_eq!(postcard::to_stdvec(&layout).unwrap(), bytes, "{layout:?}");
    }
}

/// The snapshot's header as docs/FORMAT.md gives it, for serde to write: the runtime
/// writes these bytes by hand.
#[derive(Serialize)]
#[serde(bound = "")]
struct HeaderLayout<'a, M: StateMachine> {
    machine: &'a str,
    data_version: u32,
    cursor: &'a Cursor<M>,
}

/// Version, header length, header and data, each part written by serde.
fn snapshot_by_serde<M: StateMachine>(data: &M::Procedure, cursor: &Cursor<M>) -> Vec<u8> {
    let header = postcard::to_stdvec(&HeaderLayout::<M> {
        machine: M::NAME,
        data_version: M::DATA_VERSION,
        cursor,
    })
    .unwrap();
    let mut bytes = vec![codec::SNAPSHOT_VERSION];
    bytes.extend(postcard::to_stdvec(&header.len()).unwrap());
    bytes.extend(header);
    bytes.extend(postcard::to_stdvec(data).unwrap());
    bytes
}

#[tokio::test]
async fn snapshots_are_the_bytes_serde_writes_for_their_layout() {
    // Every cursor of a run that goes forward, fails and rolls back.
    let mut run = Stepper::<v1::OrderState>::new(order(), ());
    let mut cursors = vec![run.cursor().clone()];
    while !run.cursor().phase().is_finished() {
        run.step().await;
        cursors.push(run.cursor().clone());
    }
    assert!(matches!(run.cursor().phase(), Phase::RolledBack { .. }));
    for cursor in &cursors {
        assert_eq!(
            codec::encode::<v1::OrderState>(&order(), cursor).unwrap(),
            snapshot_by_serde::<v1::OrderState>(&order(), cursor),
            "{cursor:?}"
        );
    }
    // A header of 128 bytes or more: its length takes two bytes.
    let cursor = Cursor::<LongNameState>::new();
    let bytes = codec::encode::<LongNameState>(&LongNamed, &cursor).unwrap();
    assert_eq!(
        bytes,
        snapshot_by_serde::<LongNameState>(&LongNamed, &cursor)
    );
    assert!(bytes[1] >= 0x80, "the length is a varint of two bytes");
    assert_eq!(codec::machine_name(&bytes).unwrap(), LongNameState::NAME);
}

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(
    procedure = LongNamed,
    name = "a_machine_whose_stable_name_is_long_enough_that_a_snapshot_header_naming_it_takes_more_than_one_hundred_and_twenty_seven_bytes_to_write"
)]
enum LongNameState {
    #[initial]
    #[transition(to = [Over])]
    Going,
    #[terminal]
    Over,
}

#[derive(Serialize, Deserialize)]
struct LongNamed;

impl LongNameStateHandlers for LongNamed {
    async fn going(&mut self, _: &Context<()>) -> Step<long_name_state::Going> {
        Ok(long_name_state::Going::Over.into())
    }
}

/// The runtime keeps the cursor's lists as last written and appends to them as they
/// grow: after every kind of change, the snapshot is still serde's bytes, and reads back
/// as the same cursor.
#[test]
fn snapshots_follow_every_change_to_the_cursor() {
    use v1::OrderState::{Charge, Reserve, Validate};
    let check = |cursor: &Cursor<v1::OrderState>| {
        let bytes = codec::encode::<v1::OrderState>(&order(), cursor).unwrap();
        assert_eq!(
            bytes,
            snapshot_by_serde::<v1::OrderState>(&order(), cursor),
            "{cursor:?}"
        );
        // And it reads back (by hand, as a restart reads it) as the same cursor.
        assert_eq!(&codec::decode::<v1::OrderState>(&bytes).unwrap().1, cursor);
    };
    let mut cursor = Cursor::<v1::OrderState>::new();
    check(&cursor);
    // New states, then states entered again (a count inside the list changes).
    for next in [Reserve, Validate, Reserve, Charge] {
        cursor.advance(next).unwrap();
        check(&cursor);
    }
    assert_eq!(cursor.entries(Reserve), 2);
    // A decoded cursor, and a clone, each go on by themselves.
    let bytes = codec::encode::<v1::OrderState>(&order(), &cursor).unwrap();
    let (_, mut decoded) = codec::decode::<v1::OrderState>(&bytes).unwrap();
    let mut clone = cursor.clone();
    // Rolling back takes states off the completed list.
    cursor.start_rollback(Error::fatal("card declined"));
    check(&cursor);
    while cursor.pending_rollback().is_some() {
        cursor.rolled_back();
        check(&cursor);
    }
    assert!(matches!(cursor.phase(), Phase::RolledBack { .. }));
    for other in [&mut decoded, &mut clone] {
        check(other);
        other.advance(Validate).unwrap();
        check(other);
    }
    assert_eq!(decoded, clone);
}
