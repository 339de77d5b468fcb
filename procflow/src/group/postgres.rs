//! [`PgElection`]: the group's election in PostgreSQL (cargo feature `postgres`).
//!
//! The election is the store's leader row (`{schema}.leader`): a term, a holder and an
//! expiry on the database's clock. A candidate campaigns with one `UPDATE` that takes
//! the row only if its lease has expired, and moves the term up by one: the new term is
//! the fencing token, the very number `PgStore` compares in every fenced transaction, so
//! no other election state exists. A leader renews the lease every third of the TTL and
//! ends its term (makes [`lost`](Election::lost) resolve) when two thirds of the TTL
//! have passed since the send of its last acknowledged renewal (or of its campaign,
//! before the first): the lease, set or renewed no earlier than that send, cannot have
//! expired yet. Standbys read how long the lease has left and try again when it ends, or
//! at once when a leader resigns (it `NOTIFY`s them; they `LISTEN`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use procflow_store::BoxFuture;
use procflow_store::postgres::PgConfig;
use procflow_store::postgres::tokio_postgres::{self, Client};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use super::election::{Election, ElectionError, Term, term_over};

/// One candidate of the election on a PostgreSQL store's leader row (cargo feature
/// `postgres`).
///
/// The row (`{schema}.leader`) holds a term, a holder and a lease's expiry on the
/// database's clock. A candidate campaigns with one `UPDATE` that takes the row only once
/// the lease has expired and moves the term up by one: the new term is the fencing token
/// `PgStore` compares in every fenced transaction. A leader renews its lease every third
/// of the TTL, on a connection of its own, and ends its term two thirds of the TTL after
/// the send of its last acknowledged renewal (or of its campaign, before the first): the
/// lease cannot have expired yet. A renewal that finds another term deposes it at once.
/// Standbys read how long the lease has left and try again as it ends; a resigned lease
/// ends at once, and a resignation wakes them (`NOTIFY` / `LISTEN` on channel
/// `procflow_leader`, the schema as payload).
///
/// The row is created with the store's schema: connect a
/// [`PgStore`](procflow_store::postgres::PgStore) to the schema before campaigning.
///
/// # Examples
///
/// ```no_run
/// use procflow::executor::Executor;
/// use procflow::group::{ExecutorGroup, PgElection};
/// use procflow_store::postgres::{PgConfig, PgStore};
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
/// let config = PgConfig::new("host=10.0.0.9 user=app dbname=app", "procedures");
/// let store = Arc::new(PgStore::connect(config.clone()).await?);
/// let election = PgElection::new(&config, "10.0.0.1:7000", Duration::from_secs(3));
/// let group = ExecutorGroup::join(Arc::new(election), "10.0.0.1:7000", move || {
///     Executor::builder(store.clone(), ()).register::<JobState>()
/// });
/// // Every process runs the same; one leads, the others answer `NotLeader`.
/// let executor = group.leading().await;
/// executor.submit(Job).await?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct PgElection {
    config: PgConfig,
    address: String,
    ttl: Duration,
    request_timeout: Duration,
    sql: Statements,
    /// The campaign's connection; opened again when it breaks.
    client: tokio::sync::Mutex<Option<Client>>,
    /// A connection listening for resignations, which wake `resigned`; opened again when
    /// it breaks. Without it standbys still look every quarter TTL.
    listener: tokio::sync::Mutex<Option<Client>>,
    resigned: Arc<Notify>,
    terms: Mutex<HashMap<u64, Held>>,
}

/// A term this candidate holds: the task renewing its lease.
struct Held {
    /// Why the term ended, once it has.
    lost: watch::Receiver<Option<String>>,
    keeper: JoinHandle<()>,
}

/// The election's statements, with the schema's name in them.
#[derive(Clone)]
struct Statements {
    /// `$1` holder, `$2` TTL in ms: the new term, if the lease had expired.
    take: String,
    /// `$1` term, `$2` TTL in ms: the term, if it is still the row's.
    renew: String,
    /// `$1` term, `$2` the schema: ends the term's lease now and notifies the standbys.
    resign: String,
    /// The lease's time left in ms (0 once expired).
    remaining: String,
    /// The holder, while its lease runs.
    holder: String,
}

/// The channel a resignation is announced on (`NOTIFY`), with the schema as payload.
const CHANNEL: &str = "procflow_leader";

impl Statements {
    fn new(table: &str) -> Self {
        let ttl = "clock_timestamp() + $2::bigint * interval '1 millisecond'";
        Self {
            take: format!(
                "UPDATE {table} SET term = term + 1, holder = $1, expires_at = {ttl} \
                 WHERE id = 1 AND expires_at <= clock_timestamp() RETURNING term"
            ),
            renew: format!(
                "UPDATE {table} SET expires_at = {ttl} WHERE id = 1 AND term = $1 RETURNING term"
            ),
            resign: format!(
                "WITH ended AS (UPDATE {table} SET holder = NULL, expires_at = '-infinity' \
                 WHERE id = 1 AND term = $1 RETURNING term) \
                 SELECT pg_notify('{CHANNEL}', $2) FROM ended"
            ),
            remaining: format!(
                "SELECT greatest(0, extract(epoch FROM expires_at - clock_timestamp()) * 1000)\
                 ::bigint FROM {table} WHERE id = 1"
            ),
            holder: format!(
                "SELECT holder FROM {table} WHERE id = 1 AND expires_at > clock_timestamp()"
            ),
        }
    }
}

impl PgElection {
    /// A candidate advertising `address` on the leader row of the store `config`
    /// describes. Its terms hold a lease of `ttl` (at least 300 ms); a dead leader is
    /// replaced about `ttl` after its last renewal. Connects when it first campaigns.
    #[must_use]
    pub fn new(config: &PgConfig, address: impl Into<String>, ttl: Duration) -> Self {
        let ttl = ttl.max(Duration::from_millis(300));
        Self {
            sql: Statements::new(&config.leader_table()),
            config: config.clone(),
            address: address.into(),
            request_timeout: (ttl / 3).min(Duration::from_secs(2)),
            ttl,
            client: tokio::sync::Mutex::new(None),
            listener: tokio::sync::Mutex::new(None),
            resigned: Arc::new(Notify::new()),
            terms: Mutex::new(HashMap::new()),
        }
    }

    /// The lease TTL terms hold.
    #[must_use]
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn terms(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Held>> {
        self.terms.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ttl_ms(&self) -> i64 {
        i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX)
    }

    /// Runs `request` on the campaign's connection (opening it if needed) within the
    /// request timeout; a connection that failed or timed out is dropped.
    async fn call<T>(
        &self,
        what: &str,
        request: impl AsyncFnOnce(&Client) -> Result<T, tokio_postgres::Error>,
    ) -> Result<T, ElectionError> {
        let mut slot = self.client.lock().await;
        if slot.as_ref().is_none_or(Client::is_closed) {
            let client = self
                .config
                .connect()
                .await
                .map_err(|e| ElectionError::with_source(format!("postgres: {what}"), e))?;
            *slot = Some(client);
        }
        let client = slot.as_ref().expect("connected above");
        let result = tokio::time::timeout(self.request_timeout, request(client)).await;
        match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => {
                if error.as_db_error().is_none() {
                    *slot = None;
                }
                Err(describe(what, &self.config, error))
            }
            Err(_) => {
                *slot = None;
                Err(ElectionError::new(format!(
                    "postgres: {what}: no answer within {:?}",
                    self.request_timeout
                )))
            }
        }
    }

    /// One attempt: `Ok(Some(term))` if this candidate now leads, `Ok(None)` after
    /// waiting for the current lease to end (try again).
    async fn try_once(&self) -> Result<Option<Term>, ElectionError> {
        // Listening before the attempt: a resignation after it wakes the wait below.
        self.listen().await;
        // The lease's clock may start as soon as the request is sent: so does the term's.
        let sent = Instant::now();
        let (take, ttl, address) = (&self.sql.take, self.ttl_ms(), &self.address);
        let row = self
            .call("campaigning", async |client| {
                client.query_opt(take, &[address, &ttl]).await
            })
            .await?;
        if let Some(row) = row {
            let term: i64 = row.get(0);
            let token =
                u64::try_from(term).map_err(|_| ElectionError::new("postgres: negative term"))?;
            let safe_until = sent + self.ttl * 2 / 3;
            if Instant::now() >= safe_until {
                // A campaign this slow won a term whose lease may expire before a renewal
                // can reach it: give it up rather than act on it.
                tracing::warn!(token, "won a term too late to hold it safely; resigning");
                let _ = self.give_up(token).await;
                return Ok(None);
            }
            self.hold(token, safe_until);
            return Ok(Some(Term { token }));
        }
        let remaining = &self.sql.remaining;
        let left: i64 = self
            .call("reading the leader's lease", async |client| {
                client.query_one(remaining, &[]).await.map(|row| row.get(0))
            })
            .await?;
        // Wake as the lease ends, at a resignation, or a quarter TTL from now (in case
        // the notification was lost with a connection).
        let left = Duration::from_millis(u64::try_from(left).unwrap_or(0));
        let pause = (left + Duration::from_millis(5)).min(self.ttl / 4);
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = self.resigned.notified() => {}
        }
        Ok(None)
    }

    /// Listens for resignations, if not already: best effort, the campaign looks every
    /// quarter TTL regardless.
    async fn listen(&self) {
        let mut slot = self.listener.lock().await;
        if slot.as_ref().is_some_and(|client| !client.is_closed()) {
            return;
        }
        let (resigned, schema) = (Arc::clone(&self.resigned), self.config.schema().to_owned());
        let listening = async {
            let client = self
                .config
                .connect_with(move |notification| {
                    if notification.payload() == schema {
                        // A permit is kept if no campaign waits yet.
                        resigned.notify_one();
                    }
                })
                .await
                .ok()?;
            client
                .batch_execute(&format!("LISTEN {CHANNEL}"))
                .await
                .ok()?;
            Some(client)
        };
        *slot = tokio::time::timeout(self.request_timeout, listening)
            .await
            .ok()
            .flatten();
    }

    /// Ends term `token` in the row, if it is still the row's.
    async fn give_up(&self, token: u64) -> Result<(), ElectionError> {
        let (resign, term) = (&self.sql.resign, i64::try_from(token).unwrap_or(i64::MAX));
        let schema = self.config.schema();
        self.call("resigning", async |client| {
            client.execute(resign, &[&term, &schema]).await
        })
        .await
        .map(drop)
    }

    /// Starts renewing the term's lease; until a renewal is acknowledged the term is safe
    /// until `safe_until`, two thirds of the TTL after the campaign was sent.
    fn hold(&self, token: u64, safe_until: Instant) {
        let (lost_tx, lost) = watch::channel(None);
        let renewal = Renewal {
            config: self.config.clone(),
            sql: self.sql.renew.clone(),
            token,
            ttl: self.ttl,
            safe_until,
        };
        let keeper = tokio::spawn(async move {
            let reason = renewal.run().await;
            tracing::warn!(token, %reason, "leadership term over");
            lost_tx.send_replace(Some(reason));
        });
        self.terms().insert(token, Held { lost, keeper });
    }
}

/// A PostgreSQL error as an election error; a missing leader table says what to do.
fn describe(what: &str, config: &PgConfig, error: tokio_postgres::Error) -> ElectionError {
    let undefined_table = error
        .as_db_error()
        .is_some_and(|db| db.code() == &tokio_postgres::error::SqlState::UNDEFINED_TABLE);
    if undefined_table {
        return ElectionError::with_source(
            format!(
                "postgres: {what}: there is no table {}; connect a PgStore to schema `{}` \
                 first (it creates the schema)",
                config.leader_table(),
                config.schema()
            ),
            error,
        );
    }
    ElectionError::with_source(format!("postgres: {what}"), error)
}

/// The renewals of one term, on a connection of their own (a renewal must not queue
/// behind a campaign's request).
struct Renewal {
    config: PgConfig,
    sql: String,
    token: u64,
    ttl: Duration,
    /// Until when the lease cannot have expired, as far as this process knows.
    safe_until: Instant,
}

impl Renewal {
    /// Renews every third of the TTL; returns why the term ended: deposed, or two thirds
    /// of the TTL passed since the send of the last acknowledged renewal.
    async fn run(mut self) -> String {
        let too_late = "no renewal acknowledged in time: stepping down before the lease can expire";
        let term = i64::try_from(self.token).unwrap_or(i64::MAX);
        let ttl_ms = i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX);
        let mut client: Option<Client> = None;
        let mut next = Instant::now() + self.ttl / 3;
        loop {
            tokio::time::sleep_until(next.into()).await;
            let sent = Instant::now();
            if sent >= self.safe_until {
                return too_late.into();
            }
            let budget = self.safe_until - sent;
            let renew = async {
                if client.as_ref().is_none_or(Client::is_closed) {
                    client = Some(self.config.connect().await.map_err(|e| e.to_string())?);
                }
                let client = client.as_ref().expect("connected above");
                let row = client.query_opt(&self.sql, &[&term, &ttl_ms]).await;
                row.map_err(|e| e.to_string())
            };
            match tokio::time::timeout(budget, renew).await {
                Ok(Ok(Some(_))) => {
                    self.safe_until = sent + self.ttl * 2 / 3;
                    next = sent + self.ttl / 3;
                }
                Ok(Ok(None)) => return "deposed: the leader row holds a newer term".into(),
                // Try again soon, on a new connection, while there is time.
                Ok(Err(_)) | Err(_) => {
                    client = None;
                    next = Instant::now() + Duration::from_millis(50);
                }
            }
        }
    }
}

impl Election for PgElection {
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
        Box::pin(term_over("postgres", term.token, lost))
    }

    fn resign(&self, term: Term) -> BoxFuture<'_, Result<(), ElectionError>> {
        let held = self.terms().remove(&term.token);
        Box::pin(async move {
            let Some(held) = held else { return Ok(()) };
            held.keeper.abort();
            // Expiring the lease now lets a standby win at its next look.
            self.give_up(term.token).await
        })
    }

    fn leader(&self) -> BoxFuture<'_, Result<Option<String>, ElectionError>> {
        Box::pin(async move {
            let holder = &self.sql.holder;
            self.call("reading the leader row", async |client| {
                let row = client.query_opt(holder, &[]).await?;
                Ok(row.and_then(|row| row.get::<_, Option<String>>(0)))
            })
            .await
        })
    }
}

impl Drop for PgElection {
    fn drop(&mut self) {
        for held in self.terms().values() {
            held.keeper.abort();
        }
    }
}
