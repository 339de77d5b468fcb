//! [`EtcdElection`]: the group's election in etcd (cargo feature `etcd`).
//!
//! A candidate campaigns by creating the store's leader key (`{prefix}/leader`) under a
//! lease of its own, in a transaction that succeeds only if the key does not exist. The
//! key's create revision is the term's fencing token, the very number `EtcdStore`
//! compares in every fenced transaction: no other election state exists.
//!
//! A leader keeps its lease alive every third of the TTL and ends its term (makes
//! [`lost`](Election::lost) resolve) when two thirds of the TTL have passed since the
//! send of its last acknowledged keep-alive (before the first one, since the lease grant
//! was sent, so a slow campaign counts against the term): the lease, granted or renewed
//! no earlier than that send, cannot have expired yet. A campaign won after that point is
//! resigned at once. It also ends the term when the key is deleted or replaced. Standbys
//! watch the key and campaign again when it goes.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use procflow_store::BoxFuture;
use procflow_store::etcd::etcd_client::{
    Client, Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use procflow_store::etcd::{EtcdConfig, connect_options};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::election::{Election, ElectionError, Term, term_over};

/// One candidate of the election on an etcd store's leader key (cargo feature `etcd`).
///
/// A candidate campaigns by creating the leader key (`{prefix}/leader`) under a lease of
/// its own, in a transaction that succeeds only if the key does not exist. The key's
/// create revision is the term's fencing token, the number `EtcdStore` compares in every
/// fenced transaction. A leader keeps its lease alive every third of the TTL and ends its
/// term when two thirds of the TTL have passed since the send of its last acknowledged
/// keep-alive, or of the lease grant before the first (the lease cannot have expired
/// yet), or when the key is deleted or replaced.
/// Standbys watch the key and campaign again when it goes.
///
/// # Examples
///
/// ```no_run
/// use procflow::executor::Executor;
/// use procflow::group::{EtcdElection, ExecutorGroup};
/// use procflow_store::etcd::{EtcdConfig, EtcdStore};
/// use std::sync::Arc;
/// use std::time::Duration;
/// # use procflow::prelude::*;
/// # #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
/// # #[state_machine(procedure = Job)]
/// # enum JobState { #[initial] #[transition(to = [Done])] Start, #[terminal] Done }
/// # #[derive(serde::Serialize, serde::Deserialize)]
/// # struct Job;
/// # impl JobStateHandlers for Job {
/// #     async fn start(&mut self, _: &Context<()>) -> Step<job_state::Start> {
/// #         Ok(job_state::Start::Done.into())
/// #     }
/// # }
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let config = EtcdConfig::new(["127.0.0.1:2379"], "/myapp/procedures");
/// let store = Arc::new(EtcdStore::connect(config.clone()).await?);
/// let election = EtcdElection::new(store.client(), &config, "10.0.0.1:7000", Duration::from_secs(3));
/// let group = ExecutorGroup::join(Arc::new(election), "10.0.0.1:7000", move || {
///     Executor::builder(store.clone(), ()).register::<JobState>()
/// });
/// // Every process runs the same; one leads, the others answer `NotLeader`.
/// let executor = group.leading().await;
/// executor.submit(Job).await?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct EtcdElection {
    /// Replaced by a fresh connection when a watch stalls ([`Self::reconnect`]).
    client: Mutex<Client>,
    endpoints: Vec<String>,
    key: String,
    address: String,
    ttl: Duration,
    request_timeout: Duration,
    terms: Mutex<HashMap<u64, Held>>,
}

/// A term this candidate holds: its lease, and the task keeping it.
struct Held {
    lease: i64,
    /// Why the term ended, once it has.
    lost: watch::Receiver<Option<String>>,
    keeper: JoinHandle<()>,
}

impl EtcdElection {
    /// A candidate advertising `address` on the leader key of the store `config`
    /// describes, through `client` (e.g. [`EtcdStore::client`](procflow_store::etcd::EtcdStore::client)).
    /// Its terms hold a lease of `ttl` (rounded up to whole seconds, at least 2: etcd's
    /// minimum); a dead leader is replaced about `ttl` after its last keep-alive.
    #[must_use]
    pub fn new(
        client: Client,
        config: &EtcdConfig,
        address: impl Into<String>,
        ttl: Duration,
    ) -> Self {
        Self {
            client: Mutex::new(client),
            endpoints: config.endpoints().to_vec(),
            key: config.leader_key(),
            address: address.into(),
            ttl: Duration::from_secs(ttl.as_secs_f64().ceil().max(2.0) as u64),
            request_timeout: Duration::from_secs(2),
            terms: Mutex::new(HashMap::new()),
        }
    }

    /// The lease TTL terms hold.
    #[must_use]
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The client requests go through now (cheap to clone: it shares the connection).
    fn client(&self) -> Client {
        self.client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Opens new connections to the endpoints, for the requests that follow: a watch
    /// that stalled may have been served by a member that is cut off, or over a link
    /// that went silent without breaking, and the old connections may still be routed to
    /// it. The new client connects as the store does ([`connect_options`]: it requires a
    /// leader and pings its connections). If no endpoint answers, the old client stays.
    async fn reconnect(&self) {
        let options = connect_options(self.request_timeout);
        let connect = Client::connect(self.endpoints.clone(), Some(options));
        if let Ok(Ok(client)) = tokio::time::timeout(self.request_timeout, connect).await {
            *self.client.lock().unwrap_or_else(|e| e.into_inner()) = client;
        }
    }

    fn terms(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Held>> {
        self.terms.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn call<T>(
        &self,
        what: &str,
        request: impl Future<Output = Result<T, procflow_store::etcd::etcd_client::Error>>,
    ) -> Result<T, ElectionError> {
        match tokio::time::timeout(self.request_timeout, request).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(ElectionError::with_source(format!("etcd: {what}"), error)),
            Err(_) => Err(ElectionError::new(format!(
                "etcd: {what}: no answer within {:?}",
                self.request_timeout
            ))),
        }
    }

    /// One attempt: `Ok(Some(term))` if this candidate now leads, `Ok(None)` after the
    /// current leader's key went away (try again).
    async fn try_once(&self) -> Result<Option<Term>, ElectionError> {
        let mut client = self.client();
        let ttl = i64::try_from(self.ttl.as_secs()).unwrap_or(i64::MAX);
        // The lease's clock may start as soon as the grant is sent: so does the term's.
        let granted_from = Instant::now();
        let grant = self
            .call("granting a lease", client.lease_grant(ttl, None))
            .await?;
        let lease = grant.id();
        let granted = Duration::from_secs(u64::try_from(grant.ttl()).unwrap_or(0)).min(self.ttl);
        let safe_until = granted_from + granted * 2 / 3;
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then([TxnOp::put(
                self.key.clone(),
                self.address.clone(),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(self.key.clone(), None)]);
        let response = match self.call("campaigning", client.txn(txn)).await {
            Ok(response) => response,
            Err(error) => {
                let _ = client.lease_revoke(lease).await;
                return Err(error);
            }
        };
        let revision = response.header().map_or(0, |h| h.revision());
        if response.succeeded() {
            let token = u64::try_from(revision)
                .map_err(|_| ElectionError::new("etcd: negative revision"))?;
            if Instant::now() >= safe_until {
                // A campaign this slow won a term whose lease may expire before a
                // keep-alive can renew it: give it up rather than act on it.
                tracing::warn!(token, "won a term too late to hold it safely; resigning");
                let _ = self
                    .call("revoking a lease", client.lease_revoke(lease))
                    .await;
                return Ok(None);
            }
            self.hold(token, lease, granted, safe_until);
            return Ok(Some(Term { token }));
        }
        // Someone leads: give the lease back, and wait for their key to go.
        let _ = self
            .call("revoking a lease", client.lease_revoke(lease))
            .await;
        let leader_exists = response
            .op_responses()
            .into_iter()
            .any(|r| matches!(r, TxnOpResponse::Get(get) if !get.kvs().is_empty()));
        if leader_exists {
            self.deleted_after(revision).await?;
        }
        Ok(None)
    }

    /// Waits until the leader key is deleted after `revision`.
    ///
    /// A watch can stall without breaking: the member serving it is cut off from the
    /// rest of the cluster (require-leader makes etcd cancel such a watch, after a few
    /// election timeouts), or the link to it went silent. So when the watch has said
    /// nothing for a quarter of the TTL it asks for a progress report, and if nothing
    /// comes for another quarter it gives up: the election reconnects and the campaign
    /// is tried again. A dead leader's key is thus noticed about half a TTL after it
    /// goes, even through a stalled watch.
    async fn deleted_after(&self, revision: i64) -> Result<(), ElectionError> {
        let mut client = self.client();
        let options = WatchOptions::new().with_start_revision(revision + 1);
        let mut stream = self
            .call(
                "watching the leader key",
                client.watch(self.key.clone(), Some(options)),
            )
            .await?;
        let quiet = self.ttl / 4;
        let mut asked = false;
        loop {
            let message = match tokio::time::timeout(quiet, stream.message()).await {
                Ok(message) => message,
                Err(_) if !asked => {
                    asked = true;
                    // A failed send shows as a broken stream on the next read.
                    let _ = tokio::time::timeout(quiet, stream.request_progress()).await;
                    continue;
                }
                Err(_) => {
                    self.reconnect().await;
                    return Err(ElectionError::new(format!(
                        "etcd: watching the leader key: no progress report within {:?}; \
                         reconnected",
                        quiet * 2
                    )));
                }
            };
            asked = false;
            match message {
                Ok(Some(response)) => {
                    if response.canceled()
                        || response
                            .events()
                            .iter()
                            .any(|e| e.event_type() == EventType::Delete)
                    {
                        return Ok(());
                    }
                }
                Ok(None) => return Ok(()),
                Err(error) => {
                    return Err(ElectionError::with_source(
                        "etcd: watching the leader key",
                        error,
                    ));
                }
            }
        }
    }

    /// Starts keeping the term's lease (of `ttl`) alive; until a keep-alive is
    /// acknowledged the term is safe until `safe_until`, two thirds of the TTL after the
    /// grant was sent.
    fn hold(&self, token: u64, lease: i64, ttl: Duration, safe_until: Instant) {
        let (lost_tx, lost) = watch::channel(None);
        let keeper = tokio::spawn(keep(
            self.client(),
            self.key.clone(),
            Lease {
                id: lease,
                ttl,
                safe_until,
            },
            token,
            lost_tx,
        ));
        self.terms().insert(
            token,
            Held {
                lease,
                lost,
                keeper,
            },
        );
    }
}

/// A term's lease, as its keeper sees it.
struct Lease {
    id: i64,
    ttl: Duration,
    /// Until when the lease cannot have expired, as far as this process knows.
    safe_until: Instant,
}

/// Keeps `lease` alive until the term is lost; then says so on `lost`.
async fn keep(
    client: Client,
    key: String,
    lease: Lease,
    token: u64,
    lost: watch::Sender<Option<String>>,
) {
    let id = lease.id;
    let reason = tokio::select! {
        reason = renew(client.clone(), lease) => reason,
        reason = key_gone(client, key, token) => reason,
    };
    tracing::warn!(token, lease = id, %reason, "leadership term over");
    lost.send_replace(Some(reason));
}

/// Renews every third of the TTL; returns when two thirds of it passed since the send of
/// the last acknowledged renewal (or of the grant, before the first). A broken
/// keep-alive stream (the etcd member it ran on died) is opened again, on whichever
/// member answers, while there is time.
async fn renew(mut client: Client, lease: Lease) -> String {
    let Lease {
        id: lease,
        ttl,
        mut safe_until,
    } = lease;
    let too_late = "no keep-alive acknowledged in time: stepping down before the lease can expire";
    loop {
        let budget = safe_until.saturating_duration_since(Instant::now());
        let (mut keeper, mut stream) =
            match tokio::time::timeout(budget, client.lease_keep_alive(lease)).await {
                Ok(Ok(pair)) => pair,
                Ok(Err(_)) if Instant::now() < safe_until => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                _ => return too_late.into(),
            };
        loop {
            let sent = Instant::now();
            let answer = async {
                keeper.keep_alive().await?;
                stream.message().await
            };
            let budget = safe_until.saturating_duration_since(sent);
            match tokio::time::timeout(budget, answer).await {
                Ok(Ok(Some(response))) if response.ttl() > 0 => safe_until = sent + ttl * 2 / 3,
                Ok(Ok(Some(_))) => return "the lease expired".into(),
                // The stream broke: open another.
                Ok(Ok(None) | Err(_)) => break,
                Err(_) => return too_late.into(),
            }
            tokio::time::sleep_until((sent + ttl / 3).into()).await;
            if Instant::now() >= safe_until {
                return too_late.into();
            }
        }
    }
}

/// Returns when the leader key of term `token` is deleted or replaced.
async fn key_gone(mut client: Client, key: String, token: u64) -> String {
    let start = i64::try_from(token).unwrap_or(i64::MAX);
    let mut stream = match client
        .watch(key, Some(WatchOptions::new().with_start_revision(start)))
        .await
    {
        Ok(stream) => stream,
        // The renewals still guard the term.
        Err(_) => return std::future::pending().await,
    };
    loop {
        match stream.message().await {
            Ok(Some(response)) => {
                for event in response.events() {
                    let ours = event.kv().is_some_and(|kv| kv.create_revision() == start);
                    if event.event_type() == EventType::Delete || !ours {
                        return "the leader key was deleted or replaced".into();
                    }
                }
            }
            _ => return std::future::pending().await,
        }
    }
}

impl Election for EtcdElection {
    fn campaign(&self) -> BoxFuture<'_, Result<Term, ElectionError>> {
        Box::pin(async move {
            loop {
                if let Some(term) = self.try_once().await? {
                    return Ok(term);
                }
            }
        })
    }

    fn lost(&self, term: Term) -> BoxFuture<'_, ElectionError> {
        let lost = self.terms().get(&term.token).map(|held| held.lost.clone());
        Box::pin(term_over("etcd", term.token, lost))
    }

    fn resign(&self, term: Term) -> BoxFuture<'_, Result<(), ElectionError>> {
        let held = self.terms().remove(&term.token);
        Box::pin(async move {
            let Some(held) = held else { return Ok(()) };
            held.keeper.abort();
            let mut client = self.client();
            // Revoking the lease deletes the key: a standby wins at once.
            self.call(
                "revoking the leader's lease",
                client.lease_revoke(held.lease),
            )
            .await
            .map(drop)
        })
    }

    fn leader(&self) -> BoxFuture<'_, Result<Option<String>, ElectionError>> {
        Box::pin(async move {
            let mut client = self.client();
            let response = self
                .call("reading the leader key", client.get(self.key.clone(), None))
                .await?;
            Ok(response
                .kvs()
                .first()
                .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
        })
    }
}

impl Drop for EtcdElection {
    fn drop(&mut self) {
        for held in self.terms().values() {
            held.keeper.abort();
        }
    }
}
