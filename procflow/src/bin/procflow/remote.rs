//! `--url`: the same commands through a running executor's admin API
//! (`procflow::admin`). Reads use the endpoints the page uses, which answer from the
//! executor's memory or by key: `list` pages through `/api/summaries`, `show`,
//! `history` and `diagram` read one procedure by id, `locks` reads `/api/locks`. Writes
//! post their requests, which it carries out at once; a write checks the ids it names
//! by key, and a bulk write selects its procedures from the same list.

use procflow::ProcedureId;
use procflow::locks::Lock;
use procflow::operator::{Action, ProcedureRecord, Request};
use serde_json::{Value, json};
use std::time::{Duration, SystemTime};

use crate::act::Procedures;
use crate::args::Filter;

/// Rows asked per page of `/api/summaries` (its most).
const PAGE: usize = 1000;

/// Every row of the list that the server's filters pass, page after page (`GET
/// /api/summaries?status=&machine=`), as the API writes them.
pub fn list(
    url: &str,
    token: Option<&str>,
    status: Option<&str>,
    machine: Option<&str>,
) -> Result<Vec<Value>, String> {
    let mut query = format!("limit={PAGE}");
    for (key, value) in [("status", status), ("machine", machine)] {
        if let Some(value) = value {
            query.push_str(&format!("&{key}={}", escape(value)));
        }
    }
    let mut rows = Vec::new();
    let mut after: Option<u64> = None;
    loop {
        // The first page from a list with every change made so far (a list that pages
        // poll may be a rebuild behind); the next pages from the same or a newer one.
        let page = after.map_or("&fresh=true".to_owned(), |id| format!("&after={id}"));
        let body = get(url, &format!("api/summaries?{query}{page}"), token)?;
        let Some(page_rows) = body["rows"].as_array() else {
            return Err(format!(
                "{url} answered a list this CLI cannot read: {body}"
            ));
        };
        rows.extend(page_rows.iter().cloned());
        match body["next"].as_u64() {
            Some(next) => after = Some(next),
            None => return Ok(rows),
        }
    }
}

/// A running executor, as a write command finds the procedures it names.
pub struct Remote<'a> {
    pub url: &'a str,
    pub token: Option<&'a str>,
}

impl Procedures for Remote<'_> {
    fn check(&self, id: u64) -> Result<(), String> {
        record(self.url, self.token, id).map(drop)
    }

    /// The list's rows with the filter's status and machine (filtered by the server),
    /// submitted before `--older-than` ago and not ended.
    fn live(&self, filter: &Filter) -> Result<Vec<u64>, String> {
        let (status, machine) = (filter.status.as_deref(), filter.machine.as_deref());
        let rows = list(self.url, self.token, status, machine)?;
        let older_than = filter.older_than.map(|age| SystemTime::now() - age.0);
        let mut live = Vec::new();
        for row in &rows {
            let (Some(id), Some(submitted)) = (row["id"].as_u64(), row["submitted_ms"].as_u64())
            else {
                return Err(format!(
                    "{} answered a row this CLI cannot read: {row}",
                    self.url
                ));
            };
            let submitted = SystemTime::UNIX_EPOCH + Duration::from_millis(submitted);
            let ended = ENDED.contains(&row["status"]["name"].as_str().unwrap_or_default());
            if !ended && older_than.is_none_or(|limit| submitted <= limit) {
                live.push(id);
            }
        }
        Ok(live)
    }
}

/// The names of the statuses of an ended procedure, as the API writes them
/// (`Status::name` of those whose `is_finished` holds).
const ENDED: [&str; 4] = ["succeeded", "rolled-back", "failed", "bypassed"];

/// One procedure's record, read by id (`GET /api/procedures/{id}`).
pub fn record(url: &str, token: Option<&str>, id: u64) -> Result<ProcedureRecord, String> {
    let body = get(url, &format!("api/procedures/{id}"), token)?;
    serde_json::from_value(body)
        .map_err(|e| format!("{url} answered a record this CLI cannot read: {e}"))
}

/// Procedure `id`'s machine in Mermaid, its path drawn on it.
pub fn diagram(url: &str, token: Option<&str>, id: u64) -> Result<String, String> {
    let body = get(url, &format!("api/procedures/{id}/diagram"), token)?;
    body["mermaid"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("{url} answered a diagram without Mermaid: {body}"))
}

/// The locks held now, with their holders (`GET /api/locks`).
pub fn held_locks(url: &str, token: Option<&str>) -> Result<Vec<(ProcedureId, Lock)>, String> {
    let body = get(url, "api/locks", token)?;
    let held = body["held"].as_array().cloned().unwrap_or_default();
    held.into_iter()
        .map(|entry| {
            let id = entry["id"].as_u64().map(ProcedureId::new);
            let lock = serde_json::from_value(entry["lock"].clone()).ok();
            id.zip(lock)
                .ok_or_else(|| format!("{url} answered locks this CLI cannot read: {entry}"))
        })
        .collect()
}

/// A GET that must answer 200.
fn get(url: &str, path: &str, token: Option<&str>) -> Result<Value, String> {
    let (status, body) = call(url, path, token, None)?;
    if status != 200 {
        return Err(error_of(status, &body));
    }
    Ok(body)
}

/// Posts `request`; says what became of it, or why it failed.
pub fn send(url: &str, token: Option<&str>, request: &Request) -> Result<String, String> {
    let ask = json!({ "by": request.by, "reason": request.reason });
    let (path, body) = match &request.action {
        Action::Abort(id) => (format!("api/procedures/{id}/abort"), ask),
        Action::Bypass { id, recursive } => {
            let mut ask = ask;
            ask["recursive"] = json!(recursive);
            (format!("api/procedures/{id}/bypass"), ask)
        }
        Action::Wake(event) => (format!("api/events/{}/wake", escape(event)), ask),
        other => return Err(format!("{other:?} cannot be sent to the admin API")),
    };
    let (status, answer) = call(url, &path, Some(token.unwrap_or_default()), Some(body))?;
    match answer["outcome"].as_str() {
        Some("done") => Ok(format!(
            "{:?}: done for {} procedure(s)",
            request.action, answer["procedures"]
        )),
        Some("refused") => Err(format!(
            "{:?}: refused: {}",
            request.action, answer["reason"]
        )),
        _ => Err(format!(
            "{:?}: {}",
            request.action,
            error_of(status, &answer)
        )),
    }
}

/// One HTTP call: its status and JSON body, or why there is none.
fn call(
    url: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> Result<(u16, Value), String> {
    let full = format!("{}/{path}", url.trim_end_matches('/'));
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent();
    let bearer = format!("Bearer {}", token.unwrap_or_default());
    let sent = match (body, token) {
        (None, None) => agent.get(&full).call(),
        (None, Some(_)) => agent.get(&full).header("Authorization", &bearer).call(),
        (Some(body), _) => agent
            .post(&full)
            .header("Authorization", &bearer)
            .send_json(&body),
    };
    let mut response = sent.map_err(|e| format!("cannot reach the admin API at {url}: {e}"))?;
    let status = response.status().as_u16();
    let body = response.body_mut().read_json::<Value>().map_err(|e| {
        format!("{full} answered {status} without JSON ({e}): is it a procflow admin API?")
    })?;
    Ok((status, body))
}

fn error_of(status: u16, body: &Value) -> String {
    let message = body["error"].as_str().unwrap_or("no reason given");
    match status {
        401 | 403 => format!("{message} (give the token with --token or PROCFLOW_TOKEN)"),
        _ => format!("{status}: {message}"),
    }
}

/// Percent-encodes an event name for a URL path segment.
fn escape(segment: &str) -> String {
    let mut out = String::new();
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}
