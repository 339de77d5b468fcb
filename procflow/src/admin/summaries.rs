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

/// How stale a busy executor's list may be, at least; a list that takes long to build
/// is rebuilt less often (see [`Snapshot::rebuild_after`]).
const REBUILD_AT_MOST_EVERY: Duration = Duration::from_secs(1);
/// A rebuild may take one tenth of one core, at most: the rest is the steps'.
const REBUILD_SHARE: u32 = 10;
/// Rows per page unless `limit` says otherwise, and the most it may say.
const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;

/// One procedure as the list shows it. Made for every procedure at every rebuild, so it
/// allocates nothing of its own: its detail line is written when the row is sent.
struct Row(ProcedureInfo);

impl Serialize for Row {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let info = &self.0;
        let mut map = serializer.serialize_map(Some(9))?;
        map.serialize_entry("id", &info.id)?;
        map.serialize_entry("parent", &info.parent)?;
        map.serialize_entry("machine", info.machine)?;
        map.serialize_entry("state", info.state)?;
        map.serialize_entry("status", &StatusJson(&info.status))?;
        map.serialize_entry("steps", &info.steps)?;
        map.serialize_entry(
            "submitted_ms",
            &crate::operator::ser::millis(&info.submitted),
        )?;
        map.serialize_entry("updated_ms", &crate::operator::ser::millis(&info.updated))?;
        map.serialize_entry("detail", &self.detail())?;
        map.end()
    }
}

/// A status as the record API writes it (`{"name": .., ..}`).
struct StatusJson<'a>(&'a Status);

impl Serialize for StatusJson<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        crate::operator::ser::status(self.0, serializer)
    }
}

impl Row {
    fn id(&self) -> u64 {
        self.0.id.get()
    }

    /// One line on why it is where it is.
    fn detail(&self) -> String {
        match (&self.0.status, &self.0.error) {
            (Status::Suspended { event }, _) => format!("on {event}"),
            (
                Status::Stuck {
                    error, attempts, ..
                },
                _,
            ) => format!("{attempts} attempts: {error}"),
            (_, Some(error)) => error.to_string(),
            _ => String::new(),
        }
    }

    /// Whether the row shows `needle`'s text in its id, machine, state, status, event or
    /// error.
    fn contains(&self, needle: &Needle) -> bool {
        let info = &self.0;
        let mut digits = [0; 20];
        (needle.digits && needle.in_text(decimal(info.id.get(), &mut digits)))
            || needle.names.iter().any(|name| {
                [info.machine, info.state, info.status.name()]
                    .iter()
                    .any(|field| same_static(field, name))
            })
            || match &info.status {
                Status::Suspended { event } => needle.in_text(event),
                Status::Stuck { error, .. } => needle.in_text(&error.to_string()),
                _ => (info.error.as_ref()).is_some_and(|e| needle.in_text(&e.to_string())),
            }
    }
}

/// A text filter, prepared once per request: a million rows are then checked without
/// an allocation or a case fold each, but for their events.
struct Needle {
    /// Lower case, trimmed, not empty.
    text: String,
    /// Searches for `text`, set up once.
    finder: memchr::memmem::Finder<'static>,
    /// The text is all digits: ids may contain it.
    digits: bool,
    /// The machine, state and status names that contain it (few: a row's are checked
    /// against these by identity).
    names: Vec<&'static str>,
}

impl Needle {
    fn new(text: &str, snapshot: &Snapshot) -> Self {
        let text = text.to_lowercase();
        let digits = text.bytes().all(|b| b.is_ascii_digit());
        let names = (snapshot.names.iter().copied())
            .filter(|name| contains_folded(name, &text))
            .collect();
        Self {
            finder: memchr::memmem::Finder::new(text.as_bytes()).into_owned(),
            text,
            digits,
            names,
        }
    }

    /// Whether `hay` contains the text, ignoring `hay`'s ASCII case.
    fn in_text(&self, hay: &str) -> bool {
        // Most texts have no capitals: the prepared search is exact there.
        if !hay.bytes().any(|b| b.is_ascii_uppercase()) {
            return self.finder.find(hay.as_bytes()).is_some();
        }
        contains_folded(hay, &self.text)
    }
}

/// The same `&'static str`: the names of one machine's states come from one table, so a
/// pointer comparison settles it (a value comparison backs it up).
fn same_static(a: &'static str, b: &'static str) -> bool {
    std::ptr::eq(a, b) || a == b
}

/// `n` in decimal, written into `buf`.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &str {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    std::str::from_utf8(&buf[at..]).expect("digits are ASCII")
}

/// Whether `hay` contains `needle` (lower case), ignoring the ASCII case of `hay`.
fn contains_folded(hay: &str, needle: &str) -> bool {
    // Most fields have no capitals: the standard search, which is fast, is exact there.
    if !hay.bytes().any(|b| b.is_ascii_uppercase()) {
        return hay.contains(needle);
    }
    let (hay, needle) = (hay.as_bytes(), needle.as_bytes());
    let Some(&first) = needle.first() else {
        return true;
    };
    if needle.len() > hay.len() {
        return false;
    }
    (0..=hay.len() - needle.len()).any(|at| {
        hay[at].to_ascii_lowercase() == first
            && hay[at..at + needle.len()].eq_ignore_ascii_case(needle)
    })
}

/// The table at one moment: rows by id, counts, and each procedure's children.
pub(super) struct Snapshot {
    /// The process's change count it was built at.
    version: u64,
    built: Instant,
    /// How long building it took.
    took: Duration,
    rows: Vec<Row>,
    by_status: BTreeMap<&'static str, usize>,
    by_machine: BTreeMap<&'static str, usize>,
    children: HashMap<u64, Vec<ProcedureId>>,
    /// Every machine, state and status name of its rows, once.
    names: Vec<&'static str>,
    /// How many rows each filter asked of this snapshot matches ([`ListQuery::filter_key`]):
    /// counting them takes a pass over every row, which pages that poll one filter then
    /// pay once per snapshot, not once per poll. Emptied when it reaches
    /// [`MATCHED_KEPT`] filters.
    matched: Mutex<HashMap<String, usize>>,
}

/// The most filters whose match counts a snapshot keeps.
const MATCHED_KEPT: usize = 256;

impl Snapshot {
    fn build(version: u64, infos: Vec<ProcedureInfo>, started: Instant) -> Self {
        let mut snapshot = Self {
            version,
            built: started,
            took: Duration::ZERO,
            rows: Vec::with_capacity(infos.len()),
            by_status: BTreeMap::new(),
            by_machine: BTreeMap::new(),
            children: HashMap::new(),
            names: Vec::new(),
            matched: Mutex::default(),
        };
        let mut names = std::collections::BTreeSet::new();
        let mut last_state: Option<&'static str> = None;
        for info in infos {
            *snapshot.by_status.entry(info.status.name()).or_default() += 1;
            *snapshot.by_machine.entry(info.machine).or_default() += 1;
            if let Some(parent) = info.parent {
                let children = snapshot.children.entry(parent.get()).or_default();
                children.push(info.id);
            }
            // States repeat from one row to the next: a set insert only on a change.
            if !last_state.is_some_and(|last| same_static(last, info.state)) {
                names.insert(info.state);
                last_state = Some(info.state);
            }
            snapshot.rows.push(Row(info));
        }
        names.extend(snapshot.by_machine.keys().chain(snapshot.by_status.keys()));
        snapshot.names = names.into_iter().collect();
        snapshot.took = started.elapsed();
        snapshot
    }

    /// When a changed executor's list may be built again: a second after this one, or
    /// ten times as long as this one took, so that rebuilding a large list takes at most
    /// a tenth of one core from the steps (a million procedures are then a few seconds
    /// behind, at most).
    fn rebuild_after(&self) -> Duration {
        REBUILD_AT_MOST_EVERY.max(self.took * REBUILD_SHARE)
    }

    /// The match count of filter `key`, if a request counted it already.
    fn matched(&self, key: &str) -> Option<usize> {
        let counts = self.matched.lock().unwrap_or_else(|e| e.into_inner());
        counts.get(key).copied()
    }

    /// Keeps the match count of filter `key`.
    fn remember_matched(&self, key: String, count: usize) {
        let mut counts = self.matched.lock().unwrap_or_else(|e| e.into_inner());
        if counts.len() >= MATCHED_KEPT {
            counts.clear();
        }
        counts.insert(key, count);
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
    /// The snapshot in hand; if something changed since it was built, and it is old
    /// enough ([`Snapshot::rebuild_after`]), a new one is started in the background for
    /// the next requests.
    pub(super) async fn get<E: Send + Sync + 'static>(
        &self,
        executor: &crate::executor::Executor<E>,
    ) -> Arc<Snapshot> {
        if let Some(snapshot) = self.in_hand() {
            let stale = snapshot.version != executor.changes()
                && snapshot.built.elapsed() >= snapshot.rebuild_after();
            if stale && !self.rebuilding.swap(true, Ordering::AcqRel) {
                let (current, rebuilding) =
                    (Arc::clone(&self.current), Arc::clone(&self.rebuilding));
                let executor = executor.clone();
                tokio::task::spawn_blocking(move || {
                    install(&current, Arc::new(build(&executor)));
                    rebuilding.store(false, Ordering::Release);
                });
            }
            return snapshot;
        }
        let _first = self.first.lock().await;
        if let Some(snapshot) = self.in_hand() {
            return snapshot;
        }
        self.build_now(executor).await
    }

    /// A snapshot with every change made before the call: the one in hand if nothing
    /// changed since it was built, else one built now (not rate-limited: for one-off
    /// readers, not for pages that poll).
    pub(super) async fn fresh<E: Send + Sync + 'static>(
        &self,
        executor: &crate::executor::Executor<E>,
    ) -> Arc<Snapshot> {
        if let Some(snapshot) = self.in_hand() {
            if snapshot.version == executor.changes() {
                return snapshot;
            }
        }
        self.build_now(executor).await
    }

    /// Builds a snapshot now (off the runtime's threads), keeps it, and returns it.
    async fn build_now<E: Send + Sync + 'static>(
        &self,
        executor: &crate::executor::Executor<E>,
    ) -> Arc<Snapshot> {
        let executor = executor.clone();
        let built = tokio::task::spawn_blocking(move || Arc::new(build(&executor)))
            .await
            .expect("building a snapshot does not panic");
        install(&self.current, Arc::clone(&built));
        built
    }

    fn in_hand(&self) -> Option<Arc<Snapshot>> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Makes `built` the snapshot in hand, unless a newer one landed meanwhile (a fresh
/// build and a background rebuild may finish in either order).
fn install(current: &Mutex<Option<Arc<Snapshot>>>, built: Arc<Snapshot>) {
    let mut current = current.lock().unwrap_or_else(|e| e.into_inner());
    if current.as_ref().is_none_or(|c| c.version <= built.version) {
        *current = Some(built);
    }
}

/// A snapshot of `executor` now (its version read first: a change during the build
/// makes the next request build again).
fn build<E: Send + Sync + 'static>(executor: &crate::executor::Executor<E>) -> Snapshot {
    let started = Instant::now();
    let version = executor.changes();
    Snapshot::build(version, executor.snapshot(), started)
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
    /// `fresh=true`: answer from a list that has every change made before the request
    /// (built now if the one in hand is older), as a one-off reader such as the CLI
    /// wants; a polling page leaves it out and may be a rebuild behind.
    #[serde(default)]
    fresh: bool,
}

impl ListQuery {
    /// The filter alone (not the order or the page), as a key of
    /// [`Snapshot::matched`]: the text as the needle holds it (lower case, trimmed).
    fn filter_key(&self, text: Option<&Needle>) -> String {
        let part = |p: &Option<String>| p.as_deref().unwrap_or("\u{0}").to_owned();
        let text = text.map_or("\u{0}", |n| n.text.as_str());
        [part(&self.status), part(&self.machine), part(&self.state)].join("\u{1}") + "\u{1}" + text
    }

    fn admits(&self, row: &Row, text: Option<&Needle>) -> bool {
        let is = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        is(&self.status, row.0.status.name())
            && is(&self.machine, row.0.machine)
            && is(&self.state, row.0.state)
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
                 after, limit, since and fresh"
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
    let snapshot = if query.fresh {
        shared.summaries.fresh(&shared.executor).await
    } else {
        shared.summaries.get(&shared.executor).await
    };
    if query.since == Some(snapshot.version) {
        return Ok(Json(
            json!({ "version": snapshot.version, "unchanged": true }),
        ));
    }
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    let text = query.q.as_deref().map(str::trim).filter(|t| !t.is_empty());
    let needle = text.map(|text| Needle::new(text, &snapshot));
    let admitted = |row: &Row| query.admits(row, needle.as_ref());
    let rows = &snapshot.rows;
    // Where the page starts: just after `after` (a binary search on the sorted ids). The
    // first request of a filter on a snapshot counts its matches in the same pass that
    // collects the page; later ones stop once the page is full.
    let (before, from): (&[Row], &[Row]) = if descending {
        let end = query
            .after
            .map_or(rows.len(), |after| rows.partition_point(|r| r.id() < after));
        (&rows[end..], &rows[..end])
    } else {
        let start = query
            .after
            .map_or(0, |after| rows.partition_point(|r| r.id() <= after));
        (&rows[..start], &rows[start..])
    };
    let key = query.filter_key(needle.as_ref());
    let known = snapshot.matched(&key);
    let mut page: Vec<&Row> = Vec::with_capacity(limit + 1);
    let ordered: Box<dyn Iterator<Item = &Row>> = if descending {
        Box::new(from.iter().rev())
    } else {
        Box::new(from.iter())
    };
    let mut counted = 0;
    for row in ordered.filter(|row| admitted(row)) {
        counted += 1;
        if page.len() <= limit {
            page.push(row);
        } else if known.is_some() {
            break; // The count is known: the page (and whether there is a next) is all.
        }
    }
    let matched = known.unwrap_or_else(|| {
        let matched = counted + before.iter().filter(|row| admitted(row)).count();
        snapshot.remember_matched(key, matched);
        matched
    });
    let next = (page.len() > limit).then(|| page[limit - 1].0.id);
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
