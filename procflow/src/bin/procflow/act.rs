//! The write commands: each stores a request for the executor, which carries it out when
//! it next starts on the store (on PostgreSQL or etcd: the running leader, within its
//! request poll), or, with `--url`, hands it to the running executor.

use crate::args::{Filter, Place, Target};
use crate::remote;
use procflow::operator::{Action, Catalog, Request, leave_request};
use procflow::store::{Store, StoreError, WalConfig, WalStore};
use std::path::Path;

pub fn abort(
    at: &Place,
    token: Option<&str>,
    target: &Target,
    ids: impl FnOnce(&dyn Procedures) -> Result<Vec<u64>, String>,
) -> Result<(), String> {
    leave(at, token, |procedures| {
        let requests = ids(procedures)?
            .into_iter()
            .map(|id| Request::new(Action::Abort(id), &target.by, &target.reason));
        Ok(requests.collect())
    })
}

pub fn bypass(
    at: &Place,
    token: Option<&str>,
    target: &Target,
    recursive: bool,
    ids: impl FnOnce(&dyn Procedures) -> Result<Vec<u64>, String>,
) -> Result<(), String> {
    if target.reason.is_empty() {
        return Err("a bypass needs --reason: it is recorded in the procedure's history".into());
    }
    leave(at, token, |procedures| {
        let requests = ids(procedures)?
            .into_iter()
            .map(|id| Request::new(Action::Bypass { id, recursive }, &target.by, &target.reason));
        Ok(requests.collect())
    })
}

pub fn wake(at: &Place, token: Option<&str>, event: String, by: &str) -> Result<(), String> {
    leave(at, token, |_| {
        Ok(vec![Request::new(Action::Wake(event), by, "")])
    })
}

/// Where a write command finds the procedures it names: the stopped store's catalog,
/// or a running executor's list and records (by id, and `/api/summaries` for a filter;
/// never its whole store).
pub trait Procedures {
    /// `Ok` if procedure `id` exists; else why not.
    fn check(&self, id: u64) -> Result<(), String>;
    /// The procedures `filter` selects that have not ended, by id.
    fn live(&self, filter: &Filter) -> Result<Vec<u64>, String>;
}

/// Makes the requests and hands them over: to the admin API at `--url`, into the
/// stopped store at `--store`, or into the shared store at `--postgres` or `--etcd`.
fn leave(
    at: &Place,
    token: Option<&str>,
    make: impl FnOnce(&dyn Procedures) -> Result<Vec<Request>, String>,
) -> Result<(), String> {
    match (&at.url, &at.store) {
        (Some(url), _) => send(url, token, make),
        (None, Some(dir)) => store(dir, make),
        (None, None) => match crate::shared::leave(at, make)? {
            true => Ok(()),
            false => Err(crate::args::GIVE_A_PLACE.to_owned()),
        },
    }
}

/// Posts each request to the admin API, which carries it out before it answers.
fn send(
    url: &str,
    token: Option<&str>,
    make: impl FnOnce(&dyn Procedures) -> Result<Vec<Request>, String>,
) -> Result<(), String> {
    let requests = make(&remote::Remote { url, token })?;
    if requests.is_empty() {
        return Err("no procedure matches".to_owned());
    }
    let mut failed = 0;
    for request in &requests {
        match remote::send(url, token, request) {
            Ok(done) => println!("{done}"),
            Err(why) => {
                eprintln!("procflow: {why}");
                failed += 1;
            }
        }
    }
    match failed {
        0 => Ok(()),
        n => Err(format!(
            "{n} of {} requests were not carried out",
            requests.len()
        )),
    }
}

/// Opens the store for writing, stores the requests `make` makes, and says so.
fn store(
    dir: &Path,
    make: impl FnOnce(&dyn Procedures) -> Result<Vec<Request>, String>,
) -> Result<(), String> {
    // Not created if missing: a typo must not make an empty store.
    WalStore::read_only(dir).map_err(|e| e.to_string())?;
    let store = WalStore::open(dir, WalConfig::default()).map_err(|e| match e {
        StoreError::Locked { .. } => format!(
            "{e}: an executor runs on this store; requests are written to a stopped store, \
             or sent to a running executor's admin API with --url"
        ),
        e => e.to_string(),
    })?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let when = "carried out when an executor next starts on the store";
        let catalog = Catalog::load(&store).await.map_err(|e| e.to_string())?;
        store_requests(&store, &catalog, make, when).await?;
        store.close().await.map_err(|e| e.to_string())
    })
}

/// Stores in `store` the requests `make` makes from `catalog` (the store's), and says so,
/// each with `when` it is carried out.
pub async fn store_requests(
    store: &dyn Store,
    catalog: &Catalog,
    make: impl FnOnce(&dyn Procedures) -> Result<Vec<Request>, String>,
    when: &str,
) -> Result<(), String> {
    let requests = make(catalog)?;
    if requests.is_empty() {
        return Err("no procedure matches".to_owned());
    }
    for request in &requests {
        let key = leave_request(store, request)
            .await
            .map_err(|e| e.to_string())?;
        println!("stored {key}: {:?} ({when})", request.action);
    }
    Ok(())
}
