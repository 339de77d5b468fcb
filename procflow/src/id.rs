//! Procedure identifiers.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The identifier of one procedure.
///
/// Ids are handed out by the executor; they are monotonic and never reused, also
/// across restarts (they are reserved in the store in blocks of 1024, so after a restart
/// the next id may jump ahead). The in-memory [`Stepper`](crate::Stepper) uses
/// [`ProcedureId::new`] with any value the caller picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ProcedureId(u64);

impl ProcedureId {
    /// Wraps a raw id.
    #[must_use]
    pub const fn new(raw: u64) -> Self {
        Self(raw)
    }

    /// The raw id, as the store keys it.
    #[must_use]
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for ProcedureId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`, so `{:<6}` and friends line ids up in tables.
        f.pad(&format!("#{}", self.0))
    }
}
