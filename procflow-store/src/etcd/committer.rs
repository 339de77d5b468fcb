//! Group commit: batches committed while a transaction is in flight wait in a queue, and
//! the next transaction carries as many of them as fit (see [`Plan::try_add`]), the way
//! the WAL's committer shares one fsync. One etcd round trip then persists many
//! procedures' steps.

use std::sync::Arc;

use etcd_client::TxnOpResponse;
use tokio::sync::{mpsc, oneshot};

use super::Shared;
use super::plan::{Plan, Prepared};
use crate::error::StoreError;

/// A batch waiting for its transaction, and where to send its result.
pub(crate) struct Pending {
    pub(crate) batch: Prepared,
    pub(crate) reply: oneshot::Sender<Result<(), StoreError>>,
}

/// Runs until every sender is dropped and the queue is empty.
pub(crate) async fn run(shared: Arc<Shared>, mut queue: mpsc::UnboundedReceiver<Pending>) {
    let mut carried: Option<Pending> = None;
    loop {
        let first = match carried.take() {
            Some(first) => first,
            None => match queue.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        let mut plan = Plan::new(first.batch.token);
        if !plan.try_add(&first.batch, &shared.keys) {
            // Limits::check let it through, so this is a bug in the size accounting.
            let _ = first.reply.send(Err(StoreError::TooLarge {
                what: "etcd transaction",
                size: first.batch.writes.len(),
                limit: super::plan::MAX_TXN_OPS,
            }));
            continue;
        }
        let mut group = vec![first];
        while let Ok(next) = queue.try_recv() {
            if plan.try_add(&next.batch, &shared.keys) {
                group.push(next);
            } else {
                carried = Some(next);
                break;
            }
        }
        commit_group(&shared, &plan, group).await;
    }
}

/// Commits `group` as `plan`, one transaction; if a check fails for a group of several,
/// commits each on its own to find out whose it was.
async fn commit_group(shared: &Shared, plan: &Plan, group: Vec<Pending>) {
    let result = commit_plan(shared, plan).await;
    let refused_check = matches!(
        result,
        Err(StoreError::UnknownProcedure(_) | StoreError::MetaExists { .. })
    );
    if group.len() > 1 && refused_check {
        for pending in group {
            let mut alone = Plan::new(pending.batch.token);
            alone.try_add(&pending.batch, &shared.keys);
            let result = commit_plan(shared, &alone).await;
            finish(shared, pending, result);
        }
        return;
    }
    for pending in group {
        finish(shared, pending, clone_result(&result));
    }
}

fn finish(shared: &Shared, pending: Pending, result: Result<(), StoreError>) {
    if result.is_ok() {
        shared.remember_parents(&pending.batch.parents);
    }
    // The committing future may have been dropped: its batch is in, or not, all the same.
    let _ = pending.reply.send(result);
}

/// One transaction: `Ok` if it applied, else the check that failed.
async fn commit_plan(shared: &Shared, plan: &Plan) -> Result<(), StoreError> {
    let response = shared
        .call(
            "committing a transaction (it may or may not have applied)",
            |mut kv| {
                let txn = plan.txn(&shared.keys);
                async move { kv.txn(txn).await }
            },
        )
        .await?;
    if response.succeeded() {
        return Ok(());
    }
    let mut responses = response.op_responses().into_iter();
    let leader = match responses.next() {
        Some(TxnOpResponse::Get(get)) => get.kvs().first().map_or(0, |kv| kv.create_revision()),
        _ => 0,
    };
    if let Some(token) = plan.token()
        && i64::try_from(token).ok() != Some(leader)
    {
        return Err(StoreError::Fenced {
            token,
            highest: u64::try_from(leader).unwrap_or(0),
        });
    }
    for (id, response) in plan.must_exist().zip(responses.by_ref()) {
        if matches!(response, TxnOpResponse::Get(get) if get.kvs().is_empty()) {
            return Err(StoreError::UnknownProcedure(id));
        }
    }
    for (key, response) in plan.must_be_absent().zip(responses) {
        if matches!(response, TxnOpResponse::Get(get) if !get.kvs().is_empty()) {
            return Err(StoreError::MetaExists {
                key: key.to_owned(),
            });
        }
    }
    Err(shared.io(
        "committing a transaction (it may or may not have applied)",
        std::io::Error::other("etcd refused the transaction's checks, yet each holds"),
    ))
}

/// Every member of a group gets the group's result; errors are not `Clone`.
fn clone_result(result: &Result<(), StoreError>) -> Result<(), StoreError> {
    match result {
        Ok(()) => Ok(()),
        Err(StoreError::Fenced { token, highest }) => Err(StoreError::Fenced {
            token: *token,
            highest: *highest,
        }),
        Err(StoreError::UnknownProcedure(id)) => Err(StoreError::UnknownProcedure(*id)),
        Err(StoreError::MetaExists { key }) => Err(StoreError::MetaExists { key: key.clone() }),
        Err(StoreError::Io {
            context,
            path,
            source,
        }) => Err(StoreError::Io {
            context,
            path: path.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        }),
        Err(other) => Err(StoreError::Encoding {
            reason: other.to_string(),
        }),
    }
}
