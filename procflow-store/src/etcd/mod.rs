//! [`EtcdStore`]: procedures kept in an etcd cluster (cargo feature `etcd`), and
//! [`LocalCluster`], which starts etcd processes on this machine for tests and examples.
//!
//! * **One batch is one transaction.** Ops on the same key are merged first (etcd refuses
//!   a transaction naming a key twice); [`limits`](crate::Store::limits) are etcd's, so
//!   a batch over them is [`StoreError::TooLarge`] and is never split.
//! * **Group commit.** Batches committed while a transaction is in flight share the next
//!   one, as long as it stays within etcd's limits.
//! * **Fencing in etcd itself.** A batch with a fencing token commits only if the leader
//!   key (`{prefix}/leader`) still has that create revision: the write of a leader that
//!   has been replaced, or whose lease ended, is refused by etcd with
//!   [`StoreError::Fenced`]. The executor group's etcd election writes that key.
//! * **Unknown outcomes.** Every request has a deadline. A timeout, a lost connection or
//!   an etcd leader change while a commit is in flight is [`StoreError::Io`]: the batch
//!   may or may not be durable.
//! * **Paged loading.** [`load`](crate::Store::load) reads `page_size` keys per request,
//!   all at one revision, so a million procedures load without one giant response.
//!
//! The key layout and the record encoding are in `docs/FORMAT.md`.
//!
//! # Examples
//!
//! ```no_run
//! use procflow_store::etcd::{EtcdConfig, EtcdStore};
//! use procflow_store::{Batch, Store};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let config = EtcdConfig::new(["127.0.0.1:2379"], "/myapp/procedures");
//! let store = EtcdStore::connect(config).await?;
//! store.commit(Batch::new().put(1, None, b"step 1".to_vec())).await?;
//! assert_eq!(store.load().await?.records.len(), 1);
//! # Ok::<(), procflow_store::StoreError>(())
//! # }).unwrap();
//! ```

mod cluster;
mod committer;
mod compactor;
mod keys;
mod plan;
mod record;
mod sequence;

pub use cluster::{ClusterError, ClusterOptions, LocalCluster};
pub use compactor::Compaction;
/// The etcd client this store is built on, for callers that share its connection
/// ([`EtcdStore::client`]).
pub use etcd_client;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions, KeyValue, KvClient};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::error::StoreError;
use crate::state::{Change, resolve};
use crate::store::{Batch, BoxFuture, Limits, Loaded, Op, ProcId, Record, RecordInfo, Store};
use committer::Pending;
use keys::Keys;
use plan::{Prepared, Write};

/// Where an [`EtcdStore`] keeps its data and how it talks to etcd.
#[derive(Clone, Debug)]
pub struct EtcdConfig {
    endpoints: Vec<String>,
    prefix: String,
    request_timeout: Duration,
    page_size: usize,
    compaction: Compaction,
}

impl EtcdConfig {
    /// The store under `prefix` (e.g. `"/myapp/procedures"`) of the cluster reachable at
    /// `endpoints` (`"host:port"`). Requests time out after 5 s; `load` reads 1,000 keys
    /// per request.
    pub fn new(
        endpoints: impl IntoIterator<Item = impl Into<String>>,
        prefix: impl Into<String>,
    ) -> Self {
        Self {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            prefix: prefix.into(),
            request_timeout: Duration::from_secs(5),
            page_size: 1000,
            compaction: Compaction::default(),
        }
    }

    /// How long one request may take before its outcome counts as unknown
    /// ([`StoreError::Io`]).
    #[must_use]
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How many keys one `load` request reads (at least 1).
    #[must_use]
    pub fn page_size(mut self, keys: usize) -> Self {
        self.page_size = keys.max(1);
        self
    }

    /// How the store compacts etcd's history once it writes (default: every minute,
    /// keeping five minutes; see [`Compaction`]). [`Compaction::off`] leaves it to etcd's
    /// `--auto-compaction-*` or to an operator; without either, etcd's database grows until
    /// its space quota and then refuses every write.
    #[must_use]
    pub fn compaction(mut self, compaction: Compaction) -> Self {
        self.compaction = compaction;
        self
    }

    /// The endpoints.
    #[must_use]
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The leader key of the executor group on this store: its create revision is the
    /// fencing token every fenced batch is checked against.
    #[must_use]
    pub fn leader_key(&self) -> String {
        String::from_utf8(Keys::new(&self.prefix).leader()).expect("the prefix is a string")
    }
}

/// A [`Store`] in etcd; see the [module docs](self).
pub struct EtcdStore {
    shared: Arc<Shared>,
    limits: Limits,
    queue: Mutex<Option<mpsc::UnboundedSender<Pending>>>,
    committer: tokio::sync::Mutex<Option<JoinHandle<()>>>,
}

/// What the store's callers and its committer share.
pub(crate) struct Shared {
    client: Client,
    pub(crate) keys: Keys,
    timeout: Duration,
    page_size: usize,
    /// Named in errors: the endpoints and the prefix.
    location: PathBuf,
    /// This store instance's sequence key ([`sequence`]): random, so that no other writer
    /// shares it.
    pub(crate) sequence_key: Vec<u8>,
    /// The revisions this store wrote and its loads read at, for the compactor.
    pub(crate) pins: compactor::Pins,
    /// The parent of every live record this store has seen, so that a `Finish` (which
    /// rewrites the record with its parent) needs no read first.
    parents: Mutex<HashMap<ProcId, Option<ProcId>>>,
}

impl EtcdStore {
    /// Connects to the cluster. Must be called inside a tokio runtime: it spawns the
    /// committer.
    ///
    /// # Errors
    ///
    /// [`StoreError::Io`] if no endpoint answers within the request timeout.
    pub async fn connect(config: EtcdConfig) -> Result<Self, StoreError> {
        let shared = Arc::new(Shared::connect(&config).await?);
        let limits = Limits {
            max_ops_per_batch: Some(plan::MAX_BATCH_OPS),
            max_value_bytes: Some(plan::max_batch_bytes(&shared.keys)),
            max_batch_bytes: Some(plan::max_batch_bytes(&shared.keys)),
        };
        let start = shared.create_sequence().await?;
        let (queue, receiver) = mpsc::unbounded_channel();
        let committer = tokio::spawn(committer::run(Arc::clone(&shared), start, receiver));
        // It ends on its own once the store (and its committer) are gone.
        tokio::spawn(compactor::run(Arc::downgrade(&shared), config.compaction));
        Ok(Self {
            shared,
            limits,
            queue: Mutex::new(Some(queue)),
            committer: tokio::sync::Mutex::new(Some(committer)),
        })
    }

    /// Reads the whole store once, as [`Store::load`] does, and writes nothing: no
    /// writer's sequence key, no committer, no compaction. For tools that look at a store
    /// that executors elsewhere run on, such as the `procflow` CLI's `--etcd`. The keys are
    /// read at one revision. Must be called inside a tokio runtime.
    ///
    /// Cancel safety: dropping the future drops its connection; nothing was written.
    ///
    /// # Errors
    ///
    /// [`StoreError::Io`] if no endpoint answers within the request timeout, or nothing
    /// at all is stored under the prefix (no record and no metadata: an executor stores
    /// its machines' graphs there when it starts, so a prefix it ran on is never empty).
    ///
    /// ```no_run
    /// use procflow_store::etcd::{EtcdConfig, EtcdStore};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let config = EtcdConfig::new(["127.0.0.1:2379"], "/myapp/procedures");
    /// let loaded = EtcdStore::read_only(config).await?;
    /// println!("{} records", loaded.records.len());
    /// # Ok::<(), procflow_store::StoreError>(())
    /// # }).unwrap();
    /// ```
    pub async fn read_only(config: EtcdConfig) -> Result<Loaded, StoreError> {
        let shared = Shared::connect(&config).await?;
        let loaded = shared.load_all().await?;
        if loaded.records.is_empty() && loaded.meta.is_empty() {
            return Err(StoreError::io(
                "reading the store",
                shared.location.clone(),
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "nothing is stored under prefix `{}`: it holds no procflow store \
                         (check the prefix the executors' EtcdConfig names)",
                        config.prefix
                    ),
                ),
            ));
        }
        Ok(loaded)
    }

    /// The client this store talks through (cheap to clone; it shares the connection).
    #[must_use]
    pub fn client(&self) -> Client {
        self.shared.client.clone()
    }

    async fn commit_batch(&self, batch: Batch) -> Result<(), StoreError> {
        let Some(queue) = self.sender() else {
            return Err(StoreError::Closed);
        };
        self.limits.check(&batch)?;
        let batch = self.prepare(batch).await?;
        let (reply, answer) = oneshot::channel();
        queue
            .send(Pending { batch, reply })
            .map_err(|_| StoreError::Closed)?;
        answer.await.unwrap_or(Err(StoreError::Closed))
    }

    fn sender(&self) -> Option<mpsc::UnboundedSender<Pending>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Resolves `batch` into self-contained writes: a `Finish` needs the record's parent,
    /// from this batch, from memory, or read from etcd.
    async fn prepare(&self, mut batch: Batch) -> Result<Prepared, StoreError> {
        // Read first what the resolver may ask and this store does not remember: the
        // parents of records it has not seen live.
        let mut read = HashMap::new();
        for op in &batch.ops {
            if let Op::Finish { id, .. } = op {
                let remembered = self.shared.parents().contains_key(id);
                if !remembered && !read.contains_key(id) {
                    if let Some(record) = self.get_record(*id).await? {
                        read.insert(*id, record.parent);
                    }
                }
            }
        }
        let (changes, checks) = {
            let remembered = self.shared.parents();
            resolve(&mut batch.ops, |id| {
                remembered.get(&id).or_else(|| read.get(&id)).copied()
            })?
        };
        let keys = &self.shared.keys;
        let mut prepared = Prepared {
            token: batch.fencing_token,
            must_exist: checks
                .must_exist
                .into_iter()
                .map(|id| (id, keys.record(id)))
                .collect(),
            // Checked in the transaction itself: another process may create the key.
            must_be_absent: checks
                .must_be_absent
                .into_iter()
                .map(|key| {
                    let etcd_key = keys.meta(&key);
                    (key, etcd_key)
                })
                .collect(),
            ..Prepared::default()
        };
        for change in changes {
            let (key, write) = match change {
                Change::Put {
                    id,
                    parent,
                    finished,
                    value,
                } => {
                    prepared.parents.push((id, (!finished).then_some(parent)));
                    let value = record::encode(parent, finished, &value);
                    (keys.record(id), Write::Put(value))
                }
                Change::Delete { id } => {
                    prepared.parents.push((id, None));
                    (keys.record(id), Write::Delete)
                }
                // The batch's own vector, handed back without a copy.
                Change::PutMeta { key, value } => (keys.meta(&key), Write::Put(Vec::from(value))),
                Change::DeleteMeta { key } => (keys.meta(&key), Write::Delete),
            };
            prepared.writes.push((key, write));
        }
        Ok(prepared)
    }

    async fn get_record(&self, id: ProcId) -> Result<Option<Record>, StoreError> {
        let key = self.shared.keys.record(id);
        let mut response = self
            .shared
            .call("reading a record", |mut kv| {
                let key = key.clone();
                async move { kv.get(key, None).await }
            })
            .await?;
        let Some(kv) = response.take_kvs().into_iter().next() else {
            return Ok(None);
        };
        let record = self.shared.decode(kv)?;
        if !record.finished {
            self.shared.parents().insert(id, record.parent);
        }
        Ok(Some(record))
    }

    async fn close_store(&self) -> Result<(), StoreError> {
        // Dropping the sender lets the committer finish what is queued, then end.
        drop(self.queue.lock().unwrap_or_else(|e| e.into_inner()).take());
        if let Some(committer) = self.committer.lock().await.take() {
            let _ = committer.await;
        }
        // Its sequence is of no more use: a late copy of a transaction finds no number.
        let key = self.shared.sequence_key.clone();
        let _ = self
            .shared
            .call("deleting the writer's sequence", |mut kv| {
                let key = key.clone();
                async move { kv.delete(key, None).await }
            })
            .await;
        Ok(())
    }
}

/// How the store (and procflow's `EtcdElection`, when it reconnects) connect:
/// requests and watches require an etcd leader, so a member cut off from the cluster's
/// quorum refuses them rather than serving stale reads or a watch that never fires
/// (callers retry, on another member); every request has `timeout`; connections are
/// pinged every second and dropped when a ping goes unanswered for `timeout`.
#[must_use]
pub fn connect_options(timeout: Duration) -> ConnectOptions {
    ConnectOptions::new()
        .with_require_leader(true)
        .with_connect_timeout(timeout)
        .with_timeout(timeout)
        .with_keep_alive(Duration::from_secs(1), timeout)
}

impl Shared {
    /// Connects a client to the cluster; writes nothing.
    async fn connect(config: &EtcdConfig) -> Result<Self, StoreError> {
        let location = PathBuf::from(format!(
            "etcd {} {}",
            config.endpoints.join(","),
            config.prefix
        ));
        let options = connect_options(config.request_timeout);
        let connect = Client::connect(config.endpoints.clone(), Some(options));
        let client = match tokio::time::timeout(config.request_timeout, connect).await {
            Ok(Ok(client)) => client,
            Ok(Err(error)) => {
                return Err(StoreError::io(
                    "connecting to etcd",
                    location,
                    io::Error::other(error),
                ));
            }
            Err(_) => {
                return Err(StoreError::io(
                    "connecting to etcd",
                    location,
                    io::Error::new(io::ErrorKind::TimedOut, "no endpoint answered"),
                ));
            }
        };
        let keys = Keys::new(&config.prefix);
        let sequence_key = keys.sequence(fastrand::u64(..));
        Ok(Self {
            client,
            sequence_key,
            keys,
            timeout: config.request_timeout,
            page_size: config.page_size,
            location,
            pins: compactor::Pins::default(),
            parents: Mutex::new(HashMap::new()),
        })
    }

    /// Loads at one revision. A load reads at a revision this store's compactor will not
    /// compact; if another process compacted it meanwhile, the load starts again (a few
    /// times: a history compacted faster than a load can read points at a retention
    /// window too short for the store's size).
    async fn load_all(&self) -> Result<Loaded, StoreError> {
        let mut attempts = 0;
        loop {
            let _pin = self.pins.pin();
            match self.load_once().await {
                Err(error) if is_compacted(&error) && attempts < 4 => attempts += 1,
                result => return result,
            }
        }
    }

    async fn load_once(&self) -> Result<Loaded, StoreError> {
        let shared = self;
        let mut revision = 0;
        let mut loaded = Loaded::default();
        shared
            .scan(shared.keys.records(), &mut revision, |kv| {
                loaded.records.push(shared.decode(kv)?);
                Ok(())
            })
            .await?;
        shared
            .scan(shared.keys.metas(), &mut revision, |kv| {
                let key = shared
                    .keys
                    .meta_key(kv.key())
                    .ok_or_else(|| shared.corrupt(kv.key(), "not a metadata key"))?;
                loaded.meta.insert(key, kv.into_key_value().1);
                Ok(())
            })
            .await?;
        let mut parents = shared.parents();
        for record in loaded.records.iter().filter(|r| !r.finished) {
            parents.insert(record.id, record.parent);
        }
        Ok(loaded)
    }

    /// Runs one request on the key-value client with the store's deadline. A request
    /// that fails on the connection (a member died, the channel routed to it) is sent
    /// again until the deadline (once more past it: see below). Every request the store
    /// makes may therefore reach etcd twice: reads are harmless, and a transaction applies
    /// at most once, at its writer's sequence number ([`sequence`]).
    pub(crate) async fn call<T, F, Fut>(
        &self,
        context: &'static str,
        request: F,
    ) -> Result<T, StoreError>
    where
        F: Fn(KvClient) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut deadline = tokio::time::Instant::now() + self.timeout;
        let mut extended = false;
        loop {
            match tokio::time::timeout_at(deadline, request(self.client.kv_client())).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(error)) if is_connection_error(&error) && !extended => {
                    // A pause of the whole process (SIGSTOP, a frozen VM) can use up the
                    // deadline while a request waited for its answer, which then fails
                    // with the channel's timeout as the process resumes: it gets one more
                    // deadline, so that the store reports what etcd says now (a fenced
                    // writer learns it is fenced) rather than a timeout it did not live.
                    if tokio::time::Instant::now() >= deadline {
                        deadline = tokio::time::Instant::now() + self.timeout;
                        extended = true;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(Err(error)) => return Err(self.io(context, io::Error::other(error))),
                // The same pause may expire this timer first.
                Err(_) if !extended => {
                    deadline = tokio::time::Instant::now() + self.timeout;
                    extended = true;
                }
                Err(_) => {
                    return Err(self.io(
                        context,
                        io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!(
                                "no answer within {:?}; the outcome is unknown",
                                self.timeout
                            ),
                        ),
                    ));
                }
            }
        }
    }

    /// Creates this writer's sequence key ([`sequence`]) at a random number and returns
    /// it.
    async fn create_sequence(&self) -> Result<u64, StoreError> {
        let context = "creating the writer's sequence";
        let (key, start) = (self.sequence_key.clone(), sequence::start());
        let response = self
            .call(context, |mut kv| {
                let txn = sequence::create(&key, start);
                async move { kv.txn(txn).await }
            })
            .await?;
        let found = sequence::read(response.op_responses().into_iter().next());
        // Failed: a resend found the key its own first attempt created, or (with a
        // 64-bit random id, not in practice) another writer's key.
        if response.succeeded() || found == Some(start) {
            Ok(start)
        } else {
            Err(self.io(
                context,
                io::Error::other("another store instance has this writer id"),
            ))
        }
    }

    pub(crate) fn io(&self, context: &'static str, source: io::Error) -> StoreError {
        StoreError::io(context, self.location.clone(), source)
    }

    fn corrupt(&self, key: &[u8], reason: impl Into<String>) -> StoreError {
        StoreError::Corrupt {
            file: self.location.join(String::from_utf8_lossy(key).as_ref()),
            offset: 0,
            reason: reason.into(),
        }
    }

    fn decode(&self, kv: KeyValue) -> Result<Record, StoreError> {
        let (key, value) = kv.into_key_value();
        let id = self
            .keys
            .record_id(&key)
            .ok_or_else(|| self.corrupt(&key, "not a record key"))?;
        record::decode(id, value).map_err(|reason| self.corrupt(&key, reason))
    }

    fn parents(&self) -> std::sync::MutexGuard<'_, HashMap<ProcId, Option<ProcId>>> {
        self.parents.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn remember_parents(&self, changes: &[(ProcId, Option<Option<ProcId>>)]) {
        let mut parents = self.parents();
        for (id, change) in changes {
            match change {
                Some(parent) => parents.insert(*id, *parent),
                None => parents.remove(id),
            };
        }
    }

    /// Reads every key of `[start, end)` in pages of `page_size`, all at `revision` (the
    /// first page's, if 0), passing each to `each` in key order.
    async fn scan(
        &self,
        (start, end): (Vec<u8>, Vec<u8>),
        revision: &mut i64,
        mut each: impl FnMut(KeyValue) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut from = start;
        loop {
            let mut options = GetOptions::new()
                .with_range(end.clone())
                .with_limit(i64::try_from(self.page_size).unwrap_or(i64::MAX));
            if *revision > 0 {
                options = options.with_revision(*revision);
            }
            let key = from.clone();
            let mut page = self
                .call("loading the store", |mut kv| {
                    let (key, options) = (key.clone(), options.clone());
                    async move { kv.get(key, Some(options)).await }
                })
                .await?;
            if *revision == 0 {
                *revision = page.header().map_or(0, |header| header.revision());
            }
            let more = page.more();
            let kvs = page.take_kvs();
            let Some(last) = kvs.last() else {
                return Ok(());
            };
            // The next page starts just after the last key of this one.
            from = [last.key(), &[0]].concat();
            for kv in kvs {
                each(kv)?;
            }
            if !more {
                return Ok(());
            }
        }
    }
}

/// etcd's answer to a read at, or a compaction to, a revision already compacted.
fn is_compacted(error: &StoreError) -> bool {
    let StoreError::Io { source, .. } = error else {
        return false;
    };
    let status = source
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<etcd_client::Error>());
    matches!(status, Some(etcd_client::Error::GRpcStatus(status))
        // gRPC's code 11: out of range.
        if status.code() as i32 == 11 && status.message().contains("compacted"))
}

/// An error of the connection, not an answer of etcd: worth sending again.
fn is_connection_error(error: &etcd_client::Error) -> bool {
    use etcd_client::Error;
    match error {
        Error::TransportError(_) | Error::IoError(_) => true,
        // gRPC's codes: 1 cancelled, 2 unknown (tonic's "transport error"), 14 unavailable.
        Error::GRpcStatus(status) => matches!(status.code() as i32, 1 | 2 | 14),
        _ => false,
    }
}

impl Store for EtcdStore {
    fn commit(&self, batch: Batch) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.commit_batch(batch))
    }

    fn load(&self) -> BoxFuture<'_, Result<Loaded, StoreError>> {
        Box::pin(self.shared.load_all())
    }

    fn get(&self, id: ProcId) -> BoxFuture<'_, Result<Option<Record>, StoreError>> {
        Box::pin(self.get_record(id))
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<RecordInfo>, StoreError>> {
        Box::pin(async move {
            let loaded = self.shared.load_all().await?;
            Ok(loaded
                .records
                .iter()
                .map(|r| RecordInfo {
                    id: r.id,
                    parent: r.parent,
                    finished: r.finished,
                    value_len: r.value.len(),
                })
                .collect())
        })
    }

    fn meta(&self, prefix: &str) -> BoxFuture<'_, Result<BTreeMap<String, Vec<u8>>, StoreError>> {
        let range = self.shared.keys.metas_with_prefix(prefix);
        Box::pin(async move {
            let shared = &self.shared;
            let mut meta = BTreeMap::new();
            shared
                .scan(range, &mut 0, |kv| {
                    let key = shared
                        .keys
                        .meta_key(kv.key())
                        .ok_or_else(|| shared.corrupt(kv.key(), "not a metadata key"))?;
                    meta.insert(key, kv.into_key_value().1);
                    Ok(())
                })
                .await?;
            Ok(meta)
        })
    }

    fn limits(&self) -> Limits {
        self.limits
    }

    fn close(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(self.close_store())
    }
}
