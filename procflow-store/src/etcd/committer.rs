//! Group commit: batches committed while a transaction is in flight wait in a queue, and
//! the next transaction carries as many of them as fit (see [`Plan::try_add`]), the way
//! the WAL's committer shares one fsync. One etcd round trip then persists many
//! procedures' steps. Each transaction applies at most once, at the writer's sequence
//! number ([`sequence`](super::sequence)); one whose answer is lost is settled.

use std::sync::Arc;

use etcd_client::{Txn, TxnOp, TxnOpResponse, TxnResponse};
use tokio::sync::{mpsc, oneshot};

use super::Shared;
use super::plan::{Plan, Prepared};
use super::sequence::{self, Sequence, Verdict};
use crate::error::StoreError;

/// A batch waiting for its transaction, and where to send its result.
pub(crate) struct Pending {
    pub(crate) batch: Prepared,
    pub(crate) reply: oneshot::Sender<Result<(), StoreError>>,
}

/// Runs until every sender is dropped and the queue is empty.
/// `start` is the number the writer's key was created at.
pub(crate) async fn run(
    shared: Arc<Shared>,
    start: u64,
    mut queue: mpsc::UnboundedReceiver<Pending>,
) {
    let mut carried: Option<Pending> = None;
    let mut sequence = Sequence::At(start);
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
        commit_group(&shared, &mut sequence, &plan, group).await;
    }
}

/// Commits `group` as `plan`, one transaction; if a check fails for a group of several,
/// commits each on its own to find out whose it was.
async fn commit_group(shared: &Shared, sequence: &mut Sequence, plan: &Plan, group: Vec<Pending>) {
    let result = commit_once(shared, sequence, plan).await;
    let refused_check = matches!(
        result,
        Err(StoreError::UnknownProcedure(_) | StoreError::MetaExists { .. })
    );
    if group.len() > 1 && refused_check {
        for pending in group {
            let mut alone = Plan::new(pending.batch.token);
            alone.try_add(&pending.batch, &shared.keys);
            let result = commit_once(shared, sequence, &alone).await;
            finish(shared, pending, result);
        }
        return;
    }
    for pending in group {
        finish(
            shared,
            pending,
            result.as_ref().map_err(StoreError::duplicate).copied(),
        );
    }
}

fn finish(shared: &Shared, pending: Pending, result: Result<(), StoreError>) {
    if result.is_ok() {
        shared.remember_parents(&pending.batch.parents);
    }
    // The committing future may have been dropped: its batch is in, or not, all the same.
    let _ = pending.reply.send(result);
}

/// How one attempt of a transaction went.
enum Attempt {
    Applied,
    /// It did not apply: one of its checks failed (a definite answer).
    Refused(StoreError),
    /// No answer (a timeout, a lost connection): it may apply yet.
    Unknown(StoreError),
    /// The sequence key holds a number this writer did not expect.
    Lost(StoreError),
}

/// Commits `plan` exactly once: at the writer's sequence number, settling an attempt
/// whose answer is lost. `Ok` if it applied (now or by an earlier attempt).
async fn commit_once(
    shared: &Shared,
    sequence: &mut Sequence,
    plan: &Plan,
) -> Result<(), StoreError> {
    let expected = current(shared, sequence).await?;
    match attempt(shared, plan, expected).await {
        Attempt::Unknown(error) => match settle(shared, expected).await {
            Some(true) => conclude(sequence, expected, Attempt::Applied),
            // The lost attempt can never apply: send the batch again, once, at the number
            // the settle moved to.
            Some(false) => {
                let next = expected + 1;
                conclude(sequence, next, attempt(shared, plan, next).await)
            }
            None => conclude(sequence, expected, Attempt::Unknown(error)),
        },
        other => conclude(sequence, expected, other),
    }
}

/// What an attempt at `expected` leaves the writer's sequence at, and its result.
fn conclude(sequence: &mut Sequence, expected: u64, attempt: Attempt) -> Result<(), StoreError> {
    match attempt {
        Attempt::Applied => {
            *sequence = Sequence::At(expected + 1);
            Ok(())
        }
        Attempt::Refused(error) => {
            *sequence = Sequence::At(expected);
            Err(error)
        }
        Attempt::Unknown(error) | Attempt::Lost(error) => {
            *sequence = Sequence::Unknown;
            Err(error)
        }
    }
}

/// The number the writer's next transaction expects, read from etcd if an earlier
/// outcome left it unknown.
async fn current(shared: &Shared, sequence: &mut Sequence) -> Result<u64, StoreError> {
    if let Sequence::At(n) = *sequence {
        return Ok(n);
    }
    let key = shared.sequence_key.clone();
    let response = shared
        .call("reading the writer's sequence", |mut kv| {
            let key = key.clone();
            async move { kv.get(key, None).await }
        })
        .await?;
    let value = response.kvs().first().map(etcd_client::KeyValue::value);
    let n = sequence::decode(value).ok_or_else(|| {
        shared.io(
            "reading the writer's sequence",
            std::io::Error::other("the sequence key holds no number"),
        )
    })?;
    *sequence = Sequence::At(n);
    Ok(n)
}

/// One transaction of `plan` at sequence number `expected`.
async fn attempt(shared: &Shared, plan: &Plan, expected: u64) -> Attempt {
    let context = "committing a transaction (it may or may not have applied)";
    let response = shared
        .call(context, |mut kv| {
            let txn = plan.txn(&shared.keys, &shared.sequence_key, expected);
            async move { kv.txn(txn).await }
        })
        .await;
    let response = match response {
        Ok(response) => response,
        Err(error) => return Attempt::Unknown(error),
    };
    if response.succeeded() {
        if let Some(header) = response.header() {
            shared.pins.wrote(header.revision());
        }
        return Attempt::Applied;
    }
    match failed_check(shared, plan, expected, response) {
        Ok(()) => Attempt::Applied,
        Err((error, Verdict::Refused)) => Attempt::Refused(error),
        Err((error, _)) => Attempt::Lost(error),
    }
}

/// Which check a transaction that did not apply failed, from its failure branch's reads
/// (the leader key, the sequence, the checked keys, in that order); `Ok` if an earlier
/// attempt of it applied.
fn failed_check(
    shared: &Shared,
    plan: &Plan,
    expected: u64,
    response: TxnResponse,
) -> Result<(), (StoreError, Verdict)> {
    let mut responses = response.op_responses().into_iter();
    let leader = match responses.next() {
        Some(TxnOpResponse::Get(get)) => get.kvs().first().map_or(0, |kv| kv.create_revision()),
        _ => 0,
    };
    let found = sequence::read(responses.next());
    match sequence::verdict(expected, found) {
        Verdict::AppliedBefore => return Ok(()),
        Verdict::Lost => {
            let error = shared.io(
                "committing a transaction",
                std::io::Error::other(format!(
                    "the writer's sequence holds {found:?}, not {expected}: another process \
                     writes under this store's writer id"
                )),
            );
            return Err((error, Verdict::Lost));
        }
        Verdict::Refused => {}
    }
    let refused = |error| Err((error, Verdict::Refused));
    if let Some(token) = plan.token()
        && i64::try_from(token).ok() != Some(leader)
    {
        return refused(StoreError::Fenced {
            token,
            highest: u64::try_from(leader).unwrap_or(0),
        });
    }
    for (id, response) in plan.must_exist().zip(responses.by_ref()) {
        if matches!(response, TxnOpResponse::Get(get) if get.kvs().is_empty()) {
            return refused(StoreError::UnknownProcedure(id));
        }
    }
    for (key, response) in plan.must_be_absent().zip(responses) {
        if matches!(response, TxnOpResponse::Get(get) if !get.kvs().is_empty()) {
            return refused(StoreError::MetaExists {
                key: key.to_owned(),
            });
        }
    }
    refused(shared.io(
        "committing a transaction (it may or may not have applied)",
        std::io::Error::other("etcd refused the transaction's checks, yet each holds"),
    ))
}

/// Settles an attempt at `expected` whose answer was lost: advances the writer's
/// sequence past `expected` unless the attempt did. `Some(true)`: the attempt applied;
/// `Some(false)`: it never will; `None`: the settle's own answer was lost too.
async fn settle(shared: &Shared, expected: u64) -> Option<bool> {
    let key = &shared.sequence_key;
    let response = shared
        .call("settling a transaction whose answer was lost", |mut kv| {
            let txn = Txn::new()
                .when([sequence::compare(key, expected)])
                .and_then([sequence::advance(key, expected)])
                .or_else([TxnOp::get(key.clone(), None)]);
            async move { kv.txn(txn).await }
        })
        .await
        .ok()?;
    if response.succeeded() {
        return Some(false);
    }
    let found = sequence::read(response.op_responses().into_iter().next());
    (sequence::verdict(expected, found) == Verdict::AppliedBefore).then_some(true)
}
