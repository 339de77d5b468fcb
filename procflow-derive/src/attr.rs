//! Parses procflow's attributes, recording mistakes and carrying on.

use crate::ctxt::Ctxt;
use syn::parse::ParseStream;
use syn::{Attribute, Ident, LitInt, LitStr, Path, Token, Type, bracketed, punctuated::Punctuated};

/// The keys `#[state_machine(..)]` accepts, for the "unknown key" message.
const MACHINE_KEYS: &str = "`procedure`, `name`, `env`, `max_repeats`";
/// The attributes procflow reads on a variant.
const STATE_ATTRS: [&str; 6] = [
    "initial",
    "terminal",
    "transition",
    "rollback",
    "no_rollback",
    "max_repeats",
];

/// `#[state_machine(..)]` on the enum.
#[derive(Default)]
pub struct MachineAttrs {
    /// The attribute's path, to place "missing `procedure`" errors on.
    pub attr: Option<Path>,
    /// Set as soon as the key is seen, even with a malformed value, so "missing
    /// `procedure`" is not reported on top of the malformed value.
    pub procedure_key: Option<Path>,
    pub procedure: Option<Type>,
    pub env: Option<Type>,
    pub name: Option<LitStr>,
    pub max_repeats: Option<u32>,
}

/// procflow's attributes on one variant. Flags keep the attribute path they came from, so
/// errors land on the very word the user wrote.
#[derive(Default)]
pub struct StateAttrs {
    pub initial: Option<Path>,
    pub terminal: Option<Path>,
    pub rollback: Option<Path>,
    pub no_rollback: Option<Path>,
    pub transition: Option<Transition>,
    pub max_repeats: Option<(Path, u32)>,
}

/// `#[transition(to = [..])]`.
pub struct Transition {
    pub attr: Path,
    pub targets: Vec<Ident>,
    /// False when the attribute was malformed: the targets are incomplete, so checks of
    /// the machine's graph would report noise.
    pub complete: bool,
}

pub fn machine_attrs(cx: &Ctxt, attrs: &[Attribute]) -> MachineAttrs {
    let mut out = MachineAttrs::default();
    for attr in attrs {
        if let Some(name) = STATE_ATTRS.iter().find(|name| attr.path().is_ident(name)) {
            cx.error_at(
                attr.path(),
                format_args!("`#[{name}]` belongs on a variant, not on the enum"),
            );
            continue;
        }
        if !attr.path().is_ident("state_machine") {
            continue;
        }
        if out.attr.is_some() {
            cx.error_at(
                attr.path(),
                "duplicate `#[state_machine(..)]`: merge the keys into one attribute",
            );
        }
        out.attr = Some(attr.path().clone());
        let parsed = attr.parse_nested_meta(|meta| {
            let key = &meta.path;
            if key.is_ident("procedure") {
                out.procedure_key = Some(key.clone());
                if let Some(ty) = parse_type(cx, &meta, "procedure")? {
                    set_once(cx, key, &mut out.procedure, ty);
                }
            } else if key.is_ident("env") {
                if let Some(ty) = parse_type(cx, &meta, "env")? {
                    set_once(cx, key, &mut out.env, ty);
                }
            } else if key.is_ident("name") {
                let name = parse_name(cx, &meta)?;
                set_once(cx, key, &mut out.name, name);
            } else if key.is_ident("max_repeats") {
                match parse_u32(meta.value()?, "max_repeats = 100")? {
                    Ok(value) => set_once(cx, key, &mut out.max_repeats, value),
                    Err(error) => cx.push(error),
                }
            } else {
                cx.error_at(
                    key,
                    format_args!(
                        "unknown key `{}` in `#[state_machine(..)]`; the keys are {MACHINE_KEYS}",
                        path_text(key)
                    ),
                );
                skip_value(&meta)?;
            }
            Ok(())
        });
        if let Err(error) = parsed {
            cx.push(error);
        }
    }
    out
}

pub fn state_attrs(cx: &Ctxt, attrs: &[Attribute]) -> StateAttrs {
    let mut out = StateAttrs::default();
    for attr in attrs {
        let path = attr.path();
        if path.is_ident("state_machine") {
            cx.error_at(
                path,
                "`#[state_machine(..)]` belongs on the enum, not on a variant",
            );
        } else if path.is_ident("initial") {
            flag(cx, attr, &mut out.initial);
        } else if path.is_ident("terminal") {
            flag(cx, attr, &mut out.terminal);
        } else if path.is_ident("rollback") {
            flag(cx, attr, &mut out.rollback);
        } else if path.is_ident("no_rollback") {
            flag(cx, attr, &mut out.no_rollback);
        } else if path.is_ident("transition") {
            let transition = transition(cx, attr);
            set_once(cx, path, &mut out.transition, transition);
        } else if path.is_ident("max_repeats") {
            match attr
                .meta
                .require_name_value()
                .and_then(|nv| syn::parse2::<LitInt>(quote::ToTokens::to_token_stream(&nv.value)))
            {
                Ok(lit) => match lit_u32(&lit, "#[max_repeats = 100]") {
                    Ok(n) => set_once(cx, path, &mut out.max_repeats, (path.clone(), n)),
                    Err(error) => cx.push(error),
                },
                Err(_) => cx.error_at(
                    &attr.meta,
                    "expected a number of repeats, like `#[max_repeats = 100]`",
                ),
            }
        }
    }
    out
}

/// A bare marker attribute such as `#[initial]`.
fn flag(cx: &Ctxt, attr: &Attribute, slot: &mut Option<Path>) {
    let path = attr.path();
    if attr.meta.require_path_only().is_err() {
        cx.error_at(
            &attr.meta,
            format_args!(
                "`#[{0}]` takes no arguments: write `#[{0}]`",
                path_text(path)
            ),
        );
    }
    set_once(cx, path, slot, path.clone());
}

fn transition(cx: &Ctxt, attr: &Attribute) -> Transition {
    let mut out = Transition {
        attr: attr.path().clone(),
        targets: Vec::new(),
        complete: false,
    };
    let mut seen_to = false;
    let mut seen_unknown = false;
    let parsed = attr.parse_nested_meta(|meta| {
        if !meta.path.is_ident("to") {
            seen_unknown = true;
            cx.error_at(
                &meta.path,
                format_args!(
                    "unknown key `{}` in `#[transition(..)]`; write `#[transition(to = [A, B])]`",
                    path_text(&meta.path)
                ),
            );
            return skip_value(&meta);
        }
        seen_to = true;
        let value = meta.value()?;
        if !value.peek(syn::token::Bracket) {
            return Err(
                value.error("expected a list of states in brackets, like `to = [WriteLayout]`")
            );
        }
        let content;
        bracketed!(content in value);
        let targets = Punctuated::<Ident, Token![,]>::parse_terminated(&content)?;
        out.targets.extend(targets);
        Ok(())
    });
    match parsed {
        Ok(()) if seen_to => out.complete = !seen_unknown,
        Ok(()) if seen_unknown => {}
        Ok(()) => cx.error_at(
            &attr.meta,
            "expected the target states: `#[transition(to = [A, B])]`",
        ),
        Err(error) => cx.push(error),
    }
    out
}

/// A type after `key =`. A string in its place is recorded (and consumed) so the other
/// keys are still read.
fn parse_type(
    cx: &Ctxt,
    meta: &syn::meta::ParseNestedMeta<'_>,
    key: &str,
) -> syn::Result<Option<Type>> {
    let value = meta.value()?;
    if value.peek(LitStr) {
        let lit: LitStr = value.parse()?;
        cx.error_at(
            &lit,
            format_args!(
                "write the type itself, not a string: `{key} = {}`",
                lit.value()
            ),
        );
        return Ok(None);
    }
    value.parse().map(Some)
}

fn parse_name(cx: &Ctxt, meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<LitStr> {
    let value = meta.value()?;
    let Ok(name) = value.parse::<LitStr>() else {
        return Err(value.error("expected a string: `name = \"create_table\"`"));
    };
    if name.value().trim().is_empty() {
        cx.error_at(
            &name,
            "the stored name cannot be empty: `name = \"create_table\"`",
        );
    }
    Ok(name)
}

/// A number after `=`. The outer `Result` is a parse failure that stops the attribute; the
/// inner one a wrong value, consumed so parsing goes on.
fn parse_u32(input: ParseStream<'_>, example: &str) -> syn::Result<syn::Result<u32>> {
    let expr: syn::Expr = input.parse()?;
    Ok(match &expr {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(lit),
            ..
        }) => lit_u32(lit, example),
        _ => Err(syn::Error::new_spanned(
            &expr,
            format_args!("expected a number of repeats, like `{example}`"),
        )),
    })
}

fn lit_u32(lit: &LitInt, example: &str) -> syn::Result<u32> {
    lit.base10_parse::<u32>().map_err(|_| {
        syn::Error::new_spanned(
            lit,
            format_args!(
                "expected a whole number from 0 to {}, like `{example}`",
                u32::MAX
            ),
        )
    })
}

/// Consumes `= value` after a key that was rejected, so parsing goes on with the next key.
fn skip_value(meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(Token![=]) {
        meta.value()?.parse::<syn::Expr>()?;
    } else if meta.input.peek(syn::token::Paren) {
        meta.parse_nested_meta(|inner| skip_value(&inner))?;
    }
    Ok(())
}

fn set_once<T>(cx: &Ctxt, key: &Path, slot: &mut Option<T>, value: T) {
    if slot.is_some() {
        cx.error_at(
            key,
            format_args!("duplicate `{}`: give it once", path_text(key)),
        );
    } else {
        *slot = Some(value);
    }
}

fn path_text(path: &Path) -> String {
    quote::ToTokens::to_token_stream(path)
        .to_string()
        .replace(' ', "")
}
