//! `#[derive(StateMachine)]` for [procflow](https://docs.rs/procflow): use it through
//! `procflow::StateMachine`, whose documentation lists the attributes with examples.
//!
//! The derive reads top-down: `ast` models the input (with `attr` parsing the
//! attributes), `check` enforces the machine's rules, `expand` emits the code, and
//! `fallback` emits what keeps the user's code compiling when there were errors. Every
//! mistake is collected in a `ctxt::Ctxt` and reported at once.

mod ast;
mod attr;
mod check;
mod ctxt;
mod expand;
mod fallback;
mod krate;
mod names;

use proc_macro::TokenStream;
use syn::{DeriveInput, parse_macro_input};

/// Derives `procflow::StateMachine` for an enum of states; see `procflow::StateMachine`
/// and `procflow::attributes` for the attributes.
#[proc_macro_derive(
    StateMachine,
    attributes(
        state_machine,
        initial,
        terminal,
        transition,
        rollback,
        no_rollback,
        max_repeats,
        alias
    )
)]
pub fn derive_state_machine(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    derive(&input).into()
}

fn derive(input: &DeriveInput) -> proc_macro2::TokenStream {
    let cx = ctxt::Ctxt::new();
    let machine = ast::Machine::from_ast(&cx, input);
    if let Some(machine) = &machine {
        check::check(&cx, machine);
    }
    match (cx.check(), &machine) {
        (Ok(()), Some(machine)) => expand::expand(machine),
        (Err(errors), machine) => fallback::fallback(machine.as_ref(), errors),
        (Ok(()), None) => unreachable!("a missing model always records an error"),
    }
}
