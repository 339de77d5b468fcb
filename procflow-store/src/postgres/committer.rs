//! Group commit: batches committed while a transaction is in flight wait in a queue, and
//! the next transaction carries as many of them as [`Group::try_add`] lets in, so one
//! round trip and one PostgreSQL commit (one WAL flush) persist many procedures' steps.
//! Each transaction is one call of `apply` on the committer's own connection.

use std::sync::Arc;

use deadpool_postgres::Object;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::types::ToSql;

use super::Shared;
use super::plan::{Group, MetaWrite, Plan, Prepared, RecordWrite};
use super::schema;
use crate::error::StoreError;

/// A batch waiting for its transaction, and where to send its result.
pub(crate) struct Pending {
    pub(crate) batch: Prepared,
    pub(crate) reply: oneshot::Sender<Result<(), StoreError>>,
}

/// Runs until every sender is dropped and the queue is empty.
pub(crate) async fn run(shared: Arc<Shared>, mut queue: mpsc::UnboundedReceiver<Pending>) {
    let mut connection = Link::default();
    let mut carried: Option<Pending> = None;
    loop {
        let first = match carried.take() {
            Some(first) => first,
            None => match queue.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        let mut keys = Group::of(&first.batch);
        let mut group = vec![first];
        while let Ok(next) = queue.try_recv() {
            if keys.try_add(&next.batch) {
                group.push(next);
            } else {
                carried = Some(next);
                break;
            }
        }
        commit_group(&shared, &mut connection, group).await;
    }
}

/// Commits `group` as `plan`, one transaction; if a check failed for a group of several,
/// commits each on its own to find out whose it was.
async fn commit_group(shared: &Shared, connection: &mut Link, group: Vec<Pending>) {
    let plan = Plan::of(group.iter().map(|pending| &pending.batch));
    let result = apply(shared, connection, &plan).await;
    let refused_check = matches!(
        result,
        Err(StoreError::UnknownProcedure(_) | StoreError::MetaExists { .. })
    );
    if group.len() > 1 && refused_check {
        for pending in group {
            let alone = Plan::of([&pending.batch]);
            let result = apply(shared, connection, &alone).await;
            // The committing future may have been dropped: its batch is in, or not.
            let _ = pending.reply.send(result);
        }
        return;
    }
    for pending in group {
        let _ = pending
            .reply
            .send(result.as_ref().map_err(StoreError::duplicate).copied());
    }
}

/// One transaction of `plan`. A connection whose request timed out or broke is dropped,
/// not reused: what it still carries may yet apply.
async fn apply(shared: &Shared, connection: &mut Link, plan: &Plan<'_>) -> Result<(), StoreError> {
    let context = "committing a transaction (it may or may not have applied)";
    // Nothing is sent if this fails: a definite failure, reported as the others are, an
    // I/O error.
    let client = connection.ready(shared).await?;
    match tokio::time::timeout(shared.timeout, send(shared, client, plan)).await {
        Ok(Ok(None)) => Ok(()),
        Ok(Ok(Some(highest))) => Err(StoreError::Fenced {
            token: plan.token.and_then(|t| u64::try_from(t).ok()).unwrap_or(0),
            highest: u64::try_from(highest).unwrap_or(0),
        }),
        Ok(Err(error)) => {
            if let Some(refusal) = refusal(&error, plan.token) {
                return Err(refusal);
            }
            if error.as_db_error().is_none() {
                connection.abandon();
            }
            Err(shared.io(context, std::io::Error::other(error)))
        }
        Err(_) => {
            connection.abandon();
            Err(shared.io(
                context,
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "no answer within {:?}; the outcome is unknown",
                        shared.timeout
                    ),
                ),
            ))
        }
    }
}

/// The committer's connection and its server process; and the process of the last
/// connection it gave up on with a statement's outcome unknown.
///
/// A statement whose answer never came may still be on its way (in a socket buffer, a
/// slow link, a proxy), and would run whenever it reaches its server process, after
/// later commits on a new connection. So before anything is sent on a new connection,
/// that process is ended (`pg_terminate_backend`, waiting for it to exit): whatever it
/// did is then final, and nothing of it can apply late.
#[derive(Default)]
struct Link {
    connection: Option<(Object, Backend)>,
    abandoned: Option<Backend>,
}

/// A server process, known by its pid and its start: after a server restart another
/// process may have the pid.
#[derive(Debug)]
struct Backend {
    pid: i32,
    started: String,
}

/// This connection's server process.
const BACKEND: &str = "SELECT pid, backend_start::text FROM pg_stat_activity \
     WHERE pid = pg_backend_pid()";

/// Ends server process `$1` started at `$2`, waiting up to `$3` ms; true once it is gone
/// (also if it was gone before).
const TERMINATE: &str = "SELECT coalesce(bool_and(pg_terminate_backend(pid, $3)), true) \
     FROM pg_stat_activity WHERE pid = $1 AND backend_start::text = $2";

impl Link {
    /// The connection, opened if needed; a new one only once the abandoned process has
    /// ended.
    async fn ready(&mut self, shared: &Shared) -> Result<&Object, StoreError> {
        if self.connection.as_ref().is_some_and(|(c, _)| c.is_closed()) {
            self.abandon();
        }
        if self.connection.is_none() {
            let context = "connecting to PostgreSQL";
            let object = shared.connect(context).await?;
            let backend = shared
                .timed(context, async {
                    let row = object.query_one(BACKEND, &[]).await?;
                    Ok(Backend {
                        pid: row.get(0),
                        started: row.get(1),
                    })
                })
                .await?;
            if let Some(old) = &self.abandoned {
                end_process(shared, &object, old).await?;
                self.abandoned = None;
            }
            self.connection = Some((object, backend));
        }
        Ok(&self.connection.as_ref().expect("connected above").0)
    }

    /// Drops the connection; its process is to be ended before the next is used.
    fn abandon(&mut self) {
        if let Some((object, backend)) = self.connection.take() {
            drop(Object::take(object));
            self.abandoned = Some(backend);
        }
    }
}

/// Ends `backend` through `client`, or fails if it is still there.
async fn end_process(
    shared: &Shared,
    client: &Object,
    backend: &Backend,
) -> Result<(), StoreError> {
    let context = "ending the server process of a connection given up on";
    // Half the deadline: the request itself must answer within it.
    let wait_ms = i64::try_from(shared.timeout.as_millis() / 2).unwrap_or(i64::MAX);
    let params: [&(dyn ToSql + Sync); 3] = [&backend.pid, &backend.started, &wait_ms];
    let gone: bool = shared
        .timed(context, async {
            Ok(client.query_one(TERMINATE, &params).await?.get(0))
        })
        .await?;
    if gone {
        Ok(())
    } else {
        Err(shared.io(
            context,
            std::io::Error::other(format!(
                "server process {} did not end within {wait_ms} ms",
                backend.pid
            )),
        ))
    }
}

/// Sends `plan` as one statement: `Ok(None)` once it applied, `Ok(Some(term))` if a
/// one-record put found the leader row at another `term` and wrote nothing.
async fn send(
    shared: &Shared,
    client: &Object,
    plan: &Plan<'_>,
) -> Result<Option<i64>, tokio_postgres::Error> {
    if let Some((
        id,
        RecordWrite::Put {
            parent,
            finished,
            value,
        },
    )) = plan.single_put()
    {
        let statement = client.prepare_cached(&shared.sql.put_one).await?;
        let params: [&(dyn ToSql + Sync); 5] = [&plan.token, &id, parent, finished, value];
        if client.execute(&statement, &params).await? == 1 {
            return Ok(None);
        }
        let statement = client.prepare_cached(&shared.sql.term).await?;
        return Ok(Some(client.query_one(&statement, &[]).await?.get(0)));
    }
    let statement = client.prepare_cached(&shared.sql.apply).await?;
    client.execute(&statement, &Params::of(plan).refs()).await?;
    Ok(None)
}

/// The store's refusal `error` carries, if `apply` raised one.
fn refusal(error: &tokio_postgres::Error, token: Option<i64>) -> Option<StoreError> {
    let db = error.as_db_error()?;
    let detail = db.detail().unwrap_or_default();
    match db.code().code() {
        schema::FENCED => Some(StoreError::Fenced {
            token: token.and_then(|t| u64::try_from(t).ok()).unwrap_or(0),
            highest: detail.parse().unwrap_or(0),
        }),
        schema::UNKNOWN_PROCEDURE => Some(StoreError::UnknownProcedure(
            detail.parse().unwrap_or_default(),
        )),
        schema::META_EXISTS => Some(StoreError::MetaExists {
            key: detail.to_owned(),
        }),
        _ => None,
    }
}

/// `apply`'s arguments, column by column.
#[derive(Default)]
struct Params<'a> {
    fence: Option<i64>,
    must_exist: Vec<i64>,
    create_keys: Vec<&'a str>,
    put_ids: Vec<i64>,
    put_parents: Vec<Option<i64>>,
    put_finished: Vec<bool>,
    put_values: Vec<&'a [u8]>,
    finish_ids: Vec<i64>,
    finish_values: Vec<&'a [u8]>,
    delete_ids: Vec<i64>,
    meta_keys: Vec<&'a str>,
    meta_values: Vec<&'a [u8]>,
    meta_deletes: Vec<&'a str>,
}

impl<'a> Params<'a> {
    fn of(plan: &Plan<'a>) -> Self {
        let mut params = Params {
            fence: plan.token,
            must_exist: plan.must_exist.iter().copied().collect(),
            create_keys: plan.must_be_absent.iter().copied().collect(),
            ..Params::default()
        };
        for (&id, write) in &plan.records {
            match write {
                RecordWrite::Put {
                    parent,
                    finished,
                    value,
                } => {
                    params.put_ids.push(id);
                    params.put_parents.push(*parent);
                    params.put_finished.push(*finished);
                    params.put_values.push(value);
                }
                RecordWrite::Finish { value } => {
                    params.finish_ids.push(id);
                    params.finish_values.push(value);
                }
                RecordWrite::Delete => params.delete_ids.push(id),
            }
        }
        for (key, write) in &plan.meta {
            match write {
                MetaWrite::Put(value) => {
                    params.meta_keys.push(key);
                    params.meta_values.push(value);
                }
                MetaWrite::Delete => params.meta_deletes.push(key),
            }
        }
        params
    }

    /// In the order of `apply`'s parameters.
    fn refs(&self) -> [&(dyn ToSql + Sync); 13] {
        [
            &self.fence,
            &self.must_exist,
            &self.create_keys,
            &self.put_ids,
            &self.put_parents,
            &self.put_finished,
            &self.put_values,
            &self.finish_ids,
            &self.finish_values,
            &self.delete_ids,
            &self.meta_keys,
            &self.meta_values,
            &self.meta_deletes,
        ]
    }
}
