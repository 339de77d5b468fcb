//! The path generated code uses to reach the procflow runtime.
//!
//! Hard-coding `::procflow` breaks a user who renamed the dependency
//! (`pf = { package = "procflow", .. }`): there is no `::procflow` in their crate. So the
//! path is, in order: `#[state_machine(crate = "..")]` when given (for re-exports through
//! another crate, which no manifest can reveal), else the name the user's Cargo.toml gives
//! the `procflow` package, else `::procflow`.

use proc_macro_crate::{FoundCrate, crate_name};
use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::{Ident, Path};

/// `<path to procflow>::__private`, the module every generated item goes through.
pub fn private_path(explicit: Option<&Path>) -> TokenStream {
    let krate = match explicit {
        Some(path) => path.to_token_stream(),
        None => from_manifest(),
    };
    quote!(#krate::__private)
}

/// The dependency's name in the user's Cargo.toml. `Itself` (the procflow package's own
/// doctests and examples) and a manifest that cannot be read keep `::procflow`, which is
/// right there.
fn from_manifest() -> TokenStream {
    match crate_name("procflow") {
        Ok(FoundCrate::Name(name)) => {
            let ident = Ident::new(&name, Span::call_site());
            quote!(::#ident)
        }
        Ok(FoundCrate::Itself) | Err(_) => quote!(::procflow),
    }
}
