//! Table operations contending for entity locks, with child procedures holding locks
//! below their parent's.
//!
//! ```text
//! cargo run --example table_ops
//! ```
//!
//! Four procedures on one namespace `ns`, submitted one after the other:
//!
//! | procedure | locks (held for life) |
//! |---|---|
//! | `create_table ns/users` (3 regions) | shared `ns`, exclusive `ns/users` |
//! | `alter_table ns/users` | shared `ns`, exclusive `ns/users` |
//! | `create_table ns/orders` (2 regions) | shared `ns`, exclusive `ns/orders` |
//! | `drop_namespace ns` | exclusive `ns` |
//!
//! Each `create_table` spawns one `open_region` child per region, which takes exclusive
//! `ns/<table>/r<i>`: allowed although its parent holds exclusive `ns/<table>`, because a
//! child runs on its parent's behalf. Regions wait (suspended, holding no worker) until
//! the simulated region server comes up; the example starts it only once it has seen
//! the alter and the drop waiting for their locks, so the ordering below is the same on
//! every run:
//!
//! - the alter waits (`WaitingForLock`) until the create of the same table has ended;
//! - the create of `orders` runs meanwhile, next to the create of `users` (shared `ns`);
//! - the drop of the namespace waits for all of them (it was queued after the alter, and
//!   requests are served first come, first served), and runs last.
//!
//! The example prints the locks held while everything is in flight, then a timeline of
//! what ran when, checks the ordering, and exits with 0 (1 when a check fails). It uses a
//! `MemStore`: see the `create_table` and `transfer` examples for the durable `WalStore`.

use procflow::ProcedureId;
use procflow::executor::{Executor, Outcome, Status};
use procflow::locks::LockKeyError;
use procflow::prelude::*;
use procflow::store::MemStore;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Regions report here until the region server is up.
const REGION_SERVER_UP: &str = "region-server-up";

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = CreateTable, name = "create_table", env = Cluster)]
enum CreateTableState {
    #[initial]
    #[transition(to = [AddToMeta])]
    Prepare,
    #[transition(to = [AssignRegions])]
    #[rollback]
    AddToMeta,
    #[transition(to = [Enable])]
    AssignRegions,
    #[transition(to = [Created])]
    Enable,
    #[terminal]
    Created,
}

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = OpenRegion, name = "open_region", env = Cluster)]
enum OpenRegionState {
    #[initial]
    #[transition(to = [Opened])]
    Open,
    #[terminal]
    Opened,
}

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = AlterTable, name = "alter_table", env = Cluster)]
enum AlterTableState {
    #[initial]
    #[transition(to = [Reopen])]
    Modify,
    #[transition(to = [Altered])]
    Reopen,
    #[terminal]
    Altered,
}

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = DropNamespace, name = "drop_namespace", env = Cluster)]
enum DropNamespaceState {
    #[initial]
    #[transition(to = [RemoveNamespace])]
    DropTables,
    #[transition(to = [Dropped])]
    RemoveNamespace,
    #[terminal]
    Dropped,
}

#[derive(Serialize, Deserialize)]
struct CreateTable {
    ns: String,
    table: String,
    regions: u32,
}

#[derive(Serialize, Deserialize)]
struct OpenRegion {
    ns: String,
    table: String,
    region: u32,
}

#[derive(Serialize, Deserialize)]
struct AlterTable {
    ns: String,
    table: String,
    schema: String,
}

#[derive(Serialize, Deserialize)]
struct DropNamespace {
    ns: String,
}

/// A table in the catalog.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Table {
    schema: String,
    regions: BTreeSet<u32>,
    enabled: bool,
}

#[derive(Debug, Default)]
struct Catalog {
    namespaces: BTreeSet<String>,
    /// By `ns/table`.
    tables: BTreeMap<String, Table>,
    /// What `drop_namespace` found and dropped, as `(ns/table, table)`.
    dropped: Vec<(String, Table)>,
}

/// One line of the timeline.
#[derive(Clone, Debug)]
struct Event {
    at: Duration,
    /// None for events of no procedure.
    id: Option<ProcedureId>,
    /// `create_table ns/users`, `open_region ns/users/r0`…
    who: String,
    what: String,
    /// Seen by `main` (a status), not done by a handler.
    observed: bool,
}

/// What the handlers share: the catalog, the region server's state and the timeline.
/// Cloning shares them (the executor owns its environment; `main` keeps a clone).
#[derive(Clone)]
struct Cluster {
    start: Instant,
    catalog: Arc<Mutex<Catalog>>,
    region_server_up: Arc<AtomicBool>,
    timeline: Arc<Mutex<Vec<Event>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Cluster {
    fn new() -> Self {
        let catalog = Catalog {
            namespaces: BTreeSet::from(["ns".to_owned()]),
            ..Catalog::default()
        };
        Self {
            start: Instant::now(),
            catalog: Arc::new(Mutex::new(catalog)),
            region_server_up: Arc::default(),
            timeline: Arc::default(),
        }
    }

    fn catalog(&self) -> MutexGuard<'_, Catalog> {
        lock(&self.catalog)
    }

    /// Adds what a handler does to the timeline.
    fn record(&self, id: ProcedureId, who: impl Into<String>, what: impl Into<String>) {
        self.push(Some(id), who.into(), what.into(), false);
    }

    /// Adds what `main` saw to the timeline.
    fn observe(&self, id: Option<ProcedureId>, who: &str, what: &str) {
        let shown = id.map_or_else(String::new, |id| id.to_string());
        println!("{shown:<6} {who:<26} {what}");
        self.push(id, who.into(), what.into(), true);
    }

    fn push(&self, id: Option<ProcedureId>, who: String, what: String, observed: bool) {
        lock(&self.timeline).push(Event {
            at: self.start.elapsed(),
            id,
            who,
            what,
            observed,
        });
    }

    fn timeline(&self) -> Vec<Event> {
        lock(&self.timeline).clone()
    }
}

fn fatal_unless(ok: bool, message: impl FnOnce() -> String) -> Result<(), Error> {
    if ok {
        Ok(())
    } else {
        Err(Error::fatal(message()))
    }
}

impl CreateTable {
    fn who(&self) -> String {
        format!("create_table {}/{}", self.ns, self.table)
    }

    fn key(&self) -> String {
        format!("{}/{}", self.ns, self.table)
    }
}

impl CreateTableStateHandlers for CreateTable {
    async fn prepare(&mut self, ctx: &Context<Cluster>) -> Step<create_table_state::Prepare> {
        ctx.env().record(ctx.id(), self.who(), "Prepare");
        let catalog = ctx.env().catalog();
        fatal_unless(catalog.namespaces.contains(&self.ns), || {
            format!("no namespace {}", self.ns)
        })?;
        fatal_unless(!catalog.tables.contains_key(&self.key()), || {
            format!("table {} exists", self.key())
        })?;
        Ok(create_table_state::Prepare::AddToMeta.into())
    }

    async fn add_to_meta(&mut self, ctx: &Context<Cluster>) -> Step<create_table_state::AddToMeta> {
        ctx.env().record(ctx.id(), self.who(), "AddToMeta");
        let table = Table {
            schema: "v1".into(),
            regions: BTreeSet::new(),
            enabled: false,
        };
        ctx.env().catalog().tables.insert(self.key(), table);
        Ok(create_table_state::AddToMeta::AssignRegions.into())
    }

    async fn rollback_add_to_meta(&mut self, ctx: &Context<Cluster>) -> Result<(), Error> {
        ctx.env().record(ctx.id(), self.who(), "rollback AddToMeta");
        ctx.env().catalog().tables.remove(&self.key());
        Ok(())
    }

    async fn assign_regions(
        &mut self,
        ctx: &Context<Cluster>,
    ) -> Step<create_table_state::AssignRegions> {
        ctx.env().record(
            ctx.id(),
            self.who(),
            format!(
                "AssignRegions: spawns {} open_region children",
                self.regions
            ),
        );
        let children = (0..self.regions)
            .map(|region| {
                Child::new::<OpenRegionState>(&OpenRegion {
                    ns: self.ns.clone(),
                    table: self.table.clone(),
                    region,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Flow::spawn(
            children,
            create_table_state::AssignRegions::Enable,
        ))
    }

    async fn enable(&mut self, ctx: &Context<Cluster>) -> Step<create_table_state::Enable> {
        ctx.env().record(ctx.id(), self.who(), "Enable");
        let mut catalog = ctx.env().catalog();
        let table = catalog
            .tables
            .get_mut(&self.key())
            .ok_or_else(|| Error::fatal(format!("{} vanished", self.key())))?;
        fatal_unless(table.regions.len() == self.regions as usize, || {
            format!("{} has regions {:?}", self.key(), table.regions)
        })?;
        table.enabled = true;
        Ok(create_table_state::Enable::Created.into())
    }

    fn locks(&self) -> Result<Locks, LockKeyError> {
        Ok(Locks::new([
            Lock::shared(&self.ns)?,
            Lock::exclusive(self.key())?,
        ]))
    }
}

impl OpenRegion {
    fn key(&self) -> String {
        format!("{}/{}/r{}", self.ns, self.table, self.region)
    }
}

impl OpenRegionStateHandlers for OpenRegion {
    /// Opens the region once the region server is up; until then waits for it, suspended.
    async fn open(&mut self, ctx: &Context<Cluster>) -> Step<open_region_state::Open> {
        let who = format!("open_region {}", self.key());
        if !ctx.env().region_server_up.load(Ordering::SeqCst) {
            ctx.env()
                .record(ctx.id(), who, "Open: waits for the region server");
            return Ok(Flow::suspend(REGION_SERVER_UP));
        }
        ctx.env().record(ctx.id(), who, "Open: opened");
        let mut catalog = ctx.env().catalog();
        let key = format!("{}/{}", self.ns, self.table);
        let table = catalog
            .tables
            .get_mut(&key)
            .ok_or_else(|| Error::fatal(format!("{key} vanished")))?;
        table.regions.insert(self.region);
        Ok(open_region_state::Open::Opened.into())
    }

    fn locks(&self) -> Result<Locks, LockKeyError> {
        Ok(Locks::new([Lock::exclusive(self.key())?]))
    }
}

impl AlterTable {
    fn who(&self) -> String {
        format!("alter_table {}/{}", self.ns, self.table)
    }

    fn key(&self) -> String {
        format!("{}/{}", self.ns, self.table)
    }
}

impl AlterTableStateHandlers for AlterTable {
    async fn modify(&mut self, ctx: &Context<Cluster>) -> Step<alter_table_state::Modify> {
        ctx.env().record(
            ctx.id(),
            self.who(),
            format!("Modify: schema {}", self.schema),
        );
        let mut catalog = ctx.env().catalog();
        let table = catalog
            .tables
            .get_mut(&self.key())
            .ok_or_else(|| Error::fatal(format!("no table {}", self.key())))?;
        fatal_unless(table.enabled, || format!("{} is not enabled", self.key()))?;
        table.schema.clone_from(&self.schema);
        Ok(alter_table_state::Modify::Reopen.into())
    }

    async fn reopen(&mut self, ctx: &Context<Cluster>) -> Step<alter_table_state::Reopen> {
        let regions = ctx
            .env()
            .catalog()
            .tables
            .get(&self.key())
            .map_or(0, |t| t.regions.len());
        ctx.env()
            .record(ctx.id(), self.who(), format!("Reopen: {regions} regions"));
        Ok(alter_table_state::Reopen::Altered.into())
    }

    fn locks(&self) -> Result<Locks, LockKeyError> {
        Ok(Locks::new([
            Lock::shared(&self.ns)?,
            Lock::exclusive(self.key())?,
        ]))
    }
}

impl DropNamespace {
    fn who(&self) -> String {
        format!("drop_namespace {}", self.ns)
    }
}

impl DropNamespaceStateHandlers for DropNamespace {
    async fn drop_tables(
        &mut self,
        ctx: &Context<Cluster>,
    ) -> Step<drop_namespace_state::DropTables> {
        let mut catalog = ctx.env().catalog();
        let prefix = format!("{}/", self.ns);
        let doomed: Vec<_> = catalog
            .tables
            .keys()
            .filter(|key| key.starts_with(&prefix))
            .cloned()
            .collect();
        let mut found = Vec::new();
        for key in doomed {
            if let Some(table) = catalog.tables.remove(&key) {
                found.push(format!(
                    "{key} ({}, {} regions)",
                    table.schema,
                    table.regions.len()
                ));
                catalog.dropped.push((key, table));
            }
        }
        drop(catalog);
        ctx.env().record(
            ctx.id(),
            self.who(),
            format!("DropTables: {}", found.join(", ")),
        );
        Ok(drop_namespace_state::DropTables::RemoveNamespace.into())
    }

    async fn remove_namespace(
        &mut self,
        ctx: &Context<Cluster>,
    ) -> Step<drop_namespace_state::RemoveNamespace> {
        ctx.env().record(ctx.id(), self.who(), "RemoveNamespace");
        ctx.env().catalog().namespaces.remove(&self.ns);
        Ok(drop_namespace_state::RemoveNamespace::Dropped.into())
    }

    fn locks(&self) -> Result<Locks, LockKeyError> {
        Ok(Locks::new([Lock::exclusive(&self.ns)?]))
    }
}

type Failure = Box<dyn std::error::Error>;

/// Waits until procedure `id` reports a status `wanted` accepts.
async fn status(
    executor: &Executor<Cluster>,
    id: ProcedureId,
    wanted: impl Fn(&Status) -> bool,
) -> Result<(), Failure> {
    let mut info = executor.subscribe(id).ok_or("unknown procedure")?;
    info.wait_for(|i| wanted(&i.status)).await?;
    Ok(())
}

/// Waits until procedure `id` is in the lock queue.
///
/// The executor reports `WaitingForLock` once the request is in the lock queue; this also
/// checks `lock_waiters`, so the example states the order it relies on.
async fn queued(executor: &Executor<Cluster>, id: ProcedureId) -> Result<(), Failure> {
    status(executor, id, |s| *s == Status::WaitingForLock).await?;
    while !executor.lock_waiters().contains(&id) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

/// Waits until create_table `id` waits for its regions, and each region for the region
/// server; returns the regions' ids, in region order.
async fn regions_waiting(
    executor: &Executor<Cluster>,
    id: ProcedureId,
) -> Result<Vec<ProcedureId>, Failure> {
    status(executor, id, |s| *s == Status::WaitingChildren).await?;
    // A parent's children are listed before it reports waiting for them.
    let children: Vec<_> = executor
        .list()
        .into_iter()
        .filter(|p| p.parent == Some(id))
        .map(|p| p.id)
        .collect();
    for child in &children {
        status(executor, *child, |s| matches!(s, Status::Suspended { .. })).await?;
    }
    Ok(children)
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), Failure> {
    if ok { Ok(()) } else { Err(what().into()) }
}

/// The procedures of the example.
struct Ids {
    create_users: ProcedureId,
    users_regions: Vec<ProcedureId>,
    alter_users: ProcedureId,
    create_orders: ProcedureId,
    orders_regions: Vec<ProcedureId>,
    drop_ns: ProcedureId,
}

/// Submits the four operations one after the other, each once the previous one is
/// where it should be, and returns with all of them in flight.
async fn contend(executor: &Executor<Cluster>, cluster: &Cluster) -> Result<Ids, Failure> {
    let create_users = executor
        .submit(CreateTable {
            ns: "ns".into(),
            table: "users".into(),
            regions: 3,
        })
        .await?;
    let users_regions = regions_waiting(executor, create_users).await?;
    cluster.observe(
        Some(create_users),
        "create_table ns/users",
        "is WaitingChildren; its 3 regions are Suspended until the region server is up",
    );

    let alter_users = executor
        .submit(AlterTable {
            ns: "ns".into(),
            table: "users".into(),
            schema: "v2".into(),
        })
        .await?;
    queued(executor, alter_users).await?;
    cluster.observe(
        Some(alter_users),
        "alter_table ns/users",
        "is WaitingForLock: create_table ns/users holds exclusive ns/users",
    );

    let create_orders = executor
        .submit(CreateTable {
            ns: "ns".into(),
            table: "orders".into(),
            regions: 2,
        })
        .await?;
    let orders_regions = regions_waiting(executor, create_orders).await?;
    cluster.observe(
        Some(create_orders),
        "create_table ns/orders",
        "is WaitingChildren: it runs next to create_table ns/users (both share ns)",
    );

    let drop_ns = executor.submit(DropNamespace { ns: "ns".into() }).await?;
    queued(executor, drop_ns).await?;
    cluster.observe(
        Some(drop_ns),
        "drop_namespace ns",
        "is WaitingForLock: it needs exclusive ns, behind the alter",
    );
    Ok(Ids {
        create_users,
        users_regions,
        alter_users,
        create_orders,
        orders_regions,
        drop_ns,
    })
}

/// The label a procedure's events carry.
fn label(timeline: &[Event], id: ProcedureId) -> String {
    timeline
        .iter()
        .find(|e| e.id == Some(id))
        .map_or_else(|| id.to_string(), |e| e.who.clone())
}

/// Prints who holds which locks and who waits, and checks the parent/child locks and the
/// queue order.
fn show_locks(executor: &Executor<Cluster>, cluster: &Cluster, ids: &Ids) -> Result<(), Failure> {
    let timeline = cluster.timeline();
    let mut held: BTreeMap<ProcedureId, Vec<String>> = BTreeMap::new();
    for (id, lock) in executor.held_locks() {
        held.entry(id).or_default().push(lock.to_string());
    }
    println!("\nlocks held:");
    for (id, locks) in &held {
        let (id, who) = (id.to_string(), label(&timeline, *id));
        println!("  {id:<6} {who:<26} {}", locks.join(", "));
    }
    let waiters = executor.lock_waiters();
    let waiting: Vec<_> = waiters
        .iter()
        .map(|id| format!("{id} {}", label(&timeline, *id)))
        .collect();
    println!(
        "waiting for locks, first come first served: {}\n",
        waiting.join(", ")
    );

    check(waiters == [ids.alter_users, ids.drop_ns], || {
        format!("lock waiters {waiters:?}, expected the alter then the drop")
    })?;
    let parent = ["shared ns".to_owned(), "exclusive ns/users".to_owned()];
    check(
        held.get(&ids.create_users).map(Vec::as_slice) == Some(&parent[..]),
        || {
            format!(
                "create_table ns/users holds {:?}",
                held.get(&ids.create_users)
            )
        },
    )?;
    for (i, region) in ids.users_regions.iter().enumerate() {
        let wanted = [format!("exclusive ns/users/r{i}")];
        check(
            held.get(region).map(Vec::as_slice) == Some(&wanted[..]),
            || {
                format!(
                    "region {region} holds {:?}, expected {wanted:?}",
                    held.get(region)
                )
            },
        )?;
    }
    Ok(())
}

fn print_timeline(timeline: &[Event]) {
    println!("\ntimeline (ms since start; in parentheses what main saw):");
    for event in timeline {
        let id = event.id.map_or_else(String::new, |id| id.to_string());
        let what = match event.observed {
            true => format!("({})", event.what),
            false => event.what.clone(),
        };
        let ms = event.at.as_secs_f64() * 1000.0;
        println!("  {ms:>7.3}  {id:<6} {:<26} {what}", event.who);
    }
}

/// Checks, on what the handlers did, the ordering the locks promise.
fn check_order(timeline: &[Event], ids: &Ids) -> Result<(), Failure> {
    let handlers: Vec<&Event> = timeline.iter().filter(|e| !e.observed).collect();
    // Positions, in the handlers' events, of the events of a procedure tree.
    let positions = |root: ProcedureId, children: &[ProcedureId]| -> Vec<usize> {
        let tree = |id: Option<ProcedureId>| {
            id == Some(root) || id.is_some_and(|id| children.contains(&id))
        };
        let events = handlers.iter().enumerate();
        events.filter(|(_, e)| tree(e.id)).map(|(i, _)| i).collect()
    };
    let first = |p: &[usize]| p.iter().min().copied().unwrap_or(usize::MAX);
    let last = |p: &[usize]| p.iter().max().copied().unwrap_or(0);
    let users = positions(ids.create_users, &ids.users_regions);
    let alter = positions(ids.alter_users, &[]);
    let orders = positions(ids.create_orders, &ids.orders_regions);
    let drop = positions(ids.drop_ns, &[]);

    check(last(&users) < first(&alter), || {
        "alter_table ns/users overlapped create_table ns/users".into()
    })?;
    check(first(&orders) < last(&users), || {
        "create_table ns/orders did not run next to create_table ns/users".into()
    })?;
    let before_drop = [users, alter, orders].concat();
    check(last(&before_drop) < first(&drop), || {
        "drop_namespace ns did not run last".into()
    })?;
    Ok(())
}

async fn run() -> Result<(), Failure> {
    let cluster = Cluster::new();
    let executor = Executor::builder(Arc::new(MemStore::new()), cluster.clone())
        .register::<CreateTableState>()
        .register::<OpenRegionState>()
        .register::<AlterTableState>()
        .register::<DropNamespaceState>()
        .start()
        .await?;
    let ids = contend(&executor, &cluster).await?;
    show_locks(&executor, &cluster, &ids)?;

    // The region server comes up: every region opens, and the rest follows from the locks.
    cluster.region_server_up.store(true, Ordering::SeqCst);
    let woken = executor.wake(REGION_SERVER_UP).await?;
    cluster.observe(
        None,
        "region server",
        &format!("is up: woke {woken} regions"),
    );
    for id in [
        ids.create_users,
        ids.alter_users,
        ids.create_orders,
        ids.drop_ns,
    ] {
        let outcome = executor.wait(id).await?;
        check(outcome == Outcome::Succeeded, || {
            format!("{id}: {outcome:?}")
        })?;
    }
    executor.shutdown().await?;

    let timeline = cluster.timeline();
    print_timeline(&timeline);
    check_order(&timeline, &ids)?;
    let catalog = cluster.catalog();
    let dropped: Vec<_> = catalog
        .dropped
        .iter()
        .map(|(key, t)| (key.as_str(), t.schema.as_str(), t.regions.len()))
        .collect();
    let expected = [("ns/orders", "v1", 2), ("ns/users", "v2", 3)];
    check(dropped == expected, || {
        format!("drop_namespace dropped {dropped:?}, expected {expected:?}")
    })?;
    check(catalog.namespaces.is_empty(), || {
        "namespace ns is still there".into()
    })?;
    println!(
        "\nok: the alter ran after the create of ns/users, ns/orders ran alongside, \
         the drop ran last and found users at v2"
    );
    Ok(())
}

#[tokio::main]
async fn main() {
    if std::env::args().len() > 1 {
        eprintln!("usage: table_ops (no arguments)");
        std::process::exit(2);
    }
    // Every wait above is on an event; the timeout only turns a bug into a failure.
    match tokio::time::timeout(Duration::from_secs(10), run()).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            eprintln!("FAILED: {error}");
            std::process::exit(1);
        }
        Err(_) => {
            eprintln!("FAILED: timed out (a procedure never got its locks?)");
            std::process::exit(1);
        }
    }
}

/// `cargo test` runs these (the example has `test = true`): the double-execution check on
/// the table creation, children and locks included.
#[cfg(test)]
mod crash_checks {
    use super::*;
    use procflow::testing::CrashTest;

    /// A cluster whose region server is already up: regions open without waiting.
    fn cluster() -> Cluster {
        let cluster = Cluster::new();
        cluster.region_server_up.store(true, Ordering::SeqCst);
        cluster
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn create_table_with_regions_survives_double_execution() {
        let test = CrashTest::new(|b| {
            b.register::<CreateTableState>()
                .register::<OpenRegionState>()
        });
        let report = test
            .double_execution::<CreateTableState, _>(
                cluster,
                || CreateTable {
                    ns: "ns".into(),
                    table: "users".into(),
                    regions: 3,
                },
                |cluster| cluster.catalog().tables.clone(),
            )
            .await
            .unwrap();
        assert_eq!(report.clean.outcome, Outcome::Succeeded);
        let users = &report.observed["ns/users"];
        assert_eq!(users.regions.len(), 3);
        assert!(users.enabled);
    }

    /// A cluster holding an enabled `ns/users` of two regions.
    fn cluster_with_users() -> Cluster {
        let cluster = cluster();
        cluster.catalog().tables.insert(
            "ns/users".into(),
            Table {
                schema: "v1".into(),
                regions: BTreeSet::from([0, 1]),
                enabled: true,
            },
        );
        cluster
    }

    fn catalog_view(cluster: &Cluster) -> (Vec<String>, Vec<String>, Vec<String>) {
        let catalog = cluster.catalog();
        let tables = catalog
            .tables
            .iter()
            .map(|(key, t)| format!("{key} {} {:?} {}", t.schema, t.regions, t.enabled))
            .collect();
        let namespaces = catalog.namespaces.iter().cloned().collect();
        let dropped = catalog.dropped.iter().map(|(key, _)| key.clone()).collect();
        (tables, namespaces, dropped)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn alter_table_survives_double_execution() {
        let test = CrashTest::new(|b| b.register::<AlterTableState>());
        let report = test
            .double_execution::<AlterTableState, _>(
                cluster_with_users,
                || AlterTable {
                    ns: "ns".into(),
                    table: "users".into(),
                    schema: "v2".into(),
                },
                catalog_view,
            )
            .await
            .unwrap();
        assert_eq!(report.clean.outcome, Outcome::Succeeded);
        assert_eq!(report.observed.0, ["ns/users v2 {0, 1} true"]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn drop_namespace_survives_double_execution() {
        let test = CrashTest::new(|b| b.register::<DropNamespaceState>());
        let report = test
            .double_execution::<DropNamespaceState, _>(
                cluster_with_users,
                || DropNamespace { ns: "ns".into() },
                catalog_view,
            )
            .await
            .unwrap();
        assert_eq!(report.clean.outcome, Outcome::Succeeded);
        let (tables, namespaces, dropped) = report.observed;
        assert!(tables.is_empty() && namespaces.is_empty());
        assert_eq!(
            dropped,
            ["ns/users"],
            "dropped once, however often the step ran"
        );
    }
}
