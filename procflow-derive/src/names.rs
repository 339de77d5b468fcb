//! Names the derive makes up, and the "did you mean" hint.

use heck::ToSnakeCase;
use proc_macro2::Span;
use syn::Ident;

/// `WriteLayout` → `write_layout`, as an identifier (raw if it is a keyword: `Move` →
/// `r#move`).
pub fn snake_ident(name: &str, span: Span) -> Ident {
    let snake = name.to_snake_case();
    syn::parse_str::<Ident>(&snake)
        .map(|mut ident| {
            ident.set_span(span);
            ident
        })
        .unwrap_or_else(|_| Ident::new_raw(&snake, span))
}

/// The execute handler's name for a state.
pub fn execute_method(state: &Ident) -> Ident {
    snake_ident(&state.to_string(), state.span())
}

/// The rollback handler's name for a state.
pub fn rollback_method(state: &Ident) -> Ident {
    snake_ident(&format!("Rollback{state}"), state.span())
}

/// `CreateTableState` → `CreateTableStateHandlers`.
pub fn handlers_trait(machine: &Ident) -> Ident {
    Ident::new(&format!("{machine}Handlers"), machine.span())
}

/// `CreateTableState` → `create_table_state`: the module holding the target types.
pub fn targets_module(machine: &Ident) -> Ident {
    snake_ident(&machine.to_string(), machine.span())
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
