//! The README's main job: create a "table" in a directory, one durable step at a time, on
//! the embedded write-ahead log.
//!
//! ```text
//! cargo run --example create_table                      # fresh temp dir, runs to the end
//! cargo run --example create_table -- --dir /tmp/t --crash-at AddToMeta   # exits mid-way
//! cargo run --example create_table -- --dir /tmp/t      # resumes from the last step
//! ```
//!
//! Every step's result is committed to the `WalStore` (durable: fdatasync) before the next
//! step runs, so a run that dies anywhere resumes from its last committed step. The step
//! that was running when the process died runs again, which is why every handler here is
//! idempotent (it writes whole files). This example drives the machine with
//! `procflow::Stepper` and persists by hand; the executor will do both for you.

use procflow::prelude::*;
use procflow::{Cursor, Phase, StepReport, Stepper, codec};
use procflow_store::{Batch, Store, WalConfig, WalStore};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

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
    #[transition(to = [Created])]
    #[no_rollback]
    AssignRegions,
    #[terminal]
    Created,
}

/// Where tables live: `<root>/tables/<name>/` and `<root>/meta/<name>`.
struct Catalog {
    root: PathBuf,
}

#[derive(Serialize, Deserialize)]
struct CreateTable {
    name: String,
    regions: u32,
}

impl CreateTable {
    fn table_dir(&self, catalog: &Catalog) -> PathBuf {
        catalog.root.join("tables").join(&self.name)
    }
    fn meta_file(&self, catalog: &Catalog) -> PathBuf {
        catalog.root.join("meta").join(&self.name)
    }
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
        if self.name.is_empty() || self.name.contains('/') {
            return Err(Error::fatal(format!("bad table name {:?}", self.name)));
        }
        if self.meta_file(ctx.env()).exists() {
            return Err(Error::fatal(format!("table {} already exists", self.name)));
        }
        Ok(create_table_state::Prepare::WriteLayout.into())
    }

    async fn write_layout(
        &mut self,
        ctx: &Context<Catalog>,
    ) -> Step<create_table_state::WriteLayout> {
        let layout = format!("table={}\nregions={}\n", self.name, self.regions);
        write_file(&self.table_dir(ctx.env()).join("layout"), &layout)?;
        Ok(create_table_state::WriteLayout::AddToMeta.into())
    }

    async fn rollback_write_layout(&mut self, ctx: &Context<Catalog>) -> Result<(), Error> {
        remove(&self.table_dir(ctx.env()))
    }

    async fn add_to_meta(&mut self, ctx: &Context<Catalog>) -> Step<create_table_state::AddToMeta> {
        write_file(&self.meta_file(ctx.env()), "state=enabling\n")?;
        Ok(create_table_state::AddToMeta::AssignRegions.into())
    }

    async fn rollback_add_to_meta(&mut self, ctx: &Context<Catalog>) -> Result<(), Error> {
        remove(&self.meta_file(ctx.env()))
    }

    async fn assign_regions(
        &mut self,
        ctx: &Context<Catalog>,
    ) -> Step<create_table_state::AssignRegions> {
        for region in 0..self.regions {
            let file = self.table_dir(ctx.env()).join(format!("region-{region}"));
            write_file(
                &file,
                &format!("region={region}\nserver=rs-{}\n", region % 3),
            )?;
        }
        write_file(&self.meta_file(ctx.env()), "state=enabled\n")?;
        Ok(create_table_state::AssignRegions::Created.into())
    }
}

/// The id of the one procedure this example runs.
const PROCEDURE: u64 = 1;

struct Args {
    dir: PathBuf,
    crash_at: Option<CreateTableState>,
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
                let names: Vec<_> = CreateTableState::STATES.iter().map(|s| s.name()).collect();
                crash_at = Some(CreateTableState::from_name(&name).ok_or(format!(
                    "--crash-at {name}: not a state; the states are {}",
                    names.join(", ")
                ))?);
            }
            "-h" | "--help" => {
                return Err("usage: create_table [--dir DIR] [--crash-at STATE]".into());
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

async fn persist(
    store: &WalStore,
    run: &Stepper<CreateTableState>,
) -> Result<(), Box<dyn std::error::Error>> {
    let value = codec::encode(run.procedure(), run.cursor())?;
    let batch = if run.cursor().phase().is_finished() {
        Batch::new().finish(PROCEDURE, value)
    } else {
        Batch::new().put(PROCEDURE, None, value)
    };
    store.commit(batch).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args().map_err(|message| {
        eprintln!("{message}");
        std::process::exit(2)
    })?;
    println!("catalog: {}", args.dir.display());
    let store = WalStore::open(args.dir.join("wal"), WalConfig::default())?;
    let loaded = store.load().await?;
    let catalog = Arc::new(Catalog {
        root: args.dir.clone(),
    });

    let mut run = match loaded.records.iter().find(|r| r.id == PROCEDURE) {
        Some(record) if record.finished => {
            let (table, cursor) = codec::decode::<CreateTableState>(&record.value)?;
            println!(
                "`{}` already finished in this catalog: {:?}",
                table.name,
                cursor.phase()
            );
            return Ok(());
        }
        Some(record) => {
            let (table, cursor) = codec::decode::<CreateTableState>(&record.value)?;
            println!(
                "resuming `{}` at {:?} after {} steps",
                table.name,
                cursor.state(),
                cursor.steps()
            );
            Stepper::resume(table, cursor, catalog)
        }
        None => {
            let table = CreateTable {
                name: "users".into(),
                regions: 4,
            };
            let run = Stepper::resume(table, Cursor::new(), catalog);
            persist(&store, &run).await?;
            println!("submitted `users` ({} regions)", run.procedure().regions);
            run
        }
    };

    while !run.cursor().phase().is_finished() {
        let report = run.step().await;
        persist(&store, &run).await?;
        match &report {
            StepReport::Moved { from, to } => {
                println!("step {:>2}: {from:?} -> {to:?}", run.cursor().steps());
                if args.crash_at == Some(*to) {
                    println!(
                        "--crash-at {to:?}: exiting abruptly (run again with --dir to resume)"
                    );
                    std::process::exit(42);
                }
            }
            StepReport::RolledBack(state) => println!("rolled back {state:?}"),
            StepReport::RetryLater(error) => {
                println!("retrying: {error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => println!("{other:?}"),
        }
    }
    store.close().await?;
    match run.cursor().phase() {
        Phase::Succeeded => println!(
            "table `{}` created: {} regions under {}",
            run.procedure().name,
            run.procedure().regions,
            run.procedure()
                .table_dir(&Catalog { root: args.dir })
                .display()
        ),
        other => {
            println!("table not created: {other:?}");
            std::process::exit(1);
        }
    }
    Ok(())
}
