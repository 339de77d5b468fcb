//! A process that leaves one operator request in a shared etcd store at a given moment:
//! `tests/request_keys.rs` starts two of them in separate PID namespaces (both pid 1, as
//! two containers are) to write in the same millisecond.
//!
//! ```text
//! request_writer --endpoints HOST:PORT,... --prefix P --at-ms MS --event NAME
//! ```
//!
//! Waits until the wall clock reaches `MS` (ms since the Unix epoch), leaves a request to
//! wake `NAME`, and prints `pid PID key KEY`. Exits 1 on any error.

use procflow::operator::{Action, Request, leave_request};
use procflow_store::etcd::{EtcdConfig, EtcdStore};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[tokio::main]
async fn main() {
    if let Err(error) = run().await {
        eprintln!("request_writer: {error}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut endpoints, mut prefix, mut at_ms, mut event) = (None, None, None, None);
    while let Some(arg) = args.next() {
        let value = args.next().ok_or(format!("{arg} needs a value"))?;
        match arg.as_str() {
            "--endpoints" => endpoints = Some(value),
            "--prefix" => prefix = Some(value),
            "--at-ms" => at_ms = Some(value.parse::<u64>()?),
            "--event" => event = Some(value),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let endpoints: Vec<String> = endpoints
        .ok_or("--endpoints is required")?
        .split(',')
        .map(str::to_owned)
        .collect();
    let config = EtcdConfig::new(endpoints, prefix.ok_or("--prefix is required")?);
    let store = EtcdStore::connect(config).await?;
    let at_ms = at_ms.ok_or("--at-ms is required")?;
    // Sleep to just before the moment, then spin: both writers make their request in the
    // same millisecond.
    let left = at_ms.saturating_sub(now_ms());
    tokio::time::sleep(Duration::from_millis(left.saturating_sub(5))).await;
    while now_ms() < at_ms {
        std::hint::spin_loop();
    }
    let request = Request::new(
        Action::Wake(event.ok_or("--event is required")?),
        "request_writer",
        "two writers, one millisecond",
    );
    let key = leave_request(&store, &request).await?;
    println!("pid {} key {key}", std::process::id());
    Ok(())
}
