//! How the operator types serialize (for the CLI's `--json` and the admin API): times as
//! milliseconds since the Unix epoch, statuses by name, errors as their messages.

use crate::Error;
use crate::executor::Status;
use serde::Serializer;
use serde::ser::SerializeMap;
use std::time::{SystemTime, UNIX_EPOCH};

fn millis(time: &SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub(crate) fn ms<S: Serializer>(time: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(millis(time))
}

pub(crate) fn opt_ms<S: Serializer>(time: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
    match time {
        Some(time) => s.serialize_some(&millis(time)),
        None => s.serialize_none(),
    }
}

pub(crate) fn opt_error<S: Serializer>(error: &Option<Error>, s: S) -> Result<S::Ok, S::Error> {
    match error {
        Some(error) => s.serialize_some(&error.to_string()),
        None => s.serialize_none(),
    }
}

/// `{"name": "stuck", "error": "...", "since_ms": 1, "attempts": 3}`, `{"name":
/// "suspended", "event": "..."}`, `{"name": "runnable"}`.
pub(crate) fn status<S: Serializer>(status: &Status, s: S) -> Result<S::Ok, S::Error> {
    let mut map = s.serialize_map(None)?;
    map.serialize_entry("name", status.name())?;
    match status {
        Status::Suspended { event } => map.serialize_entry("event", event)?,
        Status::Stuck {
            error,
            since,
            attempts,
        } => {
            map.serialize_entry("error", &error.to_string())?;
            map.serialize_entry("since_ms", &millis(since))?;
            map.serialize_entry("attempts", attempts)?;
        }
        _ => {}
    }
    map.end()
}
