//! How the operator types serialize (for the CLI's `--json` and the admin API): times as
//! milliseconds since the Unix epoch, statuses by name, errors as their messages; and how
//! they read back.

use crate::Error;
use crate::executor::Status;
use serde::de::Error as _;
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serializer};
use std::time::{SystemTime, UNIX_EPOCH};

pub(crate) fn millis(time: &SystemTime) -> u64 {
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

// The way back, for a client of the admin API (`procflow --url`): a record read from JSON
// equals the one written, but for errors, which come back as fatal errors with the same
// message.

fn time(ms: u64) -> SystemTime {
    UNIX_EPOCH + std::time::Duration::from_millis(ms)
}

pub(crate) fn de_ms<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
    u64::deserialize(d).map(time)
}

pub(crate) fn de_opt_ms<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SystemTime>, D::Error> {
    Ok(Option::<u64>::deserialize(d)?.map(time))
}

pub(crate) fn de_opt_error<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Error>, D::Error> {
    Ok(Option::<String>::deserialize(d)?.map(Error::fatal))
}

/// The map [`status`] writes.
#[derive(Deserialize)]
struct StatusRepr {
    name: String,
    event: Option<String>,
    error: Option<String>,
    since_ms: Option<u64>,
    attempts: Option<u32>,
}

pub(crate) fn de_status<'de, D: Deserializer<'de>>(d: D) -> Result<Status, D::Error> {
    let repr = StatusRepr::deserialize(d)?;
    Ok(match repr.name.as_str() {
        "runnable" => Status::Runnable,
        "waiting-children" => Status::WaitingChildren,
        "waiting-lock" => Status::WaitingForLock,
        "suspended" => Status::Suspended {
            event: repr.event.unwrap_or_default(),
        },
        "stuck" => Status::Stuck {
            error: Error::fatal(repr.error.unwrap_or_default()),
            since: time(repr.since_ms.unwrap_or_default()),
            attempts: repr.attempts.unwrap_or_default(),
        },
        "rolling-back" => Status::RollingBack,
        "succeeded" => Status::Succeeded,
        "rolled-back" => Status::RolledBack,
        "failed" => Status::Failed,
        "bypassed" => Status::Bypassed,
        other => return Err(D::Error::custom(format!("unknown status `{other}`"))),
    })
}
