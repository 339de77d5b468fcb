//! The README's main job: create a "table" in a directory, one durable step at a time, on
//! the embedded write-ahead log, with one child procedure per region.
//!
//! ```text
//! cargo run --example create_table                                   # fresh temp dir
//! cargo run --example create_table -- --dir /tmp/t --crash-at AddToMeta   # dies mid-way
//! cargo run --example create_table -- --dir /tmp/t                   # resumes, finishes
//! cargo run --example create_table -- --diagram          # the machine, as a Mermaid diagram
//! cargo run -p procflow --features cli --bin procflow -- list --store /tmp/t   # look inside
//! ```
//!
//! `--crash-at STATE` exits the process abruptly inside that state's handler, before its
//! result is persisted: the next run (same `--dir`) resumes from the last persisted step
//! and runs that step again, which is why every handler here is idempotent (it writes
//! whole files). The submit carries a nonce, so the next run finds the same procedure
//! instead of starting another.

use procflow::executor::{Executor, Outcome, SubmitOptions};
use procflow::prelude::*;
use procflow::store::{WalConfig, WalStore};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = CreateTable, name = "create_table", env = Catalog)]
enum CreateTableState {
    #[initial]
    #[transition(to = [WriteLayout])]
    Prepare,
    #[transition(to = [AddToMeta])]
    #[rollback]
    WriteLayout,
    #[transition(to = [AssignRegions])]
    #[rollback]
    AddToMeta,
    #[transition(to = [Enable])]
    #[no_rollback]
    AssignRegions,
    #[transition(to = [Created])]
    Enable,
    #[terminal]
    Created,
}

/// One region of the table: a child procedure of `AssignRegions`.
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = OpenRegion, name = "open_region", env = Catalog)]
enum OpenRegionState {
    #[initial]
    #[transition(to = [Opened])]
    Open,
    #[terminal]
    Opened,
}

/// Where tables live: `<root>/tables/<name>/` and `<root>/meta/<name>`.
struct Catalog {
    root: PathBuf,
    crash_at: Option<String>,
}

impl Catalog {
    fn table_dir(&self, table: &str) -> PathBuf {
        self.root.join("tables").join(table)
    }

    fn meta_file(&self, table: &str) -> PathBuf {
        self.root.join("meta").join(table)
    }

    /// `--crash-at`: die here, as a `kill -9` would, before the step's result is stored.
    fn maybe_crash(&self, state: &str) {
        if self.crash_at.as_deref() == Some(state) {
            println!("--crash-at {state}: exiting abruptly (run again with --dir to resume)");
            std::process::exit(42);
        }
    }
}

#[derive(Serialize, Deserialize)]
struct CreateTable {
    name: String,
    regions: u32,
}

#[derive(Serialize, Deserialize)]
struct OpenRegion {
    table: String,
    region: u32,
}

/// Writes a whole file (create or replace), so running it twice has the effect of once.
fn write_file(path: &Path, contents: &str) -> Result<(), Error> {
    std::fs::create_dir_all(path.parent().expect("a file path has a parent")).retryable()?;
    std::fs::write(path, contents).retryable()
}

fn remove(path: &Path) -> Result<(), Error> {
    let result = if path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    match result {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::retryable_from(e)),
        _ => Ok(()),
    }
}

impl CreateTableStateHandlers for CreateTable {
    async fn prepare(&mut self, ctx: &Context<Catalog>) -> Step<create_table_state::Prepare> {
        ctx.env().maybe_crash("Prepare");
        if self.name.is_empty() || self.name.contains('/') {
            return Err(Error::fatal(format!("bad table name {:?}", self.name)));
        }
        if ctx.env().meta_file(&self.name).exists() {
            return Err(Error::fatal(format!("table {} already exists", self.name)));
        }
        Ok(create_table_state::Prepare::WriteLayout.into())
    }

    async fn write_layout(
        &mut self,
        ctx: &Context<Catalog>,
    ) -> Step<create_table_state::WriteLayout> {
        ctx.env().maybe_crash("WriteLayout");
        let layout = format!("table={}\nregions={}\n", self.name, self.regions);
        write_file(&ctx.env().table_dir(&self.name).join("layout"), &layout)?;
        Ok(create_table_state::WriteLayout::AddToMeta.into())
    }

    async fn rollback_write_layout(&mut self, ctx: &Context<Catalog>) -> Result<(), Error> {
        remove(&ctx.env().table_dir(&self.name))
    }

    async fn add_to_meta(&mut self, ctx: &Context<Catalog>) -> Step<create_table_state::AddToMeta> {
        ctx.env().maybe_crash("AddToMeta");
        write_file(&ctx.env().meta_file(&self.name), "state=enabling\n")?;
        Ok(create_table_state::AddToMeta::AssignRegions.into())
    }

    async fn rollback_add_to_meta(&mut self, ctx: &Context<Catalog>) -> Result<(), Error> {
        remove(&ctx.env().meta_file(&self.name))
    }

    async fn assign_regions(
        &mut self,
        ctx: &Context<Catalog>,
    ) -> Step<create_table_state::AssignRegions> {
        ctx.env().maybe_crash("AssignRegions");
        let children = (0..self.regions)
            .map(|region| {
                Child::new::<OpenRegionState>(&OpenRegion {
                    table: self.name.clone(),
                    region,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Flow::spawn(
            children,
            create_table_state::AssignRegions::Enable,
        ))
    }

    async fn enable(&mut self, ctx: &Context<Catalog>) -> Step<create_table_state::Enable> {
        ctx.env().maybe_crash("Enable");
        write_file(&ctx.env().meta_file(&self.name), "state=enabled\n")?;
        Ok(create_table_state::Enable::Created.into())
    }
}

impl OpenRegionStateHandlers for OpenRegion {
    async fn open(&mut self, ctx: &Context<Catalog>) -> Step<open_region_state::Open> {
        ctx.env().maybe_crash("Open");
        let file = ctx
            .env()
            .table_dir(&self.table)
            .join(format!("region-{}", self.region));
        write_file(
            &file,
            &format!("region={}\nserver=rs-{}\n", self.region, self.region % 3),
        )?;
        Ok(open_region_state::Open::Opened.into())
    }
}

struct Args {
    dir: PathBuf,
    crash_at: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut dir = None;
    let mut crash_at = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--dir" => dir = Some(PathBuf::from(value()?)),
            "--crash-at" => {
                let name = value()?;
                let states = CreateTableState::STATES.iter().map(|s| s.name());
                let names: Vec<_> = states.chain(["Open"]).collect();
                if !names.contains(&name.as_str()) {
                    return Err(format!(
                        "--crash-at {name}: not a state; the states are {}",
                        names.join(", ")
                    ));
                }
                crash_at = Some(name);
            }
            "--diagram" => {
                print!("{}", CreateTableState::mermaid());
                std::process::exit(0);
            }
            "-h" | "--help" => {
                return Err(
                    "usage: create_table [--dir DIR] [--crash-at STATE] [--diagram]".into(),
                );
            }
            other => return Err(format!("unknown argument {other}; try --help")),
        }
    }
    let dir = dir.unwrap_or_else(|| {
        let unique = format!(
            "procflow-create-table-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        );
        std::env::temp_dir().join(unique)
    });
    Ok(Args { dir, crash_at })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args().unwrap_or_else(|message| {
        eprintln!("{message}");
        std::process::exit(2)
    });
    println!("catalog: {}", args.dir.display());
    // The store's files sit next to the catalog's `tables/` and `meta/` (the store
    // ignores names that are not its own), so `procflow list --store DIR` reads it.
    let store = Arc::new(WalStore::open(&args.dir, WalConfig::default())?);
    let catalog = Catalog {
        root: args.dir.clone(),
        crash_at: args.crash_at,
    };
    let executor = Executor::builder(store, catalog)
        .register::<CreateTableState>()
        .register::<OpenRegionState>()
        .start()
        .await?;

    // The nonce makes the submit idempotent: a second run gets the first run's procedure.
    let table = CreateTable {
        name: "users".into(),
        regions: 4,
    };
    let options = SubmitOptions::default().nonce("create-table-users");
    let id = executor.submit_with(table, options).await?;
    let info = executor.state(id).expect("just submitted");
    if info.status.is_finished() {
        println!(
            "`users` already finished in this catalog: {:?}",
            info.status
        );
        return Ok(());
    }
    if info.steps > 0 {
        println!(
            "resuming `users` at {} after {} steps",
            info.state, info.steps
        );
    } else {
        println!("submitted `users` (4 regions) as procedure {id}");
    }

    let mut updates = executor.subscribe(id).expect("known procedure");
    let mut last = (String::new(), u64::MAX);
    loop {
        let info = updates.borrow_and_update().clone();
        if (info.state.to_owned(), info.steps) != last {
            println!("step {:>2}: {} ({:?})", info.steps, info.state, info.status);
            last = (info.state.to_owned(), info.steps);
        }
        if info.status.is_finished() || updates.changed().await.is_err() {
            break;
        }
    }
    let outcome = executor.wait(id).await?;
    let regions = executor
        .list()
        .iter()
        .filter(|p| p.parent == Some(id))
        .count();
    executor.shutdown().await?;
    match outcome {
        Outcome::Succeeded => {
            let dir = args.dir.join("tables").join("users");
            println!(
                "table `users` created: {regions} regions under {}",
                dir.display()
            );
            Ok(())
        }
        other => {
            println!("table not created: {other:?}");
            std::process::exit(1);
        }
    }
}

/// `cargo test` runs these (the example has `test = true`): the double-execution check on
/// this example's procedures.
#[cfg(test)]
mod crash_checks {
    use super::*;
    use procflow::testing::CrashTest;
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A catalog in a fresh directory per pass.
    fn catalog() -> Catalog {
        static PASS: AtomicU32 = AtomicU32::new(0);
        let root = std::env::temp_dir().join(format!(
            "procflow-create-table-check-{}-{}",
            std::process::id(),
            PASS.fetch_add(1, Ordering::SeqCst)
        ));
        Catalog {
            root,
            crash_at: None,
        }
    }

    /// Every file the procedure left, by path under the catalog root; then removes them.
    fn files(catalog: &Catalog) -> BTreeMap<String, String> {
        fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    walk(&path, root, out);
                } else {
                    let name = path.strip_prefix(root).unwrap().display().to_string();
                    out.insert(name, std::fs::read_to_string(&path).unwrap());
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(&catalog.root, &catalog.root, &mut out);
        let _ = std::fs::remove_dir_all(&catalog.root);
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn create_table_survives_double_execution() {
        let test = CrashTest::new(|b| {
            b.register::<CreateTableState>()
                .register::<OpenRegionState>()
        });
        let report = test
            .double_execution::<CreateTableState, _>(
                catalog,
                || CreateTable {
                    name: "users".into(),
                    regions: 3,
                },
                files,
            )
            .await
            .unwrap();
        assert_eq!(report.clean.outcome, Outcome::Succeeded);
        // Layout, meta, three regions.
        assert_eq!(report.observed.len(), 5, "{:?}", report.observed);
        assert_eq!(report.observed["meta/users"], "state=enabled\n");
        assert!(report.killed_before.kills >= 8);
    }
}
