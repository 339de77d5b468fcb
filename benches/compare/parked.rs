//! The machine of workloads 6 and 7: five updates to 1 KiB of state, then the procedure
//! either ends or parks for good. Parked procedures stay unfinished in the store, the way
//! long-lived idle procedures do (a table waiting for its regions, say); ended ones are
//! deleted by the executor's retention.

use procflow::executor::{Config, Executor, Status};
use procflow::prelude::*;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Bytes of user state each procedure carries (HBase's evaluations use 1 KiB).
pub const STATE_BYTES: usize = 1024;

/// The prefix of the events parked procedures wait for; nothing ever wakes them.
const NEVER: &str = "bench-never";

/// Five updates in a row, then `Done` (or parked in `Five`).
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Kilobyte, name = "bench_five_updates")]
pub enum FiveUpdates {
    #[initial]
    #[transition(to = [Two])]
    One,
    #[transition(to = [Three])]
    Two,
    #[transition(to = [Four])]
    Three,
    #[transition(to = [Five])]
    Four,
    #[transition(to = [Done])]
    Five,
    #[terminal]
    Done,
}

/// The procedure's data: 1 KiB the steps change, and whether it parks after them.
#[derive(Serialize, Deserialize)]
pub struct Kilobyte {
    /// Opaque bytes, declared as such for serde (as a user storing bytes would): postcard
    /// then decodes them with one copy instead of a visit per byte.
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
    park: bool,
}

impl Kilobyte {
    /// State made from `seed`; `park` decides the procedure's end.
    pub fn new(seed: u64, park: bool) -> Self {
        Self {
            data: seed.to_le_bytes().repeat(STATE_BYTES / 8),
            park,
        }
    }

    /// What every step does: change the state, so each update writes a new value.
    fn update(&mut self, step: u8) {
        for byte in self.data.iter_mut().step_by(64) {
            *byte = byte.wrapping_add(step);
        }
    }
}

impl FiveUpdatesHandlers for Kilobyte {
    async fn one(&mut self, _: &Context<()>) -> Step<five_updates::One> {
        self.update(1);
        Ok(five_updates::One::Two.into())
    }

    async fn two(&mut self, _: &Context<()>) -> Step<five_updates::Two> {
        self.update(2);
        Ok(five_updates::Two::Three.into())
    }

    async fn three(&mut self, _: &Context<()>) -> Step<five_updates::Three> {
        self.update(3);
        Ok(five_updates::Three::Four.into())
    }

    async fn four(&mut self, _: &Context<()>) -> Step<five_updates::Four> {
        self.update(4);
        Ok(five_updates::Four::Five.into())
    }

    /// The fifth update: a parked procedure persists it with its suspension, an ending
    /// one with its move to `Done`. Each procedure waits for an event of its own, as one
    /// waiting for its own region or table would. (The executor used to keep an event's
    /// waiters in a list scanned on every suspend and exit, which made half a million
    /// procedures on one event quadratic; they are a set now, but the bench keeps the
    /// realistic shape.)
    async fn five(&mut self, ctx: &Context<()>) -> Step<five_updates::Five> {
        self.update(5);
        if self.park {
            Ok(Flow::suspend(format!("{NEVER}-{}", ctx.id().get())))
        } else {
            Ok(five_updates::Five::Done.into())
        }
    }
}

/// The executor's settings for these workloads: every procedure may be live at once
/// (parked ones hold a running slot for good, so the default limit of 10,000 would stop
/// the executor once that many parked), and ended procedures are deleted from the store
/// at once rather than after 15 minutes.
pub fn config(procedures: u64) -> Config {
    Config {
        max_running: usize::try_from(procedures).unwrap_or(usize::MAX).max(1) + 4096,
        retention: Duration::ZERO,
        cleanup_interval: Duration::from_millis(500),
        ..crate::drive::config()
    }
}

/// Submits procedures `first..first + count` from `clients` concurrent clients, each
/// submitting one, waiting until it has parked or ended, then taking the next id. Those
/// for which `park(id)` holds park.
pub async fn populate(
    executor: &Executor<()>,
    first: u64,
    count: u64,
    clients: u64,
    park: fn(u64) -> bool,
) {
    let next = Arc::new(AtomicU64::new(first));
    let end = first + count;
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (executor, next) = (executor.clone(), Arc::clone(&next));
            tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= end {
                        break;
                    }
                    let id = executor
                        .submit(Kilobyte::new(n, park(n)))
                        .await
                        .expect("submit");
                    settle(&executor, id).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("client task");
    }
}

/// Waits until procedure `id` is parked, has ended, or is already gone (an ended
/// procedure is deleted at its next cleanup).
async fn settle(executor: &Executor<()>, id: ProcedureId) {
    let Some(mut info) = executor.subscribe(id) else {
        return;
    };
    loop {
        let status = info.borrow_and_update().status.clone();
        if matches!(status, Status::Suspended { .. }) || status.is_finished() {
            return;
        }
        if info.changed().await.is_err() {
            return;
        }
    }
}

/// Waits until the store holds exactly `live` records: every ended procedure deleted.
pub async fn await_cleanup(store: &dyn procflow::store::Store, live: u64) {
    loop {
        let records = store.list().await.expect("list the store").len() as u64;
        if records <= live {
            assert_eq!(records, live, "parked procedures went missing");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
