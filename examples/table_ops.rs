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
use procflow::executor::{Executor, Outcome, ProcedureInfo, Status};
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
    id: ProcedureId,
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
        self.push(id, who.into(), what.into(), false);
    }

    /// Adds what `main` saw to the timeline.
    fn observe(&self, id: ProcedureId, who: &str, what: &str) {
        println!("{:<6} {who:<26} {what}", show_id(id));
        self.push(id, who.into(), what.into(), true);
    }

    fn push(&self, id: ProcedureId, who: String, what: String, observed: bool) {
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

/// `#7`, or nothing for the id `main` uses for events of no procedure.
fn show_id(id: ProcedureId) -> String {
    match id.get() {
        0 => String::new(),
        _ => id.to_string(),
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
) -> Result<ProcedureInfo, Failure> {
    let mut info = executor.subscribe(id).ok_or("unknown procedure")?;
    let seen = info.wait_for(|i| wanted(&i.status)).await?.clone();
    Ok(seen)
}

/// Waits until procedure `id` is in the lock queue.
///
/// Its status turns `WaitingForLock` just before its request joins the queue, so the
/// status alone does not say that a procedure submitted next will queue behind it: this
/// also polls `lock_waiters` (briefly) for it.
async fn queued(executor: &Executor<Cluster>, id: ProcedureId) -> Result<(), Failure> {
    status(executor, id, |s| *s == Status::WaitingForLock).await?;
    while !executor.lock_waiters().contains(&id) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

/// Waits until create_table `id` waits for its regions, and each region for the region
/// server.
async fn regions_waiting(executor: &Executor<Cluster>, id: ProcedureId) -> Result<(), Failure> {
    status(executor, id, |s| *s == Status::WaitingChildren).await?;
    let children: Vec<_> = executor
        .list()
        .into_iter()
        .filter(|p| p.parent == Some(id))
        .collect();
    for child in &children {
        status(executor, child.id, |s| {
            matches!(s, Status::Suspended { .. })
        })
        .await?;
    }
    Ok(())
}

/// The label a procedure's events carry.
fn label(timeline: &[Event], id: ProcedureId) -> String {
    timeline
        .iter()
        .find(|e| e.id == id)
        .map_or_else(|| id.to_string(), |e| e.who.clone())
}

fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), Failure> {
    if ok { Ok(()) } else { Err(what().into()) }
}

/// Positions in the timeline of the events of `ids`.
fn positions(timeline: &[Event], ids: &[ProcedureId]) -> Vec<usize> {
    let at = timeline.iter().enumerate();
    at.filter(|(_, e)| ids.contains(&e.id))
        .map(|(i, _)| i)
        .collect()
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
    let create_users = executor
        .submit::<CreateTableState>(CreateTable {
            ns: "ns".into(),
            table: "users".into(),
            regions: 3,
        })
        .await?;
    regions_waiting(&executor, create_users).await?;
    cluster.observe(
        create_users,
        "create_table ns/users",
        "is WaitingChildren; its 3 regions are Suspended until the region server is up",
    );

    let alter_users = executor
        .submit::<AlterTableState>(AlterTable {
            ns: "ns".into(),
            table: "users".into(),
            schema: "v2".into(),
        })
        .await?;
    queued(&executor, alter_users).await?;
    cluster.observe(
        alter_users,
        "alter_table ns/users",
        "is WaitingForLock: create_table ns/users holds exclusive ns/users",
    );

    let create_orders = executor
        .submit::<CreateTableState>(CreateTable {
            ns: "ns".into(),
            table: "orders".into(),
            regions: 2,
        })
        .await?;
    regions_waiting(&executor, create_orders).await?;
    cluster.observe(
        create_orders,
        "create_table ns/orders",
        "is WaitingChildren: it runs next to create_table ns/users (both share ns)",
    );

    let drop_ns = executor
        .submit::<DropNamespaceState>(DropNamespace { ns: "ns".into() })
        .await?;
    queued(&executor, drop_ns).await?;
    cluster.observe(
        drop_ns,
        "drop_namespace ns",
        "is WaitingForLock: it needs exclusive ns, behind the alter",
    );

    // Everything is in flight: who holds what.
    let timeline = cluster.timeline();
    let mut held: BTreeMap<ProcedureId, Vec<String>> = BTreeMap::new();
    for (id, lock) in executor.held_locks() {
        held.entry(id).or_default().push(lock.to_string());
    }
    println!("\nlocks held:");
    for (id, locks) in &held {
        println!(
            "  {id:<6} {:<26} {}",
            label(&timeline, *id),
            locks.join(", ")
        );
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
    check(waiters == [alter_users, drop_ns], || {
        format!("lock waiters {waiters:?}, expected the alter then the drop")
    })?;
    let users_regions: Vec<_> = executor
        .list()
        .into_iter()
        .filter(|p| p.parent == Some(create_users))
        .map(|p| p.id)
        .collect();
    for (i, region) in users_regions.iter().enumerate() {
        let wanted = format!("exclusive ns/users/r{i}");
        check(held.get(region) == Some(&vec![wanted.clone()]), || {
            format!(
                "region {region} holds {:?}, expected {wanted}",
                held.get(region)
            )
        })?;
    }
    let parent_holds = held
        .get(&create_users)
        .is_some_and(|l| l.contains(&"exclusive ns/users".to_owned()));
    check(parent_holds, || {
        "create_table ns/users does not hold exclusive ns/users".into()
    })?;

    // The region server comes up: every region opens, and the rest follows from the locks.
    cluster.region_server_up.store(true, Ordering::SeqCst);
    let woken = executor.wake(REGION_SERVER_UP);
    cluster.observe(
        ProcedureId::new(0),
        "region server",
        &format!("is up: woke {woken} regions"),
    );
    for id in [create_users, alter_users, create_orders, drop_ns] {
        let outcome = executor.wait(id).await?;
        check(outcome == Outcome::Succeeded, || {
            format!("{id}: {outcome:?}")
        })?;
    }
    executor.shutdown().await?;

    let timeline = cluster.timeline();
    println!("\ntimeline (ms since start):");
    for event in &timeline {
        let id = show_id(event.id);
        let what = match event.observed {
            true => format!("({})", event.what),
            false => event.what.clone(),
        };
        println!(
            "  {:>7.3}  {id:<6} {:<26} {what}",
            event.at.as_secs_f64() * 1000.0,
            event.who,
        );
    }

    // The guarantees the locks gave, read off the timeline (handler events only).
    let handlers: Vec<Event> = timeline.into_iter().filter(|e| !e.observed).collect();
    let orders_regions: Vec<_> = handlers
        .iter()
        .filter(|e| e.who.starts_with("open_region ns/orders/"))
        .map(|e| e.id)
        .collect();
    let users_tree = [&[create_users][..], &users_regions].concat();
    let users = positions(&handlers, &users_tree);
    let alter = positions(&handlers, &[alter_users]);
    let orders = positions(&handlers, &[&[create_orders][..], &orders_regions].concat());
    let drop = positions(&handlers, &[drop_ns]);
    let last = |p: &[usize]| p.iter().max().copied().unwrap_or(0);
    let first = |p: &[usize]| p.iter().min().copied().unwrap_or(usize::MAX);
    check(last(&users) < first(&alter), || {
        "alter_table ns/users overlapped create_table ns/users".into()
    })?;
    check(first(&orders) < last(&users), || {
        "create_table ns/orders did not run next to create_table ns/users".into()
    })?;
    check(
        handlers.len() == drop.len() + first(&drop) && first(&drop) > last(&alter),
        || "drop_namespace ns did not run last".into(),
    )?;
    let dropped: Vec<_> = cluster
        .catalog()
        .dropped
        .iter()
        .map(|(key, t)| (key.clone(), t.schema.clone(), t.regions.len()))
        .collect();
    let expected = [
        ("ns/orders".to_owned(), "v1".to_owned(), 2),
        ("ns/users".to_owned(), "v2".to_owned(), 3),
    ];
    check(dropped == expected, || {
        format!("drop_namespace dropped {dropped:?}, expected {expected:?}")
    })?;
    check(cluster.catalog().namespaces.is_empty(), || {
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
