//! The part of the two deploy builds (`deploy_v1`, `deploy_v2`) that does not change
//! between them: the order workload's driver and its outside world. `tests/deploy.rs`
//! runs them one after the other on one store, and kills them.
//!
//! ```text
//! deploy_vN --wal DIR --orders N [--check]
//! deploy_vN --endpoints HOST:PORT,.. --prefix P --name NAME --dir DIR --orders N [--check]
//! ```
//!
//! Orders `o0..oN` (nonces `order-<i>`, so every build and every leader submits the same
//! ones) hold the exclusive lock `stock/<i / 2>` for life, two orders per key, and go
//! `Reserve → Pack → Ship → Done`. `Pack` waits for `DIR/signals/pack-<i>`, `Ship` for
//! `DIR/signals/pay-<i>`: the test creates the files, the leader wakes the events.
//!
//! Effects, outside the store: `DIR/effects/<order>`, one idempotent line per step
//! (`reserve o1`, `pack o1`, `ship o1 qty=3 note=None`: what the build's data said); and
//! `DIR/locks/<key>`, `<key> <order> life` at the start and end of every step, for the
//! test's lock span check.
//!
//! Prints `leading NAME BUILD` (etcd), then `status BUILD suspended=S waiting=W stuck=T
//! done=D` whenever the counts change, and `done N` once every order succeeded (then
//! exits 0). `--check` starts the executor with `check_data`. Exits 1 on any error.

use crate::order::{BUILD, Order, OrderState, order};
use procflow::executor::{Executor, ExecutorBuilder, Status, SubmitOptions};
use procflow::prelude::*;
use procflow::store::Store;
use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The outside world the handlers act on.
pub struct Shop {
    effects: PathBuf,
    locks: PathBuf,
    signals: PathBuf,
}

impl Shop {
    fn new(dir: &Path) -> std::io::Result<Self> {
        let shop = Shop {
            effects: dir.join("effects"),
            locks: dir.join("locks"),
            signals: dir.join("signals"),
        };
        for dir in [&shop.effects, &shop.locks, &shop.signals] {
            std::fs::create_dir_all(dir)?;
        }
        Ok(shop)
    }

    /// Appends `line` to order `name`'s effects unless it is there: a step run again
    /// after a kill, by this build or another, does not repeat it.
    pub fn effect(&self, name: &str, line: &str) -> Result<(), Error> {
        let path = self.effects.join(name);
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.lines().any(|l| l == line) {
            return Ok(());
        }
        append(&path, line).retryable()
    }

    /// `<key> <owner> life`, for the lock span check.
    pub fn lock_line(&self, key: &str, owner: &str) -> Result<(), Error> {
        append(
            &self.locks.join(key.replace('/', "_")),
            &format!("{key} {owner} life"),
        )
        .retryable()
    }

    /// Whether the test created `DIR/signals/<event>`.
    pub fn signalled(&self, event: &str) -> bool {
        self.signals.join(event).exists()
    }

    /// The signals created so far.
    fn signals(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.signals) else {
            return Vec::new();
        };
        entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect()
    }
}

/// One `O_APPEND` write of `line` and its newline.
fn append(path: &Path, line: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    file.write_all(format!("{line}\n").as_bytes())
}

/// The lock every order holds for life: two orders per key.
pub fn stock_key(index: u32) -> String {
    format!("stock/{}", index / 2)
}

/// A step's work under its lock: a lock line, the effect, a lock line.
pub fn act(shop: &Shop, index: u32, effect: &str) -> Result<(), Error> {
    let name = format!("o{index}");
    shop.lock_line(&stock_key(index), &name)?;
    shop.effect(&name, effect)?;
    shop.lock_line(&stock_key(index), &name)
}

struct Args {
    wal: Option<PathBuf>,
    etcd: Vec<String>,
    prefix: String,
    name: String,
    dir: Option<PathBuf>,
    orders: u32,
    check: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        wal: None,
        etcd: Vec::new(),
        prefix: String::new(),
        name: String::new(),
        dir: None,
        orders: 6,
        check: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--wal" => args.wal = Some(PathBuf::from(value()?)),
            "--endpoints" => args.etcd = value()?.split(',').map(str::to_owned).collect(),
            "--prefix" => args.prefix = value()?,
            "--name" => args.name = value()?,
            "--dir" => args.dir = Some(PathBuf::from(value()?)),
            "--orders" => args.orders = value()?.parse().map_err(|e| format!("{arg}: {e}"))?,
            "--check" => args.check = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

pub fn main() {
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    if let Err(error) = runtime.block_on(run()) {
        say(&format!("error: {error}"));
        eprintln!("deploy_{BUILD}: {error}");
        std::process::exit(1);
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

type Failure = Box<dyn std::error::Error>;

async fn run() -> Result<(), Failure> {
    let args = parse_args()?;
    if let Some(wal) = &args.wal {
        let store: Arc<dyn Store> = Arc::new(procflow::store::WalStore::open(
            wal.join("wal"),
            procflow::store::WalConfig::default(),
        )?);
        let shop = Arc::new(Shop::new(wal)?);
        let executor = builder(&store, &shop, args.check).start().await?;
        drive(&executor, &shop, args.orders).await?;
        executor.shutdown().await?;
        return Ok(());
    }
    group(&args).await
}

fn builder(store: &Arc<dyn Store>, shop: &Arc<Shop>, check: bool) -> ExecutorBuilder<Shop> {
    Executor::builder_shared(Arc::clone(store), Arc::clone(shop))
        .register::<OrderState>()
        .check_data(check)
}

/// Submits every order (again after a restart or a takeover: the nonces find them), wakes
/// each signalled event once, reports the counts, and returns once every order succeeded.
async fn drive(executor: &Executor<Shop>, shop: &Shop, orders: u32) -> Result<(), Failure> {
    for index in 0..orders {
        let options = SubmitOptions::default().nonce(format!("order-{index}"));
        executor
            .submit_with::<Order, _>(order(index), options)
            .await?;
    }
    let mut woken = BTreeSet::new();
    let mut last = String::new();
    loop {
        for signal in shop.signals() {
            if woken.insert(signal.clone()) {
                executor.wake(&signal).await?;
            }
        }
        let (mut suspended, mut waiting, mut stuck, mut done) = (0, 0, 0, 0);
        for info in executor.list() {
            match info.status {
                Status::Suspended { .. } => suspended += 1,
                Status::WaitingForLock => waiting += 1,
                Status::Stuck { .. } => stuck += 1,
                Status::Succeeded => done += 1,
                _ => {}
            }
        }
        let status = format!(
            "status {BUILD} suspended={suspended} waiting={waiting} stuck={stuck} done={done}"
        );
        if status != last {
            say(&status);
            last = status;
        }
        if done == orders as usize {
            say(&format!("done {orders}"));
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A member of an executor group on etcd: leads when elected, and drives the orders
/// while it leads.
#[cfg(feature = "etcd")]
async fn group(args: &Args) -> Result<(), Failure> {
    use procflow::group::{EtcdElection, ExecutorGroup};
    use procflow_store::etcd::{EtcdConfig, EtcdStore};
    let dir = args
        .dir
        .clone()
        .ok_or("--dir is required with --endpoints")?;
    let config = EtcdConfig::new(args.etcd.clone(), args.prefix.clone())
        .request_timeout(Duration::from_secs(2));
    let store: Arc<dyn Store> = Arc::new(EtcdStore::connect(config.clone()).await?);
    let client = EtcdStore::connect(config.clone()).await?.client();
    let election = EtcdElection::new(client, &config, &args.name, Duration::from_secs(2));
    let shop = Arc::new(Shop::new(&dir)?);
    let check = args.check;
    let make = {
        let shop = Arc::clone(&shop);
        move || builder(&store, &shop, check)
    };
    let group = ExecutorGroup::join(Arc::new(election), args.name.clone(), make);
    loop {
        let executor = group.leading().await;
        let token = group.term().map_or(0, |t| t.token);
        say(&format!("leading {} {BUILD}", args.name));
        tokio::select! {
            result = drive(&executor, &shop, args.orders) => {
                if let Err(error) = result {
                    say(&format!("drive failed: {error}"));
                }
            }
            () = executor.stopped() => {}
        }
        executor.stopped().await;
        if let Some(error) = group.last_error() {
            say(&format!("halted: {error}"));
        }
        while group.term().is_some_and(|t| t.token == token) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[cfg(not(feature = "etcd"))]
async fn group(_: &Args) -> Result<(), Failure> {
    Err(
        "--endpoints (a group on etcd) needs the `etcd` feature: cargo build --features etcd"
            .into(),
    )
}
