//! `GET /api/summaries`: the procedures as a list shows them, from the executor's memory,
//! filtered, paged and counted on the server, so a page over a million procedures
//! downloads one page.
//!
//! The rows come from one [`Snapshot`] of the executor's table, shared by every request
//! and rebuilt only when something changed, and then at most once a second: pages that
//! poll an unchanged executor cost a comparison each (`since`), and pages that poll a
//! busy one share one rebuild a second, taken from the table a few thousand entries at a
//! time (`Executor::snapshot`) so steps are not held up. A request never waits for a
//! rebuild (but the very first): it is answered from the snapshot in hand while the next
//! one is built in the background.

use super::error::ApiError;
use super::server::Shared;
use crate::ProcedureId;
use crate::executor::{ProcedureInfo, Status};
use axum::Json;
use axum::extract::{Query, State};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How stale a busy executor's list may be.
const REBUILD_AT_MOST_EVERY: Duration = Duration::from_secs(1);
/// Rows per page unless `limit` says otherwise, and the most it may say.
const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;

/// One procedure as the list shows it.
#[derive(Serialize)]
struct Row {
    id: ProcedureId,
    parent: Option<ProcedureId>,
    machine: &'static str,
    state: &'static str,
    #[serde(serialize_with = "crate::operator::ser::status")]
    status: Status,
    steps: u64,
    /// One line on why it is where it is.
    detail: String,
    /// What the text filter searches, in lower case, made once per snapshot.
    #[serde(skip)]
    text: String,
}

impl Row {
    fn of(info: ProcedureInfo) -> Self {
        let detail = match (&info.status, &info.error) {
            (Status::Suspended { event }, _) => format!("on {event}"),
            (
                Status::Stuck {
                    error, attempts, ..
                },
                _,
            ) => format!("{attempts} attempts: {error}"),
            (_, Some(error)) => error.to_string(),
            _ => String::new(),
        };
        // Fields joined by a character no text filter is trimmed to, so a match does not
        // span two of them.
        let text = format!(
            "{}\n{}\n{}\n{}\n{}",
            info.id.get(),
            info.machine,
            info.state,
            info.status.name(),
            detail
        )
        .to_lowercase();
        Self {
            id: info.id,
            parent: info.parent,
            machine: info.machine,
            state: info.state,
            status: info.status,
            steps: info.steps,
            detail,
            text,
        }
    }

    /// Whether the row contains `text` (lower case, trimmed) in its id, machine, state,
    /// status or detail.
    fn contains(&self, text: &str) -> bool {
        self.text.contains(text)
    }
}

/// The table at one moment: rows by id, counts, and each procedure's children.
pub(super) struct Snapshot {
    /// The process's change count it was built at.
    version: u64,
    built: Instant,
    rows: Vec<Row>,
    by_status: BTreeMap<&'static str, usize>,
    by_machine: BTreeMap<&'static str, usize>,
    children: HashMap<u64, Vec<ProcedureId>>,
}

impl Snapshot {
    fn build(version: u64, infos: Vec<ProcedureInfo>) -> Self {
        let mut snapshot = Self {
            version,
            built: Instant::now(),
            rows: Vec::with_capacity(infos.len()),
            by_status: BTreeMap::new(),
            by_machine: BTreeMap::new(),
            children: HashMap::new(),
        };
        for info in infos {
            *snapshot.by_status.entry(info.status.name()).or_default() += 1;
            *snapshot.by_machine.entry(info.machine).or_default() += 1;
            if let Some(parent) = info.parent {
                snapshot
                    .children
                    .entry(parent.get())
                    .or_default()
                    .push(info.id);
            }
            snapshot.rows.push(Row::of(info));
        }
        snapshot
    }

    /// Procedure `id`'s children, by id (from memory: live ones and those finished
    /// within their retention).
    pub(super) fn children(&self, id: u64) -> &[ProcedureId] {
        self.children.get(&id).map_or(&[], Vec::as_slice)
    }
}

/// What the executor's admin keeps between requests.
#[derive(Default)]
pub(super) struct Cache {
    current: Arc<Mutex<Option<Arc<Snapshot>>>>,
    /// A rebuild is under way (in the background).
    rebuilding: Arc<AtomicBool>,
    /// The first build: the only one requests wait for.
    first: tokio::sync::Mutex<()>,
}

impl Cache {
    /// The snapshot in hand; if something changed since it was built, and it is at least
    /// a second old, a new one is started in the background for the next requests.
    pub(super) async fn get<E: Send + Sync + 'static>(
        &self,
        executor: &crate::executor::Executor<E>,
    ) -> Arc<Snapshot> {
        if let Some(snapshot) = self.in_hand() {
            let stale = snapshot.version != executor.changes()
                && snapshot.built.elapsed() >= REBUILD_AT_MOST_EVERY;
            if stale && !self.rebuilding.swap(true, Ordering::AcqRel) {
                let (current, rebuilding) =
                    (Arc::clone(&self.current), Arc::clone(&self.rebuilding));
                let executor = executor.clone();
                tokio::task::spawn_blocking(move || {
                    let built = Arc::new(build(&executor));
                    *current.lock().unwrap_or_else(|e| e.into_inner()) = Some(built);
                    rebuilding.store(false, Ordering::Release);
                });
            }
            return snapshot;
        }
        let _first = self.first.lock().await;
        if let Some(snapshot) = self.in_hand() {
            return snapshot;
        }
        let executor = executor.clone();
        let built = tokio::task::spawn_blocking(move || Arc::new(build(&executor)))
            .await
            .expect("building a snapshot does not panic");
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::clone(&built));
        built
    }

    fn in_hand(&self) -> Option<Arc<Snapshot>> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// A snapshot of `executor` now (its version read first: a change during the build
/// makes the next request build again).
fn build<E: Send + Sync + 'static>(executor: &crate::executor::Executor<E>) -> Snapshot {
    let version = executor.changes();
    Snapshot::build(version, executor.snapshot())
}

/// `?status=stuck&machine=job&state=Ship&q=text&order=desc&after=ID&limit=N&since=V`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    status: Option<String>,
    machine: Option<String>,
    state: Option<String>,
    q: Option<String>,
    /// `asc` (by id, the default) or `desc`.
    order: Option<String>,
    /// The page starts after this id (in the order asked).
    after: Option<u64>,
    limit: Option<usize>,
    /// The `version` of the list the caller shows: if nothing changed since, the answer
    /// says so and carries no rows.
    since: Option<u64>,
}

impl ListQuery {
    fn admits(&self, row: &Row, text: Option<&str>) -> bool {
        let is = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        is(&self.status, row.status.name())
            && is(&self.machine, row.machine)
            && is(&self.state, row.state)
            && text.is_none_or(|text| row.contains(text))
    }
}

/// `GET /api/summaries`: `{"version", "total", "matched", "counts": {"status": {..},
/// "machine": {..}}, "rows": [..], "next": id or null}`, or `{"version", "unchanged":
/// true}` when `since` is the current version.
pub(super) async fn list<E: Send + Sync + 'static>(
    State(shared): State<Arc<Shared<E>>>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(query) = query.map_err(|e| {
        ApiError::new(
            axum::http::StatusCode::BAD_REQUEST,
            format!(
                "{e}; the parameters are status, machine, state, q, order (asc or desc), \
                 after, limit and since"
            ),
        )
    })?;
    let descending = match query.order.as_deref() {
        None | Some("asc") => false,
        Some("desc") => true,
        Some(other) => {
            return Err(ApiError::new(
                axum::http::StatusCode::BAD_REQUEST,
                format!("order must be `asc` or `desc`, not `{other}`"),
            ));
        }
    };
    let snapshot = shared.summaries.get(&shared.executor).await;
    if query.since == Some(snapshot.version) {
        return Ok(Json(
            json!({ "version": snapshot.version, "unchanged": true }),
        ));
    }
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    let text = query.q.as_deref().map(str::trim).filter(|t| !t.is_empty());
    let text = text.map(str::to_lowercase);
    let admitted = |row: &&Row| query.admits(row, text.as_deref());
    let rows = &snapshot.rows;
    // Where the page starts: just after `after`, by a binary search on the sorted ids.
    let (page, matched): (Vec<&Row>, usize) = if descending {
        let end = query.after.map_or(rows.len(), |after| {
            rows.partition_point(|r| r.id.get() < after)
        });
        let page = rows[..end].iter().rev().filter(admitted).take(limit + 1);
        (page.collect(), rows.iter().filter(admitted).count())
    } else {
        let start = query
            .after
            .map_or(0, |after| rows.partition_point(|r| r.id.get() <= after));
        let page = rows[start..].iter().filter(admitted).take(limit + 1);
        (page.collect(), rows.iter().filter(admitted).count())
    };
    let next = (page.len() > limit).then(|| page[limit - 1].id);
    let page = &page[..page.len().min(limit)];
    Ok(Json(json!({
        "version": snapshot.version,
        "total": rows.len(),
        "matched": matched,
        "counts": { "status": snapshot.by_status, "machine": snapshot.by_machine },
        "rows": page,
        "next": next,
    })))
}
