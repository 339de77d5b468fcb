//! The admin page on a running executor: accounts being provisioned, one child procedure
//! per storage bucket, waiting for a storage service that is down, and one account stuck
//! past its point of no return.
//!
//! ```text
//! cargo run --example admin --features admin                  # serves http://127.0.0.1:7077/
//! cargo run --example admin --features admin -- --addr 127.0.0.1:8080 --token s3cret
//! cargo run --example admin --features admin -- --serve-for 5 # stops by itself (CI)
//! PROCFLOW_TOKEN=s3cret cargo run -p procflow --features cli --bin procflow -- \
//!     list --url http://127.0.0.1:7077                       # the CLI, through the API
//! ```
//!
//! `/metrics` serves procflow's series through a Prometheus exporter (see the README's
//! "Metrics" for the list). Open the page, pick a procedure: its diagram shows where it is. Type the token (printed
//! at start, or `--token`) to use the buttons: *Wake* `storage-ready` lets the buckets
//! open and the accounts finish; *Abort* rolls an account back (its reservation undone);
//! *Bypass* (with a reason) ends the stuck one without running its handlers. The store is
//! a WAL in a temporary directory (`--dir` to keep it, and `procflow list --store DIR`
//! reads it while the example runs).

use procflow::admin::Admin;
use procflow::executor::Executor;
use procflow::prelude::*;
use procflow::store::{WalConfig, WalStore};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Buckets wait for this event: the storage service is up.
const STORAGE_READY: &str = "storage-ready";

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Provision, name = "provision_account")]
enum ProvisionState {
    #[initial]
    #[transition(to = [CreateBuckets])]
    #[rollback]
    Reserve,
    #[transition(to = [Activate])]
    CreateBuckets,
    #[transition(to = [Active])]
    #[no_rollback]
    Activate,
    #[terminal]
    Active,
}

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = CreateBucket, name = "create_bucket")]
enum CreateBucketState {
    #[initial]
    #[transition(to = [Created])]
    Create,
    #[terminal]
    Created,
}

#[derive(Serialize, Deserialize)]
struct Provision {
    account: String,
    buckets: u32,
    /// The billing system refuses the activation, for good.
    billing_refuses: bool,
}

#[derive(Serialize, Deserialize)]
struct CreateBucket {
    name: String,
    /// It has asked the storage service and waits for its answer (`storage-ready`).
    asked: bool,
}

impl ProvisionStateHandlers for Provision {
    async fn reserve(&mut self, _: &Context<()>) -> Step<provision_state::Reserve> {
        Ok(provision_state::Reserve::CreateBuckets.into())
    }

    async fn rollback_reserve(&mut self, _: &Context<()>) -> Result<(), Error> {
        Ok(())
    }

    async fn create_buckets(&mut self, _: &Context<()>) -> Step<provision_state::CreateBuckets> {
        let buckets = (0..self.buckets).map(|i| {
            let name = format!("{}-{i}", self.account);
            Child::new::<CreateBucketState>(&CreateBucket { name, asked: false })
        });
        let buckets = buckets.collect::<Result<Vec<_>, _>>()?;
        if buckets.is_empty() {
            return Ok(provision_state::CreateBuckets::Activate.into());
        }
        Ok(Flow::spawn(
            buckets,
            provision_state::CreateBuckets::Activate,
        ))
    }

    async fn activate(&mut self, _: &Context<()>) -> Step<provision_state::Activate> {
        if self.billing_refuses {
            return Err(Error::fatal("billing refuses the account: card declined"));
        }
        Ok(provision_state::Activate::Active.into())
    }

    fn locks(&self) -> Result<Locks, LockKeyError> {
        Ok(Locks::new(vec![Lock::exclusive(format!(
            "accounts/{}",
            self.account
        ))?]))
    }
}

impl CreateBucketStateHandlers for CreateBucket {
    async fn create(&mut self, _: &Context<()>) -> Step<create_bucket_state::Create> {
        // The first run asks; a wake of `storage-ready` is the answer.
        if !self.asked {
            self.asked = true;
            return Ok(Flow::suspend(STORAGE_READY));
        }
        Ok(create_bucket_state::Create::Created.into())
    }
}

struct Args {
    addr: SocketAddr,
    token: String,
    dir: Option<PathBuf>,
    serve_for: Option<Duration>,
}

fn parse_args() -> Result<Args, String> {
    let mut parsed = Args {
        addr: Admin::<()>::DEFAULT_ADDR,
        token: std::env::var("PROCFLOW_TOKEN").unwrap_or_default(),
        dir: None,
        serve_for: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--addr" => parsed.addr = value()?.parse().map_err(|e| format!("--addr: {e}"))?,
            "--token" => parsed.token = value()?,
            "--dir" => parsed.dir = Some(value()?.into()),
            "--serve-for" => {
                let seconds: u64 = value()?.parse().map_err(|e| format!("--serve-for: {e}"))?;
                parsed.serve_for = Some(Duration::from_secs(seconds));
            }
            other => {
                return Err(format!(
                    "unknown argument {other}; use --addr, --token, --dir or --serve-for"
                ));
            }
        }
    }
    if parsed.token.is_empty() {
        // Unguessable enough for a demo on localhost.
        parsed.token = format!("{:016x}", fastrand::u64(..));
    }
    Ok(parsed)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args().unwrap_or_else(|message| {
        eprintln!("admin: {message}");
        std::process::exit(2);
    });
    // procflow records through the `metrics` facade; this recorder keeps the series for
    // `/metrics` (installed first, so that it sees every one).
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    let temp = tempfile::tempdir()?;
    let dir = args.dir.clone().unwrap_or_else(|| temp.path().to_owned());
    let store = Arc::new(WalStore::open(&dir, WalConfig::default())?);
    let executor = Executor::builder(store, ())
        .register::<ProvisionState>()
        .register::<CreateBucketState>()
        .start()
        .await?;
    for (account, buckets, billing_refuses) in [("acme", 2, false), ("globex", 3, false)] {
        let account = account.to_owned();
        executor
            .submit(Provision {
                account,
                buckets,
                billing_refuses,
            })
            .await?;
    }
    executor
        .submit(Provision {
            account: "initech".into(),
            buckets: 0,
            billing_refuses: true,
        })
        .await?;

    let server = Admin::new(executor.clone())
        .token(args.token.clone())
        .metrics(move || prometheus.render())
        .bind(args.addr)
        .serve()
        .await
        .map_err(|e| {
            format!(
                "cannot serve on {}: {e} (choose another with --addr)",
                args.addr
            )
        })?;
    println!("admin page at http://{}/", server.local_addr());
    println!("metrics at http://{}/metrics", server.local_addr());
    println!("token: {}", args.token);
    println!("store: {}", dir.display());
    match args.serve_for {
        Some(time) => tokio::time::sleep(time).await,
        None => {
            println!("Ctrl-C to stop");
            tokio::signal::ctrl_c().await?;
        }
    }
    server.shutdown().await?;
    executor.shutdown().await?;
    println!("stopped");
    Ok(())
}
