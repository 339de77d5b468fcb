//! Workload 3: the ten-step machine persisted the way a user without procflow would, each
//! step's state committed to a redb table (a durable commit per step).

use crate::drive::{Ids, Rate, Write, hand_persisting_loop};
use redb::{Database, TableDefinition};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Procedure id → current state (its index, then the 64 bytes).
const PROCEDURES: TableDefinition<u64, &[u8]> = TableDefinition::new("procedures");

/// Runs `clients` closed-loop clients on a new redb file in `dir`: each procedure's
/// initial state is committed before its first step, then its state after every step,
/// every commit with redb's default durability (`Immediate`: durable when `commit`
/// returns). redb has one writer at a time, so `begin_write` runs on tokio's blocking
/// pool, where it waits for the writer before it.
pub async fn closed_loop_on_redb(dir: &Path, clients: u64, duration: Duration) -> Rate {
    std::fs::create_dir_all(dir).expect("create the redb directory");
    let db = Arc::new(Database::create(dir.join("procedures.redb")).expect("create redb"));
    hand_persisting_loop(clients, duration, Ids::PerClient, move |id, write| {
        let db = Arc::clone(&db);
        async move {
            // An ended procedure's row stays: the redb table has no cleanup.
            if let Write::Initial(value) | Write::Step(value) = write {
                put(db, id, value).await;
            }
        }
    })
    .await
}

async fn put(db: Arc<Database>, id: u64, value: Vec<u8>) {
    tokio::task::spawn_blocking(move || {
        let tx = db.begin_write().expect("begin a redb write");
        {
            let mut table = tx.open_table(PROCEDURES).expect("open the table");
            table.insert(id, value.as_slice()).expect("insert");
        }
        tx.commit().expect("commit");
    })
    .await
    .expect("redb commit task");
}
