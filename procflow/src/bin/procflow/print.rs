//! Output: aligned tables for people, one JSON document for scripts (`--json`).

use procflow::ProcedureId;
use procflow::operator::{Catalog, HistoryEntry, ProcedureRecord, StepOutcome, Waiting};
use serde::Serialize;
use std::time::{SystemTime, UNIX_EPOCH};

pub fn list(records: &[&ProcedureRecord], json: bool) {
    if json {
        return print_json(&records);
    }
    let rows = records.iter().map(|r| {
        vec![
            r.id.to_string(),
            r.machine.clone(),
            r.state.clone(),
            r.status.name().to_owned(),
            r.steps.to_string(),
            r.parent.map_or_else(|| "-".to_owned(), |p| p.to_string()),
            clock(r.updated),
            detail(r),
        ]
    });
    table(&LIST_COLUMNS, rows.collect());
}

/// The columns of a list, from the store or from the admin API.
const LIST_COLUMNS: [&str; 8] = [
    "ID", "MACHINE", "STATE", "STATUS", "STEPS", "PARENT", "UPDATED", "DETAIL",
];

/// The list as `/api/summaries` gives it (`--url`): the same columns as [`list`].
pub fn rows(rows: &[serde_json::Value], json: bool) {
    if json {
        return print_json(&rows);
    }
    let text = |value: &serde_json::Value| match value {
        serde_json::Value::String(text) => text.clone(),
        serde_json::Value::Null => "-".to_owned(),
        other => other.to_string(),
    };
    let time = |value: &serde_json::Value| {
        let ms = value.as_u64().unwrap_or(0);
        clock(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms))
    };
    let rows = rows.iter().map(|r| {
        vec![
            text(&r["id"]),
            text(&r["machine"]),
            text(&r["state"]),
            text(&r["status"]["name"]),
            text(&r["steps"]),
            text(&r["parent"]),
            time(&r["updated_ms"]),
            text(&r["detail"]),
        ]
    });
    table(&LIST_COLUMNS, rows.collect());
}

pub fn unreadable(unreadable: &[(ProcedureId, String)]) {
    for (id, reason) in unreadable {
        eprintln!("procedure {id} cannot be read: {reason}");
    }
}

/// One procedure in full; its descendants from `catalog` (without one, from `--url`,
/// its children by id).
pub fn show(catalog: Option<&Catalog>, record: &ProcedureRecord, json: bool) {
    if json {
        return print_json(record);
    }
    let field = |name: &str, value: String| println!("{name:<12} {value}");
    field("id", record.id.to_string());
    field("machine", record.machine.clone());
    if let Some(summary) = &record.summary {
        field("summary", summary.clone());
    }
    field("status", record.status.name().to_owned());
    field("state", record.state.clone());
    field("steps", record.steps.to_string());
    field("data version", record.data_version.to_string());
    if let Some(nonce) = &record.nonce {
        field("nonce", nonce.clone());
    }
    field("submitted", clock(record.submitted));
    field("updated", clock(record.updated));
    if let Some(finished) = record.finished {
        field("finished", clock(finished));
    }
    if let Some(cause) = &record.cause {
        field("cause", cause.to_string());
    }
    if let Some(error) = &record.last_error {
        field(
            "last error",
            format!("{error} (attempt {})", record.attempts),
        );
    }
    field("waiting", waiting(&record.waiting));
    let locks: Vec<String> = record.locks.iter().map(ToString::to_string).collect();
    if !locks.is_empty() {
        let held = if record.holds_locks {
            "held"
        } else {
            "not held"
        };
        field(
            "locks",
            format!("{} ({held}, {:?})", locks.join(", "), record.hold),
        );
    }
    if let Some(abort) = &record.abort_requested {
        field("abort", format!("requested: {abort}"));
    }
    if let Some(bypass) = &record.bypass {
        field(
            "bypassed",
            format!(
                "by {} at {}: {}",
                bypass.by,
                clock(bypass.at),
                bypass.reason
            ),
        );
    }
    println!("tree");
    tree(catalog, record, 1);
}

/// The procedure and its descendants, indented.
fn tree(catalog: Option<&Catalog>, record: &ProcedureRecord, depth: usize) {
    println!(
        "{:indent$}{} {} {} ({})",
        "",
        record.id,
        record.machine,
        record.state,
        record.status.name(),
        indent = depth * 2
    );
    for &child in &record.children {
        match catalog.and_then(|catalog| catalog.get(child)) {
            Some(child) => tree(catalog, child, depth + 1),
            None if catalog.is_none() => println!("{:indent$}{child}", "", indent = depth * 2 + 2),
            None => {}
        }
    }
}

pub fn history(record: &ProcedureRecord, json: bool) {
    if json {
        return print_json(&record.history);
    }
    if record.history_dropped > 0 {
        println!("({} older entries dropped)", record.history_dropped);
    }
    let rows = record.history.iter().map(|entry: &HistoryEntry| {
        vec![
            clock(entry.at),
            format!("{:?}", entry.kind).to_lowercase(),
            entry.state.clone(),
            outcome(&entry.outcome),
        ]
    });
    table(&["AT", "KIND", "STATE", "OUTCOME"], rows.collect());
}

pub fn locks(held: &[(ProcedureId, procflow::locks::Lock)], json: bool) {
    if json {
        #[derive(Serialize)]
        struct Held<'a> {
            procedure: ProcedureId,
            lock: &'a procflow::locks::Lock,
        }
        let held: Vec<_> = held
            .iter()
            .map(|(procedure, lock)| Held {
                procedure: *procedure,
                lock,
            })
            .collect();
        return print_json(&held);
    }
    let rows = held.iter().map(|(id, lock)| {
        vec![
            lock.key().to_owned(),
            format!("{:?}", lock.mode()).to_lowercase(),
            id.to_string(),
        ]
    });
    table(&["KEY", "MODE", "HELD BY"], rows.collect());
}

fn detail(record: &ProcedureRecord) -> String {
    if let Some(error) = &record.last_error {
        return error.clone();
    }
    if let Some(cause) = &record.cause {
        return cause.to_string();
    }
    match &record.waiting {
        Waiting::Nothing => String::new(),
        other => waiting(other),
    }
}

fn waiting(waiting: &Waiting) -> String {
    match waiting {
        Waiting::Nothing => "nothing".to_owned(),
        Waiting::Children(ids) => {
            let ids: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
            format!("children {}", ids.join(" "))
        }
        Waiting::Event { event, until } => match until {
            Some(until) => format!("event `{event}` until {}", clock(*until)),
            None => format!("event `{event}`"),
        },
        _ => format!("{waiting:?}"),
    }
}

fn outcome(outcome: &StepOutcome) -> String {
    match outcome {
        StepOutcome::Moved => "moved on".to_owned(),
        StepOutcome::Spawned(n) => format!("spawned {n} children"),
        StepOutcome::Suspended(event) => format!("suspended on `{event}`"),
        StepOutcome::Retried(error) => format!("failed, retried: {error}"),
        StepOutcome::Failed(error) => format!("failed: {error}"),
        StepOutcome::Undone => "undone".to_owned(),
        StepOutcome::Interrupted(cause) => format!("interrupted: {cause}"),
        StepOutcome::Bypassed { by, reason } => format!("bypassed by {by}: {reason}"),
        StepOutcome::Ended => "ended".to_owned(),
        other => format!("{other:?}"),
    }
}

/// UTC, to the second: `2026-11-23 14:05:09`.
fn clock(time: SystemTime) -> String {
    let secs = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(i64::try_from(days).unwrap_or(0));
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// Days since 1970-01-01 to a (year, month, day) of the proleptic Gregorian calendar
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let month = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn table(headers: &[&str], rows: Vec<Vec<String>>) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(headers.to_vec());
    for row in &rows {
        line(row.iter().map(String::as_str).collect());
    }
}

fn print_json<T: Serialize + ?Sized>(value: &T) {
    match serde_json::to_string_pretty(value) {
        Ok(text) => println!("{text}"),
        Err(error) => eprintln!("procflow: cannot print JSON: {error}"),
    }
}
