//! `--postgres` and `--etcd`: a shared store beside the executors that run on it. Reads
//! take one snapshot (`PgStore::read_only`, `EtcdStore::read_only`: they write nothing
//! and take no lock writers wait for); writes leave requests that the running leader picks
//! up within its request poll (`Config::request_poll`), as any process may on a shared
//! store.

use crate::act::Procedures;
use crate::args::Place;
use procflow::operator::{Catalog, Request};
use procflow::store::Loaded;

/// Where the store is: which backend, and its location.
#[cfg_attr(
    not(all(feature = "postgres", feature = "etcd")),
    allow(
        dead_code,
        reason = "a backend left out of the build is only named in its error"
    )
)]
enum Shared<'a> {
    Postgres {
        connection: &'a str,
        schema: &'a str,
    },
    Etcd {
        endpoints: Vec<String>,
        prefix: &'a str,
    },
}

/// The shared store `at` names, if it names one.
fn shared(at: &Place) -> Result<Option<Shared<'_>>, String> {
    match (&at.postgres, &at.etcd) {
        (Some(connection), _) => {
            let schema = at.schema.as_deref().ok_or(
                "give --schema NAME with --postgres: the schema the executors' PgConfig names",
            )?;
            Ok(Some(Shared::Postgres { connection, schema }))
        }
        (None, Some(endpoints)) => {
            let prefix = at.prefix.as_deref().ok_or(
                "give --prefix PREFIX with --etcd: the prefix the executors' EtcdConfig names",
            )?;
            let endpoints = endpoints.split(',').map(str::to_owned).collect();
            Ok(Some(Shared::Etcd { endpoints, prefix }))
        }
        (None, None) => Ok(None),
    }
}

/// The whole shared store `at` names (`None` if it names none).
pub fn load(at: &Place) -> Result<Option<Loaded>, String> {
    let Some(place) = shared(at)? else {
        return Ok(None);
    };
    runtime()?.block_on(place.read_only()).map(Some)
}

/// Stores the requests `make` makes in the shared store `at` names, once it is known to
/// hold one (`false` if it names none).
pub fn leave(
    at: &Place,
    make: impl FnOnce(&dyn Procedures) -> Result<Vec<Request>, String>,
) -> Result<bool, String> {
    let Some(place) = shared(at)? else {
        return Ok(false);
    };
    runtime()?.block_on(async {
        // Read before it is opened, so that a typo does not make an empty store; the
        // requests are checked against that snapshot (the executors go on regardless).
        let catalog = Catalog::from_loaded(&place.read_only().await?);
        let store = place.open().await?;
        let when = "carried out by the running leader within its request poll, \
                    or by the next executor to start";
        let stored = crate::act::store_requests(store.as_ref(), &catalog, make, when).await;
        store.close().await.map_err(|e| e.to_string())?;
        stored.map(|()| true)
    })
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

impl Shared<'_> {
    async fn read_only(&self) -> Result<Loaded, String> {
        match self {
            #[cfg(feature = "postgres")]
            Shared::Postgres { connection, schema } => {
                use procflow::store::postgres::{PgConfig, PgStore};
                let config = PgConfig::new(*connection, *schema);
                PgStore::read_only(config).await.map_err(|e| e.to_string())
            }
            #[cfg(feature = "etcd")]
            Shared::Etcd { endpoints, prefix } => {
                use procflow::store::etcd::{EtcdConfig, EtcdStore};
                let config = EtcdConfig::new(endpoints.clone(), *prefix);
                EtcdStore::read_only(config)
                    .await
                    .map_err(|e| e.to_string())
            }
            #[cfg_attr(
                all(feature = "postgres", feature = "etcd"),
                allow(unreachable_patterns, reason = "every backend is built")
            )]
            other => Err(other.not_built()),
        }
    }

    async fn open(&self) -> Result<Box<dyn procflow::store::Store>, String> {
        match self {
            #[cfg(feature = "postgres")]
            Shared::Postgres { connection, schema } => {
                use procflow::store::postgres::{PgConfig, PgStore};
                let config = PgConfig::new(*connection, *schema);
                let store = PgStore::connect(config).await.map_err(|e| e.to_string())?;
                Ok(Box::new(store))
            }
            #[cfg(feature = "etcd")]
            Shared::Etcd { endpoints, prefix } => {
                use procflow::store::etcd::{Compaction, EtcdConfig, EtcdStore};
                // Compaction is the executors' business, not a passing CLI's.
                let config =
                    EtcdConfig::new(endpoints.clone(), *prefix).compaction(Compaction::off());
                let store = EtcdStore::connect(config)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(Box::new(store))
            }
            #[cfg_attr(
                all(feature = "postgres", feature = "etcd"),
                allow(unreachable_patterns, reason = "every backend is built")
            )]
            other => Err(other.not_built()),
        }
    }

    /// What a build without this backend's feature says.
    #[cfg_attr(
        all(feature = "postgres", feature = "etcd"),
        allow(dead_code, reason = "every backend is built")
    )]
    fn not_built(&self) -> String {
        let (what, feature) = match self {
            Shared::Postgres { .. } => ("PostgreSQL", "postgres"),
            Shared::Etcd { .. } => ("etcd", "etcd"),
        };
        format!(
            "this procflow was built without {what} support: \
             cargo install procflow --features cli,{feature}"
        )
    }
}
