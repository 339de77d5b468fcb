//! `--postgres`: a PostgreSQL store beside the executors that run on it. Reads take one
//! snapshot (`PgStore::read_only`: it creates nothing and takes no lock writers wait for);
//! writes leave requests that the running leader picks up within its request poll
//! (`Config::request_poll`), as any process may on a shared store.

use crate::act::Procedures;
use procflow::operator::Request;
use procflow::store::Loaded;

/// The whole store in schema `schema` of the database `connection` names.
#[cfg(feature = "postgres")]
pub fn load(connection: &str, schema: Option<&str>) -> Result<Loaded, String> {
    use procflow::store::postgres::PgStore;

    let config = config(connection, schema)?;
    runtime()?
        .block_on(PgStore::read_only(config))
        .map_err(|e| e.to_string())
}

/// Stores the requests `make` makes in the store, once it is known to hold one.
#[cfg(feature = "postgres")]
pub fn leave(
    connection: &str,
    schema: Option<&str>,
    make: impl FnOnce(&dyn Procedures) -> Result<Vec<Request>, String>,
) -> Result<(), String> {
    use procflow::store::Store;
    use procflow::store::postgres::PgStore;

    let config = config(connection, schema)?;
    runtime()?.block_on(async {
        // Not created if missing: a typo in the schema must not make an empty store.
        PgStore::read_only(config.clone())
            .await
            .map_err(|e| e.to_string())?;
        let store = PgStore::connect(config).await.map_err(|e| e.to_string())?;
        let when = "carried out by the running leader within its request poll, \
                    or by the next executor to start";
        let stored = crate::act::store_requests(&store, make, when).await;
        store.close().await.map_err(|e| e.to_string())?;
        stored
    })
}

#[cfg(feature = "postgres")]
fn config(
    connection: &str,
    schema: Option<&str>,
) -> Result<procflow::store::postgres::PgConfig, String> {
    let schema = schema
        .ok_or("give --schema NAME with --postgres: the schema the executors' PgConfig names")?;
    Ok(procflow::store::postgres::PgConfig::new(connection, schema))
}

#[cfg(feature = "postgres")]
fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

#[cfg(not(feature = "postgres"))]
const WITHOUT: &str = "this procflow was built without PostgreSQL support: \
                       cargo install procflow --features cli,postgres";

/// Says how to get a build that reads PostgreSQL.
#[cfg(not(feature = "postgres"))]
pub fn load(_connection: &str, _schema: Option<&str>) -> Result<Loaded, String> {
    Err(WITHOUT.to_owned())
}

/// Says how to get a build that writes to PostgreSQL.
#[cfg(not(feature = "postgres"))]
pub fn leave(
    _connection: &str,
    _schema: Option<&str>,
    _make: impl FnOnce(&dyn Procedures) -> Result<Vec<Request>, String>,
) -> Result<(), String> {
    Err(WITHOUT.to_owned())
}
