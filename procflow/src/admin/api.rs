//! The JSON endpoints: reads of the executor's live view, and the operators' requests.

use super::auth::Actor;
use super::error::ApiError;
use super::server::Shared;
use crate::ProcedureId;
use crate::executor::Handled;
use crate::operator::{Action, Catalog, ProcedureRecord, Request};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;

type Shared_<E> = State<Arc<Shared<E>>>;

/// `?status=stuck&machine=job`.
#[derive(Deserialize)]
pub(super) struct Filter {
    status: Option<String>,
    machine: Option<String>,
}

pub(super) async fn list<E: Send + Sync + 'static>(
    State(shared): Shared_<E>,
    Query(filter): Query<Filter>,
) -> Result<Json<Vec<ProcedureRecord>>, ApiError> {
    let catalog = shared.executor.catalog().await?;
    let records = catalog.records().iter().filter(|r| {
        let status = filter.status.as_deref();
        status.is_none_or(|s| r.status.name() == s)
            && filter.machine.as_deref().is_none_or(|m| r.machine == m)
    });
    Ok(Json(records.cloned().collect()))
}

/// One procedure's record, with its data: `data` (JSON, redacted as its machine says, or
/// `null`) and `data_note` (why it is `null`).
pub(super) async fn record<E: Send + Sync + 'static>(
    State(shared): Shared_<E>,
    Path(id): Path<u64>,
) -> Result<Json<Value>, ApiError> {
    // Its children from the shared list's index: finding them in the table would scan
    // it, under the lock steps need, on every poll of an open procedure.
    let read = shared
        .executor
        .record_and_data(ProcedureId::new(id))
        .await?;
    let (mut record, shown) = read.ok_or_else(|| ApiError::not_found(id))?;
    let snapshot = shared.executor.lists().get(&shared.executor).await;
    record.children = snapshot.children(id).to_vec();
    let mut answer = serde_json::to_value(&record).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("record #{id}: {e}"),
        )
    })?;
    let (data, note) = shown.into_fields();
    if let Value::Object(fields) = &mut answer {
        fields.insert("data".into(), data);
        fields.insert("data_note".into(), note);
    }
    Ok(Json(answer))
}

/// `{"mermaid": .., "svg": ..}`, both with the procedure's path drawn on its machine.
pub(super) async fn diagram<E: Send + Sync + 'static>(
    State(shared): Shared_<E>,
    Path(id): Path<u64>,
) -> Result<Json<Value>, ApiError> {
    // This procedure and its machine only: a click costs two reads, at any store size.
    let catalog = shared.executor.one(ProcedureId::new(id)).await?;
    let catalog = catalog.ok_or_else(|| ApiError::not_found(id))?;
    let record = catalog
        .get(ProcedureId::new(id))
        .ok_or_else(|| ApiError::not_found(id))?;
    let no_graph = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("the store holds no graph of machine `{}`", record.machine),
        )
    };
    let mermaid = catalog.diagram(record.id).ok_or_else(no_graph)?;
    let svg = catalog.svg(record.id).ok_or_else(no_graph)?;
    Ok(Json(json!({ "mermaid": mermaid, "svg": svg })))
}

pub(super) async fn catalog<E: Send + Sync + 'static>(
    State(shared): Shared_<E>,
) -> Result<Json<Catalog>, ApiError> {
    Ok(Json(shared.executor.catalog().await?))
}

pub(super) async fn locks<E: Send + Sync + 'static>(State(shared): Shared_<E>) -> Json<Value> {
    let held = shared.executor.held_locks().into_iter();
    let held: Vec<Value> = held
        .map(|(id, lock)| json!({ "id": id, "lock": lock }))
        .collect();
    Json(json!({ "held": held, "waiting": shared.executor.lock_waiters() }))
}

/// Any other path: a JSON 404 that names it (axum's own is empty).
pub(super) async fn unknown(uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no such page or endpoint: {}", uri.path()),
    )
}

/// The body of a mutation; every field optional except a bypass's `reason`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct Ask {
    by: Option<String>,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    recursive: bool,
}

impl Ask {
    /// The body parsed (the token was checked before it was read: `auth::writes`).
    fn parse(body: &Bytes) -> Result<Self, ApiError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::default());
        }
        // `null` is no body too.
        serde_json::from_slice::<Option<Self>>(body)
            .map(Option::unwrap_or_default)
            .map_err(|e| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "the body must be JSON like {{\"by\": \"alice\", \"reason\": \"..\"}}: {e}"
                    ),
                )
            })
    }

    /// The request, by the token's holder: a different name the body claims is kept
    /// beside it, never instead of it.
    fn request(self, action: Action, actor: &Actor) -> Request {
        let name = &*actor.0;
        let by = match self.by {
            Some(claimed) if !claimed.is_empty() && claimed != name => {
                format!("{name} (as {claimed})")
            }
            _ => name.to_owned(),
        };
        Request::new(action, by, self.reason)
    }
}

pub(super) async fn abort<E: Send + Sync + 'static>(
    State(shared): Shared_<E>,
    Path(id): Path<u64>,
    Extension(actor): Extension<Actor>,
    body: Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let ask = Ask::parse(&body)?;
    carry_out(&shared, ask.request(Action::Abort(id), &actor)).await
}

pub(super) async fn bypass<E: Send + Sync + 'static>(
    State(shared): Shared_<E>,
    Path(id): Path<u64>,
    Extension(actor): Extension<Actor>,
    body: Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let ask = Ask::parse(&body)?;
    if ask.reason.trim().is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "a bypass needs a reason: it is recorded in the procedure's history",
        ));
    }
    let recursive = ask.recursive;
    carry_out(
        &shared,
        ask.request(Action::Bypass { id, recursive }, &actor),
    )
    .await
}

pub(super) async fn wake<E: Send + Sync + 'static>(
    State(shared): Shared_<E>,
    Path(event): Path<String>,
    Extension(actor): Extension<Actor>,
    body: Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let ask = Ask::parse(&body)?;
    carry_out(&shared, ask.request(Action::Wake(event), &actor)).await
}

/// Hands `request` to the executor, waits until it is done, and logs what became of it.
async fn carry_out<E: Send + Sync + 'static>(
    shared: &Shared<E>,
    request: Request,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let (action, by, reason) = (
        request.action.clone(),
        request.by.clone(),
        request.reason.clone(),
    );
    let handled = shared.executor.request(request).await;
    tracing::info!(
        target: "procflow::admin",
        ?action,
        by,
        reason,
        outcome = ?handled,
        "operator request"
    );
    match handled? {
        Handled::Done { procedures } => Ok((
            StatusCode::OK,
            Json(json!({ "outcome": "done", "procedures": procedures })),
        )),
        Handled::Refused(why) => Ok((
            StatusCode::CONFLICT,
            Json(json!({ "outcome": "refused", "reason": why })),
        )),
        // Handled is non_exhaustive for callers outside the crate only.
    }
}
