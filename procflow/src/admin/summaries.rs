//! `GET /api/summaries`: the procedures as a list shows them, from the executor's memory,
//! filtered, paged and counted on the server, so a page over a million procedures
//! downloads one page.
//!
//! The rows come from one [`Snapshot`] of the executor's table, shared by every request
//! (and every admin over the executor) and brought up to date only when something
//! changed, and then at most once a second. Pages that poll an unchanged executor cost a
//! comparison each (`since`). The first snapshot reads the whole table, a few thousand
//! entries at a time so steps are not held up; every later one reads only the
//! procedures the executor noted as changed since (its journal, `executor/journal.rs`), copies
//! the chunks of rows they fall in and shares the rest with the snapshot before. A
//! request never waits for a build (but the very first): it is answered from the
//! snapshot in hand while the next one is built in the background.

use super::error::ApiError;
use super::server::Shared;
use crate::ProcedureId;
use crate::executor::packed::PackedInfo;
use crate::executor::{Status, Taken};
use axum::Json;
use axum::extract::{Query, State};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};
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
/// allocates nothing of its own: its detail line is written when the row is sent. Kept
/// packed as the executor's table keeps it: a list of a million procedures is a million
/// rows.
#[derive(Clone)]
struct Row(PackedInfo);

impl Serialize for Row {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let info = &self.0;
        let (submitted, updated) = info.times();
        let mut map = serializer.serialize_map(Some(9))?;
        map.serialize_entry("id", &info.id())?;
        map.serialize_entry("parent", &info.parent())?;
        map.serialize_entry("machine", info.machine())?;
        map.serialize_entry("state", info.state())?;
        map.serialize_entry("status", &StatusJson(&info.status()))?;
        map.serialize_entry("steps", &info.steps())?;
        map.serialize_entry("submitted_ms", &crate::operator::ser::millis(&submitted))?;
        map.serialize_entry("updated_ms", &crate::operator::ser::millis(&updated))?;
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
        self.0.id().get()
    }

    /// One line on why it is where it is.
    fn detail(&self) -> String {
        match (&*self.0.status(), self.0.error()) {
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

    /// What filters compare: its status name, machine and state.
    fn fields(&self) -> Fields {
        [self.0.status_name(), self.0.machine(), self.0.state()]
    }

    /// Its free text, which a text filter searches: its event, or its error.
    fn text(&self, into: &mut String) {
        use std::fmt::Write as _;
        let info = &self.0;
        // The event without making the status: every row of a chunk is searched.
        if let Some(event) = info.event() {
            into.push_str(event);
            return;
        }
        let _ = match &*info.status() {
            Status::Stuck { error, .. } => write!(into, "{error}"),
            _ => info.error().map_or(Ok(()), |e| write!(into, "{e}")),
        };
    }
}

/// A row's status name, machine and state.
type Fields = [&'static str; 3];

/// Up to [`CHUNK`] rows by id, with their free texts side by side so that a text filter
/// searches a chunk in one pass (a million events are then searched in a few
/// milliseconds, not a few tens).
#[derive(Clone)]
struct Chunk {
    rows: Vec<Row>,
    /// Each row's id and [`Row::fields`], side by side: a filter that passes over a
    /// million rows reads these (32 bytes a row), not the rows (about 200).
    ids: Vec<u64>,
    fields: Vec<Fields>,
    /// Each row's [`Row::text`] in ASCII lower case, each followed by a NUL (which no
    /// needle holds, so no match spans two rows).
    text: String,
    /// Where each row's text ends in `text` (its NUL).
    ends: Vec<u32>,
}

impl Chunk {
    fn new(rows: Vec<Row>) -> Self {
        let mut text = String::new();
        let mut ends = Vec::with_capacity(rows.len());
        for row in &rows {
            let from = text.len();
            row.text(&mut text);
            text[from..].make_ascii_lowercase();
            ends.push(u32::try_from(text.len()).expect("a chunk's texts fit in 4 GiB"));
            text.push('\0');
        }
        Self {
            ids: rows.iter().map(Row::id).collect(),
            fields: rows.iter().map(Row::fields).collect(),
            rows,
            text,
            ends,
        }
    }

    /// Whether row `at` shows `needle`'s text in its id, machine, state or status (its
    /// event and error are in [`hits`](Self::hits)).
    fn names(&self, at: usize, needle: &Needle) -> bool {
        let mut digits = [0; 20];
        (needle.digits && needle.in_text(decimal(self.ids[at], &mut digits)))
            || (needle.names.iter())
                .any(|name| self.fields[at].iter().any(|field| same_static(field, name)))
    }

    /// Which rows' free text contains `needle`, by index.
    fn hits(&self, needle: &Needle) -> Vec<bool> {
        let mut hits = vec![false; self.rows.len()];
        for at in needle.finder.find_iter(self.text.as_bytes()) {
            let row = self.ends.partition_point(|&end| (end as usize) < at);
            hits[row] = true;
        }
        hits
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
        // A NUL separates rows in a chunk's text: no row's text holds one.
        let text = text.to_lowercase().replace('\0', "");
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
pub(crate) struct Snapshot {
    /// The process's change count it was built at.
    version: u64,
    built: Instant,
    /// How long building it took.
    took: Duration,
    /// The rows by id, in chunks of the ids `[k × CHUNK, (k + 1) × CHUNK)` keyed by `k`
    /// (the non-empty ones): the next snapshot copies the chunks whose procedures
    /// changed and shares every other one.
    chunks: BTreeMap<u64, Arc<Chunk>>,
    /// Rows in all chunks.
    total: usize,
    by_status: BTreeMap<&'static str, usize>,
    by_machine: BTreeMap<&'static str, usize>,
    children: HashMap<u64, Vec<ProcedureId>>,
    /// Every machine, state and status name of its rows, once (and, after updates, some
    /// no row has any more: a name is only ever matched against rows).
    names: BTreeSet<&'static str>,
    /// How many rows each filter asked of this snapshot matches ([`ListQuery::filter_key`]):
    /// counting them takes a pass over every row, which pages that poll one filter then
    /// pay once per snapshot, not once per poll. Emptied when it reaches
    /// [`MATCHED_KEPT`] filters.
    matched: Mutex<HashMap<String, usize>>,
}

/// The most filters whose match counts a snapshot keeps.
const MATCHED_KEPT: usize = 256;
/// Ids per chunk of [`Snapshot::chunks`]: a changed procedure costs the copy of this
/// many rows at most, an unchanged chunk a pointer.
const CHUNK: u64 = 1024;

impl Snapshot {
    fn empty(version: u64, built: Instant) -> Self {
        Self {
            version,
            built,
            took: Duration::ZERO,
            chunks: BTreeMap::new(),
            total: 0,
            by_status: BTreeMap::new(),
            by_machine: BTreeMap::new(),
            children: HashMap::new(),
            names: BTreeSet::new(),
            matched: Mutex::default(),
        }
    }

    /// A snapshot of every procedure, `infos` by id.
    fn whole(version: u64, infos: Vec<PackedInfo>, started: Instant) -> Self {
        let mut snapshot = Self::empty(version, started);
        let mut chunk: Vec<Row> = Vec::new();
        for info in infos {
            let k = info.id().get() / CHUNK;
            if chunk.last().is_some_and(|last| last.id() / CHUNK != k) {
                snapshot.close_chunk(std::mem::take(&mut chunk));
            }
            snapshot.count(&info);
            chunk.push(Row(info));
        }
        snapshot.close_chunk(chunk);
        snapshot.took = started.elapsed();
        snapshot
    }

    fn close_chunk(&mut self, rows: Vec<Row>) {
        if let Some(first) = rows.first() {
            self.total += rows.len();
            self.chunks
                .insert(first.id() / CHUNK, Arc::new(Chunk::new(rows)));
        }
    }

    /// This snapshot with `changed` (by id; each with its new snapshot, or `None` once
    /// it is gone) applied: the chunks they fall in are copied and changed, the rest
    /// shared.
    fn updated(
        &self,
        version: u64,
        changed: Vec<(u64, Option<PackedInfo>)>,
        started: Instant,
    ) -> Self {
        let mut next = Self {
            chunks: self.chunks.clone(),
            total: self.total,
            by_status: self.by_status.clone(),
            by_machine: self.by_machine.clone(),
            children: self.children.clone(),
            names: self.names.clone(),
            ..Self::empty(version, started)
        };
        let mut changed = changed.into_iter().peekable();
        while let Some((first, _)) = changed.peek() {
            let k = first / CHUNK;
            let chunk = next.chunks.remove(&k);
            let mut rows = chunk.map_or_else(Vec::new, |c| Arc::unwrap_or_clone(c).rows);
            next.total -= rows.len();
            while let Some((id, info)) = changed.next_if(|(id, _)| id / CHUNK == k) {
                let at = rows.binary_search_by_key(&id, Row::id);
                // The old row leaves the counts before the new one comes in: both may
                // name the same parent.
                if let Ok(at) = at {
                    next.forget(&rows[at].0);
                }
                match (at, info) {
                    (Ok(at), Some(info)) => {
                        next.count(&info);
                        rows[at] = Row(info);
                    }
                    (Ok(at), None) => drop(rows.remove(at)),
                    (Err(at), Some(info)) => {
                        next.count(&info);
                        rows.insert(at, Row(info));
                    }
                    (Err(_), None) => {}
                }
            }
            next.close_chunk(rows);
        }
        next.took = started.elapsed();
        next
    }

    /// Adds `info` to the counts, the children index and the names.
    fn count(&mut self, info: &PackedInfo) {
        *self.by_status.entry(info.status_name()).or_default() += 1;
        *self.by_machine.entry(info.machine()).or_default() += 1;
        if let Some(parent) = info.parent() {
            let children = self.children.entry(parent.get()).or_default();
            if let Err(at) = children.binary_search(&info.id()) {
                children.insert(at, info.id());
            }
        }
        for name in [info.machine(), info.state(), info.status_name()] {
            // Most rows repeat names already in: a lookup, not an insert.
            if !self.names.contains(name) {
                self.names.insert(name);
            }
        }
    }

    /// Takes `info` out of the counts and the children index.
    fn forget(&mut self, info: &PackedInfo) {
        fn down(counts: &mut BTreeMap<&'static str, usize>, key: &'static str) {
            if let Some(count) = counts.get_mut(key) {
                *count -= 1;
                if *count == 0 {
                    counts.remove(key);
                }
            }
        }
        down(&mut self.by_status, info.status_name());
        down(&mut self.by_machine, info.machine());
        if let Some(parent) = info.parent()
            && let Some(children) = self.children.get_mut(&parent.get())
        {
            children.retain(|child| *child != info.id());
            if children.is_empty() {
                self.children.remove(&parent.get());
            }
        }
    }

    /// The rows `query` admits with an id of `from` or more, by id.
    fn ascending<'s>(
        &'s self,
        from: u64,
        query: &'s ListQuery,
        needle: Option<&'s Needle>,
    ) -> impl Iterator<Item = &'s Row> {
        let chunks = self.chunks.range(from / CHUNK..).map(|(_, chunk)| &**chunk);
        let rows = chunks.flat_map(move |chunk| admitted(chunk, query, needle, false));
        rows.skip_while(move |row| row.id() < from)
    }

    /// The rows `query` admits with an id of `to` or less, by id from the highest.
    fn descending<'s>(
        &'s self,
        to: u64,
        query: &'s ListQuery,
        needle: Option<&'s Needle>,
    ) -> impl Iterator<Item = &'s Row> {
        let chunks = (self.chunks.range(..=to / CHUNK).rev()).map(|(_, chunk)| &**chunk);
        let rows = chunks.flat_map(move |chunk| admitted(chunk, query, needle, true));
        rows.skip_while(move |row| row.id() > to)
    }

    /// When a changed executor's list may be built again: a second after this one, or
    /// ten times as long as this one took, so that rebuilding a large list takes at most
    /// a tenth of one core from the steps.
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

/// The rows of `chunk` that `query` admits, by id (from the highest if `descending`).
/// Its free texts are searched once, when the first row needs them.
fn admitted<'s>(
    chunk: &'s Chunk,
    query: &'s ListQuery,
    needle: Option<&'s Needle>,
    descending: bool,
) -> impl Iterator<Item = &'s Row> {
    let mut hits: Option<Vec<bool>> = None;
    let order: Box<dyn Iterator<Item = usize>> = if descending {
        Box::new((0..chunk.rows.len()).rev())
    } else {
        Box::new(0..chunk.rows.len())
    };
    order.filter_map(move |at| {
        let shows = |needle: &Needle| {
            chunk.names(at, needle) || hits.get_or_insert_with(|| chunk.hits(needle))[at]
        };
        let admits = query.fields_admit(&chunk.fields[at]) && needle.is_none_or(shows);
        admits.then(|| &chunk.rows[at])
    })
}

/// The executor's list, shared by every admin over it: one snapshot, brought up to date
/// from the procedures that changed (the executor's journal has one reader: this).
#[derive(Default)]
pub(crate) struct Cache {
    current: Arc<Mutex<Option<Arc<Snapshot>>>>,
    /// A rebuild is under way (in the background).
    rebuilding: Arc<AtomicBool>,
    /// Builds one at a time: each takes the journal's ids since the one before, so two
    /// at once would each miss what the other took.
    building: Arc<Mutex<()>>,
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
                let (current, building, rebuilding) = (
                    Arc::clone(&self.current),
                    Arc::clone(&self.building),
                    Arc::clone(&self.rebuilding),
                );
                let executor = executor.clone();
                tokio::task::spawn_blocking(move || {
                    build(&executor, &current, &building);
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
        let (executor, current, building) = (
            executor.clone(),
            Arc::clone(&self.current),
            Arc::clone(&self.building),
        );
        tokio::task::spawn_blocking(move || build(&executor, &current, &building))
            .await
            .expect("building a snapshot does not panic")
    }

    fn in_hand(&self) -> Option<Arc<Snapshot>> {
        lock(&self.current).clone()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Builds the next snapshot of `executor` and makes it `current`: the one in hand with
/// the procedures changed since it was built, or, for the first, every procedure. The
/// version is read first: a change during the build makes the next request build again
/// (and is in the journal for it).
fn build<E: Send + Sync + 'static>(
    executor: &crate::executor::Executor<E>,
    current: &Mutex<Option<Arc<Snapshot>>>,
    building: &Mutex<()>,
) -> Arc<Snapshot> {
    let _one_at_a_time = lock(building);
    let started = Instant::now();
    let version = executor.changes();
    let previous = lock(current).clone();
    let taken = executor.snapshot_changes(previous.is_none());
    let built = match taken {
        Taken::Everything(infos) => Snapshot::whole(version, infos, started),
        Taken::Changed(changed) => {
            let previous = previous.expect("changes are taken against a snapshot in hand");
            previous.updated(version, changed, started)
        }
    };
    let built = Arc::new(built);
    *lock(current) = Some(Arc::clone(&built));
    built
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

    /// Whether a row with these [`Row::fields`] has the status, machine and state asked
    /// (the text aside).
    fn fields_admit(&self, [status, machine, state]: &Fields) -> bool {
        let is = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        is(&self.status, status) && is(&self.machine, machine) && is(&self.state, state)
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
        shared.executor.lists().fresh(&shared.executor).await
    } else {
        shared.executor.lists().get(&shared.executor).await
    };
    if query.since == Some(snapshot.version) {
        return Ok(Json(
            json!({ "version": snapshot.version, "unchanged": true }),
        ));
    }
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    let text = query.q.as_deref().map(str::trim).filter(|t| !t.is_empty());
    let needle = text.map(|text| Needle::new(text, &snapshot));
    let needle = needle.filter(|needle| !needle.text.is_empty());
    let needle = needle.as_ref();
    // Where the page starts: just after `after`. The first request of a filter on a
    // snapshot counts its matches in the same pass that collects the page (and over the
    // rows before it); later ones stop once the page is full.
    let none = || -> Box<dyn Iterator<Item = &Row>> { Box::new(std::iter::empty()) };
    let up = |from| -> Box<dyn Iterator<Item = &Row>> {
        Box::new(snapshot.ascending(from, &query, needle))
    };
    let down = |to| -> Box<dyn Iterator<Item = &Row>> {
        Box::new(snapshot.descending(to, &query, needle))
    };
    let (before, from) = match (descending, query.after) {
        (false, None) => (none(), up(0)),
        (false, Some(after)) => (down(after), after.checked_add(1).map_or_else(none, up)),
        (true, None) => (none(), down(u64::MAX)),
        (true, Some(after)) => (up(after), after.checked_sub(1).map_or_else(none, down)),
    };
    let key = query.filter_key(needle);
    let known = snapshot.matched(&key);
    let mut page: Vec<&Row> = Vec::with_capacity(limit + 1);
    let mut counted = 0;
    for row in from {
        counted += 1;
        if page.len() <= limit {
            page.push(row);
        } else if known.is_some() {
            break; // The count is known: the page (and whether there is a next) is all.
        }
    }
    let matched = known.unwrap_or_else(|| {
        let matched = counted + before.count();
        snapshot.remember_matched(key, matched);
        matched
    });
    let next = (page.len() > limit).then(|| page[limit - 1].0.id());
    let page = &page[..page.len().min(limit)];
    Ok(Json(json!({
        "version": snapshot.version,
        "total": snapshot.total,
        "matched": matched,
        "counts": { "status": snapshot.by_status, "machine": snapshot.by_machine },
        "rows": page,
        "next": next,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::ProcedureInfo;
    use std::time::SystemTime;

    fn packed(infos: impl IntoIterator<Item = ProcedureInfo>) -> Vec<PackedInfo> {
        infos.into_iter().map(PackedInfo::pack).collect()
    }

    fn info(id: u64, parent: Option<u64>, steps: u64, suspended: bool) -> ProcedureInfo {
        ProcedureInfo {
            id: ProcedureId::new(id),
            parent: parent.map(ProcedureId::new),
            machine: if id % 2 == 0 { "even" } else { "odd" },
            status: if suspended {
                Status::Suspended {
                    event: format!("e{id}"),
                }
            } else {
                Status::Runnable
            },
            state: "S",
            steps,
            error: None,
            submitted: SystemTime::UNIX_EPOCH,
            updated: SystemTime::UNIX_EPOCH,
        }
    }

    /// Rows, counts and children, to compare two snapshots.
    fn contents(snapshot: &Snapshot) -> String {
        let all = ListQuery::default();
        let rows: Vec<String> = (snapshot.ascending(0, &all, None))
            .map(|row| format!("{}:{}:{}", row.id(), row.0.steps(), row.0.status_name()))
            .collect();
        let mut children: Vec<_> = snapshot.children.iter().collect();
        children.sort();
        format!(
            "{} {rows:?} {:?} {:?} {children:?}",
            snapshot.total, snapshot.by_status, snapshot.by_machine
        )
    }

    /// Random additions, changes and removals across chunk bounds, applied to a snapshot
    /// one batch at a time, give what a snapshot of the whole table gives.
    #[test]
    fn a_snapshot_brought_up_to_date_equals_one_built_whole() {
        let mut rng = fastrand::Rng::with_seed(32);
        let mut table: BTreeMap<u64, ProcedureInfo> = BTreeMap::new();
        let now = Instant::now();
        let mut snapshot = Snapshot::whole(0, Vec::new(), now);
        for round in 0..200 {
            let mut changed: BTreeMap<u64, Option<ProcedureInfo>> = BTreeMap::new();
            for _ in 0..rng.usize(1..60) {
                // Ids around a few chunk bounds, so chunks fill, empty and come back.
                let id = rng.u64(1..4 * CHUNK + 5);
                let parent = (rng.u8(..4) == 0).then(|| rng.u64(1..50));
                let now = if rng.u8(..3) == 0 {
                    None
                } else {
                    Some(info(id, parent, round, rng.bool()))
                };
                match &now {
                    Some(info) => table.insert(id, info.clone()),
                    None => table.remove(&id),
                };
                changed.insert(id, now);
            }
            let changed = changed
                .into_iter()
                .map(|(id, info)| (id, info.map(PackedInfo::pack)));
            snapshot = snapshot.updated(round, changed.collect(), now);
            let whole = Snapshot::whole(round, packed(table.values().cloned()), now);
            assert_eq!(contents(&snapshot), contents(&whole), "round {round}");
        }
    }

    #[test]
    fn a_text_filter_finds_events_and_errors_whatever_their_case_and_never_across_rows() {
        let mut infos = vec![
            info(1, None, 0, true),
            info(2, None, 0, true),
            info(3, None, 0, false),
            info(CHUNK + 1, None, 0, true),
        ];
        infos[0].status = Status::Suspended {
            event: "Go-Alpha".into(),
        };
        infos[1].status = Status::Suspended {
            event: "beta".into(),
        };
        infos[2].error = Some(crate::Error::fatal("Region Refused"));
        infos[3].status = Status::Suspended {
            event: "alphabet".into(),
        };
        let snapshot = Snapshot::whole(0, packed(infos), Instant::now());
        let all = ListQuery::default();
        let found = |text: &str| {
            let needle = Needle::new(text, &snapshot);
            let rows = snapshot.ascending(0, &all, Some(&needle));
            rows.map(Row::id).collect::<Vec<_>>()
        };
        assert_eq!(found("ALPHA"), [1, CHUNK + 1]);
        assert_eq!(found("refused"), [3]);
        assert_eq!(
            found("alphabeta"),
            Vec::<u64>::new(),
            "rows 1 and 2 are not one text"
        );
        assert_eq!(found("a\0b"), found("ab"), "a NUL is dropped from a needle");
        assert_eq!(found("odd"), [1, 3, CHUNK + 1], "machine names match too");
        let down = |text: &str| {
            let needle = Needle::new(text, &snapshot);
            let rows = snapshot.descending(u64::MAX, &all, Some(&needle));
            rows.map(Row::id).collect::<Vec<_>>()
        };
        assert_eq!(down("alpha"), [CHUNK + 1, 1]);
    }

    #[test]
    fn rows_are_read_from_any_id_up_or_down_across_chunks() {
        let ids = [1, 5, CHUNK - 1, CHUNK, 3 * CHUNK + 7];
        let infos = ids.iter().map(|&id| info(id, None, 0, false));
        let snapshot = Snapshot::whole(0, packed(infos), Instant::now());
        let all = ListQuery::default();
        let up = |from| (snapshot.ascending(from, &all, None).map(Row::id)).collect::<Vec<_>>();
        let down = |to| (snapshot.descending(to, &all, None).map(Row::id)).collect::<Vec<_>>();
        assert_eq!(up(0), ids);
        assert_eq!(up(6), [CHUNK - 1, CHUNK, 3 * CHUNK + 7]);
        assert_eq!(up(CHUNK + 1), [3 * CHUNK + 7]);
        assert_eq!(down(u64::MAX), [3 * CHUNK + 7, CHUNK, CHUNK - 1, 5, 1]);
        assert_eq!(down(CHUNK - 2), [5, 1]);
        assert_eq!(down(0), Vec::<u64>::new());
    }
}
