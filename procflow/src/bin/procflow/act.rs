//! The write commands: each stores a request for the executor, which carries it out when
//! it next starts on the store.

use crate::args::Target;
use procflow::operator::{Action, Catalog, Request, leave_request};
use procflow::store::{Store, StoreError, WalConfig, WalStore};
use std::path::Path;

pub fn abort(
    store: &Path,
    target: &Target,
    ids: impl FnOnce(&Catalog) -> Result<Vec<u64>, String>,
) -> Result<(), String> {
    leave(store, |catalog| {
        let requests = ids(catalog)?
            .into_iter()
            .map(|id| Request::new(Action::Abort(id), &target.by, &target.reason));
        Ok(requests.collect())
    })
}

pub fn bypass(
    store: &Path,
    target: &Target,
    recursive: bool,
    ids: impl FnOnce(&Catalog) -> Result<Vec<u64>, String>,
) -> Result<(), String> {
    if target.reason.is_empty() {
        return Err("a bypass needs --reason: it is recorded in the procedure's history".into());
    }
    leave(store, |catalog| {
        let requests = ids(catalog)?
            .into_iter()
            .map(|id| Request::new(Action::Bypass { id, recursive }, &target.by, &target.reason));
        Ok(requests.collect())
    })
}

pub fn wake(store: &Path, event: String, by: &str) -> Result<(), String> {
    leave(store, |_| {
        Ok(vec![Request::new(Action::Wake(event), by, "")])
    })
}

/// Opens the store for writing, stores the requests `make` makes, and says so.
fn leave(
    dir: &Path,
    make: impl FnOnce(&Catalog) -> Result<Vec<Request>, String>,
) -> Result<(), String> {
    // Not created if missing: a typo must not make an empty store.
    WalStore::read_only(dir).map_err(|e| e.to_string())?;
    let store = WalStore::open(dir, WalConfig::default()).map_err(|e| match e {
        StoreError::Locked { .. } => format!(
            "{e}: an executor runs on this store; requests are written to a stopped store \
             (the admin API, for a running executor, is not built yet)"
        ),
        e => e.to_string(),
    })?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let catalog = Catalog::load(&store).await.map_err(|e| e.to_string())?;
        let requests = make(&catalog)?;
        if requests.is_empty() {
            return Err("no procedure matches".to_owned());
        }
        for request in &requests {
            let key = leave_request(&store, request)
                .await
                .map_err(|e| e.to_string())?;
            println!(
                "stored {key}: {:?} (carried out when an executor next starts on the store)",
                request.action
            );
        }
        store.close().await.map_err(|e| e.to_string())
    })
}
