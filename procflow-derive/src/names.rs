//! Names the derive makes up, and the "did you mean" hint.

use heck::ToSnakeCase;
use proc_macro2::Span;
use syn::Ident;
use syn::ext::IdentExt;

/// Words an identifier cannot be in some edition, though syn accepts them as plain
/// identifiers: a generated `fn gen` fails to compile in edition 2024.
const RESERVED: [&str; 15] = [
    "abstract", "async", "await", "become", "box", "do", "dyn", "final", "gen", "macro",
    "override", "priv", "try", "typeof", "virtual",
];
/// Keywords that cannot even be raw identifiers (`r#crate` is an error): they get a `_`.
const NOT_RAW: [&str; 5] = ["crate", "self", "super", "Self", "_"];

/// `WriteLayout` → `write_layout`, as an identifier valid in every edition: raw if it is a
/// keyword (`Move` → `r#move`, `Gen` → `r#gen`), with a `_` where even a raw identifier is
/// not allowed (`Crate` → `crate_`).
pub fn snake_ident(name: &str, span: Span) -> Ident {
    let snake = name.to_snake_case();
    if NOT_RAW.contains(&snake.as_str()) {
        return Ident::new(&format!("{snake}_"), span);
    }
    if RESERVED.contains(&snake.as_str()) {
        return Ident::new_raw(&snake, span);
    }
    syn::parse_str::<Ident>(&snake)
        .map(|mut ident| {
            ident.set_span(span);
            ident
        })
        .unwrap_or_else(|_| Ident::new_raw(&snake, span))
}

/// A state's name as written without `r#`: `r#type` → `type`. It is what the store and
/// the diagram show, and what generated names derive from.
pub fn state_name(state: &Ident) -> String {
    state.unraw().to_string()
}

/// The execute handler's name for a state.
pub fn execute_method(state: &Ident) -> Ident {
    snake_ident(&state_name(state), state.span())
}

/// The rollback handler's name for a state.
pub fn rollback_method(state: &Ident) -> Ident {
    // Snake-case the state first: `Rollback{type}` would run the words together.
    let snake = state_name(state).to_snake_case();
    snake_ident(&format!("rollback_{snake}"), state.span())
}

/// `CreateTableState` → `CreateTableStateHandlers`.
pub fn handlers_trait(machine: &Ident) -> Ident {
    Ident::new(&format!("{}Handlers", state_name(machine)), machine.span())
}

/// `CreateTableState` → `create_table_state`: the module holding the target types.
pub fn targets_module(machine: &Ident) -> Ident {
    snake_ident(&state_name(machine), machine.span())
}

/// The declared name closest to `unknown`, if one is close enough to be a typo.
pub fn did_you_mean<'a>(
    unknown: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|candidate| {
            (
                strsim::jaro_winkler(&unknown.to_lowercase(), &candidate.to_lowercase()),
                candidate,
            )
        })
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, candidate)| candidate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snake_case_and_keywords() {
        let span = Span::call_site();
        assert_eq!(snake_ident("WriteLayout", span).to_string(), "write_layout");
        assert_eq!(snake_ident("Move", span).to_string(), "r#move");
        assert_eq!(snake_ident("Gen", span).to_string(), "r#gen");
        assert_eq!(snake_ident("Crate", span).to_string(), "crate_");
        let raw = Ident::new_raw("type", span);
        assert_eq!(execute_method(&raw).to_string(), "r#type");
        assert_eq!(rollback_method(&raw).to_string(), "rollback_type");
        assert_eq!(
            rollback_method(&Ident::new("AddToMeta", span)).to_string(),
            "rollback_add_to_meta"
        );
    }

    #[test]
    fn typo_hints() {
        let states = ["Prepare", "WriteLayout", "AddToMeta"];
        assert_eq!(did_you_mean("WriteLayot", states), Some("WriteLayout"));
        assert_eq!(did_you_mean("addtometa", states), Some("AddToMeta"));
        assert_eq!(did_you_mean("Zebra", states), None);
    }
}
