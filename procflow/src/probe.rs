//! Compile-time probes, so that a machine enum missing several derives, or a procedure
//! type missing several traits, gets one error naming all of them.
//!
//! rustc reports every unmet bound on its own, one error per missing trait, each with a
//! different suggestion, and for a missing `Send` its own message instead of ours.
//! Instead, the derive asks of each needed trait whether the type implements it, by autoref specialization: the `Has*` traits give `Probe<T>` a method
//! when `T` implements the trait, and the `Lacks*` traits give `&Probe<T>` a method of
//! the same name for every `T`. Method lookup tries `Probe<T>` before `&Probe<T>`, so
//! the call answers [`Present`] or [`Absent`]. [`all`] folds the answers into one type,
//! and only [`Present`] implements [`AllDerived`] and [`ProcedureReady`]: one obligation
//! each, so at most one error, whose message lists everything needed.
//!
//! Not public API: the derive's output uses it through `procflow::__private`.

#![doc(hidden)]

use core::fmt::Debug;

use core::marker::PhantomData;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The enum type whose derives are probed.
pub struct Probe<T>(PhantomData<T>);

impl<T> Probe<T> {
    /// A probe for `T`; a value is needed only to call the probing methods on.
    pub const fn new() -> Self {
        Self(PhantomData)
    }
}

impl<T> Default for Probe<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// The answer when the enum implements the probed trait(s).
pub struct Present;

/// The answer when the enum lacks the probed trait, or one of them.
pub struct Absent;

/// Declares, for one trait, the pair of probing traits.
macro_rules! probe {
    ($trait:ident, $has:ident, $lacks:ident, $method:ident) => {
        #[doc = concat!("Answers [`Present`] when `T: ", stringify!($trait), "`.")]
        pub trait $has {
            /// The answer.
            fn $method(&self) -> Present {
                Present
            }
        }

        impl<T: $trait> $has for Probe<T> {}

        #[doc = concat!("Answers [`Absent`] for any `T`, found only when `", stringify!($trait), "` is not implemented.")]
        pub trait $lacks {
            /// The answer.
            fn $method(&self) -> Absent {
                Absent
            }
        }

        impl<T> $lacks for &Probe<T> {}
    };
}

probe!(Clone, HasClone, LacksClone, probe_clone);
probe!(Copy, HasCopy, LacksCopy, probe_copy);
probe!(Debug, HasDebug, LacksDebug, probe_debug);
probe!(PartialEq, HasPartialEq, LacksPartialEq, probe_partial_eq);
probe!(Eq, HasEq, LacksEq, probe_eq);
probe!(Send, HasSend, LacksSend, probe_send);
probe!(Serialize, HasSerialize, LacksSerialize, probe_serialize);
probe!(
    DeserializeOwned,
    HasDeserialize,
    LacksDeserialize,
    probe_deserialize
);

/// Type-level "and" of two answers.
pub trait And<B> {
    /// [`Present`] if both are.
    type Out: Default;
}

impl Default for Present {
    fn default() -> Self {
        Present
    }
}

impl Default for Absent {
    fn default() -> Self {
        Absent
    }
}

impl And<Present> for Present {
    type Out = Present;
}
impl And<Absent> for Present {
    type Out = Absent;
}
impl And<Present> for Absent {
    type Out = Absent;
}
impl And<Absent> for Absent {
    type Out = Absent;
}

/// Folds two answers into one, so that several missing derives fail one obligation.
pub fn all<A: And<B>, B>(_: A, _: B) -> A::Out {
    A::Out::default()
}

/// Implemented only when every probed derive is present.
#[diagnostic::on_unimplemented(
    message = "a state machine enum needs `#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]`",
    label = "`{E}` lacks some of `Clone, Copy, Debug, PartialEq, Eq`",
    note = "the runtime copies, compares and logs states: derive all five"
)]
pub trait AllDerived<E> {}

#[diagnostic::do_not_recommend]
impl<E> AllDerived<E> for Present {}

/// Fails to compile, once, unless the folded answer for enum `E` is [`Present`].
pub fn require_derives<E, T: AllDerived<E>>(_answer: T) {}

// What the procedure type lacks gets one error naming exactly that: each of these traits
// is implemented for every combination of answers but the one its message describes, so
// only that one fails.

/// Fails only when the procedure type is not `Send`.
#[diagnostic::on_unimplemented(
    message = "the procedure type `{P}` is not `Send`",
    label = "run on any worker thread",
    note = "own its data (no references) and hold no `Rc` or `RefCell`"
)]
pub trait SendReady<P> {}

#[diagnostic::do_not_recommend]
impl<P> SendReady<P> for Present {}

/// Fails only when the procedure type is `Deserialize` but not `Serialize` (`De` is the
/// `Deserialize` answer).
#[diagnostic::on_unimplemented(
    message = "the procedure type `{P}` is not `Serialize`",
    label = "persisted after every step",
    note = "derive `serde::Serialize` on it"
)]
pub trait SerializeReady<P, De> {}

#[diagnostic::do_not_recommend]
impl<P, De> SerializeReady<P, De> for Present {}
#[diagnostic::do_not_recommend]
impl<P> SerializeReady<P, Absent> for Absent {}

/// Fails only when the procedure type is `Serialize` but not `Deserialize` (`Ser` is the
/// `Serialize` answer).
#[diagnostic::on_unimplemented(
    message = "the procedure type `{P}` is not `Deserialize`",
    label = "read back after a restart",
    note = "derive `serde::Deserialize` on it"
)]
pub trait DeserializeReady<P, Ser> {}

#[diagnostic::do_not_recommend]
impl<P, Ser> DeserializeReady<P, Ser> for Present {}
#[diagnostic::do_not_recommend]
impl<P> DeserializeReady<P, Absent> for Absent {}

/// Fails only when the procedure type is neither `Serialize` nor `Deserialize`.
#[diagnostic::on_unimplemented(
    message = "the procedure type `{P}` is neither `Serialize` nor `Deserialize`",
    label = "persisted after every step, and read back after a restart",
    note = "derive `serde::Serialize, serde::Deserialize` on it"
)]
pub trait SerdeReady<P> {}

#[diagnostic::do_not_recommend]
impl<P> SerdeReady<P> for (Present, Present) {}
#[diagnostic::do_not_recommend]
impl<P> SerdeReady<P> for (Present, Absent) {}
#[diagnostic::do_not_recommend]
impl<P> SerdeReady<P> for (Absent, Present) {}

/// Fails to compile unless procedure type `P` is `Send`, `Serialize` and `Deserialize`,
/// with one error naming exactly what it lacks (two when it lacks `Send` as well).
pub fn require_procedure<P, Send, Ser, De>(_send: Send, _serialize: Ser, _deserialize: De)
where
    Send: SendReady<P>,
    Ser: SerializeReady<P, De>,
    De: DeserializeReady<P, Ser>,
    (Ser, De): SerdeReady<P>,
{
}
