//! One member of an executor group on etcd or PostgreSQL: the process
//! `tests/etcd_failover.rs`, `tests/pg_failover.rs` and `examples/cluster.rs` start
//! three of, and kill. (The example includes this file as a module and runs its `main` in
//! its own child processes.)
//!
//! ```text
//! group_worker (--endpoints HOST:PORT,... --prefix P | --postgres CONNECTION --schema S)
//!              --name NAME --ledger DIR
//!              [--procedures 100] [--steps 20] [--step-ms 20] [--ttl 2] [--fencing-only]
//! ```
//!
//! Joins the group on the etcd store under `--prefix` (feature `etcd`), or on the
//! PostgreSQL store in schema `--schema` (feature `postgres`). When it leads, it prints
//! `leading NAME token T`, submits the `--procedures` chains (with nonces, so a new
//! leader submits the same ones) and prints `all done N` once every one succeeded. Each
//! step appends `procedure step token` to the ledger in `DIR`, an outside system that
//! checks the token: it refuses a write whose token is lower than one it has seen (the
//! pattern `Context::fencing_token` is for), so a replaced leader's late effects do not
//! land. Steps are idempotent: a step whose line is already there is not written again.
//! If its executor stops, it prints `halted: REASON`; whenever the member's last error
//! changes (it cannot campaign, say), `trouble: ERROR`. `--fencing-only` keeps the leader
//! from stepping down when its lease is lost, to show that the store's fencing alone stops
//! it.

use procflow::executor::{Executor, SubmitOptions};
use procflow::group::{Election, ElectionError, ExecutorGroup, Term};
use procflow::prelude::*;
use procflow::store::{BoxFuture, Store};
use serde::{Deserialize, Serialize};
use std::io::{Read, Seek, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Chain, env = Ledger, name = "chain")]
enum ChainState {
    #[initial]
    #[transition(to = [Work, Done])]
    Work,
    #[terminal]
    Done,
}

/// The outside system every step writes to: `DIR/ledger`, one line per effect, guarded by
/// an exclusive lock on the file.
struct Ledger {
    path: PathBuf,
    step_delay: Duration,
}

impl Ledger {
    /// Appends `procedure step token` unless it is there already; refuses a token lower
    /// than the highest the ledger holds.
    fn record(&self, procedure: u32, step: u32, token: u64) -> std::io::Result<()> {
        use fs4::FileExt;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&self.path)?;
        FileExt::lock(&file)?;
        let mut text = String::new();
        file.rewind()?;
        file.read_to_string(&mut text)?;
        let mut highest = 0;
        let mut done = false;
        for line in text.lines() {
            let fields: Vec<u64> = line.split(' ').filter_map(|f| f.parse().ok()).collect();
            if let [p, s, t] = fields[..] {
                highest = highest.max(t);
                done |= (p, s) == (u64::from(procedure), u64::from(step));
            }
        }
        if token < highest {
            return Err(std::io::Error::other(format!(
                "ledger: token {token} is stale (seen {highest})"
            )));
        }
        if !done {
            file.write_all(format!("{procedure} {step} {token}\n").as_bytes())?;
        }
        Ok(()) // The lock goes with the file.
    }
}

#[derive(Serialize, Deserialize)]
struct Chain {
    index: u32,
    steps: u32,
    done: u32,
}

impl ChainStateHandlers for Chain {
    async fn work(&mut self, ctx: &Context<Ledger>) -> Step<chain_state::Work> {
        let step = self.done + 1;
        let token = ctx.fencing_token().unwrap_or(0);
        ctx.env().record(self.index, step, token).retryable()?;
        tokio::time::sleep(ctx.env().step_delay).await;
        self.done = step;
        Ok(if step == self.steps {
            chain_state::Work::Done
        } else {
            chain_state::Work::Work
        }
        .into())
    }
}

/// An election whose terms never end on their own: a leader that lost its lease goes on
/// as if it had not noticed (`--fencing-only`).
struct Oblivious(Arc<dyn Election>);

impl Election for Oblivious {
    fn campaign(&self) -> BoxFuture<'_, Result<Term, ElectionError>> {
        self.0.campaign()
    }
    fn lost(&self, _: Term) -> BoxFuture<'_, ElectionError> {
        Box::pin(std::future::pending())
    }
    fn resign(&self, term: Term) -> BoxFuture<'_, Result<(), ElectionError>> {
        self.0.resign(term)
    }
    fn leader(&self) -> BoxFuture<'_, Result<Option<String>, ElectionError>> {
        self.0.leader()
    }
}

/// Where the group keeps its procedures and holds its election. (A build without the
/// backend's feature only names it in its error.)
#[cfg_attr(not(all(feature = "etcd", feature = "postgres")), allow(dead_code))]
enum Backend {
    Etcd {
        endpoints: Vec<String>,
        prefix: String,
    },
    Postgres {
        connection: String,
        schema: String,
    },
}

struct Args {
    backend: Backend,
    name: String,
    ledger: PathBuf,
    procedures: u32,
    steps: u32,
    step_ms: u64,
    ttl: u64,
    fencing_only: bool,
}

fn parse_args() -> Result<Args, String> {
    let (mut endpoints, mut prefix) = (Vec::new(), String::new());
    let (mut connection, mut schema) = (String::new(), String::new());
    let mut args = Args {
        backend: Backend::Etcd {
            endpoints: Vec::new(),
            prefix: String::new(),
        },
        name: String::new(),
        ledger: PathBuf::new(),
        procedures: 100,
        steps: 20,
        step_ms: 20,
        ttl: 2,
        fencing_only: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{arg}: {e}"));
        match arg.as_str() {
            "--endpoints" => endpoints = value()?.split(',').map(str::to_owned).collect(),
            "--prefix" => prefix = value()?,
            "--postgres" => connection = value()?,
            "--schema" => schema = value()?,
            "--name" => args.name = value()?,
            "--ledger" => args.ledger = PathBuf::from(value()?),
            "--procedures" => args.procedures = number(value()?)? as u32,
            "--steps" => args.steps = number(value()?)? as u32,
            "--step-ms" => args.step_ms = number(value()?)?,
            "--ttl" => args.ttl = number(value()?)?,
            "--fencing-only" => args.fencing_only = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    args.backend = match (connection.is_empty(), endpoints.is_empty()) {
        (false, true) if !schema.is_empty() => Backend::Postgres { connection, schema },
        (true, false) if !prefix.is_empty() => Backend::Etcd { endpoints, prefix },
        _ => {
            return Err(
                "name one store: --endpoints and --prefix (etcd), or --postgres and --schema"
                    .into(),
            );
        }
    };
    if args.name.is_empty() || args.ledger.as_os_str().is_empty() {
        return Err("--name and --ledger are required".into());
    }
    Ok(args)
}

#[tokio::main]
pub async fn main() {
    if let Err(error) = run().await {
        eprintln!("group_worker: {error}");
        std::process::exit(1);
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Arc::new(parse_args()?);
    let (store, election) = connect(&args).await?;
    let election: Arc<dyn Election> = if args.fencing_only {
        Arc::new(Oblivious(election))
    } else {
        election
    };
    let ledger_path = args.ledger.join("ledger");
    let step_delay = Duration::from_millis(args.step_ms);
    let group = Arc::new(ExecutorGroup::join(
        election,
        args.name.clone(),
        move || {
            let ledger = Ledger {
                path: ledger_path.clone(),
                step_delay,
            };
            Executor::builder_shared(Arc::clone(&store), Arc::new(ledger)).register::<ChainState>()
        },
    ));
    tokio::spawn(report_trouble(Arc::clone(&group)));
    loop {
        let executor = group.leading().await;
        let token = group.term().map_or(0, |t| t.token);
        say(&format!("leading {} token {token}", args.name));
        tokio::select! {
            result = lead(&executor, &args) => match result {
                Ok(()) => say(&format!("all done {}", args.procedures)),
                Err(error) => say(&format!("lead failed: {error}")),
            },
            () = executor.stopped() => {}
        }
        executor.stopped().await;
        say(&format!(
            "halted: {}",
            executor
                .halted()
                .map_or_else(|| "shut down".to_owned(), |e| e.to_string())
        ));
        // Until the member has left this term, `leading` would hand out the same executor.
        while group.term().is_some_and(|t| t.token == token) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

type Connected = (Arc<dyn Store>, Arc<dyn Election>);

/// The store and the election `args` name.
async fn connect(args: &Args) -> Result<Connected, Box<dyn std::error::Error>> {
    #[cfg_attr(
        not(any(feature = "etcd", feature = "postgres")),
        allow(unused_variables)
    )]
    let ttl = Duration::from_secs(args.ttl);
    match &args.backend {
        #[cfg(feature = "etcd")]
        Backend::Etcd { endpoints, prefix } => {
            use procflow::group::EtcdElection;
            use procflow_store::etcd::{EtcdConfig, EtcdStore};
            let config = EtcdConfig::new(endpoints.clone(), prefix.clone())
                .request_timeout(Duration::from_secs(2));
            let store = Arc::new(EtcdStore::connect(config.clone()).await?);
            let client = EtcdStore::connect(config.clone()).await?.client();
            let election = EtcdElection::new(client, &config, &args.name, ttl);
            Ok((store, Arc::new(election)))
        }
        #[cfg(feature = "postgres")]
        Backend::Postgres { connection, schema } => {
            use procflow::group::PgElection;
            use procflow_store::postgres::{PgConfig, PgStore};
            let config = PgConfig::new(connection, schema).request_timeout(Duration::from_secs(2));
            let store = Arc::new(PgStore::connect(config.clone()).await?);
            let election = PgElection::new(&config, &args.name, ttl);
            Ok((store, Arc::new(election)))
        }
        #[allow(unreachable_patterns)]
        Backend::Etcd { .. } => Err("built without the feature `etcd`".into()),
        #[allow(unreachable_patterns)]
        Backend::Postgres { .. } => Err("built without the feature `postgres`".into()),
    }
}

/// Prints `trouble: ERROR` each time the member's last error changes: why it stopped
/// leading, or why it cannot campaign (etcd without a quorum, say).
async fn report_trouble(group: Arc<ExecutorGroup<Ledger>>) {
    let mut last = String::new();
    loop {
        let now = group.last_error().map(|e| chain(&*e)).unwrap_or_default();
        if now != last && !now.is_empty() {
            say(&format!("trouble: {now}"));
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `error: its source: its source's source…`
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

/// Submits every chain (again, after a takeover: the nonces make that harmless) and waits
/// until each one succeeded.
async fn lead(executor: &Executor<Ledger>, args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let mut ids = Vec::new();
    for index in 0..args.procedures {
        let chain = Chain {
            index,
            steps: args.steps,
            done: 0,
        };
        let options = SubmitOptions::default().nonce(format!("chain-{index}"));
        ids.push(executor.submit_with(chain, options).await?);
    }
    for id in ids {
        let outcome = executor.wait(id).await?;
        if !matches!(outcome, procflow::executor::Outcome::Succeeded) {
            return Err(format!("procedure {id} ended {outcome:?}").into());
        }
    }
    Ok(())
}
