//! Collects every error of one derive, so a single compile shows all mistakes.

use quote::ToTokens;
use std::cell::RefCell;
use std::fmt::Display;
use std::thread;

/// The error sink of one derive. Phases push errors and carry on with a best-effort
/// value; [`Ctxt::check`] combines them at the end.
pub struct Ctxt {
    // `None` once `check` ran; dropping an unchecked context is a bug in this crate.
    errors: RefCell<Option<Vec<syn::Error>>>,
    // Set when rustc itself reports the mistake (a misspelt attribute): no message of
    // ours, but no expansion of an unsound machine either.
    reported_by_rustc: std::cell::Cell<bool>,
}

impl Ctxt {
    pub fn new() -> Self {
        Self {
            errors: RefCell::new(Some(Vec::new())),
            reported_by_rustc: std::cell::Cell::new(false),
        }
    }

    /// Records `message` on the tokens of `at`.
    pub fn error_at(&self, at: impl ToTokens, message: impl Display) {
        self.push(syn::Error::new_spanned(at, message));
    }

    /// Records an error syn produced.
    pub fn push(&self, error: syn::Error) {
        self.errors
            .borrow_mut()
            .as_mut()
            .expect("Ctxt used after check")
            .push(error);
    }

    /// Marks the derive as failed by a mistake rustc reports on its own, so the fallback
    /// is emitted without an error of ours on top.
    pub fn reported_by_rustc(&self) {
        self.reported_by_rustc.set(true);
    }

    /// All recorded errors combined into one, or `Ok` when there were none. `Err(None)`:
    /// failed, with rustc reporting why.
    pub fn check(self) -> Result<(), Option<syn::Error>> {
        let errors = self.errors.borrow_mut().take().expect("Ctxt checked twice");
        let mut errors = errors.into_iter();
        let Some(mut combined) = errors.next() else {
            return if self.reported_by_rustc.get() {
                Err(None)
            } else {
                Ok(())
            };
        };
        for error in errors {
            combined.combine(error);
        }
        Err(Some(combined))
    }
}

impl Drop for Ctxt {
    fn drop(&mut self) {
        if !thread::panicking() && self.errors.borrow().is_some() {
            panic!("procflow-derive: forgot to check for errors");
        }
    }
}
