//! Parses procflow's attributes, recording mistakes and carrying on.

use crate::ctxt::Ctxt;
use syn::parse::ParseStream;
use syn::{Attribute, Ident, LitInt, LitStr, Path, Token, Type, bracketed, punctuated::Punctuated};

/// The keys `#[state_machine(..)]` accepts, for the "unknown key" message.
const MACHINE_KEYS: &str = "`procedure`, `name`, `env`, `max_repeats`, `module`, `crate`, \
     `version`, `oldest`, `migrate`, `show_data`, `redact`";
/// The attributes procflow reads on a variant.
const STATE_ATTRS: [&str; 7] = [
    "initial",
    "terminal",
    "transition",
    "rollback",
    "no_rollback",
    "max_repeats",
    "alias",
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
    /// `crate = "path"`: where generated code finds procflow.
    pub krate: Option<Path>,
    /// `module = "name"`: the name of the generated targets module, for when the default
    /// (`job_state` for `JobState`) is taken by another item.
    pub module: Option<Ident>,
    /// `version = N`: the data version this build writes; the key and the number, for
    /// errors.
    pub version: Option<(Path, LitInt, u32)>,
    /// `oldest = K`: the oldest data version this build reads.
    pub oldest: Option<(Path, LitInt, u32)>,
    /// `migrate(V = OldType, ..)`: the key, then each version with the type its records
    /// are read as.
    pub migrate: Option<(Path, Vec<Migration>)>,
    /// `show_data = false`: operators' tools do not show the data; the key, for errors.
    pub show_data: Option<(Path, bool)>,
    /// `redact = ["field", "nested.field"]`: the key, and the fields shown redacted.
    pub redact: Option<(Path, Vec<LitStr>)>,
}

/// `V = OldType` in `migrate(..)`.
pub struct Migration {
    pub version: LitInt,
    pub number: u32,
    pub ty: Type,
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
    /// `#[alias = "Old"]`: the state's former names.
    pub aliases: Vec<LitStr>,
    /// An attribute spelt like one of procflow's (`#[transtion(..)]`): rustc reports it
    /// ("cannot find attribute"), and the rules that depend on it would only add noise.
    pub misspelt: bool,
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
                if let Some(ty) = recover(cx, &meta, parse_type(cx, &meta, "procedure"))?.flatten()
                {
                    set_once(cx, key, &mut out.procedure, ty);
                }
            } else if key.is_ident("env") {
                if let Some(ty) = recover(cx, &meta, parse_type(cx, &meta, "env"))?.flatten() {
                    set_once(cx, key, &mut out.env, ty);
                }
            } else if key.is_ident("name") {
                if let Some(name) = recover(cx, &meta, parse_name(cx, &meta))? {
                    set_once(cx, key, &mut out.name, name);
                }
            } else if key.is_ident("max_repeats") {
                let value = meta.value()?;
                match recover(cx, &meta, parse_u32(value, "max_repeats = 100"))? {
                    Some(Ok(value)) => set_once(cx, key, &mut out.max_repeats, value),
                    Some(Err(error)) => cx.push(error),
                    None => {}
                }
            } else if key.is_ident("module") {
                if let Some(module) = recover(cx, &meta, parse_module(&meta))? {
                    set_once(cx, key, &mut out.module, module);
                }
            } else if key.is_ident("crate") {
                if let Some(path) = recover(cx, &meta, parse_crate(&meta))? {
                    set_once(cx, key, &mut out.krate, path);
                }
            } else if key.is_ident("version") || key.is_ident("oldest") {
                let example = if key.is_ident("version") {
                    "version = 1"
                } else {
                    "oldest = 1"
                };
                let value = meta.value()?;
                match recover(cx, &meta, parse_version(value, example))? {
                    Some(Ok(parsed)) => {
                        let slot = if key.is_ident("version") {
                            &mut out.version
                        } else {
                            &mut out.oldest
                        };
                        set_once(cx, key, slot, (key.clone(), parsed.0, parsed.1));
                    }
                    Some(Err(error)) => cx.push(error),
                    None => {}
                }
            } else if key.is_ident("show_data") {
                if let Some(shown) = recover(cx, &meta, parse_bool(&meta))? {
                    set_once(cx, key, &mut out.show_data, (key.clone(), shown));
                }
            } else if key.is_ident("redact") {
                if let Some(fields) = recover(cx, &meta, parse_redact(cx, &meta))? {
                    set_once(cx, key, &mut out.redact, (key.clone(), fields));
                }
            } else if key.is_ident("migrate") {
                if let Some(migrations) = recover(cx, &meta, parse_migrate(cx, &meta))? {
                    set_once(cx, key, &mut out.migrate, (key.clone(), migrations));
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
            match &mut out.transition {
                // Merge, so the message shows the one attribute to write instead.
                Some(first) => {
                    first.targets.extend(transition.targets);
                    first.complete &= transition.complete;
                    cx.error_at(
                        path,
                        format_args!(
                            "a state has one `#[transition(..)]`: merge them into `{}`",
                            corrected(&first.targets)
                        ),
                    );
                }
                None => out.transition = Some(transition),
            }
        } else if path.is_ident("alias") {
            match attr
                .meta
                .require_name_value()
                .and_then(|nv| syn::parse2::<LitStr>(quote::ToTokens::to_token_stream(&nv.value)))
            {
                Ok(alias) if alias.value().trim().is_empty() => cx.error_at(
                    &alias,
                    "an alias is the state's former name: `#[alias = \"Reserve\"]`",
                ),
                Ok(alias) => out.aliases.push(alias),
                Err(_) => cx.error_at(
                    &attr.meta,
                    "expected the state's former name as a string: `#[alias = \"Reserve\"]`",
                ),
            }
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
        } else if let Some(meant) = path
            .get_ident()
            .and_then(|ident| crate::names::did_you_mean(&ident.to_string(), STATE_ATTRS))
        {
            out.misspelt = true;
            // Read it as the attribute it was meant to be, so the fallback's target types
            // match the user's handlers; any further mistake in it shows once fixed.
            let scratch = Ctxt::new();
            match meant {
                "transition" if out.transition.is_none() => {
                    out.transition = Some(transition(&scratch, attr));
                }
                "initial" => out.initial = Some(path.clone()),
                "terminal" => out.terminal = Some(path.clone()),
                "rollback" => out.rollback = Some(path.clone()),
                _ => {}
            }
            let _ = scratch.check();
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
    let syn::Meta::List(list) = &attr.meta else {
        // `#[transition]` or `#[transition = ..]`: nothing to recover.
        cx.error_at(
            &attr.meta,
            "`#[transition]` needs the states this one may move to: write \
             `#[transition(to = [Next])]`",
        );
        return out;
    };
    // Mistakes whose message shows the corrected attribute wait until every target is known.
    let mut fix_later: Vec<(proc_macro2::TokenStream, &'static str)> = Vec::new();
    let mut seen_to = false;
    let parsed = list.parse_args_with(|input: ParseStream<'_>| {
        let mut clean = true;
        while !input.is_empty() {
            let key: Path = input.parse()?;
            if !key.is_ident("to") {
                clean = false;
                cx.error_at(
                    &key,
                    format_args!(
                        "unknown key `{}` in `#[transition(..)]`; write `#[transition(to = [A, B])]`",
                        path_text(&key)
                    ),
                );
                skip_to_comma(input)?;
            } else {
                if seen_to {
                    fix_later.push((
                        quote::ToTokens::to_token_stream(&key),
                        "`to` is given twice: put every target in one list;",
                    ));
                }
                seen_to = true;
                input.parse::<Token![=]>()?;
                if input.peek(syn::token::Bracket) {
                    let content;
                    let brackets = bracketed!(content in input);
                    let paths = Punctuated::<Path, Token![,]>::parse_terminated(&content)?;
                    if paths.is_empty() {
                        clean = false;
                        cx.push(syn::Error::new(
                            brackets.span.join(),
                            "a step must move somewhere: list its targets, like \
                             `#[transition(to = [Next])]`, or mark the state `#[terminal]`",
                        ));
                    }
                    clean &= targets_from_paths(&paths, &mut out.targets, &mut fix_later);
                } else {
                    // `to = A, B`: read the names anyway, so only this mistake is reported.
                    let paths = Punctuated::<Path, Token![,]>::parse_terminated(input)?;
                    targets_from_paths(&paths, &mut out.targets, &mut fix_later);
                    fix_later.push((
                        quote::ToTokens::to_token_stream(&paths),
                        "the targets go in brackets:",
                    ));
                }
            }
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
        }
        if !seen_to && clean {
            cx.error_at(
                &attr.meta,
                "expected the target states: `#[transition(to = [A, B])]`",
            );
            clean = false;
        }
        Ok(clean)
    });
    match parsed {
        Ok(clean) => out.complete = clean,
        Err(error) => cx.push(error),
    }
    let fixed = corrected(&out.targets);
    for (at, what) in fix_later {
        cx.error_at(at, format_args!("{what} write `{fixed}`"));
    }
    out
}

/// Keeps the targets written as names; a path (`State::A`) is queued for an error showing
/// its last segment. Returns whether every target was a plain name.
fn targets_from_paths(
    paths: &Punctuated<Path, Token![,]>,
    targets: &mut Vec<Ident>,
    fix_later: &mut Vec<(proc_macro2::TokenStream, &'static str)>,
) -> bool {
    let mut plain = true;
    for path in paths {
        if let Some(ident) = path.get_ident() {
            targets.push(ident.clone());
        } else if let Some(last) = path.segments.last() {
            plain = false;
            targets.push(last.ident.clone());
            fix_later.push((
                quote::ToTokens::to_token_stream(path),
                "a target is a state's name alone, without a path:",
            ));
        }
    }
    plain
}

/// `#[transition(to = [A, B])]` for the given targets, as shown in messages.
pub fn corrected(targets: &[Ident]) -> String {
    let names: Vec<String> = targets.iter().map(ToString::to_string).collect();
    format!("#[transition(to = [{}])]", names.join(", "))
}

/// Skips a rejected value up to the next `,` of the attribute, so parsing goes on.
fn skip_to_comma(input: ParseStream<'_>) -> syn::Result<()> {
    input.step(|cursor| {
        let mut rest = *cursor;
        while let Some((tt, next)) = rest.token_tree() {
            if matches!(&tt, proc_macro2::TokenTree::Punct(p) if p.as_char() == ',') {
                break;
            }
            rest = next;
        }
        Ok(((), rest))
    })
}

/// Records a value that failed to parse and skips to the next key, so every bad value of
/// one attribute is reported, not only the first.
fn recover<T>(
    cx: &Ctxt,
    meta: &syn::meta::ParseNestedMeta<'_>,
    parsed: syn::Result<T>,
) -> syn::Result<Option<T>> {
    match parsed {
        Ok(value) => Ok(Some(value)),
        Err(error) => {
            cx.push(error);
            skip_to_comma(meta.input)?;
            Ok(None)
        }
    }
}

/// `crate = "path"`, a string as in `#[serde(crate = "..")]`.
fn parse_crate(meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<Path> {
    let value = meta.value()?;
    let Ok(lit) = value.parse::<LitStr>() else {
        return Err(value.error("expected the path as a string: `crate = \"pf\"`"));
    };
    lit.parse::<Path>().map_err(|_| {
        syn::Error::new_spanned(
            &lit,
            "expected a path to procflow, like `crate = \"pf\"` or `crate = \"my_sdk::procflow\"`",
        )
    })
}

fn parse_module(meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<Ident> {
    let value = meta.value()?;
    let Ok(lit) = value.parse::<LitStr>() else {
        return Err(value.error("expected the module's name as a string: `module = \"job_steps\"`"));
    };
    lit.parse::<Ident>().map_err(|_| {
        let fixed: String = lit
            .value()
            .chars()
            .map(|c| if c.is_alphanumeric() { c } else { '_' })
            .collect();
        syn::Error::new_spanned(
            &lit,
            format_args!(
                "a module name is one identifier: `module = \"{}\"`",
                fixed.trim_matches('_')
            ),
        )
    })
}

/// A type after `key =`. A string in its place is recorded (and consumed) so the other
/// keys are still read; the string's content is kept when it is a type, so the generated
/// code uses it and the user's handlers see the type they wrote.
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
        return Ok(lit.parse().ok());
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

/// `show_data = false` (or `true`).
fn parse_bool(meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<bool> {
    const EXPECTED: &str =
        "expected `true` or `false`: `show_data = false` hides the data from operators";
    let value = meta.value()?;
    match value.parse::<syn::Lit>() {
        Ok(syn::Lit::Bool(flag)) => Ok(flag.value),
        Ok(other) => Err(syn::Error::new_spanned(other, EXPECTED)),
        Err(_) => Err(value.error(EXPECTED)),
    }
}

/// `redact = ["password", "credentials.token"]`: field names, or dotted paths into nested
/// fields, none empty.
fn parse_redact(cx: &Ctxt, meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<Vec<LitStr>> {
    const EXAMPLE: &str = "`redact = [\"password\", \"credentials.token\"]`";
    let value = meta.value()?;
    let content;
    if !value.peek(syn::token::Bracket) {
        return Err(value.error(format_args!(
            "expected a list of field names in brackets: {EXAMPLE}"
        )));
    }
    bracketed!(content in value);
    let fields = Punctuated::<syn::Lit, Token![,]>::parse_terminated(&content)?;
    let mut out = Vec::new();
    for field in fields {
        let syn::Lit::Str(field) = field else {
            cx.error_at(
                &field,
                format_args!("expected a field name as a string: {EXAMPLE}"),
            );
            continue;
        };
        let text = field.value();
        if text.split('.').any(|part| part.trim().is_empty()) {
            cx.error_at(
                &field,
                format_args!(
                    "`{text}` is not a field path: write field names joined by dots, like {EXAMPLE}"
                ),
            );
            continue;
        }
        out.push(field);
    }
    Ok(out)
}

/// `version = N` or `oldest = K`: a data version, from 1. As [`parse_u32`], the outer
/// `Result` stops the attribute, the inner one is a wrong value.
fn parse_version(input: ParseStream<'_>, example: &str) -> syn::Result<syn::Result<(LitInt, u32)>> {
    let expr: syn::Expr = input.parse()?;
    let syn::Expr::Lit(syn::ExprLit {
        lit: syn::Lit::Int(lit),
        ..
    }) = &expr
    else {
        return Ok(Err(syn::Error::new_spanned(
            &expr,
            format_args!("expected a data version, a whole number from 1, like `{example}`"),
        )));
    };
    Ok(match lit.base10_parse::<u32>() {
        Ok(0) | Err(_) => Err(syn::Error::new_spanned(
            lit,
            format_args!(
                "data versions count from 1 (the version of a machine that never set one): \
                 write `{example}`"
            ),
        )),
        Ok(n) => Ok((lit.clone(), n)),
    })
}

/// `migrate(1 = OldV1, 2 = OldV2)`. Each entry's mistakes are recorded and the others
/// still read.
fn parse_migrate(cx: &Ctxt, meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<Vec<Migration>> {
    const EXAMPLE: &str = "`migrate(1 = CreateTableV1)`";
    if !meta.input.peek(syn::token::Paren) {
        return Err(meta.input.error(format_args!(
            "expected the older versions and the types their records are read as: {EXAMPLE}"
        )));
    }
    let content;
    syn::parenthesized!(content in meta.input);
    let mut out = Vec::new();
    while !content.is_empty() {
        let version: LitInt = match content.parse() {
            Ok(version) => version,
            Err(_) => {
                let error = content.error(format_args!(
                    "expected a data version, then `=` and the type its records are read \
                     as: {EXAMPLE}"
                ));
                skip_to_comma(&content)?;
                cx.push(error);
                let _ = content.parse::<Option<Token![,]>>()?;
                continue;
            }
        };
        content.parse::<Token![=]>()?;
        let ty: Type = content.parse()?;
        match version.base10_parse::<u32>() {
            Ok(number) if number > 0 => out.push(Migration {
                version,
                number,
                ty,
            }),
            _ => cx.error_at(
                &version,
                "data versions count from 1: a migration reads records of an older version \
                 (1, 2, ..)",
            ),
        }
        if !content.is_empty() {
            content.parse::<Token![,]>()?;
        }
    }
    Ok(out)
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

#[cfg(test)]
mod tests {
    use super::STATE_ATTRS;
    use crate::names::did_you_mean;

    // Attributes other derives and rustc put on variants must not be taken for a misspelt
    // one of ours, or a correct machine would fail silently.
    #[test]
    fn other_variant_attributes_are_not_misspellings() {
        for other in [
            "doc",
            "default",
            "allow",
            "deny",
            "warn",
            "expect",
            "cfg",
            "cfg_attr",
            "serde",
            "deprecated",
            "must_use",
            "non_exhaustive",
            "strum",
            "error",
        ] {
            assert_eq!(did_you_mean(other, STATE_ATTRS), None, "{other}");
        }
        assert_eq!(did_you_mean("transtion", STATE_ATTRS), Some("transition"));
        assert_eq!(did_you_mean("intial", STATE_ATTRS), Some("initial"));
        assert_eq!(did_you_mean("terminl", STATE_ATTRS), Some("terminal"));
    }
}
