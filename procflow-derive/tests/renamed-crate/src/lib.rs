//! Machines compiled against procflow renamed to `pf`: one found through the manifest,
//! one through `#[state_machine(crate = "..")]` and a re-export. `tests/run.rs` runs them.

use pf::prelude::*;

/// Found through the manifest: the user's Cargo.toml calls procflow `pf`.
#[derive(pf::StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Count)]
pub enum CountState {
    /// Adds one.
    #[initial]
    #[transition(to = [Done])]
    Add,
    /// Finished.
    #[terminal]
    Done,
}

/// The data of [`CountState`].
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Count {
    /// Incremented by the one step.
    pub value: u32,
}

impl CountStateHandlers for Count {
    async fn add(&mut self, _: &Context<()>) -> Step<count_state::Add> {
        self.value += 1;
        Ok(count_state::Add::Done.into())
    }
}

/// procflow reached through a re-export, as an SDK wrapping procflow would offer it.
pub mod sdk {
    pub use pf as runtime;
}

/// Named explicitly with `crate = ".."`; state names that are keywords, reserved words
/// and raw identifiers.
#[derive(pf::StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Words, crate = "crate::sdk::runtime")]
#[allow(non_camel_case_types)]
pub enum WordsState {
    /// `fn r#gen`: `gen` is reserved in edition 2024.
    #[initial]
    #[transition(to = [r#type])]
    Gen,
    /// A raw identifier: handler `r#type`, stored as `type`.
    #[transition(to = [Crate])]
    #[rollback]
    r#type,
    /// `crate` cannot even be raw: handler `crate_`.
    #[transition(to = [Move])]
    Crate,
    /// A keyword: handler `r#move`.
    #[transition(to = [Done])]
    Move,
    /// Finished.
    #[terminal]
    Done,
}

/// The data of [`WordsState`].
#[derive(serde::Serialize, serde::Deserialize, Default)]
pub struct Words {
    /// The handlers that ran, in order.
    pub ran: Vec<String>,
}

impl WordsStateHandlers for Words {
    async fn r#gen(&mut self, _: &Context<()>) -> Step<words_state::Gen> {
        self.ran.push("gen".into());
        Ok(words_state::Gen::r#type.into())
    }
    async fn r#type(&mut self, _: &Context<()>) -> Step<words_state::r#type> {
        self.ran.push("type".into());
        Ok(words_state::r#type::Crate.into())
    }
    async fn rollback_type(&mut self, _: &Context<()>) -> Result<(), Error> {
        Ok(())
    }
    async fn crate_(&mut self, _: &Context<()>) -> Step<words_state::Crate> {
        self.ran.push("crate".into());
        Ok(words_state::Crate::Move.into())
    }
    async fn r#move(&mut self, _: &Context<()>) -> Step<words_state::Move> {
        self.ran.push("move".into());
        Ok(words_state::Move::Done.into())
    }
}
