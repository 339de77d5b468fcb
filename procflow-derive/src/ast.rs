//! The derive input as procflow sees it: an enum of states with their attributes, each
//! keeping a reference to the syn node it came from so errors can be placed on it.

use crate::attr::{self, MachineAttrs, StateAttrs};
use crate::ctxt::Ctxt;
use crate::krate;
use proc_macro2::TokenStream;
use syn::{Data, DeriveInput, Fields, Ident, Variant, Visibility};

pub struct Machine<'a> {
    pub ident: &'a Ident,
    pub vis: &'a Visibility,
    pub attrs: MachineAttrs,
    pub states: Vec<State<'a>>,
    /// `<procflow>::__private`, the path generated code names the runtime by.
    pub private: TokenStream,
}

pub struct State<'a> {
    pub ident: &'a Ident,
    pub attrs: StateAttrs,
}

impl<'a> Machine<'a> {
    /// Reads the input. `None` when it is not an enum at all; every other mistake is
    /// recorded and a best-effort model is still returned.
    pub fn from_ast(cx: &Ctxt, input: &'a DeriveInput) -> Option<Self> {
        let variants = match &input.data {
            Data::Enum(data) => &data.variants,
            Data::Struct(data) => {
                cx.error_at(data.struct_token, NOT_AN_ENUM);
                return None;
            }
            Data::Union(data) => {
                cx.error_at(data.union_token, NOT_AN_ENUM);
                return None;
            }
        };
        if !input.generics.params.is_empty() || input.generics.where_clause.is_some() {
            cx.error_at(
                &input.generics,
                "a state machine enum cannot be generic: its states are plain names; put \
                 type parameters on the procedure type instead",
            );
            // Any code emitted for the enum would need generics it cannot have.
            return None;
        }
        if variants.is_empty() {
            cx.error_at(
                &input.ident,
                "a state machine needs states: add variants such as `#[initial] Start` and \
                 `#[terminal] Done`",
            );
        }
        let states = variants.iter().map(|v| State::from_ast(cx, v)).collect();
        let attrs = attr::machine_attrs(cx, &input.attrs);
        Some(Self {
            ident: &input.ident,
            vis: &input.vis,
            private: krate::private_path(attrs.krate.as_ref()),
            attrs,
            states,
        })
    }

    /// The generated module holding each state's targets: `module = ".."`, else the
    /// enum's name in snake case.
    pub fn targets_module(&self) -> Ident {
        self.attrs
            .module
            .clone()
            .unwrap_or_else(|| crate::names::targets_module(self.ident))
    }

    pub fn state(&self, ident: &Ident) -> Option<&State<'a>> {
        self.states.iter().find(|s| s.ident == ident)
    }

    /// The states that run a handler: every state that is not `#[terminal]`.
    pub fn steps(&self) -> impl Iterator<Item = &State<'a>> {
        self.states.iter().filter(|s| !s.is_terminal())
    }
}

const NOT_AN_ENUM: &str = "`StateMachine` can only be derived for an enum of states, like \
                           `enum JobState { #[initial] #[transition(to = [Done])] Start, #[terminal] Done }`";

impl<'a> State<'a> {
    fn from_ast(cx: &Ctxt, variant: &'a Variant) -> Self {
        if !matches!(variant.fields, Fields::Unit) {
            cx.error_at(
                &variant.fields,
                format_args!(
                    "a state carries no data: write `{}` and keep the data in the procedure struct",
                    variant.ident
                ),
            );
        }
        Self {
            ident: &variant.ident,
            attrs: attr::state_attrs(cx, &variant.attrs),
        }
    }

    pub fn is_terminal(&self) -> bool {
        self.attrs.terminal.is_some()
    }

    /// Declared targets, empty when there is no `#[transition]`.
    pub fn targets(&self) -> &[Ident] {
        self.attrs
            .transition
            .as_ref()
            .map_or(&[], |t| t.targets.as_slice())
    }
}
