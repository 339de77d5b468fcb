//! What workloads 8 and 10 (procflow on etcd, on PostgreSQL) share: executor cells, the
//! one-client ratio taken over rounds side by side with the raw loop, the table they
//! print, and the takeover of a group whose leader is killed.

use std::time::Duration;

use crate::drive::Rate;
use crate::workers::Workers;

/// Rounds of a raw cell and the one-client executor cell, side by side.
pub const ROUNDS: usize = 3;
/// The concurrencies of the executor cells.
pub const CLIENTS: [u64; 3] = [1, 16, 256];
/// The lease TTL of the takeover workers, in seconds.
pub const TAKEOVER_TTL_S: u64 = 2;

/// One executor cell: its rate, and the transactions it took.
pub struct Cell {
    pub clients: u64,
    pub rate: Rate,
    pub txns: u64,
}

/// The cells of one concurrency as one: their steps, transactions and times summed.
pub fn merge(cells: &[Cell]) -> Cell {
    let mut rate = Rate::ZERO;
    let mut txns = 0;
    for c in cells {
        rate.steps += c.rate.steps;
        rate.procedures += c.rate.procedures;
        rate.elapsed += c.rate.elapsed;
        txns += c.txns;
    }
    Cell {
        clients: cells[0].clients,
        rate,
        txns,
    }
}

/// The executor's rate at one client over the raw loop's, both summed over the rounds
/// they ran side by side (the first `singles.len()` raw cells): the raw loop's own rate
/// drifts by up to a quarter over a run, and rounds side by side cancel that.
pub fn one_client_ratio(raws: &[f64], singles: &[Cell]) -> f64 {
    let steps: u64 = singles.iter().map(|c| c.rate.steps).sum();
    let secs: f64 = singles.iter().map(|c| c.rate.elapsed.as_secs_f64()).sum();
    let paired_raw: f64 = raws[..singles.len()].iter().sum::<f64>() / singles.len() as f64;
    steps as f64 / secs / paired_raw
}

/// Prints the rounds side by side, then each cell's rate against `raw`, the raw mean.
pub fn print_cells(what: &str, raws: &[f64], singles: &[Cell], cells: &[Cell]) {
    let raw = raws.iter().sum::<f64>() / raws.len() as f64;
    let rounds: Vec<String> = raws
        .iter()
        .zip(singles)
        .map(|(raw, single)| format!("{raw:.0}/s vs {:.0}/s", single.rate.steps_per_sec()))
        .collect();
    println!(
        "raw loop of {what}, one client, and the executor at one client, round by round: {}; a last raw cell {:.0}/s; raw mean {raw:.0}/s",
        rounds.join(", "),
        raws[raws.len() - 1]
    );
    println!("clients  steps/s  txns/s  steps/txn  vs raw");
    for c in cells {
        let secs = c.rate.elapsed.as_secs_f64();
        println!(
            "{:>7}  {:>7.0}  {:>6.0}  {:>9.1}  {:>5.2}x",
            c.clients,
            c.rate.steps_per_sec(),
            c.txns as f64 / secs,
            c.rate.steps as f64 / c.txns.max(1) as f64,
            c.rate.steps_per_sec() / raw
        );
    }
}

/// Three workers on the store `store` names; the leader is killed `kills` times, each
/// time once it has worked for 700 ms. Returns each takeover in seconds: from the kill
/// until a standby leads.
pub fn takeover(store: &[&str], kills: usize) -> Vec<f64> {
    let args = [
        "--procedures",
        "20",
        "--steps",
        "1000000",
        "--step-ms",
        "50",
        "--ttl",
        &TAKEOVER_TTL_S.to_string(),
    ];
    let mut workers = Workers::start_on(store, 3, &args);
    let within = Duration::from_secs(4 * TAKEOVER_TTL_S);
    workers.kill_leaders(kills, TAKEOVER_TTL_S, within)
}
