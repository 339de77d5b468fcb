//! `--url`: the same commands through a running executor's admin API
//! (`procflow::admin`): reads fetch its catalog, writes post its requests, which it
//! carries out at once.

use procflow::operator::{Action, Catalog, Request};
use serde_json::{Value, json};

/// The executor's live catalog (`GET /api/catalog`), with `token` if given (an admin with
/// a read token wants one).
pub fn catalog(url: &str, token: Option<&str>) -> Result<Catalog, String> {
    let (status, body) = call(url, "api/catalog", token, None)?;
    if status != 200 {
        return Err(error_of(status, &body));
    }
    serde_json::from_value(body)
        .map_err(|e| format!("{url} answered a catalog this CLI cannot read: {e}"))
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
