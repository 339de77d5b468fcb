//! `procflow`: see and act on the procedures of a store from outside the process that
//! runs them. `cargo install procflow --features cli`.
//!
//! With `--store DIR`, read commands (`list`, `show`, `history`, `diagram`, `locks`) read
//! a WAL directory without its lock, so they work while an executor runs on it; write
//! commands (`abort`, `wake`, `bypass`) store a request for the executor, which carries it
//! out when it next starts on the store, so they need the store closed. With `--postgres
//! CONNECTION --schema NAME` or `--etcd ENDPOINTS --prefix PREFIX` (a build with feature
//! `postgres` or `etcd`), read commands read the shared store at one snapshot while
//! executors run on it, and write commands leave their requests in it for the running
//! leader, which polls for them. With `--url`, both go through a running executor's admin
//! API (`procflow::admin`), and writes are carried out at once.
//!
//! - `args`: the command line;
//! - `print`: tables for people, JSON for scripts;
//! - `act`: the write commands;
//! - `remote`: `--url`;
//! - `shared`: `--postgres` and `--etcd`.

mod act;
mod args;
mod print;
mod remote;
mod shared;

use args::{Cli, Command, Filter, Place};
use clap::Parser;
use procflow::ProcedureId;
use procflow::operator::{Catalog, ProcedureRecord};
use procflow::store::WalStore;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("procflow: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(mut cli: Cli) -> Result<(), String> {
    let json = cli.json;
    let token = cli.token.as_deref();
    let place = cli.command.place_mut();
    if cli.schema.is_some() && place.postgres.is_none() {
        return Err("--schema names the schema of a --postgres store; give both".to_owned());
    }
    if cli.prefix.is_some() && place.etcd.is_none() {
        return Err("--prefix names the prefix of an --etcd store; give both".to_owned());
    }
    place.schema = cli.schema.clone();
    place.prefix = cli.prefix.clone();
    match cli.command {
        // Reads through the admin API: from the executor's memory, or by key.
        Command::List {
            at: Place { url: Some(url), .. },
            filter,
        } => {
            let (status, machine) = (filter.status.as_deref(), filter.machine.as_deref());
            let mut rows = remote::list(&url, token, status, machine)?;
            if let Some(age) = filter.older_than {
                let limit = SystemTime::now() - age.0;
                let ms = |r: &serde_json::Value| r["submitted_ms"].as_u64().unwrap_or(0);
                rows.retain(|r| std::time::UNIX_EPOCH + Duration::from_millis(ms(r)) <= limit);
            }
            print::rows(&rows, json);
        }
        Command::Show {
            id,
            at: Place { url: Some(url), .. },
        } => print::show(None, &remote::record(&url, token, id)?, json),
        Command::History {
            id,
            at: Place { url: Some(url), .. },
        } => print::history(&remote::record(&url, token, id)?, json),
        Command::Diagram {
            id,
            at: Place { url: Some(url), .. },
        } => print!("{}", remote::diagram(&url, token, id)?),
        Command::Locks {
            at: Place { url: Some(url), .. },
        } => print::locks(&remote::held_locks(&url, token)?, json),
        // Reads of a store directory.
        Command::List { at, filter } => {
            let catalog = read(&at)?;
            let records = select(&catalog, &filter)?;
            print::list(&records, json);
            print::unreadable(catalog.unreadable());
        }
        Command::Show { id, at } => {
            let catalog = read(&at)?;
            print::show(Some(&catalog), record(&catalog, id)?, json);
        }
        Command::History { id, at } => {
            let catalog = read(&at)?;
            print::history(record(&catalog, id)?, json);
        }
        Command::Diagram { id, at } => {
            let catalog = read(&at)?;
            let found = record(&catalog, id)?;
            let diagram = catalog.diagram(found.id).ok_or_else(|| {
                format!(
                    "the store holds no graph of machine `{}` (an executor that runs it stores it when it starts)",
                    found.machine
                )
            })?;
            print!("{diagram}");
        }
        Command::Locks { at } => print::locks(&read(&at)?.held_locks(), json),
        Command::Abort { target, at } => {
            act::abort(&at, token, &target, |procedures| {
                select_ids(procedures, &target.ids, &target.filter)
            })?;
        }
        Command::Wake { event, by, at } => act::wake(&at, token, event, &by)?,
        Command::Bypass {
            target,
            recursive,
            at,
        } => act::bypass(&at, token, &target, recursive, |procedures| {
            select_ids(procedures, &target.ids, &target.filter)
        })?,
    }
    Ok(())
}

/// Reads a WAL directory without locking it, or a shared store at one snapshot (the
/// `--url` reads are answered above).
fn read(at: &Place) -> Result<Catalog, String> {
    let loaded = match &at.store {
        Some(dir) => WalStore::read_only(dir).map_err(|e| e.to_string())?,
        None => shared::load(at)?.ok_or(args::GIVE_A_PLACE)?,
    };
    Ok(Catalog::from_loaded(&loaded))
}

fn record(catalog: &Catalog, id: u64) -> Result<&ProcedureRecord, String> {
    catalog
        .get(ProcedureId::new(id))
        .ok_or_else(|| format!("the store holds no procedure #{id}"))
}

/// The records that pass `filter`.
fn select<'a>(catalog: &'a Catalog, filter: &Filter) -> Result<Vec<&'a ProcedureRecord>, String> {
    let older_than = filter.older_than.map(|age| SystemTime::now() - age.0);
    Ok(catalog
        .records()
        .iter()
        .filter(|r| {
            filter
                .status
                .as_deref()
                .is_none_or(|s| r.status.name() == s)
        })
        .filter(|r| filter.machine.as_deref().is_none_or(|m| r.machine == m))
        .filter(|r| older_than.is_none_or(|limit| r.submitted <= limit))
        .collect())
}

impl act::Procedures for Catalog {
    fn check(&self, id: u64) -> Result<(), String> {
        record(self, id).map(drop)
    }

    fn live(&self, filter: &Filter) -> Result<Vec<u64>, String> {
        let selected = select(self, filter)?;
        let live = selected.iter().filter(|r| !r.status.is_finished());
        Ok(live.map(|r| r.id.get()).collect())
    }
}

/// The ids given, or those the filter selects (the bulk forms); never both, never none.
fn select_ids(
    procedures: &dyn act::Procedures,
    ids: &[u64],
    filter: &Filter,
) -> Result<Vec<u64>, String> {
    if !ids.is_empty() {
        if filter.any() {
            return Err(
                "give procedure ids or filters (--status, --machine, --older-than), not both"
                    .into(),
            );
        }
        for &id in ids {
            procedures.check(id)?;
        }
        return Ok(ids.to_vec());
    }
    if !filter.any() {
        return Err(
            "name the procedures: ids, or filters (--status, --machine, --older-than)".into(),
        );
    }
    procedures.live(filter)
}
