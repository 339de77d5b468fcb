//! What the derive emits beside its errors: enough for the user's own code (the handler
//! `impl`, the target types it returns) to keep compiling, so the only errors shown are
//! the real ones.

use crate::ast::Machine;
use crate::expand::{self, Bodies};
use proc_macro2::TokenStream;
use quote::quote;

pub fn fallback(machine: Option<&Machine<'_>>, errors: Option<syn::Error>) -> TokenStream {
    let errors = errors.map(|e| e.to_compile_error());
    let Some(machine) = machine else {
        return quote!(#errors);
    };
    let targets = expand::targets_module(machine);
    let handlers = expand::handlers_trait(machine, Bodies::Stubbed);
    quote! {
        #errors
        #targets
        #handlers
    }
}
