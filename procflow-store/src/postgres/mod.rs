//! [`PgStore`]: procedures kept in PostgreSQL (cargo feature `postgres`), and
//! [`LocalPostgres`], which runs a PostgreSQL server in a temporary directory for tests
//! and examples.
//!
//! * **One batch is one transaction.** Every commit is one call of the schema's `apply`
//!   function: one statement, so one transaction and one round trip. A batch is never
//!   split; [`limits`](crate::Store::limits) bound one value and one batch.
//! * **Group commit.** Batches committed while a transaction is in flight share the next
//!   one, as on etcd: batches merge key by key, the last write winning, and a batch whose
//!   check (a record it finishes must exist, a key it creates must not) an earlier
//!   batch's write would decide waits for the next transaction. If a check fails in a
//!   group, each batch of it is committed alone to find whose it was.
//! * **Fencing in the database.** A batch with a fencing token commits only if the
//!   leader row (`{schema}.leader`) holds that term, read inside the transaction under a
//!   `FOR KEY SHARE` lock. A takeover changes the term (a column with a unique index), so
//!   its update needs the row's `FOR UPDATE` lock: it waits for every commit in flight,
//!   and every commit that starts after it waits for it and then reads the new term
//!   (READ COMMITTED re-reads a row it waited for). So under PostgreSQL's default
//!   isolation every fenced write either committed while its term was current or is
//!   refused with [`StoreError::Fenced`]. procflow's `PgElection` writes that row.
//! * **Unknown outcomes.** Every request has a deadline. A timeout or a lost connection
//!   while a commit is in flight is [`StoreError::Io`]: the batch may or may not be
//!   durable. The connection is dropped, and its server process ended before anything
//!   else is sent, so that the statement cannot apply late, after a newer write
//!   (PostgreSQL 14 or later).
//! * **Paged loading at one snapshot.** [`load`](crate::Store::load) and
//!   [`list`](crate::Store::list) read `page_size` rows per request inside one
//!   `REPEATABLE READ` transaction, so a million procedures load without one giant
//!   response, and every page sees the same moment.
//!
//! * **Cancel safety.** A dropped `commit` future leaves its batch queued or in flight:
//!   it commits or not, as if the caller had waited, and nothing else changes. A dropped
//!   read leaves nothing behind: its connection goes back to the pool, tokio-postgres
//!   discarding the answers still owed and rolling back a snapshot's transaction. A dropped `connect` leaves at most the schema created.
//!
//! The tables, the function and the schema's version are in `docs/FORMAT.md`; the store
//! creates them on first use, in a schema of its own.
//!
//! # Examples
//!
//! ```no_run
//! use procflow_store::postgres::{PgConfig, PgStore};
//! use procflow_store::{Batch, Store};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let config = PgConfig::new("host=127.0.0.1 user=procflow dbname=myapp", "procedures");
//! let store = PgStore::connect(config).await?;
//! store.commit(Batch::new().put(1, None, b"step 1".to_vec())).await?;
//! assert_eq!(store.load().await?.records.len(), 1);
//! # Ok::<(), procflow_store::StoreError>(())
//! # }).unwrap();
//! ```

mod committer;
mod local;
mod plan;
mod read;
mod schema;

pub use local::{INSTALL_POSTGRES, LocalPostgres, LocalPostgresError};
/// The PostgreSQL client this store is built on, for callers that talk to the same
/// database ([`PgConfig::connect`]).
pub use tokio_postgres;

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::error::StoreError;
use crate::store::{Batch, BoxFuture, Limits, Loaded, ProcId, Record, RecordInfo, Store};
use committer::Pending;
use plan::Prepared;

/// The largest value one op may carry, and the most one batch may: well under
/// PostgreSQL's 1 GB for a field and for a message.
const MAX_VALUE_BYTES: usize = 64 << 20;
const MAX_BATCH_BYTES: usize = 256 << 20;

/// Where a [`PgStore`] keeps its data and how it talks to PostgreSQL.
#[derive(Clone, Debug)]
pub struct PgConfig {
    connection: String,
    schema: String,
    request_timeout: Duration,
    page_size: usize,
}

impl PgConfig {
    /// The store in schema `schema` (created if missing) of the database `connection`
    /// names, a libpq connection string (`"host=127.0.0.1 port=5432 user=app dbname=app"`
    /// or `"postgresql://app@127.0.0.1/app"`). Requests time out after 5 s; `load` reads
    /// 1,000 rows per request.
    ///
    /// The schema's name is used in SQL as it is, so it must need no quoting: 1 to 63
    /// lowercase ASCII letters, digits and `_`, not starting with a digit.
    /// [`PgStore::connect`] refuses any other, saying so.
    pub fn new(connection: impl Into<String>, schema: impl Into<String>) -> Self {
        Self {
            connection: connection.into(),
            schema: schema.into(),
            request_timeout: Duration::from_secs(5),
            page_size: 1000,
        }
    }

    /// How long one request may take before its outcome counts as unknown
    /// ([`StoreError::Io`]).
    #[must_use]
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How many rows one `load` or `list` request reads (at least 1).
    #[must_use]
    pub fn page_size(mut self, rows: usize) -> Self {
        self.page_size = rows.max(1);
        self
    }

    /// The connection string.
    #[must_use]
    pub fn connection(&self) -> &str {
        &self.connection
    }

    /// The schema's name.
    #[must_use]
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The table holding the executor group's leader row, whose `term` every fenced
    /// transaction compares (`{schema}.leader`).
    #[must_use]
    pub fn leader_table(&self) -> String {
        format!("{}.leader", self.schema)
    }

    /// Opens one connection of this configuration (its task spawned on the current
    /// runtime), within the request timeout: for an election, or a tool, that talks to
    /// the same database as the store.
    ///
    /// # Errors
    ///
    /// [`StoreError::Io`] if the connection string does not parse, or no server answers.
    pub async fn connect(&self) -> Result<tokio_postgres::Client, StoreError> {
        self.connect_with(|_| {}).await
    }

    /// [`connect`](Self::connect), handing every notification the connection receives
    /// (after a `LISTEN` on it) to `notified`, on the connection's task.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect).
    pub async fn connect_with(
        &self,
        mut notified: impl FnMut(tokio_postgres::Notification) + Send + 'static,
    ) -> Result<tokio_postgres::Client, StoreError> {
        let location = self.location();
        let config = self.parsed(&location)?;
        let connect = config.connect(tokio_postgres::NoTls);
        let (client, mut connection) =
            match tokio::time::timeout(self.request_timeout, connect).await {
                Ok(Ok(pair)) => pair,
                Ok(Err(error)) => {
                    return Err(StoreError::io(
                        "connecting to PostgreSQL",
                        location,
                        std::io::Error::other(error),
                    ));
                }
                Err(_) => return Err(timed_out("connecting to PostgreSQL", location, self)),
            };
        tokio::spawn(async move {
            // Ends when the client is dropped or the server goes; requests then fail.
            while let Some(Ok(message)) =
                std::future::poll_fn(|cx| connection.poll_message(cx)).await
            {
                if let tokio_postgres::AsyncMessage::Notification(notification) = message {
                    notified(notification);
                }
            }
        });
        Ok(client)
    }

    fn location(&self) -> PathBuf {
        PathBuf::from(format!("postgres {} {}", self.connection, self.schema))
    }

    fn parsed(&self, location: &std::path::Path) -> Result<tokio_postgres::Config, StoreError> {
        let mut config = tokio_postgres::Config::from_str(&self.connection).map_err(|error| {
            StoreError::io(
                "reading the PostgreSQL connection string",
                location,
                std::io::Error::new(std::io::ErrorKind::InvalidInput, error),
            )
        })?;
        config
            .application_name("procflow")
            .connect_timeout(self.request_timeout);
        Ok(config)
    }
}

fn timed_out(context: &'static str, location: PathBuf, config: &PgConfig) -> StoreError {
    StoreError::io(
        context,
        location,
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {:?}", config.request_timeout),
        ),
    )
}

/// A [`Store`] in PostgreSQL; see the [module docs](self).
pub struct PgStore {
    shared: Arc<Shared>,
    queue: Mutex<Option<mpsc::UnboundedSender<Pending>>>,
    committer: tokio::sync::Mutex<Option<JoinHandle<()>>>,
}

/// What the store's callers and its committer share.
pub(crate) struct Shared {
    pool: Pool,
    config: PgConfig,
    timeout: Duration,
    /// The committer's statements.
    sql: schema::Statements,
    /// Named in errors: the connection string and the schema.
    location: PathBuf,
}

impl PgStore {
    /// Connects, creates the schema's tables and function if they are missing (or checks
    /// their version), and starts the committer. Must be called inside a tokio runtime.
    ///
    /// # Errors
    ///
    /// [`StoreError::Io`] if the schema name is not a plain identifier, the server does
    /// not answer within the request timeout, or the schema was written by a newer
    /// procflow (its version is higher than this build's).
    pub async fn connect(config: PgConfig) -> Result<Self, StoreError> {
        let shared = Arc::new(Shared::new(config)?);
        shared.create_schema().await?;
        let (queue, receiver) = mpsc::unbounded_channel();
        let committer = tokio::spawn(committer::run(Arc::clone(&shared), receiver));
        Ok(Self {
            shared,
            queue: Mutex::new(Some(queue)),
            committer: tokio::sync::Mutex::new(Some(committer)),
        })
    }

    /// Reads the whole store once, as [`Store::load`] does, and creates nothing: no
    /// schema, no table, no committer. For tools that look at a store that executors
    /// elsewhere run on, such as the `procflow` CLI's `--postgres`. Every page is read in
    /// one `REPEATABLE READ` transaction, so the result is one consistent snapshot, taken
    /// without locking anything writers wait for. Must be called inside a tokio runtime.
    ///
    /// Cancel safety: dropping the future drops its connection; nothing was written.
    ///
    /// # Errors
    ///
    /// [`StoreError::Io`] if the schema name is not a plain identifier, the server does
    /// not answer within the request timeout, the schema holds no procflow store, or it
    /// was written by a newer procflow.
    ///
    /// ```no_run
    /// use procflow_store::postgres::{PgConfig, PgStore};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let config = PgConfig::new("host=127.0.0.1 user=app dbname=app", "procedures");
    /// let loaded = PgStore::read_only(config).await?;
    /// println!("{} records", loaded.records.len());
    /// # Ok::<(), procflow_store::StoreError>(())
    /// # }).unwrap();
    /// ```
    pub async fn read_only(config: PgConfig) -> Result<Loaded, StoreError> {
        let shared = Shared::new(config)?;
        shared.check_schema().await?;
        shared.load().await
    }

    /// The configuration the store was connected with.
    #[must_use]
    pub fn config(&self) -> &PgConfig {
        &self.shared.config
    }

    async fn commit_batch(&self, batch: Batch) -> Result<(), StoreError> {
        let Some(queue) = self.sender() else {
            return Err(StoreError::Closed);
        };
        self.limits().check(&batch)?;
        let batch = Prepared::from_ops(batch.ops, batch.fencing_token)?;
        let (reply, answer) = oneshot::channel();
        queue
            .send(Pending { batch, reply })
            .map_err(|_| StoreError::Closed)?;
        answer.await.unwrap_or(Err(StoreError::Closed))
    }

    fn sender(&self) -> Option<mpsc::UnboundedSender<Pending>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    async fn close_store(&self) -> Result<(), StoreError> {
        // Dropping the sender lets the committer finish what is queued, then end.
        drop(self.queue.lock().unwrap_or_else(|e| e.into_inner()).take());
        if let Some(committer) = self.committer.lock().await.take() {
            let _ = committer.await;
        }
        Ok(())
    }
}

impl Shared {
    /// Checks the schema's name and makes the pool; connects to nothing yet.
    fn new(config: PgConfig) -> Result<Self, StoreError> {
        let location = config.location();
        let naming = "naming the store's schema";
        schema::check_name(&config.schema)
            .map_err(|reason| schema::error(naming, &location, reason))?;
        let manager = Manager::from_config(
            config.parsed(&location)?,
            tokio_postgres::NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(4)
            .build()
            .map_err(|error| {
                StoreError::io("making a pool", &location, std::io::Error::other(error))
            })?;
        Ok(Self {
            pool,
            timeout: config.request_timeout,
            sql: schema::Statements::new(&config.schema),
            config,
            location,
        })
    }

    /// A connection from the pool, within the deadline.
    async fn connect(&self, context: &'static str) -> Result<Object, StoreError> {
        match tokio::time::timeout(self.timeout, self.pool.get()).await {
            Ok(Ok(object)) => Ok(object),
            // deadpool's message leaves out why ("error connecting to server"): add the
            // causes ("Connection refused").
            Ok(Err(error)) => Err(self.io(context, std::io::Error::other(with_causes(&error)))),
            Err(_) => Err(timed_out(context, self.location.clone(), &self.config)),
        }
    }

    async fn create_schema(&self) -> Result<(), StoreError> {
        let context = "creating or checking the store's schema";
        let mut object = self.connect(context).await?;
        let ensure = schema::ensure(&mut object, &self.config.schema);
        match tokio::time::timeout(self.timeout, ensure).await {
            Ok(result) => result.map_err(|reason| schema::error(context, &self.location, reason)),
            Err(_) => Err(timed_out(context, self.location.clone(), &self.config)),
        }
    }

    /// [`schema::check`] within the deadline: the store is there, and not newer.
    async fn check_schema(&self) -> Result<(), StoreError> {
        let context = "checking the store's schema";
        let object = self.connect(context).await?;
        let check = schema::check(&object, &self.config.schema);
        match tokio::time::timeout(self.timeout, check).await {
            Ok(result) => result.map_err(|reason| schema::error(context, &self.location, reason)),
            Err(_) => Err(timed_out(context, self.location.clone(), &self.config)),
        }
    }

    pub(crate) fn io(&self, context: &'static str, source: std::io::Error) -> StoreError {
        StoreError::io(context, self.location.clone(), source)
    }
}

/// `error`'s message followed by its sources', each once.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let line = cause.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        source = cause.source();
    }
    text
}

impl Store for PgStore {
    fn commit(&self, batch: Batch) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.commit_batch(batch))
    }

    fn load(&self) -> BoxFuture<'_, Result<Loaded, StoreError>> {
        Box::pin(self.shared.load())
    }

    fn get(&self, id: ProcId) -> BoxFuture<'_, Result<Option<Record>, StoreError>> {
        Box::pin(self.shared.get(id))
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<RecordInfo>, StoreError>> {
        Box::pin(self.shared.list())
    }

    fn meta(
        &self,
        prefix: &str,
    ) -> BoxFuture<'_, Result<std::collections::BTreeMap<String, Vec<u8>>, StoreError>> {
        let prefix = prefix.to_owned();
        Box::pin(async move { self.shared.meta(&prefix).await })
    }

    fn limits(&self) -> Limits {
        Limits {
            max_ops_per_batch: None,
            max_value_bytes: Some(MAX_VALUE_BYTES),
            max_batch_bytes: Some(MAX_BATCH_BYTES),
        }
    }

    fn close(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.close_store())
    }
}
